"""Plain-text tables and JSON-ready numbers for the simulation results."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["fmt", "format_table", "json_number", "lower_median", "pearson_r"]


def json_number(x: float) -> float | str | None:
    """``inf`` as the string ``"inf"``, NaN as ``None``, anything else as a float."""
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def fmt(x: float | int | None, digits: int = 4) -> str:
    """A number for a table cell: ``inf``, integers without a point, floats fixed."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if isinstance(x, int) or (float(x).is_integer() and digits == 0):
        return str(int(x))
    return f"{x:.{digits}f}"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]], title: str = "") -> str:
    """Columns right-aligned to their widest cell, a rule under the header."""
    body = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [title] if title else []
    out += [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(out)


def lower_median(values: Sequence[float]) -> float:
    """The lower median (an actual value, so integer thresholds stay integers; inf allowed)."""
    if not values:
        return math.nan
    s = sorted(values)
    return float(s[(len(s) - 1) // 2])


def pearson_r(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson correlation; NaN when either variable is constant."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size < 2 or a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])
