"""The traffic models' HBM level, by the bounds any cache must respect (never more than the loads issued, never
less than each input once). The SM-request level of each operation is checked against a walk over its program
grid in plain Python beside the operation's other tests (tests/ops/test_<operation>.py)."""

from dataclasses import replace

import pytest
import torch

import kernels.ops.attention.kernel as attention_mod
import kernels.ops.decode_attention.kernel as decode_mod
import kernels.ops.elementwise.kernel as elementwise
import kernels.ops.kv_write.kernel as kv_write_mod
import kernels.ops.layer_norm.kernel as layer_norm_mod
import kernels.ops.linear.kernel as linear_mod
from kernels.config import DeviceLimits, Traffic, device_limits
from tests.ops.limits import H200

BF16 = torch.bfloat16


def test_traffic_without_hbm_fields_equals_its_l2_level_and_adds_up():
    t = Traffic(10, 20, 3, 30)  # how explorer/ builds the cache write and the embedding
    assert (t.hbm_read, t.hbm_written, t.hbm_bytes) == (10, 20, 30)
    total = t + Traffic(1, 2, 3, 4, 0, 2)
    assert total == Traffic(11, 22, 6, 34, 10, 22)


def test_device_limits_keep_their_positional_form_and_default_l2():
    limits = DeviceLimits("T4", 65536, 40, (7, 5), False)
    assert limits.l2_bytes == 50 * 1024 * 1024 == device_limits("cpu").l2_bytes


def models(device):
    """Every model at a small and a large shape, with the bytes of its inputs read once."""
    ln = 2 * 768 * 2
    out = []
    for rows in (64, 65536):
        out.append((layer_norm_mod.traffic(rows, 768, 2, residual=True, device=device), 2 * rows * 768 * 2 + ln))
        out.append((layer_norm_mod.traffic_unfused(rows, 768, 2, residual=True, device=device), 2 * rows * 768 * 2))
    for rows, n, k in ((1, 3072, 768), (1024, 3072, 768), (8192, 8192, 8192)):
        floor = (rows * k + n * k + n) * 2
        out.append((linear_mod.traffic(rows, n, k, 2, activation="gelu", dtype=BF16, device=device), floor))
        out.append((linear_mod.traffic_unfused(rows, n, k, 2, activation="gelu", device=device), floor))
    for b, t in ((1, 1024), (1, 65536)):
        qkv = 3 * b * 12 * t * 64 * 2
        out.append((attention_mod.traffic(b, 12, t, t, 64, 2, dtype=BF16, device=device), qkv))
        out.append((attention_mod.traffic_naive(b, 12, t, t, 64, 2, device=device), qkv))
        out.append((attention_mod.traffic_floor(b, 12, t, t, 64, 2), qkv))
    out.append((decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=device), 0))
    one = decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=device, one_launch=True)
    out.append((one, 0))
    out.append((kv_write_mod.traffic(64, 12, 64, 2), 2 * 64 * 12 * 64 * 2))
    for rows in (1, 4096):
        out.append((elementwise.traffic_add(rows * 768, 2), 2 * rows * 768 * 2))
        out.append((elementwise.traffic_gelu(rows * 3072, 2), rows * 3072 * 2))
        out.append((elementwise.traffic_bias_add(rows, 3072, 2, device=device), (rows + 1) * 3072 * 2))
    return out


@pytest.mark.parametrize("l2_mib", [1, 50, 1024])
def test_hbm_lies_between_each_input_once_and_the_loads_issued(l2_mib):
    device = replace(H200, l2_bytes=l2_mib * 1024 * 1024)
    for t, inputs_once in models(device):
        assert inputs_once <= t.hbm_read <= t.bytes_read, t
        assert t.hbm_written <= t.bytes_written, t


def test_hbm_is_the_floor_when_the_working_set_is_small():
    ln = layer_norm_mod.traffic(4096, 768, 2, residual=True, device=H200)
    assert ln.hbm_bytes == ln.min_bytes  # streaming rows: nothing to re-read
    lin = linear_mod.traffic(1024, 3072, 768, 2, activation="gelu", dtype=BF16, device=H200)
    assert lin.hbm_read + lin.hbm_written == lin.min_bytes < lin.bytes
    att = attention_mod.traffic(4, 12, 4096, 4096, 64, 2, dtype=BF16, device=H200)
    assert att.hbm_read + att.hbm_written == att.min_bytes  # ncu: 75.5 MB read, Q + K + V


def test_hbm_reads_never_grow_with_a_larger_l2_and_fall_for_large_working_sets():
    for make in (
        lambda d: linear_mod.traffic(8192, 8192, 8192, 2, dtype=BF16, device=d),
        lambda d: attention_mod.traffic(1, 12, 131072, 131072, 64, 2, dtype=BF16, device=d),
        lambda d: attention_mod.traffic_naive(1, 12, 4096, 4096, 64, 2, device=d),
        lambda d: linear_mod.traffic_unfused(16384, 3072, 768, 2, activation="gelu", device=d),
    ):
        reads = [make(replace(H200, l2_bytes=mib << 20)).hbm_read for mib in (1, 8, 50, 256, 4096)]
        assert reads == sorted(reads, reverse=True) and reads[0] > reads[-1], reads
