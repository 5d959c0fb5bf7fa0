"""The rolling, drift-weighted calibration window of one (model, task). No I/O.

Each scored verdict contributes weight w_i = 2^(-(now - t_i)/h) / pi_i: decay with
half-life h on the item's sampling time t_i, and the inverse of its review probability
pi_i (DESIGN §2). Thresholds and the reliability level are the weighted conformal forms
with the test mass w* = 1/pi_min at +inf (the largest weight a test point can carry).

Incremental: scores are few distinct values (ranks 1..K_max and +inf), so the window
keeps, per score value, the sum of *stored* weights 2^((t_i - t_ref)/h) / pi_i. Every
weight shares the factor 2^(-(now - t_ref)/h), so a snapshot costs O(distinct scores),
and adding a verdict O(1). Evicting the oldest item (window size) subtracts its stored
weight; the sums are recomputed exactly every ``max_items`` evictions to bound float
drift, and t_ref is moved forward when the stored weights grow large.

The same records in the same order give the same snapshot at the same ``now``: a
restart that reloads the records restores the thresholds exactly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from monitor.conformal import reliability_lower_bound

__all__ = ["CalibrationWindow", "WindowSnapshot"]

_REBASE_EXPONENT = 512.0  # rebase t_ref before 2^x approaches float overflow (2^1024)


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    n: int
    n_eff: float
    reliability_level: float
    reliability_lower_bound: float
    thresholds: dict[float, float]

    @property
    def alpha_star(self) -> float:
        return 1.0 - self.reliability_level


@dataclass(frozen=True, slots=True)
class _Entry:
    item_id: str
    score: float
    stored: float  # 2^((t - t_ref)/h) / pi at insertion
    t: float
    pi: float


class CalibrationWindow:
    """Weighted calibration over the most recent ``max_items`` scored verdicts."""

    def __init__(
        self,
        *,
        alphas: Sequence[float],
        max_items: int = 2000,
        half_life_s: float | None = 3600.0,
        min_inclusion_probability: float = 1.0,
        lower_bound_delta: float = 0.05,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        if half_life_s is not None and not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError("half_life_s must be > 0 (or None for no decay)")
        if not 0.0 < min_inclusion_probability <= 1.0:
            raise ValueError("min_inclusion_probability must be in (0, 1]")
        for a in alphas:
            if not 0.0 < a < 1.0:
                raise ValueError(f"alpha must be in (0, 1), got {a}")
        self.alphas = tuple(alphas)
        self.max_items = max_items
        self.half_life_s = half_life_s
        self.test_weight = 1.0 / min_inclusion_probability
        self.delta = lower_bound_delta
        self._entries: deque[_Entry] = deque()
        self._ids: set[str] = set()
        self._mass: dict[float, float] = {}
        self._sum_sq = 0.0
        self._t_ref: float | None = None
        self._evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._ids

    def _stored(self, t: float, pi: float) -> float:
        if self.half_life_s is None:
            return 1.0 / pi
        assert self._t_ref is not None
        return float(2.0 ** ((t - self._t_ref) / self.half_life_s)) / pi

    def _recompute(self) -> None:
        self._mass = {}
        self._sum_sq = 0.0
        fresh: deque[_Entry] = deque()
        for e in self._entries:
            stored = self._stored(e.t, e.pi)
            fresh.append(_Entry(e.item_id, e.score, stored, e.t, e.pi))
            self._mass[e.score] = self._mass.get(e.score, 0.0) + stored
            self._sum_sq += stored * stored
        self._entries = fresh

    def add(self, item_id: str, score: float, inclusion_probability: float, t: float) -> bool:
        """Add a scored verdict; False (and nothing changes) if ``item_id`` is present."""
        if item_id in self._ids:
            return False
        if math.isnan(score) or score < 1:
            raise ValueError(f"a rank score is >= 1 or inf, got {score}")
        if not 0.0 < inclusion_probability <= 1.0:
            raise ValueError("inclusion_probability must be in (0, 1]")
        if self._t_ref is None:
            self._t_ref = t
        elif (
            self.half_life_s is not None and (t - self._t_ref) / self.half_life_s > _REBASE_EXPONENT
        ):
            self._t_ref = t
            self._recompute()
        stored = self._stored(t, inclusion_probability)
        self._entries.append(_Entry(item_id, score, stored, t, inclusion_probability))
        self._ids.add(item_id)
        self._mass[score] = self._mass.get(score, 0.0) + stored
        self._sum_sq += stored * stored
        while len(self._entries) > self.max_items:
            old = self._entries.popleft()
            self._ids.discard(old.item_id)
            self._mass[old.score] -= old.stored
            self._sum_sq -= old.stored * old.stored
            self._evictions += 1
            if self._evictions >= self.max_items:
                self._evictions = 0
                self._recompute()
        return True

    def extend(self, records: Iterable[tuple[str, float, float, float]]) -> int:
        """Add many (item_id, score, pi, t); returns how many were new."""
        return sum(self.add(*r) for r in records)

    def threshold_at(self, alpha: float, now: float) -> float:
        """M* at any ``alpha`` (the adaptive alpha_t of ACI may leave (0, 1)).

        ``alpha <= 0`` is the full set (``inf``); ``alpha >= 1`` the empty set (0).
        """
        if alpha <= 0.0:
            return math.inf
        if alpha >= 1.0:
            return 0.0
        if self.half_life_s is None or self._t_ref is None:
            f = 1.0
        else:
            f = 2.0 ** (-(now - self._t_ref) / self.half_life_s)
        values = sorted(v for v, m in self._mass.items() if m > 0)
        denominator = sum(self._mass[v] for v in values) + (
            self.test_weight / f if f > 0 else math.inf
        )
        cumulative = 0.0
        for v in values:
            cumulative += self._mass[v]
            if cumulative / denominator >= 1.0 - alpha - 1e-10:
                return v
        return math.inf

    def snapshot(self, now: float) -> WindowSnapshot:
        """Thresholds, reliability level, bound and n_eff as of ``now``."""
        n = len(self._entries)
        # Current weights are stored weights times f; test weight w* becomes w*/f in
        # stored units, so no per-item work is needed.
        if self.half_life_s is None or self._t_ref is None:
            f = 1.0
        else:
            f = 2.0 ** (-(now - self._t_ref) / self.half_life_s)
        values = sorted(v for v, m in self._mass.items() if m > 0)
        masses = [max(self._mass[v], 0.0) for v in values]
        total_stored = sum(masses)
        test_stored = self.test_weight / f if f > 0 else math.inf
        denominator = total_stored + test_stored
        thresholds: dict[float, float] = {}
        for alpha in self.alphas:
            target = 1.0 - alpha
            cumulative, found = 0.0, math.inf
            for v, m in zip(values, masses, strict=True):
                cumulative += m
                if cumulative / denominator >= target - 1e-10:
                    found = v
                    break
            thresholds[alpha] = found
        good = sum(m for v, m in zip(values, masses, strict=True) if v <= 1.0)
        level = good / denominator if denominator > 0 and math.isfinite(denominator) else 0.0
        n_eff = total_stored**2 / self._sum_sq if self._sum_sq > 0 else 0.0
        rate = good / total_stored if total_stored > 0 else 0.0
        bound = reliability_lower_bound(rate * n_eff, n_eff, self.delta) if n_eff > 0 else 0.0
        return WindowSnapshot(
            n=n,
            n_eff=n_eff,
            reliability_level=level,
            reliability_lower_bound=bound,
            thresholds=thresholds,
        )
