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
]


def sample(kernels):
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", HEADER]
    for kid, (name, values) in enumerate(kernels):
        for (metric, unit), value in zip(METRICS, values, strict=True):
            lines.append(
                f'"{kid}","4242","python3.12","127.0.0.1","{name}","1","7","(128, 1, 1)","(512, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{metric}","{unit}","{value}"'
            )
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


FLUSH = "_l2_flush_kernel"
TEXT = sample(
    [
        (FLUSH, ("209,715,200", "1,048,576", "6,553,600", "0")),
        ("_linear_split_k_kernel", ("4,718,592", "0", "147,456", "1,152")),
        ("_split_k_reduce_kernel", ("36,864", "0", "1,344", "192")),
        (FLUSH, ("209,715,200", "43,008", "6,553,600", "0")),
        ("_layer_norm_kernel", ("12,582,912", "2,048", "393,216", "393,216")),
        (FLUSH, ("209,715,200", "12,580,864", "6,553,600", "0")),
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
    assert ln["dram_write"] == 2_048 and ln["dram_write_back"] == 12_580_864
    with pytest.raises(ValueError, match="found 2 cases between flushes, expected 3"):
        ncu_check.attribute(ncu_check.parse_ncu_csv(TEXT), 3)


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
    assert done.stdout.count("L2->SM model read") == done.stdout.count("HBM    model read") == len(ncu_check.CASES)
    assert out.read_text().startswith("case,config,model_l2_read_mb") and '"rows"' in js.read_text()
