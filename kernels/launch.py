"""Launching our kernels with less host time per call: the compiled kernel bound once per signature.

`kernel[grid](*args, **constexprs)` on a JITFunction binds every argument again on each call: it
specialises each one (dtype, 16-byte alignment, integer values), hashes that into a cache key, looks the
compiled kernel up, then launches it. In an eager decode step that work costs the host more than the
kernel costs the GPU. `fast(kernel)[grid](...)` keys the compiled kernel by what the binding depends on
(each tensor's dtype and alignment, every other argument's exact value, the launch options) and on a hit
calls the compiled kernel's launcher directly, as CompiledKernel's own runner does (or, for a kernel that
needs no scratch memory, the launcher's C entry point, as the launcher itself does).

Only on a GPU: the interpreter has no compiled kernels, so there (and with a Triton whose runner takes
other arguments, checked once by reading it, which logs a warning) every call goes through the JITFunction as
before.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re

import torch
import triton
from torch import Tensor
from triton import knobs
from triton.runtime.driver import driver
from triton.tools.tensor_descriptor import TensorDescriptor

RUNNER_CALL = "self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, launch_metadata,"
MAX_BOUND = 4096  # signatures kept per kernel; a long-running app with ever new shapes starts over past this


def _makes_call(fn, call: str) -> bool:
    """Whether fn's source makes this call (layout aside: line breaks, indents, a trailing comma); False where
    there is no source to read."""
    try:
        return _plain(call) in _plain(inspect.getsource(fn))
    except Exception:
        return False


def _plain(code: str) -> str:
    """code on one line, single-spaced, with no space after "(" and no comma or space before ")"."""
    return re.sub(r",?\s*\)", ")", re.sub(r"\(\s+", "(", " ".join(code.split())))


def _runner_matches() -> bool:
    """Whether this Triton's CompiledKernel launches as this module calls it."""
    try:
        from triton.compiler.compiler import CompiledKernel
    except ImportError:  # no such class: take the JITFunction's path
        return False
    return _makes_call(CompiledKernel.__getitem__, RUNNER_CALL)


def _enabled(interpreted: bool, runner_matches) -> bool:
    """Whether launches are bound: not in the interpreter, and only where this Triton's runner makes the call this
    module makes in its place. Where it does not, one warning says so (at import: once per process), since every
    launch then costs the host Triton's full binding, which in an eager decode step is more than the kernel."""
    if interpreted:
        return False
    if runner_matches():
        return True
    logging.getLogger(__name__).warning(
        "kernels.launch: Triton %s's CompiledKernel runner is not the one this module was written against; "
        "every launch takes Triton's own (slower) path",
        triton.__version__,
    )
    return False


ENABLED = _enabled(os.environ.get("TRITON_INTERPRET") == "1", _runner_matches)


def _bind(args, free=frozenset()) -> tuple[tuple, list]:
    """What the compiled kernel depends on, argument by argument, and the arguments as its launcher takes them.

    The launcher is handed each tensor's address instead of the tensor: it would otherwise ask the tensor for
    it again and the driver whether it is a device pointer, per tensor and per launch. Whether the tensor is
    on a GPU is part of the key instead, so a CPU tensor misses and takes the JITFunction's checked path.

    A tensor descriptor (the TMA forms' operands, built anew on every call) is keyed by what the kernel is
    compiled for, its tensor's dtype and its block shape and padding, and handed on as it is: the launcher
    encodes it for the TMA unit on every launch, as it does on the JITFunction's path. An integer in a position
    of `free` (the kernel's do_not_specialize parameters, lengths that change every step) is keyed by its type
    alone, i32 or wider, as Triton keys it there, so a new length reuses the bound launch."""
    return _binder_for(args, free)(*args)


def _kind(a, i: int, free) -> str:
    if isinstance(a, Tensor):
        return "t"
    if isinstance(a, tuple):
        return "u"
    if isinstance(a, TensorDescriptor):
        return "d"
    if i in free and isinstance(a, int):
        return "n"
    return "o"


def _binder_for(args, free=frozenset()):
    return _binder(tuple(_kind(a, i, free) for i, a in enumerate(args)))


def _free(fn) -> frozenset:
    """The positions of fn's do_not_specialize parameters (none for the interpreter's functions, which keep no
    such list and are never bound)."""
    return frozenset(i for i, p in enumerate(getattr(fn, "params", ())) if p.do_not_specialize)


def _int_type(a) -> str:
    """The type Triton gives an integer argument it does not specialise on (a bool, a 32-bit value, or wider);
    TypeError for anything else, so that a call with another pattern of arguments takes another binder."""
    if type(a) is bool:
        return "i1"
    if type(a) is not int:
        raise TypeError("not an integer")
    return "i32" if -(2**31) <= a < 2**31 else "u64" if 2**63 <= a < 2**64 else "i64"


def _bind_tuple(group: tuple) -> tuple[tuple, tuple]:
    """_bind for one tuple argument (a tensor with its strides, say), nested tuples included: its key, and the
    tuple as the launcher takes it, each tensor's address in its place (the launcher reads tuples as given)."""
    key, at = [], []
    for a in group:
        if isinstance(a, Tensor):
            p = a.data_ptr()
            key.append((a.dtype, a.is_cuda, p & 15 == 0))
            at.append(p)
        elif isinstance(a, tuple):
            k, q = _bind_tuple(a)
            key.append(k)
            at.append(q)
        else:
            key.append(a)
            at.append(a)
    return tuple(key), tuple(at)


_binders: dict = {}


def _binder(kinds: tuple):
    """_bind for arguments of these kinds, "t" a tensor, "u" a tuple, "d" a tensor descriptor, "n" an integer
    the kernel does not specialise on and "o" anything else, as straight-line code written once per such
    pattern: on every launch, no loop and no test of what each argument is. It raises AttributeError for a None
    where it takes a tensor or a descriptor, TypeError for another number of arguments or a non-integer where
    it takes an integer."""
    bind = _binders.get(kinds)
    if bind is None:
        lines = [f"    p{i} = a{i}.data_ptr()\n" for i, k in enumerate(kinds) if k == "t"]
        lines += [f"    k{i}, p{i} = _bind_tuple(a{i})\n" for i, k in enumerate(kinds) if k == "u"]
        key = [
            {
                "t": f"(a{i}.dtype, a{i}.is_cuda, p{i} & 15 == 0)",
                "u": f"k{i}",
                "d": f"(a{i}.base.dtype, a{i}.base.is_cuda, tuple(a{i}.block_shape), a{i}.padding)",
                "n": f"_int_type(a{i})",
                "o": f"a{i}",
            }[k]
            for i, k in enumerate(kinds)
        ]
        at = [f"p{i}" if k in "tu" else f"a{i}" for i, k in enumerate(kinds)]
        params = ", ".join(f"a{i}" for i in range(len(kinds)))
        source = f"def bind({params}):\n{''.join(lines)}    return ({', '.join(key)},), [{', '.join(at)}]\n"
        namespace: dict = {"_bind_tuple": _bind_tuple, "_int_type": _int_type}
        exec(source, namespace)  # noqa: S102 (the source is built above from indices alone)
        bind = _binders[kinds] = namespace["bind"]
    return bind


def _unbound(*args):
    raise TypeError("no binder yet")


def _hooks() -> tuple:
    """The launch hooks set in Triton's knobs, to hand on (see _handed_on)."""
    return _handed_on(knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)


def _handed_on(enter, leave) -> tuple:
    """The launch hooks to hand on, or (None, None) where no hook is set. Triton 3.6 keeps empty hook chains,
    which its launcher calls all the same, twice, with a metadata dict built for them on every launch."""
    if _unset(enter) and _unset(leave):
        return None, None
    return enter, leave


def _unset(hook) -> bool:
    return hook is None or getattr(hook, "calls", None) == []


_stream = None  # the driver's get_current_stream, looked up once (the driver is a lazy proxy)

# The launcher's own call of its C entry point, as Triton 3.6 writes it (whitespace aside). Where a kernel's
# launcher makes exactly this call and needs no scratch memory, the bound launch calls the C entry point
# itself, skipping the launcher's Python frame (its scratch allocators return nothing for such kernels).
LAUNCHER_CALL = (
    "self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, "
    "global_scratch, profile_scratch, *args)"
)


@functools.cache
def _launcher_matches(launcher_type) -> bool:
    return _makes_call(launcher_type.__call__, LAUNCHER_CALL)


def _entry(kernel) -> tuple:
    """(what to call, the arguments it takes between the kernel's function and its metadata)."""
    run = kernel.run
    plain = getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
    if plain and _launcher_matches(type(run)):
        return run.launch, (run.launch_cooperative_grid, run.launch_pdl, None, None)
    return run, ()


class _Fast:
    def __init__(self, fn):
        self.fn, self.bound, self.bind = fn, {}, _unbound
        self.stamped = STAMPS in getattr(fn, "arg_names", ())
        # the positions of the parameters the kernel is not specialised on (lengths): keyed by type, not value
        self.free = _free(fn)
        # Why a bound launch was refused, if one was: the arguments as bound (tuples of addresses, say) are not
        # what this Triton's launcher takes. The kernel then launches through the JITFunction from there on.
        self.refused: str | None = None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        global _stream
        if self.stamped:
            kwargs[STAMPS] = _stamps(self.fn, grid)
        if _recorded is not None:
            return _recorded.append((self.fn, args, kwargs, grid))
        lead = args[0] if isinstance(args[0], Tensor) else _first_tensor(args)
        stamped = _stamping is not None and self.stamped  # each launch a new slice: nothing to keep bound
        if not ENABLED or lead is None or not lead.is_cuda or self.refused or stamped:
            return self.fn[grid](*args, **kwargs)
        device = lead.get_device()
        try:  # the binder of the last call: its tensors are most likely where this call has them
            spec, at = self.bind(*args)
            hit = self.bound.get((device, spec, *kwargs.items()))
        except (AttributeError, TypeError):
            hit = None
        if hit is None:  # another pattern of tensors, or a signature not bound yet
            self.bind = _binder_for(args, self.free)
            spec, at = self.bind(*args)
            key = (device, spec, *kwargs.items())
            hit = self.bound.get(key)
            if hit is None:
                return self._first(grid, args, kwargs, key)
        kernel, tail, entry, between = hit
        if _stream is None:
            _stream = driver.active.get_current_stream
        stream = _stream(device)
        grid = (*grid, 1, 1)
        enter, leave = _hooks()
        if enter is None and leave is None:
            full, meta = (*at, *tail), None
        else:  # a hook (a profiler) may read the arguments: hand it the tensors themselves
            full = args + tail
            meta = kernel.launch_metadata(grid, stream, *full)
        try:
            entry(
                grid[0],
                grid[1],
                grid[2],
                stream,
                kernel.function,
                *between,
                kernel.packed_metadata,
                meta,
                enter,
                leave,
                *full,
            )
        except (TypeError, ValueError, SystemError) as e:  # the launcher read its arguments and refused them
            self.refused, self.bound = f"{type(e).__name__}: {e}", {}
            return self.fn[grid](*args, **kwargs)
        return kernel

    def _first(self, grid, args, kwargs, key):
        """Launch through the JITFunction (it binds, compiles if new and launches) and keep the compiled kernel."""
        kernel = self.fn[grid](*args, **kwargs)
        # The runner takes every parameter in order, constexprs included (it skips them); a call that leaves
        # some to their defaults is not kept. The values of the rest are part of the key.
        tail = self.fn.arg_names[len(args) :]
        if all(name in kwargs for name in tail):
            if len(self.bound) >= MAX_BOUND:
                self.bound.clear()
            self.bound[key] = (kernel, tuple(kwargs[name] for name in tail), *_entry(kernel))
        return kernel


def _first_tensor(args) -> Tensor | None:
    """The first tensor among args, tuples and descriptors' tensors searched in order: the one whose device the
    launch goes to."""
    for a in args:
        if isinstance(a, Tensor):
            return a
        if isinstance(a, TensorDescriptor):
            return a.base
        if isinstance(a, tuple) and (found := _first_tensor(a)) is not None:
            return found
    return None


_wrappers: dict = {}
_recorded: list | None = None
STAMPS = "Stamps"  # the parameter a kernel that can be stamped (kernels.stamps) takes


class Stamping:
    """The launches made while stamping: each one's kernel, grid, first program's place in `buffer` and
    operation."""

    def __init__(self, buffer: Tensor):
        self.buffer, self.used, self.launches = buffer, 0, []
        self.operations = [""]  # the operation launching now, where a caller keeps it up to date
        # (the launch they belong to, their first slot, what the kernel says they are): a kernel whose tasks stamp
        # themselves as well (the megakernel rung's, kernels.ops.decode_step's trace), each task one slot
        self.tasks: list[tuple[int, int, object]] = []

    def task_slots(self, count: int, what) -> Tensor:
        """`count` slots for the tasks of the launch made next, `what` kept beside them (its task list)."""
        from .stamps import SLOT

        if (self.used + count) * SLOT > self.buffer.numel():
            raise ValueError(f"stamping: {count} tasks do not fit the buffer after {self.used} others")
        self.tasks.append((len(self.launches), self.used, what))
        at = self.buffer[self.used * SLOT : (self.used + count) * SLOT]
        self.used += count
        return at

    def slot(self, fn, grid) -> Tensor:
        from .stamps import SLOT

        dims = (*grid, 1, 1)[:3]
        programs = dims[0] * dims[1] * dims[2]
        if (self.used + programs) * SLOT > self.buffer.numel():
            raise ValueError(
                f"stamping: {fn.__name__}'s {programs} programs do not fit the buffer after {self.used} others "
                f"({self.buffer.numel() // SLOT} programs' room)"
            )
        self.launches.append((fn.__name__, dims, self.used, self.operations[0]))
        at = self.buffer[self.used * SLOT :]
        self.used += programs
        return at


_stamping: Stamping | None = None


def stamping_on() -> bool:
    """Whether launches are being stamped (inside stamping())."""
    return _stamping is not None


def task_stamps(count: int, what) -> Tensor | None:
    """While stamping, the buffer's slots for `count` tasks of the launch made next (three int64s each: kernels.stamps'
    SLOT), with `what` kept beside them; else None."""
    return None if _stamping is None else _stamping.task_slots(count, what)


def _stamps(fn, grid) -> Tensor | None:
    """What a launch of a kernel that can be stamped hands it: its slice of the buffer while stamping, else None."""
    return None if _stamping is None else _stamping.slot(fn, grid)


@contextlib.contextmanager
def stamping(buffer: Tensor):
    """Launches made inside hand their kernels (those with a Stamps parameter) consecutive slices of `buffer`, an
    int64 GPU tensor, for kernels.stamps to write each program's start, end and SM into; yields the Stamping,
    whose `launches` say which slice is whose. Outside it every such kernel is handed None."""
    global _stamping
    if not buffer.is_cuda or buffer.dtype != torch.int64:
        raise ValueError("stamping needs an int64 tensor on a GPU: the interpreter has no global timer and no SMs")
    outer, _stamping = _stamping, Stamping(buffer)
    try:
        yield _stamping
    finally:
        _stamping = outer


@contextlib.contextmanager
def recording():
    """Launches made inside are recorded instead of run: yields the list they are appended to, each as
    (kernel, positional arguments, keyword arguments: constexprs and launch options, grid). How
    kernels.compile_check reads what every launcher passes its kernel, on CPU tensors."""
    global _recorded
    outer, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = outer


class _Plain:
    """A launch through the JITFunction each time (for a kernel launched once a step, where a kept binding buys
    little), recorded like the others inside recording()."""

    def __init__(self, fn):
        self.fn = fn
        self.stamped = STAMPS in getattr(fn, "arg_names", ())

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            if self.stamped:
                kwargs[STAMPS] = _stamps(self.fn, grid)
            if _recorded is not None:
                return _recorded.append((self.fn, args, kwargs, grid))
            return self.fn[grid](*args, **kwargs)

        return run


def plain(fn) -> _Plain:
    """fn launched as fn[grid](...) is, every time; recorded inside recording()."""
    return _Plain(fn)


def forget_bound() -> None:
    """Every kernel's bound launches dropped: the next launch of each goes through its JITFunction again (which
    compiles a specialization kernels.compiled.forget dropped)."""
    for wrapper in list(_wrappers.values()):
        wrapper.bound = {}


def fast(fn) -> _Fast:
    """fn (a triton.jit function) launched as fn[grid](...) is, with the binding kept per signature."""
    wrapper = _wrappers.get(fn)
    if wrapper is None:
        wrapper = _wrappers[fn] = _Fast(fn)
    return wrapper
