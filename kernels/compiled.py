"""Which kernel specializations this process has compiled so far.

Triton compiles a kernel once per specialization (argument dtypes, which sizes are multiples of 16, the
constexprs, the launch options) and keeps it in the kernel's cache for the process's life. A job that meets
only specializations compiled already runs at its warm speed; one that meets new ones first waits for their
compilation, about a second each on a GPU. An estimate tells the two apart by these names. Under the
interpreter nothing compiles, and the set is empty."""

import hashlib
import sys


def compiled(modules=None) -> set[str]:
    """Every specialization of a kernel in `modules` (by default the kernels package's, as imported) compiled in
    this process, each as a short stable name (the same kernel, arguments and options give the same name in any
    process on the same GPU type)."""
    if modules is None:
        modules = [m for name, m in list(sys.modules.items()) if name == "kernels" or name.startswith("kernels.")]
    names = set()
    for module in modules:
        if module is None:
            continue
        for obj in list(vars(module).values()):
            caches = getattr(obj, "device_caches", None)
            if not caches:
                continue
            for entry in list(caches.values()):
                for key in list(entry[0]):  # the kernel cache: specialization key -> compiled kernel
                    text = f"{obj.__module__}.{obj.__name__}:{key}"
                    names.add(hashlib.sha1(text.encode()).hexdigest()[:16])
    return names
