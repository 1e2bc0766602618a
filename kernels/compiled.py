"""Which kernel specializations this process has compiled so far.

Triton compiles a kernel once per specialization (argument dtypes, which sizes are multiples of 16, the
constexprs, the launch options) and keeps it in the kernel's cache for the process's life. A job that meets
only specializations compiled already runs at its warm speed; one that meets new ones first waits for their
compilation, about a second each on a GPU. An estimate tells the two apart by these names. Under the
interpreter nothing compiles, and the set is empty."""

import contextlib
import hashlib
import sys
import time


def compiled(modules=None) -> set[str]:
    """Every specialization of a kernel in `modules` (by default the kernels package's, as imported) compiled in
    this process, each as a short stable name (the same kernel, arguments and options give the same name in any
    process on the same GPU type)."""
    return {name for _, _, name in _specializations(modules)}


def forget(keep=frozenset(), modules=None) -> int:
    """Drop every compiled specialization not named in `keep` from this process's kernel caches, and the launches
    kernels.launch keeps bound, so that the next launch of each compiles it again, as in a fresh process (from
    Triton's cache directory, unless that is new and empty). Returns how many were dropped."""
    from . import launch

    dropped = 0
    for cache, key, name in _specializations(modules):
        if name not in keep:
            del cache[key]
            dropped += 1
    launch.forget_bound()
    return dropped


def _specializations(modules):
    """(the kernel cache, its key, the key's name) for every compiled specialization of a kernel in `modules`."""
    if modules is None:
        modules = [m for name, m in list(sys.modules.items()) if name == "kernels" or name.startswith("kernels.")]
    for module in modules:
        if module is None:
            continue
        for obj in list(vars(module).values()):
            caches = getattr(obj, "device_caches", None)
            if not caches:
                continue
            for entry in list(caches.values()):
                cache = entry[0]  # the kernel cache: specialization key -> compiled kernel
                for key in list(cache):
                    yield cache, key, _name(obj, key)


def _name(kernel, key) -> str:
    return hashlib.sha1(f"{kernel.__module__}.{kernel.__name__}:{key}".encode()).hexdigest()[:16]


@contextlib.contextmanager
def compile_times():
    """Within the block, the seconds each specialization's compilation took, by its name as compiled() gives it:
    they differ by kernel (a matmul's tiles against an elementwise kernel's) far more than by run. Each one's
    first launch counts too: it loads the binary and builds a launcher, which Triton compiles from C source
    (about a second) unless its cache holds one of the same signature. Empty under the interpreter (nothing
    compiles) and with a Triton whose JIT has no _do_compile to time. (Triton's knobs.compilation.listener
    reports each compilation's time, but not that first launch's setup, which a cold cache pays too: both are
    timed here, the same way.)"""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    times: dict[str, float] = {}
    original = getattr(JITFunction, "_do_compile", None)
    if original is None:
        yield times
        return
    handles = getattr(CompiledKernel, "_init_handles", None)
    loads: dict[int, tuple] = {}  # id -> (the compiled kernel, seconds its first launch's setup took)
    compiling = []  # nonempty while a compile runs: a launcher built inside it is in its time already

    def timed(self, key, *args, **kwargs):
        start = time.perf_counter()
        compiling.append(key)
        try:
            return original(self, key, *args, **kwargs)
        finally:
            compiling.pop()
            times[_name(self, key)] = time.perf_counter() - start

    def timed_handles(kernel):
        start = time.perf_counter()
        try:
            return handles(kernel)
        finally:
            if not compiling:
                loads[id(kernel)] = (kernel, time.perf_counter() - start)  # Triton calls it once per kernel

    JITFunction._do_compile = timed
    if handles is not None:
        CompiledKernel._init_handles = timed_handles
    try:
        yield times
    finally:
        JITFunction._do_compile = original
        if handles is not None:
            CompiledKernel._init_handles = handles
        for cache, key, name in _specializations(None):
            if id(cache[key]) in loads and name in times:
                times[name] += loads[id(cache[key])][1]
