"""The GPUs a Space may offer (kernels.config.GPUS): the forms each takes, and one GPU standing for another.

No GPU is needed: the forms are functions of compute capability, and the stand-in is a pure function of the real
GPU's limits and the stood-for GPU's row of GPUS (what _cuda_limits reads is faked here)."""

import types

import pytest
import torch

from kernels import config
from kernels.config import GPUS, H200, DeviceLimits, standing_in
from kernels.ops.decode_layer.kernel import programs
from kernels.ops.linear.kernel import persistent_form, resolve_config, tile_rule

# Per architecture: the persistent TMA linear, programmatic dependent launch, the shared memory Triton reserves
# for a tl.dot's barriers, the default pipeline stages. Written out, not derived, so a change to a choice
# function shows here as the architectures whose answer it changes.
FORMS = {
    75: (False, False, 0, 2),
    80: (False, False, 0, 3),
    86: (False, False, 0, 3),
    89: (False, False, 0, 3),
    90: (True, True, 0, 3),
    100: (True, True, 16, 3),  # tcgen05: a pair of 8-byte barriers per dot
    120: (False, True, 0, 3),  # a TMA unit but no wgmma or tcgen05, and 99 KB: the tile linear
}


@pytest.mark.parametrize("arch", list(GPUS))
def test_each_gpu_takes_the_forms_its_capability_allows(arch):
    gpu = GPUS[arch]
    tma, pdl, barriers, stages = FORMS[arch]
    assert (config.tma_matmul(gpu.capability), config.dependent_launch(gpu.capability)) == (tma, pdl)
    assert config.overlaps_launches(gpu) == pdl
    assert (config.mma_barrier_bytes(gpu), config.mma_barrier_bytes(gpu, dots=2)) == (barriers, 2 * barriers)
    assert config.pipeline_stages(gpu) == stages
    for dtype in (torch.float16, torch.bfloat16):
        assert persistent_form(4096, dtype, gpu) == tma
    assert not persistent_form(4096, torch.float32, gpu) and not persistent_form(16, torch.float16, gpu)
    # The fallback, GPT-2's c_fc at a long prompt: the tile rule's tiles whole, within this GPU's shared memory.
    if not tma:
        assert resolve_config(None, 4096, 3072, 768, torch.float16, gpu) == tile_rule(4096, torch.float16, gpu)


def test_the_table_names_every_gpu_once_by_its_architecture():
    assert list(GPUS) == [75, 80, 86, 89, 90, 100, 120]
    for arch, gpu in GPUS.items():
        assert gpu.capability == divmod(arch, 10) and gpu.bf16 == (arch >= 80)
    assert (H200.shared_memory, H200.num_sms, H200.capability) == (232448, 132, (9, 0))
    assert config.arch("sm_120") == config.arch("120") == config.arch(" SM_120 ") == 120
    with pytest.raises(ValueError, match=r"^unknown --arch 91: choose from 75 80 86 89 90 100 120$"):
        config.arch("91", "--arch")


def _h200(l2: int = 60 << 20) -> DeviceLimits:
    return DeviceLimits("NVIDIA H200", 232448, 132, (9, 0), True, l2)


def test_unset_the_gpu_is_itself():
    real = _h200()
    assert standing_in(real, None) is real and standing_in(real, "") is real


@pytest.mark.parametrize("arch", list(GPUS))
def test_the_h200_stands_for_every_space_gpu_with_its_own_sms_and_l2(arch):
    """What the code decides from is the stood-for GPU's; the SMs (co-resident grids) and L2 stay the H200's."""
    real, other = _h200(), GPUS[arch]
    got = standing_in(real, f"sm_{arch}")
    assert got.name == f"NVIDIA H200 standing for sm_{arch} ({other.name})" and got.stands_for == arch
    assert (got.shared_memory, got.capability, got.bf16) == (other.shared_memory, other.capability, other.bf16)
    assert (got.num_sms, got.l2_bytes) == (132, 60 << 20)
    assert (
        config.overlaps_launches(got) == FORMS[arch][1] and persistent_form(4096, torch.float16, got) == FORMS[arch][0]
    )
    assert (torch.bfloat16 in config.supported_dtypes(got)) == other.bf16


def test_a_persistent_grid_never_outgrows_the_real_gpu():
    """The RTX Pro 6000 has 188 SMs: a grid of 188 programs that wait on each other would never finish on the
    H200's 132."""
    got = standing_in(_h200(), "sm_120")
    assert programs(got, 10_000) == 132
    assert programs(GPUS[120], 10_000) == 188  # on the card itself


def test_tile_rules_refuse_what_the_stood_for_gpu_cannot_hold():
    """128x256 tiles in 3 stages fit the H200's 227 KB, not the 99 KB of the GPU it stands for."""
    from kernels import TileConfig

    big = TileConfig(block_m=128, block_n=256, block_k=64, num_stages=3)
    resolve_config(big, 4096, 3072, 768, torch.float16, _h200())
    with pytest.raises(ValueError, match=r"more than the 101376 bytes one block may use on NVIDIA H200 standing for"):
        resolve_config(big, 4096, 3072, 768, torch.float16, standing_in(_h200(), "sm_120"))


@pytest.mark.parametrize(
    "real,arch,needs",
    [
        (GPUS[86], "sm_80", "166912 bytes of shared memory per block"),  # an A10G for an A100
        (GPUS[75], "86", "101376 bytes of shared memory per block, bf16"),  # a T4 for an A10G
        (GPUS[89], "sm_120", "programmatic dependent launch"),  # an L4 for the RTX Pro 6000: same 99 KB, no PDL
        (GPUS[80], "sm_90", "232448 bytes of shared memory per block, the persistent TMA linear, programmatic"),
    ],
)
def test_a_gpu_cannot_stand_for_one_that_needs_more_than_it_has(real, arch, needs):
    with pytest.raises(ValueError, match=rf"^the {real.name} cannot stand for sm_\d+ \(.+\): that needs {needs}"):
        standing_in(real, arch)


def test_an_unknown_gpu_to_stand_for_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown EXPLORER_GPU_STANDS_FOR sm_91: choose from 75 80 86 89 90 100 120"):
        standing_in(_h200(), "sm_91")


@pytest.mark.parametrize("stands_for", [None, "sm_120", "sm_80"])
def test_cuda_limits_read_the_gpus_properties_and_the_variable(monkeypatch, stands_for):
    """What device_limits answers on a GPU, from faked device properties: the real GPU's, or standing in."""
    props = types.SimpleNamespace(
        name="NVIDIA H200",
        major=9,
        minor=0,
        multi_processor_count=132,
        shared_memory_per_block_optin=232448,
        L2_cache_size=60 << 20,
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    if stands_for:
        monkeypatch.setenv(config.GPU_STANDS_FOR, stands_for)
    else:
        monkeypatch.delenv(config.GPU_STANDS_FOR, raising=False)
    got = config._cuda_limits.__wrapped__(0)  # uncached: the cache holds the real device's answer
    assert got == (standing_in(_h200(), stands_for) if stands_for else _h200())
