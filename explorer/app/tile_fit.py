"""Tiles a visitor chose that this device cannot run, refused in the page's words: the controls as the page
labels them (the kernel's heading over its tile controls, then the field), why they do not fit, and the largest
value of each one chosen that would fit with the others as chosen."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from kernels.config import TileConfig

from .errors import UserError
from .settings import TILE_CHOICES

# A kernel's refusal starts with its own name and the whole resolved TileConfig (defaults included), which the
# page never shows; what follows says why, then advice that the largest values below make concrete.
_PREFIX = re.compile(r"^\w+: (TileConfig\([^)]*\) )?")
_ADVICE = re.compile(r"; use smaller tiles.*$")
_BYTES = re.compile(r"(\d+) bytes")
_ON_CPU = " in the CPU interpreter, which allows an A10G's or L4's so that tiles that run here run there"


def heading(kernel: str) -> str:
    """What the page writes above a kernel's tile controls (ui._tile_controls)."""
    return kernel.replace("_", " ")


def reason(message: str) -> str:
    """A kernel's refusal without its own names: "needs about 272 KiB of shared memory (...), more than ..."."""
    why = _ADVICE.sub("", _PREFIX.sub("", message.strip())).replace(" on CPU (Triton interpreter)", _ON_CPU)
    return _BYTES.sub(lambda m: f"{int(m[1]) / 1024:.0f} KiB", why)


def refusal(kernel: str, chosen: TileConfig, fits: Callable[[TileConfig], object], error: Exception) -> UserError:
    """UserError for `chosen` tiles of page kernel `kernel` (a key of settings.TILE_CHOICES) that `fits` refused
    with `error`; `fits(config)` raises ValueError for each config the run cannot take."""
    picked = {name: getattr(chosen, name) for name in TILE_CHOICES[kernel] if getattr(chosen, name) is not None}
    shown = _listed([f"{name} {value}" for name, value in picked.items()])
    why = reason(str(error))
    if len(picked) > 1:
        why = re.sub(r"^needs\b", "need", why)
    largest = []
    for name, value in picked.items():
        others = _listed([f"{n} {v}" for n, v in picked.items() if n != name])
        for smaller in sorted((v for v in TILE_CHOICES[kernel][name] if v < value), reverse=True):
            try:
                fits(replace(chosen, **{name: smaller}))
            except ValueError:
                continue
            largest.append(f"the largest {name} that fits{f' with {others}' if others else ''} is {smaller}")
            break
    advice = "; ".join(largest) if largest else "pick smaller values"
    return UserError(
        f"Tiles, {heading(kernel)}: {shown} {why}. {advice[0].upper()}{advice[1:]}, or leave them at default."
    )


def _listed(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)
