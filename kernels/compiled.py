"""Which kernel specializations this process has compiled so far.

Triton compiles a kernel once per specialization (argument dtypes, which sizes are multiples of 16, the
constexprs, the launch options) and keeps it in the kernel's cache for the process's life. A job that meets
only specializations compiled already runs at its warm speed; one that meets new ones first waits for their
compilation, about a second each on a GPU. An estimate tells the two apart by these names. Under the
interpreter nothing compiles, and the set is empty."""

import hashlib
import sys


def compiled() -> set[str]:
    """Every specialization of a kernel in the kernels package compiled in this process, each as a short stable
    name (the same kernel, arguments and options give the same name in any process on the same GPU type)."""
    names = set()
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "kernels" or module_name.startswith("kernels.")):
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
