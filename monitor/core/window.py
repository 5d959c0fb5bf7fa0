"""The rolling, drift-weighted calibration window of one (model, task). No I/O.

Each scored verdict contributes weight w_i = 2^(-(now - t_i)/h) / pi_i: decay with
half-life h on the item's sampling time t_i, and the inverse of its inclusion probability
pi_i (docs/method.md). Thresholds and the reliability level are the weighted conformal forms
with the test mass w* = 1/pi_min at +inf (the largest weight a test point can carry).

**One order.** Every verdict carries an ``order`` key, persisted by the store with the
verdict (the SQLite store's sequence number, the verdict's position in the Kafka
log). The window holds the ``max_items`` verdicts with the *largest* keys, whatever
order they are added in: the live window and the window rebuilt at a restart hold the
same items.

**Exact, path-independent sums.** Scores are few distinct values (ranks 1..K_max and
+inf), so the window keeps, per score value, the sum of *stored* weights
2^((t_i - t_ref)/h) / pi_i. Every weight shares the factor 2^(-(now - t_ref)/h), so a
snapshot costs O(distinct scores) and adding a verdict O(log n). The sums are kept in
exact fixed point (every float is an integer multiple of 2^-1074), and ``t_ref`` is a
function of the items held (their latest sampling time rounded down to a multiple of
:data:`_REBASE_HALF_LIVES` half-lives): the state, and so every snapshot, depends only
on *which* items are held and ``now`` — never on the order they were added, evicted or
reloaded in. A restart restores exactly the same thresholds.

**Effective size and bound.** n_eff = (Σw)²/Σw² (Kish; n with equal weights; it does not
change while every item ages alike). The lower bound is the one-sided Clopper–Pearson
bound from the effective counts (n_eff items, n_eff × the weighted rate Σ_{s≤1}w/Σw
successes), capped at the level: after a long pause without verdicts the items' weights
fade against the test point's w*, the level falls towards 0 (the calibration is stale),
and a lower bound above the level would claim more than the level itself, so the bound
falls with it.

**The served answer.** A verdict may also say whether the answer production served was
acceptable (``served``: True or False; None when the item had none). Over the items
that have one, the window keeps the same exact sums, and the snapshot's
:class:`ServedSnapshot` gives Σ w·1{served acceptable} / Σ w with the level's weights
(decay and 1/pi; no test point: it is a share of the reviewed items, not a conformal
level) and the one-sided Clopper–Pearson bound from those items' effective counts.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from monitor.core.conformal import reliability_lower_bound
from monitor.core.errors import ConfigError, InputError

__all__ = ["CalibrationWindow", "OrderKey", "ServedSnapshot", "WindowSnapshot"]

OrderKey = tuple[int, ...]
"""A verdict's persisted position in the window order (compared as a tuple)."""

_REBASE_HALF_LIVES = 64.0  # stored weights stay below 2^64 / pi
_FIXED_BITS = 1100  # every finite float is an integer multiple of 2^-1074
_ONE = 1 << _FIXED_BITS


def _fixed(x: float) -> int:
    """``x`` (finite, >= 0) exactly, in units of 2^-_FIXED_BITS."""
    num, den = x.as_integer_ratio()  # den is a power of two <= 2^1074
    return num * (_ONE // den)


@dataclass(frozen=True, slots=True)
class ServedSnapshot:
    """The served answers of the window's reviewed items that have one."""

    n: int
    n_eff: float
    acceptable_ratio: float
    """Σ w·1{served answer acceptable} / Σ w, with the level's weights."""
    lower_bound: float
    """One-sided Clopper–Pearson lower bound (at the window's delta) from n_eff items."""


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    n: int
    n_eff: float
    reliability_level: float
    reliability_lower_bound: float
    thresholds: dict[float, float]
    served: ServedSnapshot | None = None
    """None while no item of the window has a served answer."""

    @property
    def alpha_star(self) -> float:
        return 1.0 - self.reliability_level


@dataclass(slots=True)
class _Entry:
    item_id: str
    score: float
    t: float
    pi: float
    key: OrderKey
    stored: float = 0.0  # 2^((t - t_ref)/h) / pi (summed exactly, in fixed point)
    served: bool | None = None  # the served answer acceptable; None: the item had none


class CalibrationWindow:
    """Weighted calibration over the ``max_items`` scored verdicts latest in order."""

    def __init__(
        self,
        *,
        alphas: Sequence[float],
        max_items: int = 2000,
        half_life_s: float | None = 3600.0,
        min_inclusion_probability: float = 1.0,
        lower_bound_delta: float = 0.05,
        test_weight_seen: bool = False,
    ) -> None:
        """``test_weight_seen``: the test point's weight w* is the largest 1/pi among the
        items held (the smallest inclusion probability this window's items actually had,
        as ``relmon simulate priority`` does) rather than ``1 / min_inclusion_probability``;
        for a segment whose items are reviewed more often than the task's floor
        (``segments.min_reviews_per_hour``), whose test point is reviewed the same way."""
        if max_items < 1:
            raise ConfigError("max_items must be >= 1")
        if half_life_s is not None and not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ConfigError("half_life_s must be > 0 (or None for no decay)")
        if not 0.0 < min_inclusion_probability <= 1.0:
            raise ConfigError("min_inclusion_probability must be in (0, 1]")
        for a in alphas:
            if not 0.0 < a < 1.0:
                raise ConfigError(f"alpha must be in (0, 1), got {a}")
        self.alphas = tuple(alphas)
        self.max_items = max_items
        self.half_life_s = half_life_s
        self.test_weight = 1.0 / min_inclusion_probability
        self.test_weight_seen = test_weight_seen
        self.delta = lower_bound_delta
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[OrderKey, str]] = []  # min-heap on the order key
        self._removed: set[tuple[OrderKey, str]] = set()  # heap entries :meth:`remove` left
        self._mass: dict[float, int] = {}
        self._sum_sq = 0  # fixed point squared: units of 2^-(2 * _FIXED_BITS)
        self._served = [0, 0, 0, 0]  # items, Σw, Σw·1{acceptable}, Σw² (fixed point)
        self._t_ref = 0.0
        self._t_max = -math.inf
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._entries

    def entries(self) -> list[tuple[str, float, float, float]]:
        """``(item_id, score, sampled_at, inclusion probability)`` of every item held."""
        return [(e.item_id, e.score, e.t, e.pi) for e in self._entries.values()]

    # ----------------------------------------------------------------- internals

    def _reference(self, t_max: float) -> float:
        if self.half_life_s is None or not math.isfinite(t_max):
            return 0.0
        span = _REBASE_HALF_LIVES * self.half_life_s
        return math.floor(t_max / span) * span

    def _stored(self, t: float, pi: float) -> float:
        if self.half_life_s is None:
            return 1.0 / pi
        return float(2.0 ** ((t - self._t_ref) / self.half_life_s)) / pi

    def _account(self, e: _Entry, sign: int) -> None:
        exact = _fixed(e.stored)  # the float exactly: sums do not depend on their order
        self._mass[e.score] = self._mass.get(e.score, 0) + sign * exact
        if self._mass[e.score] == 0:
            del self._mass[e.score]
        self._sum_sq += sign * exact * exact
        if e.served is not None:
            served = self._served
            served[0] += sign
            served[1] += sign * exact
            served[2] += sign * exact * e.served
            served[3] += sign * exact * exact

    def _retarget(self, t_max: float) -> None:
        """Move to the reference time of ``t_max``; recompute every stored weight."""
        self._t_max = t_max
        t_ref = self._reference(t_max)
        if t_ref == self._t_ref:
            return
        self._t_ref = t_ref
        self._mass, self._sum_sq, self._served = {}, 0, [0, 0, 0, 0]
        for e in self._entries.values():
            e.stored = self._stored(e.t, e.pi)
            self._account(e, +1)

    # -------------------------------------------------------------------- public

    def add(
        self,
        item_id: str,
        score: float,
        inclusion_probability: float,
        t: float,
        *,
        order: OrderKey | None = None,
        served: bool | None = None,
    ) -> bool:
        """Add a scored verdict; False (and nothing changes) if ``item_id`` is held.

        ``order`` is the verdict's persisted order key (default: after everything added
        so far). A verdict earlier in order than every item of a full window is not
        held (it would be the one evicted): True, and nothing changes. ``served``:
        whether the verdict accepted the answer production served (None: none known).
        """
        if item_id in self._entries:
            return False
        if math.isnan(score) or score < 1:
            raise InputError(f"a rank score is >= 1 or inf, got {score}")
        if not 0.0 < inclusion_probability <= 1.0:
            raise InputError("inclusion_probability must be in (0, 1]")
        if not math.isfinite(t):
            raise InputError(f"a sampling time is finite, got {t}")
        self._arrivals += 1
        key: OrderKey = order if order is not None else (self._arrivals,)
        if len(self._entries) >= self.max_items and (key, item_id) < self._top():
            return True
        if t > self._t_max:
            self._retarget(t)
        entry = _Entry(item_id, score, t, inclusion_probability, key, served=served)
        self._entries[item_id] = entry
        if (key, item_id) in self._removed:
            self._removed.discard((key, item_id))  # its old heap entry stands for it again
        else:
            heapq.heappush(self._heap, (key, item_id))
        entry.stored = self._stored(t, inclusion_probability)
        self._account(entry, +1)
        while len(self._entries) > self.max_items:
            self._drop(self._pop())
        return True

    def remove(self, item_id: str) -> bool:
        """Take ``item_id`` out of the window (False: it was not held). The window is then
        exactly the one the other items alone would make, added in any order."""
        entry = self._entries.get(item_id)
        if entry is None:
            return False
        self._removed.add((entry.key, item_id))
        self._drop(item_id)
        if len(self._removed) > len(self._entries):  # compact: the heap stays O(n)
            self._heap = [(e.key, e.item_id) for e in self._entries.values()]
            heapq.heapify(self._heap)
            self._removed.clear()
        return True

    def _top(self) -> tuple[OrderKey, str]:
        """The heap's least entry of an item held."""
        while self._heap[0] in self._removed:
            self._removed.discard(heapq.heappop(self._heap))
        return self._heap[0]

    def _pop(self) -> str:
        """The item held with the least order key, off the heap."""
        self._top()
        return heapq.heappop(self._heap)[1]

    def _drop(self, item_id: str) -> None:
        old = self._entries.pop(item_id)
        self._account(old, -1)
        if old.t == self._t_max:
            if self._entries:
                self._retarget(max(e.t for e in self._entries.values()))
            else:
                self._retarget(-math.inf)

    def extend(self, records: Iterable[tuple[str, float, float, float]]) -> int:
        """Add many (item_id, score, pi, t) in order; returns how many were new."""
        return sum(self.add(*r) for r in records)

    def _scale(self, now: float) -> tuple[list[float], list[float], float, float]:
        """Score values held, their masses and Σw (stored units), and w* in stored units."""
        values = sorted(self._mass)
        masses = [self._mass[v] / _ONE for v in values]
        total = sum(self._mass.values()) / _ONE
        test_weight = self.test_weight
        if self.test_weight_seen and self._entries:
            test_weight = max(1.0 / e.pi for e in self._entries.values())
        if self.half_life_s is None or not self._entries:
            return values, masses, total, test_weight
        # A verdict sampled "after" now (another replica's clock runs ahead) is as fresh
        # as can be, not fresher: ages are never negative.
        now = max(now, self._t_max)
        f = 2.0 ** (-(now - self._t_ref) / self.half_life_s)
        return values, masses, total, (test_weight / f if f > 0 else math.inf)

    def threshold_at(self, alpha: float, now: float) -> float:
        """M* at any ``alpha`` (the adaptive alpha_t of ACI may leave (0, 1)).

        ``alpha <= 0`` is the full set (``inf``); ``alpha >= 1`` the empty set (0).
        """
        if alpha <= 0.0:
            return math.inf
        if alpha >= 1.0:
            return 0.0
        values, masses, total, test = self._scale(now)
        return _quantile(values, masses, total + test, 1.0 - alpha)

    def snapshot(self, now: float) -> WindowSnapshot:
        """Thresholds, reliability level, bound and n_eff as of ``now``."""
        values, masses, total, test = self._scale(now)
        denominator = total + test
        thresholds = {a: _quantile(values, masses, denominator, 1.0 - a) for a in self.alphas}
        good = sum(m for v, m in zip(values, masses, strict=True) if v <= 1.0)
        level = good / denominator if math.isfinite(denominator) and denominator > 0 else 0.0
        sum_sq = self._sum_sq / (_ONE * _ONE)
        n_eff = total * total / sum_sq if total > 0 and sum_sq > 0 else 0.0
        rate = min(1.0, good / total) if total > 0 else 0.0
        bound = reliability_lower_bound(rate * n_eff, n_eff, self.delta) if n_eff > 0 else 0.0
        bound = min(bound, level)  # stale calibration: the bound follows the level down
        return WindowSnapshot(
            n=len(self._entries),
            n_eff=n_eff,
            reliability_level=level,
            reliability_lower_bound=bound,
            thresholds=thresholds,
            served=self._served_snapshot(),
        )

    def _served_snapshot(self) -> ServedSnapshot | None:
        """The served answers' weighted share and bound (their weights' common decay
        factor cancels: the same at any ``now``)."""
        count, total, good, sum_sq = self._served
        if count <= 0 or total <= 0:
            return None
        ratio = min(1.0, good / total)
        n_eff = (total * total) / sum_sq  # exact integers: no underflow, no overflow
        bound = reliability_lower_bound(ratio * n_eff, n_eff, self.delta)
        return ServedSnapshot(
            n=count, n_eff=n_eff, acceptable_ratio=ratio, lower_bound=min(bound, ratio)
        )


def _quantile(values: list[float], masses: list[float], denominator: float, target: float) -> float:
    """The smallest value whose cumulative share of ``denominator`` reaches ``target``."""
    if not (math.isfinite(denominator) and denominator > 0):
        return math.inf
    cumulative = 0.0
    for v, m in zip(values, masses, strict=True):
        cumulative += m
        if cumulative / denominator >= target - 1e-10:
            return v
    return math.inf
