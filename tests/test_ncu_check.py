"""kernels.ncu_check on CPU: its ncu CSV parsing and case attribution on a hand-written sample in ncu's
format, the one-line refusal without a GPU or ncu, and the model-only table."""

import os
import subprocess
import sys

import pytest

from kernels import ncu_check

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)
METRICS = [
    ("dram__bytes_read.sum", "byte"),
    ("dram__bytes_write.sum", "byte"),
    ("lts__t_sectors_srcunit_tex_op_read.sum", "sector"),
    ("lts__t_sectors_srcunit_tex_op_write.sum", "sector"),
    ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sector"),
    ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum", "sector"),
    ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum", "sector"),
    ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "sector"),
]


def sample(kernels, metrics=METRICS):
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", HEADER]
    for kid, (name, values) in enumerate(kernels):
        for (metric, unit), value in zip(metrics, values, strict=True):
            lines.append(
                f'"{kid}","4242","python3.12","127.0.0.1","{name}","1","7","(128, 1, 1)","(512, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{metric}","{unit}","{value}"'
            )
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


FLUSH = "_l2_flush_kernel"
TEXT = sample(
    [
        (FLUSH, ("209,715,200", "1,048,576", "6,553,600", "0", "6,553,600", "0", "0", "0")),
        ("_linear_split_k_kernel", ("4,718,592", "0", "147,456", "1,152", "1,000", "150,000", "2,000", "1,152")),
        ("_split_k_reduce_kernel", ("36,864", "0", "1,344", "192", "1,344", "0", "0", "192")),
        (FLUSH, ("209,715,200", "43,008", "6,553,600", "0", "6,553,600", "0", "0", "0")),
        ("_layer_norm_kernel", ("12,582,912", "2,048", "393,216", "393,216", "393,216", "0", "0", "393,216")),
        (FLUSH, ("209,715,200", "12,580,864", "6,553,600", "0", "6,553,600", "0", "0", "0")),
    ]
)


def test_parse_ncu_csv_reads_each_kernels_metrics_in_base_units():
    kernels = ncu_check.parse_ncu_csv(TEXT)
    assert [k["id"] for k in kernels] == list(range(6))
    assert kernels[1]["kernel"] == "_linear_split_k_kernel"
    assert kernels[1]["metrics"]["dram__bytes_read.sum"] == 4_718_592
    assert kernels[4]["metrics"]["lts__t_sectors_srcunit_tex_op_write.sum"] == 393_216


def test_parse_scales_prefixed_units():
    text = TEXT.replace('"byte","4,718,592"', '"Mbyte","4.718592"')
    assert ncu_check.parse_ncu_csv(text)[1]["metrics"]["dram__bytes_read.sum"] == pytest.approx(4_718_592)


def test_attribute_sums_a_cases_kernels_and_adds_the_next_flushs_write_backs():
    cases = ncu_check.attribute(ncu_check.parse_ncu_csv(TEXT), 2)
    linear, ln = cases
    assert linear["kernels"] == ["_linear_split_k_kernel", "_split_k_reduce_kernel"]
    assert linear["dram_read"] == 4_718_592 + 36_864
    assert linear["l2_read"] == 32 * (147_456 + 1_344) and linear["l2_write"] == 32 * (1_152 + 192)
    assert linear["dram_write_back"] == 43_008
    # Requests through L1: loads and cp.async copies by either cache path (the split-K tiles), and stores.
    assert linear["l1_read"] == 32 * (1_000 + 150_000 + 2_000 + 1_344) and linear["l1_write"] == 32 * (1_152 + 192)
    assert ln["l1_read"] == ln["l2_read"] == 32 * 393_216
    assert ln["dram_write"] == 2_048 and ln["dram_write_back"] == 12_580_864
    with pytest.raises(ValueError, match="found 2 cases between flushes, expected 3"):
        ncu_check.attribute(ncu_check.parse_ncu_csv(TEXT), 3)


def test_copies_counted_in_total_are_not_counted_again_by_cache_path():
    metrics = [
        ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sector"),
        ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum", "sector"),
    ]
    metrics += [
        ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum", "sector"),
        ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum", "sector"),
    ]
    text = sample(
        [(FLUSH, ("0", "0", "0", "0")), ("_tile", ("10", "100", "60", "40")), (FLUSH, ("0", "0", "0", "0"))], metrics
    )
    assert ncu_check.attribute(ncu_check.parse_ncu_csv(text), 1)[0]["l1_read"] == 32 * (10 + 100)


def test_requests_are_judged_at_l1_and_at_the_l2_only_where_no_load_takes_the_l1_path():
    """The models count what the SMs request. A tiled kernel's L2 sees fewer (misses to one sector in flight
    together are merged), so L1's counter judges them; a case that reads 0 at L1 is judged at the L2's
    counter, and the persistent matmul's TMA copies, which neither counter sees, at HBM alone."""
    import torch

    device = ncu_check.h200_limits()
    models = [ncu_check.model(case, torch.bfloat16, device)[0] for case in ncu_check.CASES]

    def counters(l1, l2):  # each case's counters as shares of its modeled requests; HBM as modeled
        return [
            dict(
                kernels=["k"],
                dram_read=t.hbm_read,
                dram_write=t.hbm_written,
                dram_write_back=0.0,
                l1_read=l1 * t.bytes_read,
                l1_write=l1 * t.bytes_written,
                l2_read=l2 * t.bytes_read,
                l2_write=l2 * t.bytes_written,
            )
            for t in models
        ]

    tma = [case.form == "tma" for case in ncu_check.CASES]
    assert any(tma) and not all(tma)
    merged = ncu_check.rows_for(torch.bfloat16, device, counters(1.0, 0.6))
    assert all(r["verdict"] == "PASS" for r in merged)
    assert [r["requests_counter"] for r in merged] == ["none (TMA)" if t else "L1" for t in tma]
    assert all(r["l2_read_diff_pct"] == pytest.approx(100 * (1 / 0.6 - 1)) for r in merged)
    no_l1 = ncu_check.rows_for(torch.bfloat16, device, counters(0.0, 1.0))
    assert all(r["verdict"] == "PASS" for r in no_l1)
    assert [r["requests_counter"] for r in no_l1] == ["none (TMA)" if t else "L2" for t in tma]
    # Requests neither counter confirms fail, except where TMA copies pass both: there HBM alone judges.
    short = ncu_check.rows_for(torch.bfloat16, device, counters(0.0, 0.6))
    big = [
        (r, t)
        for r, t in zip(short, tma, strict=True)
        if r["model_l2_read_mb"] * ncu_check.MB > 4 * ncu_check.NOISE_BYTES
    ]
    assert big and all(r["verdict"] == ("PASS" if t else "OVER 15%") for r, t in big)


def run(*args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH="/usr/bin:/bin")  # no GPU, no ncu
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(
        [sys.executable, "-m", "kernels.ncu_check", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_gpu_or_ncu_it_says_what_is_missing_in_one_line_and_fails():
    if os.access("/usr/local/cuda/bin/ncu", os.X_OK):
        pytest.skip("ncu is installed here; only the GPU would be missing")
    done = run()
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing a CUDA GPU" in lines[0] and "ncu" in lines[0], done.stderr


def test_model_only_prints_every_case_at_both_levels(tmp_path):
    out, js = tmp_path / "m.csv", tmp_path / "m.json"
    done = run("--model-only", "--out", str(out), "--json", str(js))
    assert done.returncode == 0, done.stderr
    for case in ncu_check.CASES:
        assert case.name in done.stdout
    assert done.stdout.count("SM req read model") == done.stdout.count("HBM    read model") == len(ncu_check.CASES)
    assert "L2 " not in done.stdout  # no L2 figure without its counter: the models count requests
    assert out.read_text().startswith("case,config,model_l2_read_mb") and '"rows"' in js.read_text()
