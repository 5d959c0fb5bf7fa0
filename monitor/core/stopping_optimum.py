"""The optimum of the truncated stopping problem on given answer streams.

What is optimised
-----------------
The class is the shipped rule's (:mod:`monitor.core.stopping_boundary`): certify the
leader as soon as its count n1 and the runner-up's n2 satisfy n1 >= b[n2], with ``b``
non-decreasing and b[0] >= k0, and stop uncertified as soon as that can no longer happen
by K_max (the futility stop). A rule of the class is its table ``b``; randomised rules
are mixtures of tables (each item draws its table; randomising point by point, deciding
once per point, gives nothing outside their convex hull: the outcomes are multilinear in
the points' probabilities).

Why this state space: (n1, n2) is what makes the exact two-way tie the least favourable
null. With ``b`` non-decreasing, certifying a class a forces the pair walk of a against
every other class c, which moves only on the draws in {a, c}, into the region within
K_max of its draws, so the error at any tie of a and b plus rarer classes is at most the
region's level at the two-class tie, computed exactly here as in
:func:`~monitor.core.stopping_boundary.tie_level`. A rule that certified on more than
(n1, n2) (the total k, the other classes) could certify where the two-class tie never
goes and its level there would say nothing. The futility stop looks at k too
(leader + K_max - k < b[n2]); it never loses a certification, so every rule of the class
certifies exactly what its region certifies.

Saving alone is not the goal: the table that never certifies stops every item at k0
and "saves" 1 - k0/K_max. So the optimum is the largest expected saving of a mixture of
tables whose level at the two-class tie is <= delta and which certifies at least a given
share of the items (and, optionally, a given share before K_max), on the given answer
streams: a linear program over the weights of all monotone tables
(:func:`optimum`, HiGHS through :func:`scipy.optimize.linprog`). At K_max = 20, k0 = 3
there are 167 960 tables; :func:`enumerate_tables` evaluates them all in one depth-first
pass over b[0], b[1], ... (a stream's row n2 = y is decided by b[y] alone: n1 never
falls and n1 + K_max - k never rises, so the first stop in a row is a lookup). The
shipped table is one of them, so the optimum is at least the shipped rule's saving on
the same streams.

Streams (:func:`make_streams`): ``streams_per_item`` sequences of K_max draws from each
item's answer distribution, fixed by the seed; only (n1, n2) after each draw and whether
the leader is the item's unique mode are kept, deduplicated per item. Pure: numpy and
scipy, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linprog

from monitor.core.errors import ConfigError, InputError

__all__ = [
    "Optimum",
    "Streams",
    "TableOutcomes",
    "TableRow",
    "enumerate_tables",
    "evaluate_table",
    "make_streams",
    "optimum",
    "table_level",
    "tune_table",
]

Table = tuple[int, ...]
"""b[0], b[1], ...: the leader count that certifies against runner-up count y; runner-up
counts past the table never certify (the shipped ``TruncatedBoundary.needed`` with its
unreachable entries cut)."""


@dataclass(frozen=True, slots=True)
class Streams:
    """Answer streams reduced to what a rule of the class sees, one row per distinct
    stream of an item (``weight``: its share of all streams, items equally weighted)."""

    k_max: int
    leader: NDArray[np.int64]
    """(paths, k_max): n1 after draw t + 1."""
    runner_up: NDArray[np.int64]
    """(paths, k_max): n2 after draw t + 1."""
    mode_leads: NDArray[np.bool_]
    """(paths, k_max): the leader is the item's unique mode and leads alone."""
    weight: NDArray[np.float64]
    item: NDArray[np.int64]
    items: int


def make_streams(
    probabilities: Sequence[Sequence[float]],
    *,
    k_max: int,
    streams_per_item: int,
    seed: int,
) -> Streams:
    """``streams_per_item`` streams of ``k_max`` draws from each item's distribution.

    An item whose top probability is shared (an exact tie) has no mode: every
    certification on it is wrong."""
    if not probabilities or streams_per_item < 1 or k_max < 1:
        raise InputError("need items, streams_per_item >= 1 and k_max >= 1")
    parts: list[tuple[NDArray[np.int64], NDArray[np.bool_], NDArray[np.float64], int]] = []
    for i, dist in enumerate(probabilities):
        p = np.asarray(dist, dtype=float)
        if p.ndim != 1 or (p < 0).any() or not np.isclose(p.sum(), 1.0, atol=1e-9):
            raise InputError(f"item {i}: probabilities must be >= 0 and sum to 1")
        p = p / p.sum()
        top = np.flatnonzero(np.isclose(p, p.max(), rtol=0, atol=1e-12))
        rng = np.random.default_rng([seed, i])
        draws = rng.choice(p.size, size=(streams_per_item, k_max), p=p)
        counts = np.cumsum(draws[:, :, None] == np.arange(p.size), axis=1)
        ordered = -np.sort(-counts, axis=2)
        n1 = ordered[:, :, 0]
        n2 = ordered[:, :, 1] if p.size > 1 else np.zeros_like(n1)
        leads = (counts[:, :, top[0]] == n1) & (n1 > n2) if top.size == 1 else n1 < 0
        key = np.concatenate([n1, n2, leads], axis=1)
        rows, index, multiplicity = np.unique(key, axis=0, return_index=True, return_counts=True)
        del rows
        packed = np.stack([n1[index], n2[index]], axis=1).astype(np.int64)
        parts.append((packed, leads[index], multiplicity / streams_per_item, i))
    n = len(probabilities)
    return Streams(
        k_max,
        np.concatenate([pk[:, 0] for pk, _, _, _ in parts]),
        np.concatenate([pk[:, 1] for pk, _, _, _ in parts]),
        np.concatenate([lead for _, lead, _, _ in parts]),
        np.concatenate([w for _, _, w, _ in parts]) / n,
        np.concatenate([np.full(len(w), i, dtype=np.int64) for _, _, w, i in parts]),
        n,
    )


def _row_stops(
    streams: Streams, k0: int
) -> tuple[NDArray[np.int16], NDArray[np.bool_], NDArray[np.bool_]]:
    """stop[p, y, v]: the draw index at which stream p stops in row n2 = y when
    b[y] = v (k_max when it leaves the row first); cert and wrong at that stop."""
    k_max = streams.k_max
    n1, n2 = streams.leader, streams.runner_up
    t = np.arange(k_max)
    hi = n1 + k_max - (t + 1)  # the most the leader can reach by K_max
    rows, values = k_max // 2 + 1, k_max + 2
    paths = n1.shape[0]
    stop = np.full((paths, rows, values), k_max, dtype=np.int16)
    cert = np.zeros((paths, rows, values), dtype=bool)
    wrong = np.zeros((paths, rows, values), dtype=bool)
    every = np.arange(paths)
    for y in range(rows):
        in_row = (n2 == y) & (t >= k0 - 1)
        for v in range(values):
            hit = in_row & ((n1 >= v) | (hi < v))
            first = np.where(hit.any(axis=1), hit.argmax(axis=1), k_max)
            stop[:, y, v] = first
            at = np.minimum(first, k_max - 1)
            ok = first < k_max
            cert[:, y, v] = ok & (n1[every, at] >= v) & (n1[every, at] > y)
            wrong[:, y, v] = cert[:, y, v] & ~streams.mode_leads[every, at]
    return stop, cert, wrong


def _tie_row(
    entry: NDArray[np.float64], y: int, v: int, k_max: int
) -> tuple[float, NDArray[np.float64]]:
    """The exact two-class tie walk through row n2 = y with b[y] = v: (mass certified
    in the row, mass entering row y + 1 by leader count)."""
    mass = entry.copy()
    nxt = np.zeros(k_max + 2)
    absorbed = 0.0
    for a in range(y, k_max - y + 1):
        m = float(mass[a])
        if m == 0.0:
            continue
        if a > y and a >= v:
            absorbed += m
        elif a + y >= k_max:
            continue
        elif a == y:
            mass[a + 1] += m
        else:
            mass[a + 1] += m / 2
            nxt[a] += m / 2
    return absorbed, nxt


def table_level(table: Sequence[int], k_max: int) -> float:
    """P(a certification within ``k_max`` draws) at an exact two-class tie, exactly
    (the row-by-row walk :func:`enumerate_tables` uses)."""
    entry = np.zeros(k_max + 2)
    entry[0] = 1.0
    level = 0.0
    for y in range(k_max // 2 + 1):
        v = table[y] if y < len(table) else k_max + 1
        absorbed, entry = _tie_row(entry, y, v, k_max)
        level += absorbed
    return level


@dataclass(frozen=True, slots=True)
class TableOutcomes:
    """Every monotone table with its exact tie level and its outcomes on the streams."""

    tables: tuple[Table, ...]
    level: NDArray[np.float64]
    calls: NDArray[np.float64]
    """Expected calls per item."""
    certified: NDArray[np.float64]
    certified_early: NDArray[np.float64]
    """Certified before K_max calls."""
    wrong: NDArray[np.float64]
    """Certified with a leader that is not the unique mode (all items' mean)."""
    k_max: int
    k0: int

    def index(self, table: Sequence[int]) -> int:
        """The row of ``table`` (unreachable entries, v > K_max - y, cut first)."""
        cut = _cut(table, self.k_max)
        try:
            return self.tables.index(cut)
        except ValueError:
            raise InputError(f"{cut} is not a monotone table of this class") from None


def _cut(table: Sequence[int], k_max: int) -> Table:
    out: list[int] = []
    for y, v in enumerate(table):
        if v > k_max - y:
            break
        out.append(int(v))
    return tuple(out)


Acc = tuple[float, float, float, float, float]
"""Running (level, calls, certified, certified early, wrong) of a table's prefix."""


class _Search:
    """The depth-first pass of :func:`enumerate_tables` over b[0], b[1], ..."""

    def __init__(self, streams: Streams, k0: int) -> None:
        self.k_max, self.k0, self.w = streams.k_max, k0, streams.weight
        self.stop, self.cert, self.wrong = _row_stops(streams, k0)
        self.out: list[tuple[Table, Acc]] = []

    def walk(
        self, y: int, prefix: Table, alive: NDArray[np.int64], tie: NDArray[np.float64], acc: Acc
    ) -> None:
        """Every table extending ``prefix`` (b[0..y-1]); ``alive``: the streams not
        stopped in rows < y; ``tie``: the tie walk's mass entering row y."""
        k_max, low = self.k_max, prefix[-1] if prefix else self.k0
        for v in [*range(max(low, y + 1, self.k0), k_max - y + 1), k_max + 1]:
            s = self.stop[alive, y, v]
            done = s < k_max
            ended = alive[done]
            wd, c = self.w[ended], self.cert[ended, y, v]
            absorbed, nxt = _tie_row(tie, y, v, k_max)
            step = (
                acc[0] + absorbed,
                acc[1] + float(wd @ (s[done] + 1)),
                acc[2] + float(wd @ c),
                acc[3] + float(wd @ (c & (s[done] < k_max - 1))),
                acc[4] + float(wd @ self.wrong[ended, y, v]),
            )
            if v > k_max - y:  # none from here on: every later row stops at once
                self.finish(y + 1, prefix, alive[~done], step)
            else:
                self.walk(y + 1, (*prefix, v), alive[~done], nxt, step)

    def finish(self, y: int, prefix: Table, rest: NDArray[np.int64], acc: Acc) -> None:
        """Streams alive after a table's last entry stop uncertified at their first
        draw (>= k0) in a later row."""
        calls = acc[1]
        for row in range(y, self.k_max // 2 + 1):
            s = self.stop[rest, row, self.k_max + 1]
            done = s < self.k_max
            calls += float(self.w[rest[done]] @ (s[done] + 1))
            rest = rest[~done]
        self.out.append((prefix, (acc[0], calls, acc[2], acc[3], acc[4])))


def enumerate_tables(streams: Streams, k0: int) -> TableOutcomes:
    """Every monotone table (b[y] in [max(y + 1, k0), K_max - y], non-decreasing, cut
    at its first unreachable entry), evaluated exactly at the tie and on the streams."""
    k_max = streams.k_max
    if not 1 <= k0 <= k_max:
        raise ConfigError(f"need 1 <= k0 <= k_max, got k0={k0}, k_max={k_max}")
    search = _Search(streams, k0)
    tie = np.zeros(k_max + 2)
    tie[0] = 1.0
    search.walk(0, (), np.arange(streams.weight.size), tie, (0.0, 0.0, 0.0, 0.0, 0.0))
    rows = np.array([acc for _, acc in search.out])
    return TableOutcomes(
        tuple(t for t, _ in search.out),
        rows[:, 0],
        rows[:, 1],
        rows[:, 2],
        rows[:, 3],
        rows[:, 4],
        k_max,
        k0,
    )


@dataclass(frozen=True, slots=True)
class TableRow:
    """One table's outcomes on the streams, with the worst single item's wrong mode."""

    calls: float
    certified: float
    certified_early: float
    wrong: float
    per_item_wrong: tuple[float, ...]
    """Each item's wrong-mode rate (what delta bounds, item by item)."""


def evaluate_table(streams: Streams, table: Sequence[int], k0: int) -> TableRow:
    """``table`` (with the futility stop) on every stream directly, draw by draw."""
    k_max = streams.k_max
    b = np.full(k_max + 2, k_max + 1, dtype=np.int64)
    cut = _cut(table, k_max)
    b[: len(cut)] = cut
    n1, n2 = streams.leader, streams.runner_up
    t = np.arange(k_max)
    need = b[np.minimum(n2, k_max + 1)]
    certifies = (n1 >= need) & (n1 > n2)
    futile = n1 + k_max - (t + 1) < need
    hit = (t >= k0 - 1) & (certifies | futile)
    hit[:, -1] = True
    first = hit.argmax(axis=1)
    rows = np.arange(first.size)
    cert = certifies[rows, first]
    wrong = cert & ~streams.mode_leads[rows, first]
    w = streams.weight
    per_item = np.bincount(streams.item, weights=w * wrong, minlength=streams.items)
    return TableRow(
        float(w @ (first + 1)),
        float(w @ cert),
        float(w @ (cert & (first < k_max - 1))),
        float(w @ wrong),
        tuple(float(x) for x in per_item * streams.items),
    )


@dataclass(frozen=True, slots=True)
class Optimum:
    """The linear program's solution: a mixture of tables and what it reaches."""

    tables: tuple[Table, ...]
    weights: tuple[float, ...]
    saving: float
    calls: float
    level: float
    certified: float
    certified_early: float
    wrong: float
    best_table: Table
    """The best single (deterministic) table meeting the same constraints."""
    best_table_saving: float


def optimum(
    outcomes: TableOutcomes,
    *,
    delta: float,
    certified_at_least: float = 0.0,
    certified_early_at_least: float = 0.0,
) -> Optimum:
    """max saving over mixtures of tables: level at the two-class tie <= ``delta``,
    certified share >= ``certified_at_least`` and certified-before-K_max share >=
    ``certified_early_at_least`` (all on the streams ``outcomes`` was computed on)."""
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    o, k_max = outcomes, outcomes.k_max
    saving = 1.0 - o.calls / k_max
    a_ub = np.vstack([o.level, -o.certified, -o.certified_early])
    b_ub = np.array([delta, -certified_at_least, -certified_early_at_least])
    res = linprog(
        -saving,
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=np.ones((1, saving.size)),
        b_eq=np.ones(1),
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise InputError(f"no rule of the class meets the constraints: {res.message}")
    x = np.asarray(res.x)
    used = np.flatnonzero(x > 1e-9)
    ok = (
        (o.level <= delta)
        & (o.certified >= certified_at_least - 1e-12)
        & (o.certified_early >= certified_early_at_least - 1e-12)
    )
    best = int(np.flatnonzero(ok)[np.argmax(saving[ok])]) if ok.any() else int(used[0])
    return Optimum(
        tuple(o.tables[i] for i in used),
        tuple(float(x[i]) for i in used),
        float(x @ saving),
        float(x @ o.calls),
        float(x @ o.level),
        float(x @ o.certified),
        float(x @ o.certified_early),
        float(x @ o.wrong),
        o.tables[best],
        float(saving[best]),
    )


def tune_table(
    tuning: Sequence[tuple[TableOutcomes, int]],
    *,
    baseline: Sequence[int],
    delta: float,
    prefer_first_at_most: int = 7,
    goal_saving: float = 0.45,
    tolerance: float = 0.02,
) -> Table:
    """The shipped table's choice, from the tuning sets only (``tuning``: each set's
    outcomes, all enumerated on the same class, with its number of items).

    Feasible: exact level at the two-class tie <= ``delta``, and on every tuning set a
    certified share and a certified-before-K_max share no lower than ``baseline``'s (the
    e-value construction's table). The objective is the saving pooled over the sets'
    items (each item weighs the same). The best feasible table with b[0] <=
    ``prefer_first_at_most`` (unanimous items stop sooner) is taken when its pooled
    saving is >= ``goal_saving`` and within ``tolerance`` of the best feasible table;
    otherwise the best feasible table. Ties go to the first in enumeration order."""
    if not tuning:
        raise InputError("need at least one tuning set")
    first = tuning[0][0]
    if any(o.tables != first.tables for o, _ in tuning):
        raise InputError("the tuning sets' outcomes must enumerate the same tables")
    ok = first.level <= delta
    for o, _ in tuning:
        i = o.index(baseline)
        ok &= (o.certified >= o.certified[i] - 1e-12) & (
            o.certified_early >= o.certified_early[i] - 1e-12
        )
    items = sum(n for _, n in tuning)
    calls = np.zeros_like(first.calls)
    for o, n in tuning:
        calls += n * o.calls
    saving = 1.0 - calls / items / first.k_max
    if not ok.any():
        raise InputError("no table meets the constraints")
    feasible = np.flatnonzero(ok)
    best = int(feasible[np.argmax(saving[feasible])])
    lead = np.array([first.tables[i][0] if first.tables[i] else first.k_max + 1 for i in feasible])
    preferred = feasible[lead <= prefer_first_at_most]
    if preferred.size:
        pick = int(preferred[np.argmax(saving[preferred])])
        if saving[pick] >= goal_saving and saving[pick] >= saving[best] - tolerance:
            return first.tables[pick]
    return first.tables[best]
