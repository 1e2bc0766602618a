"""What a visitor or an API client sends, checked in one place before any work.

The browser can only send what its controls allow, but the API takes any JSON: strings in numeric
fields, 1.5 for a token count, "false" for a checkbox, NaN, a list for a choice, a 20 MB prompt. Each
function here takes one raw value and returns it typed, or raises UserError naming the field, the
value and what is allowed. Nothing is converted silently: 1.5 tokens is an error, not 1.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real

from .errors import UserError

MAX_PROMPT_CHARS = 20_000  # far past any prompt the models here can take (1024 positions)
MAX_TEXT_CHARS = 200  # shapes, length lists: a few numbers
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes


SHOWN_CHARS = 80  # a refusal echoes at most this much of the value it refuses


def _shown(value) -> str:
    if is_file_reference(value):
        return "a file reference (this app takes no files)"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def is_file_reference(value) -> bool:
    """What Gradio's clients send for a file: {"path": ..., "meta": {"_type": "gradio.FileData"}}."""
    return isinstance(value, dict) and ("path" in value or "url" in value) and "meta" in value


def whole(name: str, value, lo: int, hi: int) -> int:
    """A whole number in [lo, hi]; 3.0 is accepted as 3, 3.5 and "3" are not."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise UserError(f"{name} must be a whole number from {lo} to {hi}, got {_shown(value)}.")
    if isinstance(value, Integral):
        number = int(value)
    elif math.isfinite(value) and float(value).is_integer():
        number = int(value)
    else:
        raise UserError(f"{name} must be a whole number from {lo} to {hi}, got {_shown(value)}.")
    if not lo <= number <= hi:
        raise UserError(f"{name} must be from {lo} to {hi}, got {number}.")
    return number


def number(name: str, value, lo: float, hi: float) -> float:
    """A finite number in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise UserError(f"{name} must be a number from {lo:g} to {hi:g}, got {_shown(value)}.")
    if not lo <= value <= hi:
        raise UserError(f"{name} must be from {lo:g} to {hi:g}, got {value:g}.")
    return float(value)


def flag(name: str, value) -> bool:
    """true or false, as JSON booleans: the string "false" is not a boolean."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false, got {_shown(value)}.")
    return value


def choice(name: str, value, allowed) -> str:
    """One of `allowed` (strings), exactly."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        shown = ", ".join(map(repr, allowed[:12])) + (", ..." if len(allowed) > 12 else "")
        raise UserError(f"{name} must be one of {shown}; got {_shown(value)}.")
    return value


_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: no signs, no underscores, no other scripts' digits
_SIZE = re.compile(r"\s*([A-Za-z]+)\s*=\s*([0-9]+)\s*")


def lengths(name: str, value: str, lo: int, hi: int, most: int) -> list[int]:
    """Whole numbers separated by commas or spaces ("16, 64, 256"), each in [lo, hi], at most `most`."""
    items = re.split(r"\s*,\s*|\s+", value.strip()) if value.strip() else []
    if not items:
        raise UserError(f"{name} is empty: give one to {most} whole numbers from {lo} to {hi}, e.g. 16, 64, 256.")
    for item in items:
        if not _NUMBER.fullmatch(item):
            what = "an empty item" if not item else _shown(item)
            raise UserError(
                f"{name} must be whole numbers written with the digits 0-9 and separated by commas, e.g. 16, 64, "
                f"256; {what} is not one."
            )
    if len(items) > most:
        raise UserError(f"{name}: give at most {most} numbers (got {len(items)}).")
    numbers = [int(i) for i in items]
    for n in numbers:
        if not lo <= n <= hi:
            raise UserError(f"{name} must each be from {lo} to {hi}, got {n}.")
    return numbers


def shape(name: str, value: str, keys) -> dict[str, int]:
    """KEY=NUMBER pairs separated by commas, every key of `keys` exactly once ("B=1,H=12,T=1024,D=64")."""
    keys = list(keys)
    example = ",".join(f"{k}=..." for k in keys)
    parts = value.split(",") if value.strip() else []
    sizes: dict[str, int] = {}
    for part in parts:
        m = _SIZE.fullmatch(part)
        if m is None:
            raise UserError(
                f"{name} must be KEY=NUMBER pairs separated by commas ({example}), numbers written with the digits "
                f"0-9; {_shown(part.strip()) if part.strip() else 'an empty item'} is not one."
            )
        key, number = m.group(1), int(m.group(2))
        if key not in keys:
            raise UserError(f"{name}: {key} is not a size of this kernel; it takes {', '.join(keys)}.")
        if key in sizes:
            raise UserError(f"{name} gives {key} twice.")
        if number < 1:
            raise UserError(f"{name}: every size must be at least 1 ({key}=0).")
        sizes[key] = number
    missing = [k for k in keys if k not in sizes]
    if missing:
        raise UserError(f"{name} must give every size of this kernel ({example}); missing {', '.join(missing)}.")
    return sizes


def text(name: str, value, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A string of at most max_chars characters that can be encoded as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise UserError(f"{name} must be text, got {_shown(value)}.")
    if len(value) > max_chars:
        raise UserError(f"{name} is {len(value)} characters long; at most {max_chars} are allowed.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{name} holds a character that is not valid Unicode text (a lone surrogate).") from None
    return value
