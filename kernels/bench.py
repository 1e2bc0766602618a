"""Time each kernel next to what a user would pick instead, on a GPU: python -m kernels.bench

Every case runs ours and the PyTorch baseline in the same process on the same random inputs. Two
timings per kernel:
- device: kernels.timing.device_time, the one method the autotuner and the tile sweeps use too: the
  median over replays of a CUDA graph that calls the kernel once per input set, over enough random
  sets that together they exceed L2 several times, per call. This is the kernel's own time from
  memory (cold L2), free of Python launch overhead; the L2 column says "warm" where even the largest
  rotation fits in L2 (the smallest cases), so that number is an L2-resident one.
- eager: triton.testing.do_bench's median of plain calls (L2 flushed before each), launch overhead
  included.
The ratio is baseline time / our time: above 1.0 means ours is faster.
"""

import argparse
import datetime
import itertools

import torch
import torch.nn.functional as F

from . import attention, decode_attention, layer_norm, linear, reference, timing
from .config import device_limits

EAGER_REGIME = "eager: triton.testing.do_bench median of plain calls, L2 flushed before each, launch overhead included"


def copy_bandwidth(device) -> float:
    """Device-to-device copy of 1 GiB, bytes read plus written over its device time: GB/s."""
    n = 1 << 28  # 1 GiB of fp32, far past any L2: one set is its own rotation
    t = timing.device_time(
        lambda src, dst: dst.copy_(src),
        lambda: (torch.randn(n, device=device), torch.empty(n, device=device)),
        reps=5,
    )
    return 2 * n * 4 / t.ms / 1e6


def _time_pair(ours, theirs, make_inputs, bytes_per_set):
    """Ours and the baseline over the same rotated sets: device time (the one method) and eager time."""
    from triton.testing import do_bench

    sets = timing.rotated_inputs(make_inputs, bytes_per_set=bytes_per_set)
    row = {}
    for name, fn in (("ours", ours), ("torch", theirs)):
        t = timing.device_time(fn, sets, bytes_per_set=bytes_per_set)
        row[f"{name}_ms"] = t.ms
        cycle = itertools.cycle(sets)  # eager calls rotate through the same sets
        call = lambda fn=fn, cycle=cycle: fn(*next(cycle))
        row[f"{name}_eager_ms"] = do_bench(call, warmup=25, rep=100, return_mode="median")
    row["sets"], row["l2"], row["regime"] = t.sets, "cold" if t.regime == timing.COLD_REGIME else "warm", t.regime
    return row


def attention_cases(device, dtype):
    heads, head_dim = 12, 64
    for batch in (1, 8):
        for n in (128, 512, 1024, 4096):
            make = lambda b=batch, n=n: [
                torch.randn(b, heads, n, head_dim, device=device, dtype=dtype) for _ in range(3)
            ]
            flops = 4 * batch * heads * head_dim * n * (n + 1) // 2
            row = _time_pair(
                lambda q, k, v: attention(q, k, v),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                make,
                4 * batch * heads * n * head_dim * 2,
            )
            yield dict(
                kernel="attention (prefill, causal)", shape=f"B={batch} N={n}", unit="TFLOP/s", work=flops / 1e12, **row
            )


def decode_cases(device, dtype):
    heads, head_dim = 12, 64
    # Splits of one key tile (B=1 up to 8192 keys), and of several that loop (longer caches, larger batches).
    for batch, n in ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (32, 2048)):

        def make(b=batch, n=n):
            q = torch.randn(b, heads, 1, head_dim, device=device, dtype=dtype)
            k, v = (torch.randn(b, heads, n, head_dim, device=device, dtype=dtype) for _ in range(2))
            return q, k, v, torch.full((b,), n, device=device, dtype=torch.int32)

        kv_bytes = 2 * batch * heads * n * head_dim * 2
        row = _time_pair(
            lambda q, k, v, lens: decode_attention(q, k, v, lens),
            lambda q, k, v, lens: F.scaled_dot_product_attention(q, k, v),
            make,
            kv_bytes,
        )
        yield dict(kernel="decode attention", shape=f"B={batch} cache={n}", unit="GB/s", work=kv_bytes / 1e9, **row)


def layer_norm_cases(device, dtype):
    width = 768
    for rows in (1, 4096, 8 * 1024):
        for residual in (False, True):

            def make(rows=rows):
                return [torch.randn(rows, width, device=device, dtype=dtype) for _ in range(2)] + [
                    torch.randn(width, device=device, dtype=dtype) for _ in range(2)
                ]

            moved = rows * width * 2 * (4 if residual else 2)
            if residual:
                ours = lambda x, r, w, b: layer_norm(x, w, b, residual=r)
                theirs = lambda x, r, w, b: reference.layer_norm(x, w, b, residual=r)
            else:
                ours = lambda x, r, w, b: layer_norm(x, w, b)
                theirs = lambda x, r, w, b: F.layer_norm(x, (width,), w, b)
            name = "layernorm + residual add" if residual else "layernorm"
            row = _time_pair(ours, theirs, make, moved)
            yield dict(kernel=name, shape=f"{rows}x{width}", unit="GB/s", work=moved / 1e9, **row)


def linear_inputs(rows, k, n, device, dtype) -> tuple:
    """Random x (rows, k), weight (n, k) scaled as a layer's, bias (n,) and residual (rows, n)."""
    return (
        torch.randn(rows, k, device=device, dtype=dtype),
        torch.randn(n, k, device=device, dtype=dtype) / k**0.5,
        torch.randn(n, device=device, dtype=dtype),
        torch.randn(rows, n, device=device, dtype=dtype),
    )


def linear_cases(device, dtype):
    shapes = [  # (name, rows, in, out, activation, residual)
        ("linear + GELU (c_fc)", 1024, 768, 3072, "gelu", False),
        ("linear + GELU (c_fc)", 4096, 768, 3072, "gelu", False),
        ("linear + GELU (c_fc)", 8192, 768, 3072, "gelu", False),
        ("linear + residual (c_proj)", 4096, 3072, 768, None, True),
        ("linear decode (c_fc)", 1, 768, 3072, "gelu", False),
        ("linear decode (c_attn)", 1, 768, 2304, None, False),
        ("linear decode (c_fc)", 8, 768, 3072, "gelu", False),
        ("linear decode (lm_head)", 1, 768, 50257, None, False),
    ]
    for name, rows, k, n, act, res in shapes:
        make = lambda rows=rows, k=k, n=n: linear_inputs(rows, k, n, device, dtype)
        ours = lambda x, w, b, r, act=act, res=res: linear(x, w, b, activation=act, residual=r if res else None)
        theirs = lambda x, w, b, r, act=act, res=res: reference.linear(
            x, w, b, activation=act, residual=r if res else None
        )
        moved = 2 * (rows * k + n * k + rows * n * (2 if res else 1))
        decode = rows <= 16
        work = moved / 1e9 if decode else 2 * rows * n * k / 1e12
        row = _time_pair(ours, theirs, make, moved)
        yield dict(kernel=name, shape=f"M={rows} {k}->{n}", unit="GB/s" if decode else "TFLOP/s", work=work, **row)


def _guarded(cases, name):
    """Run the cases of one group; a case that fails is reported and the rest go on."""
    while True:
        try:
            yield next(cases)
        except StopIteration:
            return
        except Exception as e:
            print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:150]} |", flush=True)
            return


def run(dtype=torch.bfloat16, only=None):
    device = torch.device("cuda")
    groups = {
        "attention": attention_cases,
        "decode": decode_cases,
        "layer_norm": layer_norm_cases,
        "linear": linear_cases,
    }
    rows = []
    for name, cases in groups.items():
        if only and name not in only:
            continue
        for row in _guarded(cases(device, dtype), name):
            row["ours_rate"] = row["work"] / row["ours_ms"] * 1e3
            row["torch_rate"] = row["work"] / row["torch_ms"] * 1e3
            row["ratio"] = row["torch_ms"] / row["ours_ms"]
            row["eager_ratio"] = row["torch_eager_ms"] / row["ours_eager_ms"]
            print(_format_row(row), flush=True)
            rows.append(row)
    return rows


HEADER = (
    "| kernel | shape | L2 | input sets | ours ms | torch ms | ours | torch | speed-up (device) | speed-up (eager) |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
)
REGIMES = f"- device: {timing.COLD_REGIME}; the L2 column says warm where the rotated sets fit in it\n- {EAGER_REGIME}"


def _format_row(r):
    return (
        f"| {r['kernel']} | {r['shape']} | {r['l2']} | {r['sets']} | {r['ours_ms']:.4f} | {r['torch_ms']:.4f} | "
        f"{r['ours_rate']:.1f} {r['unit']} | {r['torch_rate']:.1f} {r['unit']} | "
        f"{r['ratio']:.2f}x | {r['eager_ratio']:.2f}x |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--only", nargs="*", help="attention, decode, layer_norm, linear")
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench times compiled kernels and needs a CUDA GPU")
    import triton

    limits = device_limits("cuda")
    bandwidth = copy_bandwidth("cuda")
    title = (
        f"{datetime.date.today()} · {limits.name} · torch {torch.__version__} · triton {triton.__version__} · "
        f"{args.dtype} · measured copy bandwidth {bandwidth:.0f} GB/s"
    )
    print(title)
    print(REGIMES)
    print(HEADER)
    rows = run(getattr(torch, args.dtype), args.only)
    text = "\n".join([title, "", REGIMES, "", HEADER, *map(_format_row, rows)])
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        import json

        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump(dict(title=title, regimes=REGIMES, copy_gbs=bandwidth, rows=rows), f, indent=1)


if __name__ == "__main__":
    from .timing import require_cuda

    require_cuda("python -m kernels.bench")
    main()
