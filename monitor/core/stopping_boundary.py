"""The exact truncated boundary of the ``truncated`` stopping rule.

K_max is known, so the horizon is finite and the boundary can be calibrated exactly, the
way group-sequential designs compute theirs, instead of through Ville's inequality (built
for an infinite horizon, it leaves much of delta unspent at K_max = 20).

The boundary is a table ``b``: certify the leader when its count n1 and the runner-up's
n2 satisfy n1 >= b[n2] (and n1 > n2). Which points (n1, n2) come first is the order of
the pairwise mixture e-value E_w(n1, n2) (:mod:`monitor.core.stopping_evalue`; ``w`` the
prior mass on unanimous answers): the region is {E_w >= t}, made monotone (``b``
non-decreasing, b[0] >= k0). The threshold t is the smallest for which the exact
probability of a wrong certification at the least favourable null, an exact tie between
two classes and nothing else, followed for K_max draws, is at most delta. That
probability is computed by dynamic programming over the fair walk (:func:`tie_level`).
The points come in steps, so single points just below the boundary are then added in the
same order while the level stays <= delta: no point can be added to the result.

Why that null is the least favourable one, and what is computed rather than argued, is in
``docs/beyond-the-paper.md`` ("The truncated rule"); :func:`certification_probability`
gives the exact probability of a wrong certification for any distribution over a few
classes, which the tests and ``relmon simulate stopping`` use to check the argument.
At the service's defaults (K_max = 20, k0 = 3, delta = 0.05) with no point mass given,
the table is not this construction's but the tuned one of :data:`TUNED_TABLES`: among
all 167 960 monotone tables, the one with the largest saving on the tuning answer sets
whose exact level at the two-class tie is <= delta
(:func:`monitor.core.stopping_optimum.tune_table` says how it was chosen); its level is
computed again here and it is used only if <= delta. Any other setting, or an explicit
point mass, gets the construction above, whose level is exact for every setting.
Everything here is pure and cached per (K_max, k0, delta, w): at run time a rule only
looks numbers up.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from monitor.core.errors import ConfigError, InputError
from monitor.core.stopping_evalue import mixture_log_e_value

__all__ = [
    "DEFAULT_POINT_MASS",
    "MAX_EXACT_CLASSES",
    "TUNED_TABLES",
    "TruncatedBoundary",
    "certification_probability",
    "earliest_stop",
    "tie_level",
    "truncated_boundary",
]

MAX_EXACT_CLASSES = 6
""":func:`certification_probability` enumerates count vectors: at most this many classes."""

TUNED_TABLES: dict[tuple[int, int, float], tuple[int, ...]] = {(20, 3, 0.05): (7, 9, 10)}
"""(K_max, k0, delta) -> the tuned table b[0], b[1], ... (runner-up counts past it never
certify): chosen on the tuning answer sets by :func:`~monitor.core.stopping_optimum.tune_table`
(certify 7-0, 9-1, 10-2; level 0.0498 at the two-class tie). Used when no point mass is
given (:func:`truncated_boundary` with ``point_mass=None``)."""
DEFAULT_POINT_MASS = 0.25
"""The e-value construction's prior mass on unanimous answers when none is given."""


@dataclass(frozen=True, slots=True)
class TruncatedBoundary:
    """A certification region n1 >= needed[n2] with its exact level at the two-class tie."""

    k_max: int
    k0: int
    delta: float
    point_mass: float | None
    """The e-value construction's w; None for a tuned table (:data:`TUNED_TABLES`)."""
    log_threshold: float | None
    """log t: the region is {E_w(n1, n2) >= t}, made monotone (None for a tuned table)."""
    needed: tuple[int, ...]
    """needed[y]: the leader count that certifies against a runner-up count y (K_max + 1
    when none can); runner-up counts past the table never certify."""
    level: float
    """The exact probability of a wrong certification at an exact two-class tie."""

    def leader_needed(self, runner_up: int) -> int:
        return self.needed[runner_up] if runner_up < len(self.needed) else self.k_max + 1

    def certifies(self, leader: int, runner_up: int) -> bool:
        return leader > runner_up and leader >= self.leader_needed(runner_up)

    def futile(self, leader: int, runner_up: int, k: int) -> bool:
        """Certification by K_max is impossible: all remaining draws to the leader fail."""
        return leader + self.k_max - k < self.leader_needed(runner_up)


def _needed(log_t: float, k_max: int, k0: int, point_mass: float) -> tuple[int, ...]:
    out: list[int] = []
    for y in range((k_max - 1) // 2 + 1):
        x = next(
            (
                x
                for x in range(max(y + 1, k0), k_max - y + 1)
                if mixture_log_e_value(x, y, point_mass) >= log_t
            ),
            k_max + 1,
        )
        out.append(max(x, out[-1]) if out else x)  # monotone in the runner-up's count
    return tuple(out)


def tie_level(needed: Sequence[int], k_max: int) -> float:
    """P(a certification within ``k_max`` draws) at an exact tie of two classes, exactly.

    Dynamic programming over the counts (x, y) of the two classes: every draw goes to
    either with probability 1/2; mass that reaches the region (either class leading) is
    absorbed.
    """
    b = np.full(k_max + 2, k_max + 1, dtype=np.int64)
    b[: min(len(needed), k_max + 1)] = np.asarray(needed[: k_max + 1], dtype=np.int64)
    alive = np.ones(1)  # alive[x]: the first class has x of the n draws so far
    level = 0.0
    for n in range(1, k_max + 1):
        step = np.zeros(n + 1)
        step[1:] += 0.5 * alive
        step[:-1] += 0.5 * alive
        x = np.arange(n + 1)
        y = n - x
        region = ((x > y) & (x >= b[np.minimum(y, k_max + 1)])) | (
            (y > x) & (y >= b[np.minimum(x, k_max + 1)])
        )
        level += float(step[region].sum())
        step[region] = 0.0
        alive = step
    return level


def _spend_the_rest(
    needed: tuple[int, ...], k_max: int, k0: int, delta: float, point_mass: float
) -> tuple[int, ...]:
    """Add single points below the boundary, in the e-value order, while the level stays
    <= delta (the threshold's region leaves a remainder: the points come in steps)."""
    out = list(needed)
    while True:
        lower = [min(x - 1, k_max - y) for y, x in enumerate(out)]  # k_max + 1: none yet
        frontier = [
            (mixture_log_e_value(v, y, point_mass), y)
            for y, v in enumerate(lower)
            if v >= max(y + 1, k0) and (y == 0 or out[y - 1] <= v)
        ]
        for _, y in sorted(frontier, reverse=True):
            trial = [*out[:y], lower[y], *out[y + 1 :]]
            if tie_level(trial, k_max) <= delta:
                out = trial
                break
        else:
            return tuple(out)


@lru_cache(maxsize=64)
def truncated_boundary(
    k_max: int, k0: int, delta: float, point_mass: float | None = None
) -> TruncatedBoundary:
    """The boundary at these settings: the tuned table of :data:`TUNED_TABLES` when there
    is one and ``point_mass`` is None (its exact level checked <= delta), else the e-value
    construction with w = ``point_mass`` (default :data:`DEFAULT_POINT_MASS`). Cached."""
    if not 1 <= k0 <= k_max:
        raise ConfigError(f"need 1 <= k0 <= k_max, got k0={k0}, k_max={k_max}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    tuned = TUNED_TABLES.get((k_max, k0, delta)) if point_mass is None else None
    if tuned is not None:
        width = (k_max - 1) // 2 + 1
        needed = tuple(tuned[:width]) + (k_max + 1,) * (width - len(tuned[:width]))
        level = tie_level(needed, k_max)
        monotone = all(a <= b for a, b in itertools.pairwise(needed))
        if level <= delta and needed[0] >= k0 and monotone:
            return TruncatedBoundary(k_max, k0, delta, None, None, needed, level)
    return _evalue_boundary(
        k_max, k0, delta, DEFAULT_POINT_MASS if point_mass is None else point_mass
    )


def _evalue_boundary(k_max: int, k0: int, delta: float, point_mass: float) -> TruncatedBoundary:
    """The least threshold t whose region has level <= delta at the two-class tie.

    The regions are nested in t and the level falls as t grows, so a bisection over the
    distinct e-values of the reachable (n1, n2) finds it.
    """
    if not 0.0 <= point_mass < 1.0:
        raise ConfigError(f"point_mass must be in [0, 1), got {point_mass}")
    candidates = sorted(
        {
            mixture_log_e_value(x, y, point_mass)
            for y in range((k_max - 1) // 2 + 1)
            for x in range(max(y + 1, k0), k_max - y + 1)
        }
        | {math.inf}
    )
    lo, hi = 0, len(candidates) - 1  # candidates[hi] = inf: never certify, level 0
    while lo < hi:
        mid = (lo + hi) // 2
        if tie_level(_needed(candidates[mid], k_max, k0, point_mass), k_max) <= delta:
            hi = mid
        else:
            lo = mid + 1
    needed = _spend_the_rest(
        _needed(candidates[lo], k_max, k0, point_mass), k_max, k0, delta, point_mass
    )
    return TruncatedBoundary(
        k_max, k0, delta, point_mass, candidates[lo], needed, tie_level(needed, k_max)
    )


@lru_cache(maxsize=65536)
def earliest_stop(boundary: TruncatedBoundary, leader: int, runner_up: int, k: int) -> int:
    """The fewest further draws after which the rule (with futility) could stop.

    Certification is nearest when every draw goes to the leader; futility when draws go
    to the runner-up (raising the count it needs) and elsewhere (using up the room). All
    reachable (leader, runner-up) counts are searched, so a batch of this size never
    samples past the point where one draw at a time would have stopped. Returns 0 when
    the rule stops now.
    """
    b, k_max, k0 = boundary, boundary.k_max, boundary.k0
    if k >= k_max or b.certifies(leader, runner_up):
        return 0
    if k >= k0 and b.futile(leader, runner_up, k):
        return 0
    room = k_max - k
    cert = max(b.leader_needed(runner_up) - leader, k0 - k, 1)
    limit = min(cert, room)
    for j in range(max(1, k0 - k), limit):
        for i in range(j + 1):  # i draws to the leader, l to the runner-up, rest elsewhere
            for m in range(j - i + 1):
                a, c = leader + i, runner_up + m
                if b.futile(max(a, c), min(a, c), k + j):
                    return j
    return limit


def certification_probability(
    probabilities: Sequence[float], boundary: TruncatedBoundary
) -> tuple[float, float]:
    """(P(certified), P(certified with a leader that is not the unique mode)), exactly.

    Enumerates the count vectors of up to :data:`MAX_EXACT_CLASSES` classes over K_max
    draws (the futility stop never changes what is certified, so it is left out). An
    exact tie at the top has no mode: every certification there is wrong.
    """
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 1 or p.size == 0 or p.size > MAX_EXACT_CLASSES:
        raise InputError(f"need 1 to {MAX_EXACT_CLASSES} class probabilities, got {p.size}")
    if (p < 0).any() or not math.isclose(float(p.sum()), 1.0, abs_tol=1e-9):
        raise InputError("probabilities must be >= 0 and sum to 1")
    top = np.flatnonzero(np.isclose(p, p.max(), rtol=0, atol=1e-12))
    mode = int(top[0]) if top.size == 1 else -1
    alive: dict[tuple[int, ...], float] = {(0,) * p.size: 1.0}
    certified = wrong = 0.0
    for _ in range(boundary.k_max):
        step: dict[tuple[int, ...], float] = {}
        for counts, mass in alive.items():
            for j, pj in enumerate(p):
                if pj > 0:
                    nxt = (*counts[:j], counts[j] + 1, *counts[j + 1 :])
                    step[nxt] = step.get(nxt, 0.0) + mass * pj
        alive = {}
        for counts, mass in step.items():
            order = sorted(range(p.size), key=lambda i: -counts[i])
            lead = counts[order[0]]
            second = counts[order[1]] if p.size > 1 else 0
            if boundary.certifies(lead, second):
                certified += mass
                wrong += mass if order[0] != mode else 0.0
            else:
                alive[counts] = mass
    return certified, wrong
