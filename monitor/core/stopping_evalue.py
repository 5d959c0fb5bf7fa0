"""The pairwise mixture e-value of a leader against its runner-up.

Shared by the anytime-valid rules of :mod:`monitor.core.stopping` (which compare it
with ``c / delta``) and by the exact truncated rule of
:mod:`monitor.core.stopping_boundary` (which uses it only to order the (leader,
runner-up) counts and calibrates its threshold exactly at the least favourable null).
"""

from __future__ import annotations

import math
from functools import lru_cache

from scipy import special

__all__ = ["mixture_log_e_value"]

_LN2 = math.log(2.0)


@lru_cache(maxsize=65536)
def mixture_log_e_value(x: int, y: int, point_mass: float) -> float:
    """log E for ``x`` leader and ``y`` runner-up draws (see :mod:`monitor.core.stopping`).

    E = w1 * 2^n * [y = 0] + (1 - w1) * 2^(n+1) * B(x+1, y+1) * (1 - I_1/2(x+1, y+1)),
    n = x + y, w1 = ``point_mass``. Memoised: a service evaluates the same few (x, y)
    pairs for every item.
    """
    n = x + y
    # 1 - I_{1/2}(x+1, y+1) == I_{1/2}(y+1, x+1), accurate when it is small.
    tail = float(special.betainc(y + 1, x + 1, 0.5))
    log_uniform = (
        (n + 1) * _LN2 + float(special.betaln(x + 1, y + 1)) + math.log(tail)
        if tail > 0
        else -math.inf
    )
    if point_mass <= 0:
        return log_uniform
    if point_mass >= 1:
        return n * _LN2 if y == 0 else -math.inf
    terms = [math.log1p(-point_mass) + log_uniform]
    if y == 0:
        terms.append(math.log(point_mass) + n * _LN2)
    top = max(terms)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(t - top) for t in terms))
