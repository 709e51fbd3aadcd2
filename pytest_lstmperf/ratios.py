"""Printed ratios that cannot be wrong by their formatting: :func:`format_ratio`.

A ratio of two positive times is positive and finite. One that is not (zero, negative, infinite, NaN) is a bug
or a failed measurement, never a result: :func:`format_ratio` raises :class:`ImplausibleRatio` naming it rather
than printing it. A positive ratio is never printed as zero: where its fixed decimals would read ``0.0x``, it is
printed with two significant digits (``0.019x``), so that a figure the reader must question is seen as what it
is. Whether a positive ratio is plausible for what it compares is the caller's to judge (for example
:data:`pytest_lstmperf.observation.eligibility.CELL_LOOP_FLOOR`).
"""

from __future__ import annotations

import math


class ImplausibleRatio(ValueError):
    """A ratio that cannot be one: not a positive, finite number."""


def format_ratio(value: float, decimals: int = 1, suffix: str = "x") -> str:
    """``value`` as ``f"{value:.{decimals}f}{suffix}"``, or with two significant digits where that would print
    zero; :class:`ImplausibleRatio` for a value that is not positive and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ImplausibleRatio(f"ratio {value!r}: not a number")
    if not math.isfinite(value) or value <= 0:
        raise ImplausibleRatio(f"ratio {value!r}: a ratio of two times is positive and finite")
    text = f"{value:.{decimals}f}"
    if float(text) == 0.0:
        text = f"{value:.2g}"
        if "e" in text:  # below 0.0001: plain digits, never 1e-05x
            text = f"{value:.{2 - math.floor(math.log10(value)) - 1}f}"
    return text + suffix
