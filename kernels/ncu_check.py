"""The traffic models against the H200's (or any GPU's) hardware counters, at a fixed set of shapes.

    python -m kernels.ncu_check [--dtype bf16] [--out ncu_check.csv] [--json ncu_check.json]
    python -m kernels.ncu_check --model-only      # the model columns alone; works on CPU (H200 limits)
    python -m kernels.ncu_check --only grouped    # the cases whose name holds "grouped"

The parent process runs itself again (with --child) under Nsight Compute's ncu, collecting for each
kernel the DRAM bytes read and written (the HBM level), the global-memory sectors the SMs request
through L1 (x 32 bytes: loads, cp.async copies and stores, the level the models call the SMs' requests)
and the L2 sectors those requests become (x 32 bytes). The L2 sees fewer than the SMs request where a
tiled kernel's misses to one sector are in flight together (they are merged on the way), so the models'
request level is checked against the L1 counter, and the L2 counter is shown beside it. The child
builds, compiles and warms every case before torch.cuda.profiler.start(), then launches each case
exactly once inside the profiled range.

Writes: the models count every byte written as reaching HBM eventually (kernels.config.Traffic), but
a kernel's dirty lines mostly sit in the 50 MB L2 when it ends, so its own dram__bytes_write stays
near 0. So ncu's cache control is off and the child flushes L2 itself with a read-only kernel
(_l2_flush_kernel, reading 4x the L2 size) before the first case and after every case: its DRAM
writes are the write-backs of the case before it, added to that case's counter. The same flush gives
each case cold caches. A case's kernels are the ones between two flushes (a case may launch two:
split-K reduce, decode merge), in launch order.

A row passes when model and counter agree within 15% at both levels, or differ by less than 64 KB
(tiny cases, where the flush's leftovers and sector rounding dominate).
"""

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
import triton.language as tl

METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_write.sum",
    # Global loads and stores through L1, and cp.async (LDGSTS) copies, which ncu names by cache path on
    # some GPUs. TMA loads (the Hopper persistent matmul) take no L1 path: a TMA case reads 0 here.
    "regex:^l1tex__t_sectors_pipe_lsu_mem_global_op_(ld|st|ldgsts(_cache_(access|bypass))?)\\.sum$",
)
L1_LOADS = tuple(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum" for op in ("ld", "ldgsts"))
L1_COPIES_BY_PATH = tuple(f"l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_{p}.sum" for p in ("access", "bypass"))
L1_STORES = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
FLUSH_KERNEL = "_l2_flush_kernel"
TOLERANCE = 0.15
NOISE_BYTES = 64 * 1024
# Writes reach DRAM only when the L2 evicts them, and the flush between cases does not evict every
# dirty line at once: on the H200 up to ~1 MB written by one case was counted in the next case's
# window (seen as +0.4-1.0 MB on cases that write 0.04-0.4 MB). Below this, a write difference is that.
WRITE_NOISE_BYTES = 1 << 20
MB = 1e6
UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kb": 1e3, "mb": 1e6, "gb": 1e9, "sector": 1, "": 1}


@dataclass(frozen=True)
class Case:
    name: str
    # the operation (kernels.operations) whose Counted model and call the case runs: decode_linear with "kv" is
    # RMSNorm, the q/k/v projection, rotary and the cache write; without, RMSNorm and SwiGLU
    kind: str
    shape: dict
    # linear only: "tile" is the tile kernel, whose loads pass through L1; "tma" the persistent form
    # (Hopper on, 16-bit), whose TMA copies reach shared memory past L1 and the texture path, so no
    # counter sees its requests and only its HBM level is judged. None: what the GPU picks by itself.
    form: str | None = None


CASES = (
    Case("layer_norm+residual 4096x768", "layer_norm", dict(rows=4096, width=768)),
    Case("rms_norm+residual 4096x576", "rms_norm", dict(rows=4096, width=576)),
    Case("linear M=1 768->3072 +GELU (split-K)", "linear", dict(rows=1, out=3072, inp=768)),
    Case("linear M=1024 768->3072 +GELU", "linear", dict(rows=1024, out=3072, inp=768), form="tile"),
    Case("linear M=1024 768->3072 +GELU (persistent, TMA)", "linear", dict(rows=1024, out=3072, inp=768), form="tma"),
    Case("swiglu gate+up M=1024 576->2x1536", "swiglu", dict(rows=1024, out=1536, inp=576)),
    Case("attention causal B1 H12 T1024 D64", "attention", dict(batch=1, heads=12, t=1024, d=64)),
    Case("attention causal B4 H12 T4096 D64", "attention", dict(batch=4, heads=12, t=4096, d=64)),
    Case("decode attention B1 H12 N8192 D64", "decode_attention", dict(batch=1, heads=12, n=8192, d=64)),
    Case(
        "grouped decode attention B1 H9/3 N8192 D64",
        "grouped_decode_attention",
        dict(batch=1, heads=9, kv=3, n=8192, d=64),
    ),
    Case(
        "grouped decode attention B8 H9/3 N4096 D64",
        "grouped_decode_attention",
        dict(batch=8, heads=9, kv=3, n=4096, d=64),
    ),
    # A generation's cache is allocated to its end: a length of 1500 over 4096 positions, in one-tile splits that
    # request their tiles whole before the length arrives, past it too.
    Case(
        "grouped decode attention B1 H9/3 N1500 of 4096 D64",
        "grouped_decode_attention",
        dict(batch=1, heads=9, kv=3, n=1500, d=64, cache=4096),
    ),
    # SmolLM2's decode rung: RMSNorm + q/k/v + rotary + the grouped cache write in one launch; RMSNorm + SwiGLU.
    Case("decode_linear RMSNorm+qkv+rope+KV B1 576->960 KV3", "decode_linear", dict(rows=1, out=960, inp=576, kv=3)),
    Case("decode_linear RMSNorm+SwiGLU B1 576->2x1536", "decode_linear", dict(rows=1, out=3072, inp=576)),
    Case("rotary B1 H9 T1024 D64", "rotary", dict(batch=1, heads=9, t=1024, d=64)),
    Case("kv_write B1 H12 D64 cache 1024", "kv_write", dict(batch=1, heads=12, t_max=1024, d=64)),
    Case("kv_write B128 H12 D64 cache 1024", "kv_write", dict(batch=128, heads=12, t_max=1024, d=64)),
    # The megakernel rung's whole GPT-2-small step in one launch, at context 1000 of a 1024-position cache.
    Case(
        "decode step (megakernel) GPT-2 small B1 context 1000",
        "decode_step",
        dict(batch=1, width=768, heads=12, ffn=3072, layers=12, vocab=50257, t_max=1024, context=1000),
    ),
    Case(
        "decode step (megakernel) SmolLM2-135M B1 context 1000",
        "decode_step",
        dict(batch=1, width=576, heads=9, kv=3, ffn=1536, layers=30, vocab=49152, t_max=1024, context=1000),
    ),
)


@triton.jit
def _l2_flush_kernel(X, Out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    total = tl.sum(tl.load(X + offs, mask=offs < n, other=0.0), axis=0)
    # Reads only: the buffer is zeros, so this store never happens, but the compiler cannot know that.
    tl.store(Out + tl.program_id(0), total, mask=total == 12345.0)


def h200_limits():
    """What the models assume when there is no GPU to ask (--model-only on CPU): an H200."""
    import dataclasses

    from .config import H200

    return dataclasses.replace(H200, name="NVIDIA H200 (assumed)")


def model(case: Case, dtype, device):
    """(Traffic, TileConfig or None) of one case from the kernel's own model."""
    import torch

    from .operations import operation

    item = torch.empty((), dtype=dtype).element_size()
    with form(case):
        return operation(case.kind).counted.model(case.shape, item, dtype, device)


def form(case: Case):
    """The linear's form a case asks for, as a context manager (kernels.ops.linear.kernel.forced_form)."""
    from .ops.linear.kernel import forced_form

    return forced_form({"tile": False, "tma": True}.get(case.form))


def make_call(case: Case, dtype, device):
    """Inputs on the GPU and a function that launches the case once."""
    import torch

    from .operations import operation

    rand = lambda *shape: torch.randn(shape, device=device, dtype=dtype)
    launch = operation(case.kind).counted.call(case.shape, rand, device)

    def call():
        with form(case):
            return launch()

    return call


def parse_ncu_csv(text: str) -> list[dict]:
    """ncu --csv output -> one dict per profiled kernel, in launch (ID) order:
    {"id", "kernel", "metrics": {name: value in base units (bytes, sectors)}}. Lines before the
    header (ncu's ==PROF== messages) are skipped; values may carry thousands separators."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the output')
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID", "").strip().isdigit():
            continue  # a stray message line inside the table
        kid = int(row["ID"])
        entry = kernels.setdefault(kid, {"id": kid, "kernel": row["Kernel Name"], "metrics": {}})
        raw = row["Metric Value"].replace(",", "").strip()
        unit = row.get("Metric Unit", "").strip().lower()
        if unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r} for {row['Metric Name']}")
        entry["metrics"][row["Metric Name"]] = float(raw) * UNITS[unit] if raw not in ("", "n/a") else float("nan")
    return [kernels[k] for k in sorted(kernels)]


def attribute(kernels: list[dict], n_cases: int, flush_name: str = FLUSH_KERNEL) -> list[dict]:
    """Split the launch-ordered kernels on the flush kernel (flush, case, flush, case, ..., flush) and
    sum each case's counters in bytes; the DRAM writes of the flush after a case are its write-backs."""
    groups, current, seen_flush = [], None, False
    for k in kernels:
        if flush_name in k["kernel"]:
            if current is not None:
                current["dram_write_back"] = k["metrics"].get("dram__bytes_write.sum", 0.0)
                groups.append(current)
            current, seen_flush = None, True
            continue
        if not seen_flush:
            raise ValueError(f"kernel {k['kernel']!r} (ID {k['id']}) ran before the first flush")
        if current is None:
            current = {
                "kernels": [],
                "dram_read": 0.0,
                "dram_write": 0.0,
                "l2_read": 0.0,
                "l2_write": 0.0,
                "l1_read": 0.0,
                "l1_write": 0.0,
            }
        m = k["metrics"]
        current["kernels"].append(k["kernel"])
        current["dram_read"] += m.get("dram__bytes_read.sum", 0.0)
        current["dram_write"] += m.get("dram__bytes_write.sum", 0.0)
        current["l2_read"] += 32 * m.get("lts__t_sectors_srcunit_tex_op_read.sum", 0.0)
        current["l2_write"] += 32 * m.get("lts__t_sectors_srcunit_tex_op_write.sum", 0.0)
        copies = L1_COPIES_BY_PATH if L1_LOADS[1] not in m else ()  # the copies' total, or its two paths
        current["l1_read"] += 32 * sum(m.get(name, 0.0) for name in (L1_LOADS[0], L1_LOADS[1], *copies))
        current["l1_write"] += 32 * m.get(L1_STORES, 0.0)
    if current is not None:
        raise ValueError("the last case has no flush after it")
    if len(groups) != n_cases:
        raise ValueError(f"found {len(groups)} cases between flushes, expected {n_cases}")
    return groups


def diff(model_bytes: float, counter_bytes: float, noise: int = NOISE_BYTES) -> tuple[float, bool]:
    """(model vs counter in %, within tolerance)."""
    pct = 100 * (model_bytes - counter_bytes) / counter_bytes if counter_bytes else float("nan")
    return pct, abs(model_bytes - counter_bytes) < noise or abs(pct) <= 100 * TOLERANCE


def rows_for(dtype, device, counters=None, cases=CASES) -> list[dict]:
    rows = []
    for i, case in enumerate(cases):
        t, cfg = model(case, dtype, device)
        row = dict(
            case=case.name,
            config=str(cfg) if cfg else "",
            model_l2_read_mb=t.bytes_read / MB,
            model_l2_write_mb=t.bytes_written / MB,
            model_hbm_read_mb=t.hbm_read / MB,
            model_hbm_write_mb=t.hbm_written / MB,
            floor_mb=t.min_bytes / MB,
        )
        if counters is not None:
            c = counters[i]
            hbm_write = c["dram_write"] + c["dram_write_back"]
            # The requests against L1's counter where the case's loads go through L1; a case whose loads take
            # no L1 path against the L2's, which then sees the requests themselves. TMA copies pass neither
            # counter: such a case is judged at HBM alone.
            via = "tma" if case.form == "tma" else "l1" if c["l1_read"] > 0 else "l2"
            checks = [
                ("l2_read", t.bytes_read, c["l2_read"], via == "l2"),
                ("l2_write", t.bytes_written, c["l2_write"], via == "l2"),
                ("l1_read", t.bytes_read, c["l1_read"], via == "l1"),
                ("l1_write", t.bytes_written, c["l1_write"], via == "l1"),
                ("hbm_read", t.hbm_read, c["dram_read"], True),
                ("hbm_write", t.hbm_written, hbm_write, True),
            ]
            ok = True
            for name, m, n, judged in checks:
                pct, good = diff(m, n, WRITE_NOISE_BYTES if name == "hbm_write" else NOISE_BYTES)
                row[f"counter_{name}_mb"] = n / MB
                row[f"{name}_diff_pct"] = pct
                ok &= good or not judged
            row["requests_counter"] = "none (TMA)" if via == "tma" else via.upper()
            row["counter_dram_write_in_kernel_mb"] = c["dram_write"] / MB
            row["kernels"] = " + ".join(c["kernels"])
            row["verdict"] = "PASS" if ok else "OVER 15%"
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    """Per case, the SMs' requests and HBM, modeled and (when measured) counted; the L2's counter with the
    model beside it only where the two agree, since the model counts requests, not what the L2 sees."""
    measured = "verdict" in rows[0]
    for r in rows:
        print(f"{r['case']}  [{r['config'] or 'no tiles'}]")
        for level, stem in (("SM req", "l1"), ("HBM", "hbm"), ("L2", "l2")):
            model = "l2" if stem == "l1" else stem  # the models name the request level after the L2 it asks
            if stem == "l2" and not measured:
                continue
            parts = []
            for way in ("read", "write"):
                m, line = r[f"model_{model}_{way}_mb"], f"{way} "
                if measured:
                    n, pct = r[f"counter_{stem}_{way}_mb"], r[f"{stem}_{way}_diff_pct"]
                    line += f"counter {n:9.3f} MB"
                    if stem != "l2" or abs(pct) <= 100 * TOLERANCE:
                        line += f", model {m:9.3f} MB ({pct:+6.1f}%)"
                else:
                    line += f"model {m:9.3f} MB"
                parts.append(line)
            print(f"  {level:6s} " + "  |  ".join(parts))
        print(f"  floor {r['floor_mb']:.3f} MB" + (f"  -> {r['verdict']}" if measured else ""))


def missing_tools() -> list[str]:
    import torch

    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    if find_ncu() is None:
        missing.append("Nsight Compute's ncu (not on PATH, nor /usr/local/cuda/bin/ncu)")
    return missing


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    return found or ("/usr/local/cuda/bin/ncu" if os.access("/usr/local/cuda/bin/ncu", os.X_OK) else None)


def l2_flush(device):
    """A function that evicts the L2 by reading 4x its size of clean lines (_l2_flush_kernel)."""
    import torch

    l2 = torch.cuda.get_device_properties(device).L2_cache_size or 50 * 1024 * 1024
    buf = torch.zeros(4 * l2 // 4, device=device, dtype=torch.float32)  # 4x L2 of clean lines
    sink = torch.zeros(triton.cdiv(buf.numel(), 4096), device=device)
    return lambda: _l2_flush_kernel[(sink.numel(),)](buf, sink, buf.numel(), BLOCK=4096)


def profile_between_flushes(calls) -> None:
    """Inside ncu: compile and warm every call, then flush, call, flush, ... in the profiled range."""
    import torch

    flush = l2_flush(torch.device("cuda"))
    for call in calls:  # compile and warm outside the profiled range
        call()
        call()
    flush()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    flush()
    for call in calls:
        call()
        flush()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def run_child(dtype, cases=CASES) -> None:
    import torch

    profile_between_flushes([make_call(case, dtype, torch.device("cuda")) for case in cases])


def run_ncu(child: list[str]) -> str:
    """ncu's CSV of the child process `python <child...>` (run from the repository's root), profiled with this
    module's counters, the caches left as the child leaves them."""
    log = tempfile.NamedTemporaryFile(prefix="ncu_check_", suffix=".csv", delete=False).name
    cmd = [
        find_ncu(),
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--cache-control",
        "none",
        # The L1 metrics take ncu a second pass. Kernel replay restores memory between passes, which leaves
        # dirty lines in L2 that the DRAM write counter then sees (+2.4 MB on every case, H200); replaying
        # the whole child instead gives each pass the caches a single run has.
        "--replay-mode",
        "application",
        "--metrics",
        ",".join(METRICS),
        "--csv",
        "--print-units",
        "base",
        "--log-file",
        log,
        sys.executable,
        *child,
    ]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if done.returncode != 0:
        sys.exit(f"ncu or the child failed (exit {done.returncode}); ncu's log: {log}")
    with open(log) as f:
        return f.read()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--out", default=None, help="CSV of the rows (default ncu_check.csv when measuring)")
    p.add_argument("--json", default=None, help="JSON with GPU, date, versions and rows (default ncu_check.json)")
    p.add_argument("--model-only", "--dry-run", action="store_true", help="the model columns only; no GPU or ncu")
    p.add_argument("--only", default="", help="the cases whose name holds this text (default: all)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    cases = tuple(c for c in CASES if args.only in c.name)
    if not cases:
        print(f"ncu_check: no case's name holds {args.only!r}", file=sys.stderr)
        return 2

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.child:
        run_child(dtype, cases)
        return 0
    if args.model_only:
        device = torch.device("cuda") if torch.cuda.is_available() else h200_limits()
        from .config import device_limits

        print(f"model only, {args.dtype}, limits of {device_limits(device).name}")
        rows = rows_for(dtype, device, cases=cases)
        print_table(rows)
        write_outputs(rows, args, device_limits(device).name)
        return 0
    missing = missing_tools()
    if missing:
        print("ncu_check: missing " + " and ".join(missing) + "; --model-only prints the model alone", file=sys.stderr)
        return 2
    child = ["-m", "kernels.ncu_check", "--child", "--dtype", args.dtype, "--only", args.only]
    counters = attribute(parse_ncu_csv(run_ncu(child)), len(cases))
    rows = rows_for(dtype, torch.device("cuda"), counters, cases)
    print_table(rows)
    args.out, args.json = args.out or "ncu_check.csv", args.json or "ncu_check.json"
    write_outputs(rows, args, torch.cuda.get_device_name())
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


def write_outputs(rows, args, gpu: str) -> None:
    import datetime

    import torch
    import triton

    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")
    if args.json:
        meta = dict(
            gpu=gpu,
            date=datetime.datetime.now().isoformat(timespec="seconds"),
            torch=torch.__version__,
            triton=triton.__version__,
            dtype=args.dtype,
            metrics=list(METRICS),
            rows=rows,
        )
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
