"""Checks of numeric arguments at the public boundary, shared by every pass.

A NaN that reaches a bisection hangs it, a bool passes for an int, a float
cut breaks slicing deep inside a solver: each is refused here with the
name of the argument, the value seen and the rule.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int (numpy ints too), refusing bools, floats and values out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    positive: bool = False,
    allow_inf: bool = False,
) -> float:
    """`value` as a finite float (or +inf when allowed), refusing bools, NaN and values out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value
