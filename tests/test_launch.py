"""kernels.launch: a compiled kernel is reused only for calls whose arguments it was compiled for."""

import logging

import pytest
import torch
import triton

import kernels.ops.decode_linear.kernel as fused
from kernels import decode_linear, launch, reference
from tests.tolerances import assert_close


def test_the_signature_separates_alignment_dtype_device_and_values():
    t = torch.zeros(64, dtype=torch.float16)
    base, at = launch._bind((t, 768, 1e-5))
    assert at == [t.data_ptr(), 768, 1e-5]  # the launcher gets each tensor's address
    assert launch._bind((t.clone(), 768, 1e-5))[0] == base  # another tensor like it: the same kernel
    assert launch._bind((t[1:], 768, 1e-5))[0] != base  # 2 bytes in: not 16-byte aligned
    assert launch._bind((t.float(), 768, 1e-5))[0] != base
    assert launch._bind((t, 767, 1e-5))[0] != base and launch._bind((t, 768, 1e-6))[0] != base
    assert base[0] == (torch.float16, False, True)  # a CPU tensor never shares a key with a GPU one


def test_tuples_are_bound_element_by_element_nested_ones_too():
    """A tensor grouped with its strides is keyed and handed on as a tensor alone is: (x, stride) pairs and a
    cache with its strides nested, the launcher taking the tuples as given, addresses in place of tensors."""
    t, c = torch.zeros(64, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    base, at = launch._bind(((t, 768, 1), None, (c, 3, (4, 1)), 1e-5))
    assert at == [(t.data_ptr(), 768, 1), None, (c.data_ptr(), 3, (4, 1)), 1e-5]
    assert launch._bind(((t.clone(), 768, 1), None, (c.clone(), 3, (4, 1)), 1e-5))[0] == base
    assert launch._bind(((t[1:], 768, 1), None, (c, 3, (4, 1)), 1e-5))[0] != base  # unaligned, inside a tuple
    assert launch._bind(((t, 768, 1), None, (c, 3, (4, 2)), 1e-5))[0] != base  # a nested stride differs
    assert launch._bind(((t, 768, 1), None, (c.float(), 3, (4, 1)), 1e-5))[0] != base
    assert launch._first_tensor((None, (3, (c, t)), t)) is c


def test_hooks_are_handed_on_only_when_one_is_set():
    class Chain:  # as Triton 3.6 keeps its launch hooks: a chain, empty by default
        def __init__(self, calls):
            self.calls = calls

    assert launch._handed_on(None, None) == (None, None)  # older Triton: no hook
    assert launch._handed_on(Chain([]), Chain([])) == (None, None)  # empty chains: nothing to call
    empty, profiler = Chain([]), Chain([print])
    assert launch._handed_on(empty, profiler) == (empty, profiler)  # one hook set: both are handed on
    assert launch._handed_on(None, profiler) == (None, profiler)


class _Launcher:  # as Triton 3.6 writes its launcher's call of the C entry point
    def __init__(self, scratch):
        self.global_scratch_size = self.profile_scratch_size = scratch
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.launch = object()

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        global_scratch = profile_scratch = None
        # The test reads this call as source text, laid out as the formatter lays it out.
        self.launch(
            gridX,
            gridY,
            gridZ,
            stream,
            function,
            self.launch_cooperative_grid,
            self.launch_pdl,
            global_scratch,
            profile_scratch,
            *args,
        )


class _OtherLauncher(_Launcher):  # a launcher that calls its entry point some other way
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.launch(gridX, gridY, gridZ, stream, function, args)


def test_the_c_entry_point_is_called_only_as_the_launcher_itself_would():
    class Kernel:
        def __init__(self, run):
            self.run = run

    plain = _Launcher(0)
    assert launch._entry(Kernel(plain)) == (plain.launch, (False, True, None, None))
    with_scratch, other = _Launcher(256), _OtherLauncher(0)  # scratch to allocate; an unknown call
    assert launch._entry(Kernel(with_scratch)) == (with_scratch, ())
    assert launch._entry(Kernel(other)) == (other, ())


def test_the_installed_tritons_runner_is_the_one_launches_are_bound_to():
    """Read from its source, no GPU needed: Triton 3.6 (the GPU machine's) and 3.9 (this one's) both match."""
    from triton.compiler.compiler import CompiledKernel

    assert launch._runner_matches(), triton.__version__
    assert not launch._makes_call(CompiledKernel.__getitem__, launch.RUNNER_CALL.replace("grid[2], ", ""))


def test_a_runner_that_does_not_match_is_said_once_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="kernels.launch"):
        assert not launch._enabled(False, lambda: False)
        (record,) = caplog.records
        assert f"Triton {triton.__version__}" in record.getMessage()
        assert "Triton's own (slower) path" in record.getMessage()
        caplog.clear()
        assert launch._enabled(False, lambda: True)
        assert not launch._enabled(True, lambda: pytest.fail("the interpreter has no runner to check"))
        assert not caplog.records  # a matching runner and the interpreter: nothing to say


def test_a_tensor_descriptor_is_keyed_by_dtype_block_and_padding_and_handed_on_as_it_is():
    """The TMA forms' operands: built anew on every call, the same kernel serves any descriptor of the same dtype,
    block and padding (its shape and strides are the launcher's to encode), and the launcher gets the descriptor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    a, b = torch.zeros(64, 32, dtype=torch.float16), torch.zeros(17, 32, dtype=torch.float16)
    d = TensorDescriptor.from_tensor(a, [16, 32])
    key, at = launch._bind((d, None, 17))
    assert at[0] is d and at[1:] == [None, 17]
    assert launch._bind((TensorDescriptor.from_tensor(b, [16, 32]), None, 17))[0] == key  # another shape
    assert launch._bind((TensorDescriptor.from_tensor(a, [32, 32]), None, 17))[0] != key  # another block
    assert launch._bind((TensorDescriptor.from_tensor(a.float(), [16, 32]), None, 17))[0] != key
    assert launch._bind((TensorDescriptor.from_tensor(a, [16, 32], padding="nan"), None, 17))[0] != key
    assert launch._first_tensor((None, d, b)) is a  # the launch goes where the descriptor's tensor is


def test_an_integer_the_kernel_is_not_specialised_on_is_keyed_by_its_type_alone():
    """A length in a do_not_specialize position (a new one every step with the cache off) reuses the bound launch;
    elsewhere every value is its own key; a 64-bit value or a bool is another type, as it is to Triton."""
    t = torch.zeros(64, dtype=torch.float16)
    free = frozenset({1})
    key, at = launch._bind((t, 17, 768), free)
    assert at == [t.data_ptr(), 17, 768]
    assert launch._bind((t, 400, 768), free)[0] == key and launch._bind((t, 1, 768), free)[0] == key
    assert launch._bind((t, 17, 769), free)[0] != key  # not free: its value is part of the key
    assert launch._bind((t, 2**40, 768), free)[0] != key and launch._bind((t, True, 768), free)[0] != key
    assert launch._bind((t, 17, 768))[0] != launch._bind((t, 18, 768))[0]  # no free positions: by value
    with pytest.raises(TypeError):  # another pattern of arguments: the caller takes another binder
        launch._binder_for((t, 17, 768), free)(t, 1.5, 768)


def test_the_free_positions_are_the_kernels_do_not_specialize_parameters():
    """Read from the compiled form of a kernel (in the interpreter a kernel keeps no such list, and is never bound)."""

    def kernel(X, M, N, K: triton.language.constexpr):
        pass

    assert launch._free(triton.runtime.jit.JITFunction(kernel, do_not_specialize=("M",))) == {1}
    assert launch._free(triton.runtime.jit.JITFunction(kernel, do_not_specialize=(1, 2))) == {1, 2}
    assert launch._free(triton.runtime.jit.JITFunction(kernel)) == set()


def test_the_interpreter_takes_the_jit_functions_path():
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    assert not launch.ENABLED


@pytest.mark.gpu
def test_bound_kernels_serve_aligned_and_unaligned_rows_alike(device):
    w = torch.randn(96, 64, device=device, dtype=torch.float16) / 8
    rows = torch.randn(2, 65, device=device, dtype=torch.float16)
    bound = launch.fast(fused._decode_prefetch_kernel).bound
    before = len(bound)
    for x in (rows[:, :64], rows[:, 1:], rows[:, :64], rows[:, 1:]):  # aligned, 2 bytes in, then again
        y = decode_linear(x, w)
        assert_close("linear", y, reference.linear(x.float(), w.float()), torch.float16)
    assert len(bound) == before + 2  # one kernel per alignment, each launched directly the second time
    assert launch.fast(fused._decode_prefetch_kernel).refused is None  # its tuples taken as bound


@pytest.mark.gpu
def test_bound_launches_call_a_set_hook_with_the_tensors(device):
    from triton import knobs

    w = torch.randn(96, 64, device=device, dtype=torch.float16) / 8
    x = torch.randn(2, 64, device=device, dtype=torch.float16)
    decode_linear(x, w)  # bound
    seen = []
    hook = lambda meta: seen.append(meta.get()["name"])  # Triton hands hooks a LazyDict
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton has no hook chain")
    chain.add(hook)
    try:
        y = decode_linear(x, w)
    finally:
        chain.remove(hook)
    assert seen and "decode" in seen[0]
    assert_close("linear", y, reference.linear(x.float(), w.float()), torch.float16)


@pytest.mark.gpu
def test_the_persistent_linear_is_bound_and_a_new_row_count_reuses_its_launch(device):
    """The 16-bit prefill's TMA form (Hopper): its descriptors bound by dtype and block and its rows free, so a
    prompt one token longer launches the kernel already bound, and every result is the reference's."""
    from kernels import linear
    from kernels.ops.linear.kernel import _linear_persistent_kernel, persistent_form

    if not persistent_form(64, torch.bfloat16, device):
        pytest.skip("no TMA form on this GPU")
    w = torch.randn(96, 64, device=device, dtype=torch.bfloat16) / 8
    bound = launch.fast(_linear_persistent_kernel)
    for rows in (40, 40, 41, 57):
        x = torch.randn(rows, 64, device=device, dtype=torch.bfloat16)
        y = linear(x, w)
        assert_close("linear", y, reference.linear(x.float(), w.float()), torch.bfloat16)
        if rows == 40:
            kept = len(bound.bound)
    assert len(bound.bound) == kept and kept >= 1  # 41 and 57 rows: the same bound launch
    assert bound.refused is None
