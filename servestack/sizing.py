"""Exact sizing arithmetic: concurrency = QPS x latency, rounded up only at the end.

Binary floats turn 100 req/s x 0.2 s into 20.000000000000004, which `math.ceil` makes 21. Every figure here
becomes a `Fraction` of the decimal it was written as (`0.2` is 1/5), so products are exact and only the final
count is rounded up.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

Number = int | float | str | Decimal | Fraction


def exact(value: Number) -> Fraction:
    """The decimal (or `a/b`) a number was written as, exactly: a float counts as its shortest repr (0.2 -> 1/5)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool is not a quantity")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite quantity")
        return Fraction(Decimal(repr(value)))
    if isinstance(value, str):
        text = value.strip()
        return Fraction(text) if "/" in text else Fraction(Decimal(text))
    return Fraction(value)


def concurrency(qps: Number, latency_sec: Number, headroom: Number = 1) -> int:
    """Requests in flight at `qps` when each takes `latency_sec` (Little's law), times `headroom`, rounded up."""
    return math.ceil(exact(qps) * exact(latency_sec) * exact(headroom))


def decimal_text(value: Fraction, places: int = 2, *, grouping: bool = True) -> str:
    """`value` rounded half-up to `places` decimals (with thousands separators for people to read)."""
    quantum = Decimal(1).scaleb(-places)
    rounded = (Decimal(value.numerator) / Decimal(value.denominator)).quantize(quantum, rounding="ROUND_HALF_UP")
    return f"{rounded:,}" if grouping else str(rounded)
