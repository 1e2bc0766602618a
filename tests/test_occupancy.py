"""Programs resident per SM and waves (kernels.occupancy) against cases worked by hand from the CUDA occupancy rules:
registers to each warp in units of 256 and to warps in fours, shared memory in units of 128 bytes with 1 KB reserved
per block from sm_80 on, and the SM's warp slots and block count. Then the compiled kernels' own resources, read on
this CPU from a compile for a GPU."""

import os
import subprocess
import sys

import pytest

from kernels import occupancy
from kernels.occupancy import SMS, Resources
from kernels.occupancy import occupancy as occupancy_of


def test_register_limited():
    """sm_90, 4 warps of 128 registers: a warp takes 128 x 32 = 4096 registers, 65536 hold 16 warps, 4 programs;
    warp slots would allow 16, shared memory (1 KB reserved each) 228, blocks 32."""
    occ = occupancy_of(Resources(warps=4, registers=128, shared=0), SMS[90])
    assert occ.limits["registers"] == 4 and occ.limits["warps"] == 16 and occ.limits["shared memory"] == 228
    assert (occ.resident, occ.limiter, occ.warps) == (4, "registers", 16)


def test_registers_are_rounded_per_warp_then_in_fours_of_warps():
    """33 registers: 33 x 32 = 1056, rounded to 1280 a warp; 65536 / 1280 = 51.2, 51 warps, 48 in fours: 6 programs
    of 8 warps (warp slots on sm_80 would allow 8)."""
    occ = occupancy_of(Resources(warps=8, registers=33, shared=0), SMS[80])
    assert (occ.limits["registers"], occ.limits["warps"], occ.resident, occ.limiter) == (6, 8, 6, "registers")


def test_shared_memory_limited():
    """sm_80, 48 KB of shared memory a program: 48 KB + 1 KB reserved = 50176 bytes, and 164 KB = 167936 hold 3;
    32 registers allow 16 programs of 4 warps, warp slots 16."""
    occ = occupancy_of(Resources(warps=4, registers=32, shared=48 << 10), SMS[80])
    assert occ.limits["shared memory"] == 3 and (occ.resident, occ.limiter) == (3, "shared memory")


def test_shared_memory_is_allocated_in_units_of_128_bytes():
    """sm_86: 100 KB (102,400 bytes) per SM. 24,449 bytes + 1 KB = 25,473, rounded up to 25,600: 4 fit exactly.
    24,577 + 1 KB = 25,601 rounds up to 25,728: 3 fit."""
    sm = SMS[86]
    assert occupancy_of(Resources(4, 32, 24449), sm).limits["shared memory"] == 4
    assert occupancy_of(Resources(4, 32, 24577), sm).limits["shared memory"] == 3


def test_warp_limited():
    """sm_86, 8 warps of 32 registers and no shared memory: 48 warp slots hold 6 programs; registers 8, blocks 16."""
    occ = occupancy_of(Resources(warps=8, registers=32, shared=0), SMS[86])
    assert (occ.limits["registers"], occ.resident, occ.limiter) == (8, 6, "warps")


def test_block_limited():
    """sm_89, one warp of 16 registers: 48 warp slots, 128 warps of registers, but an SM holds at most 24 blocks."""
    occ = occupancy_of(Resources(warps=1, registers=16, shared=0), SMS[89])
    assert (occ.limits["warps"], occ.resident, occ.limiter) == (48, 24, "blocks")


def test_turing_reserves_no_shared_memory_per_block():
    """sm_75: 64 KB per SM, no reservation: 16 KB programs fit 4 (sm_80's rule would make them 17 KB)."""
    assert occupancy_of(Resources(4, 32, 16 << 10), SMS[75]).limits["shared memory"] == 4


@pytest.mark.parametrize(
    "programs,resident,sms,waves,last",
    [
        (264, 1, 132, 2.0, 1.0),  # two full waves
        (200, 1, 132, 200 / 132, 68 / 132),  # a second wave of 68 on 132 SMs
        (96, 1, 132, 96 / 132, 96 / 132),  # one wave, 36 SMs idle: the persistent decode layer's shape
        (1000, 3, 132, 1000 / 396, (1000 - 2 * 396) / 396),
    ],
)
def test_waves_and_the_last_waves_fill(programs, resident, sms, waves, last):
    res = Resources(warps=8, registers=255 if resident == 1 else 80, shared=0)
    occ = occupancy_of(res, SMS[90], programs, sms)
    assert occ.resident == resident
    assert occ.waves == pytest.approx(waves) and occ.last_wave_fill == pytest.approx(last)


def test_the_limits_table_covers_every_gpu_a_space_offers():
    from kernels.config import GPUS

    assert set(SMS) == set(GPUS)
    for arch, sm in SMS.items():  # one block's shared memory (opted in) fits the SM's, less its reservation
        assert GPUS[arch].shared_memory <= sm.shared - sm.reserved, arch


def test_a_compiled_kernels_registers_warps_and_shared_memory_read_on_cpu():
    """The CLI compiles every launch for the GPU named (no GPU needed) and reads each one's resources from the
    compiled form: registers within 1..255, warps as launched, and the residency they give."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-W", "ignore", "-m", "kernels.occupancy", "--arch", "sm_120", "--dtype", "float16"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line[:58].strip(): line[58:].split() for line in done.stdout.splitlines()[2:] if line.strip()}
    assert len(rows) > 30
    for name, row in rows.items():
        warps, regs, shared, per_sm = (int(v) for v in row[:4])
        assert warps in (1, 2, 4, 8, 16) and 1 <= regs <= 255 and shared >= 0, (name, row)
        assert per_sm == occupancy_of(Resources(warps, regs, shared), SMS[120]).resident, (name, row)


def test_a_bad_arch_is_one_line():
    cmd = [sys.executable, "-m", "kernels.occupancy", "--arch", "91"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["unknown --arch 91: choose from 75 80 86 89 90 100 120"]


def test_registers_refuses_a_cubin_it_cannot_read():
    with pytest.raises(subprocess.CalledProcessError):
        occupancy.registers(b"not a cubin")
