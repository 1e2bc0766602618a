"""How a number reads on the page: times in the unit their size calls for, three significant digits."""

import math


def time_unit(ms, log: bool = False) -> tuple[str, float]:
    """The unit in which these times (in ms) read as plain numbers, and how many ms it holds: ("µs", 1e-3),
    ("ms", 1.0) or ("s", 1e3). A GPU's times are microseconds, the interpreter's seconds: in a fixed
    unit one of them reads 0.0002 or 2,000,000 (plotly's ticks: 2M). The largest time decides, so that
    it reads under 1000; on a log axis, which spans decades, the one halfway between the ends does."""
    values = sorted(abs(float(v)) for v in ms if v is not None and math.isfinite(float(v)) and float(v))
    if not values:
        return "ms", 1.0
    at = math.sqrt(values[0] * values[-1]) if log else values[-1]
    at = float(f"{at:.3g}")  # 999.7 ms is written 1.00 s, not 1,000 ms
    if at >= 1e3:
        return "s", 1e3
    if at >= 1:
        return "ms", 1.0
    return "µs", 1e-3


def duration(ms: float) -> str:
    """A time in the unit its size calls for (µs below 1 ms, ms below 1 s, s above), three significant
    digits: 12.3 µs, 878 ms, 1.00 s."""
    if ms is None or not math.isfinite(ms):
        return ""
    unit, per = time_unit([ms])
    return f"{digits3(ms / per)} {unit}"


def digits3(x: float) -> str:
    """Three significant digits, no exponent: 0.0123, 1.00, 878."""
    x = float(f"{x:.3g}")  # 0.9997 is 1.00
    digits = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 0
    return f"{x:.{digits}f}"
