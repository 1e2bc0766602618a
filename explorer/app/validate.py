"""What a visitor or an API client sends, checked in one place before any work.

The browser can only send what its controls allow, but the API takes any JSON: strings in numeric
fields, 1.5 for a token count, "false" for a checkbox, NaN, a list for a choice, a 20 MB prompt. Each
function here takes one raw value and returns it typed, or raises UserError naming the field, the
value and what is allowed. Nothing is converted silently: 1.5 tokens is an error, not 1.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from .errors import UserError

MAX_PROMPT_CHARS = 20_000  # far past any prompt the models here can take (1024 positions)
MAX_TEXT_CHARS = 200  # shapes, length lists: a few numbers
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
