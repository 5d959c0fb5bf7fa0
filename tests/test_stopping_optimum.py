"""The optimum of the truncated stopping problem: its tables, its exact level, its LP."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from monitor.app.simulate.real_stopping import load_answer_file
from monitor.core.errors import InputError
from monitor.core.stopping import TruncatedRule, get_stopping_rule
from monitor.core.stopping_boundary import (
    DEFAULT_POINT_MASS,
    TUNED_TABLES,
    tie_level,
    truncated_boundary,
)
from monitor.core.stopping_optimum import (
    Streams,
    TableOutcomes,
    enumerate_tables,
    evaluate_table,
    make_streams,
    optimum,
    table_level,
    tune_table,
)

DELTA, K0, K_MAX = 0.05, 3, 20
SMOLLM2 = Path(__file__).resolve().parent.parent / "bench" / "data" / "smollm2_answers.json"
SMALL = ((1.0,), (0.6, 0.4), (0.5, 0.5), (0.5, 0.2, 0.1, 0.1, 0.1), (0.3, *(0.1,) * 7))


def _brute_level(table: tuple[int, ...], k_max: int) -> float:
    """P(certification) at a fair two-class tie over all 2^k_max sequences."""
    b = [*table, *[k_max + 1] * (k_max + 1)]
    hits = 0
    for seq in itertools.product((0, 1), repeat=k_max):
        counts = [0, 0]
        for d in seq:
            counts[d] += 1
            n1, n2 = max(counts), min(counts)
            if n1 > n2 and n1 >= b[n2]:
                hits += 1
                break
    return hits / 2**k_max


@cache
def _small(k_max: int, k0: int, streams: int) -> tuple[Streams, object]:
    s = make_streams(SMALL, k_max=k_max, streams_per_item=streams, seed=4)
    return s, enumerate_tables(s, k0)


def _raw_draws(probabilities: tuple[float, ...], i: int, k_max: int, n: int) -> np.ndarray:
    """The draws make_streams takes for item i (same generator, same call)."""
    p = np.asarray(probabilities)
    return np.random.default_rng([4, i]).choice(p.size, size=(n, k_max), p=p)


def _replay(table: tuple[int, ...], draws: np.ndarray, mode: int | None, k_max: int, k0: int):
    """One draw at a time, by the rule's definition: (calls, certified, wrong)."""
    b = [*table, *[k_max + 1] * (k_max + 1)]
    counts = [0] * (int(draws.max()) + 1)
    for k, d in enumerate(draws, start=1):
        counts[d] += 1
        order = sorted(range(len(counts)), key=lambda j: -counts[j])
        n1 = counts[order[0]]
        n2 = counts[order[1]] if len(counts) > 1 else 0
        if n1 > n2 and n1 >= b[n2]:
            return k, True, mode is None or order[0] != mode
        if k >= k0 and n1 + k_max - k < b[n2]:
            return k, False, False
    return k_max, False, False


@pytest.mark.parametrize("table", [(3,), (4, 6), (5, 6, 7), (6, 6), (7,), (4, 5, 6, 7)])
def test_table_level_matches_brute_force_and_the_shipped_computation(
    table: tuple[int, ...],
) -> None:
    k_max = 12
    exact = _brute_level(table, k_max)
    assert table_level(table, k_max) == pytest.approx(exact, abs=1e-12)
    assert tie_level(table, k_max) == pytest.approx(exact, abs=1e-12)


def test_every_monotone_table_is_enumerated_once_with_its_exact_level() -> None:
    streams, out = _small(10, 2, 30)
    tables = out.tables  # type: ignore[attr-defined]
    assert len(set(tables)) == len(tables)
    expected = [
        t
        for m in range(6)
        for t in itertools.product(range(2, 11), repeat=m)
        if all(t[y] >= max(y + 1, 2) and t[y] <= 10 - y for y in range(m))
        and all(a <= b for a, b in itertools.pairwise(t))
    ]
    assert sorted(tables) == sorted(expected)
    for i in range(0, len(tables), 7):
        assert out.level[i] == pytest.approx(tie_level(tables[i], 10), abs=1e-12)  # type: ignore[attr-defined]
    assert np.isclose(streams.weight.sum(), 1.0)


def test_outcomes_equal_a_draw_by_draw_replay_of_the_raw_streams() -> None:
    """The depth-first pass, the vectorised evaluation and an independent replay of the
    same raw draws agree on every table checked."""
    k_max, k0, n = 10, 2, 30
    streams, out = _small(k_max, k0, n)
    tables = out.tables  # type: ignore[attr-defined]
    for idx in range(0, len(tables), 11):
        table = tables[idx]
        calls = cert = early = wrong = 0.0
        for i, dist in enumerate(SMALL):
            mode = 0 if list(dist).count(max(dist)) == 1 else None
            for draws in _raw_draws(dist, i, k_max, n):
                c, ok, bad = _replay(table, draws, mode, k_max, k0)
                calls, cert, wrong = calls + c, cert + ok, wrong + (ok and bad)
                early += ok and c < k_max
        total = len(SMALL) * n
        row = evaluate_table(streams, table, k0)
        for got, want in (
            (out.calls[idx], calls / total),  # type: ignore[attr-defined]
            (out.certified[idx], cert / total),  # type: ignore[attr-defined]
            (out.certified_early[idx], early / total),  # type: ignore[attr-defined]
            (out.wrong[idx], wrong / total),  # type: ignore[attr-defined]
            (row.calls, calls / total),
            (row.certified, cert / total),
        ):
            assert got == pytest.approx(want, abs=1e-12), table


def test_a_unanimous_item_by_hand() -> None:
    """K_max = 6, k0 = 1, delta = 0.1, answers always the same. b = (v,) certifies at v
    and has level 2^(1-v) at the tie: 0.25, 0.125, 0.0625, 0.03125 for v = 3..6. The best
    single table is v = 5 (5 calls). Mixing v = 4 (weight w) and v = 5: level
    0.125 w + 0.0625 (1 - w) <= 0.1 gives w = 0.6 and 4.4 calls, the best mixture."""
    streams = make_streams([(1.0,)], k_max=6, streams_per_item=5, seed=0)
    out = enumerate_tables(streams, 1)
    for v in (3, 4, 5, 6):
        assert out.level[out.index((v,))] == pytest.approx(2.0 ** (1 - v))
        assert out.calls[out.index((v,))] == v
    best = optimum(out, delta=0.1, certified_at_least=1.0)
    assert best.best_table == (5,) and best.best_table_saving == pytest.approx(1 / 6)
    assert best.calls == pytest.approx(4.4, abs=1e-9)
    assert dict(zip(best.tables, best.weights, strict=True)) == pytest.approx(
        {(4,): 0.6, (5,): 0.4}
    )
    assert best.level == pytest.approx(0.1)


def test_saving_alone_is_degenerate_so_certification_is_constrained() -> None:
    _, out = _small(10, 2, 30)
    free = optimum(out, delta=DELTA)  # type: ignore[arg-type]
    assert free.tables == ((),) and free.saving == pytest.approx(1 - 2 / 10)
    assert free.certified == 0.0
    with pytest.raises(InputError):
        optimum(out, delta=DELTA, certified_at_least=0.99)  # type: ignore[arg-type]


def test_the_lp_solution_is_feasible_checked_by_monte_carlo_at_the_tie() -> None:
    streams, out = _small(12, 3, 40)
    shipped = TruncatedRule(k0=3, k_max=12, delta=DELTA).boundary.needed  # a feasible point
    row = evaluate_table(streams, shipped, 3)
    best = optimum(out, delta=DELTA, certified_at_least=row.certified)  # type: ignore[arg-type]
    target = row.certified
    assert best.saving >= 1 - row.calls / 12 - 1e-12
    exact = sum(w * tie_level(t, 12) for t, w in zip(best.tables, best.weights, strict=True))
    assert exact <= DELTA + 1e-12
    assert best.certified >= target - 1e-9
    # The mixture simulated at an exact 50/50 tie (each run draws its table).
    rng = np.random.default_rng(2026)
    runs = 40_000
    picks = rng.choice(len(best.tables), size=runs, p=np.asarray(best.weights) / sum(best.weights))
    draws = rng.integers(0, 2, size=(runs, 12))
    hits = 0
    for pick, seq in zip(picks, draws, strict=True):
        _, ok, _ = _replay(best.tables[pick], seq, None, 12, 3)
        hits += ok
    assert abs(hits / runs - exact) <= 4 * np.sqrt(exact * (1 - exact) / runs)
    assert best.saving >= best.best_table_saving - 1e-12


@pytest.mark.slow
def test_the_optimum_is_at_least_the_shipped_rule_on_real_answers() -> None:
    items = load_answer_file(SMOLLM2)
    streams = make_streams(
        [it.probabilities for it in items], k_max=K_MAX, streams_per_item=60, seed=1
    )
    out = enumerate_tables(streams, K0)
    rule = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    assert isinstance(rule, TruncatedRule)
    shipped = evaluate_table(streams, rule.boundary.needed, K0)
    i = out.index(rule.boundary.needed)
    assert out.calls[i] == pytest.approx(shipped.calls, abs=1e-12)
    assert out.level[i] == pytest.approx(rule.boundary.level, abs=1e-15)
    best = optimum(
        out,
        delta=DELTA,
        certified_at_least=shipped.certified,
        certified_early_at_least=shipped.certified_early,
    )
    assert best.saving >= 1 - shipped.calls / K_MAX
    assert best.level <= DELTA + 1e-12 and best.certified >= shipped.certified - 1e-12
    # The shipped table is the best single table on these streams, so the two are equal
    # up to the order of the float sums (enumerate_tables against evaluate_table).
    assert best.best_table_saving >= 1 - shipped.calls / K_MAX - 1e-12
    assert len(out.tables) == 167_960


@pytest.mark.slow
def test_the_shipped_table_is_the_tuning_procedures_choice() -> None:
    """The documented procedure (``tune_table`` on the two tuning sets, 200 streams an
    item, seed 0, as ``bench/stopping_bench.py`` runs it) chooses the shipped table, whose
    exact level is <= delta; the held-out set is not read."""
    data = Path(__file__).resolve().parent.parent / "bench" / "data"
    tuning = []
    for name in ("smollm2_answers.json", "smollm2_tune.json"):
        items = load_answer_file(data / name)
        streams = make_streams(
            [it.probabilities for it in items], k_max=K_MAX, streams_per_item=200, seed=0
        )
        tuning.append((enumerate_tables(streams, K0), len(items)))
    evalue = truncated_boundary(K_MAX, K0, DELTA, DEFAULT_POINT_MASS).needed
    chosen = tune_table(tuning, baseline=evalue, delta=DELTA)
    shipped = get_stopping_rule("truncated", k0=K0, k_max=K_MAX, delta=DELTA, futility=True)
    assert isinstance(shipped, TruncatedRule)
    assert chosen == TUNED_TABLES[(K_MAX, K0, DELTA)]
    assert shipped.boundary.needed[: len(chosen)] == chosen
    assert table_level(chosen, K_MAX) == pytest.approx(shipped.boundary.level, abs=1e-15)
    assert shipped.boundary.level <= DELTA
    for outcomes, _ in tuning:  # the constraints, on each tuning set
        i, j = outcomes.index(chosen), outcomes.index(evalue)
        assert outcomes.certified[i] >= outcomes.certified[j]
        assert outcomes.certified_early[i] >= outcomes.certified_early[j]
        assert outcomes.calls[i] < outcomes.calls[j]


def test_tune_table_prefers_a_small_first_entry_only_within_tolerance() -> None:
    _, out = _small(12, 3, 40)
    assert isinstance(out, TableOutcomes)
    evalue = truncated_boundary(12, 3, 0.2, DEFAULT_POINT_MASS).needed
    j = out.index(evalue)
    ok = (out.level <= 0.2) & (out.certified >= out.certified[j])
    ok &= out.certified_early >= out.certified_early[j]
    best = tune_table([(out, 5)], baseline=evalue, delta=0.2, goal_saving=0.0, tolerance=0.0)
    assert out.calls[out.index(best)] == pytest.approx(out.calls[ok].min())
    for cap in range(3, 9):
        pref = [i for i in np.flatnonzero(ok) if out.tables[i] and out.tables[i][0] <= cap]
        loose = tune_table(
            [(out, 5)],
            baseline=evalue,
            delta=0.2,
            prefer_first_at_most=cap,
            goal_saving=0.0,
            tolerance=1.0,
        )
        if pref:
            assert loose[0] <= cap
            assert out.calls[out.index(loose)] == pytest.approx(min(out.calls[pref]))
        else:
            assert loose == best
    with pytest.raises(InputError):
        tune_table([], baseline=evalue, delta=0.2)
