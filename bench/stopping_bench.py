"""Model calls per item: relmon's default stopping rule against its previous default, fixed
K_max, the paper's rule, the sequential rule of the public TrustGate library, Early-Stopping
Self-Consistency and Adaptive-Consistency, with the wrong-mode rate beside each, on the
same random draws.

Rules (K_max = 20 for all; k0 = 3 and delta = 0.05 for relmon's):

- ``default``: the service's default, ``truncated`` with the futility stop (at these
  settings its tuned table, ``TUNED_TABLES`` in ``monitor/core/stopping_boundary.py``);
- ``evalue``: the default before the tuning, ``truncated`` with the futility stop and the
  e-value construction's table (``point_mass=0.25`` given explicitly);
- ``previous``: the previous default, ``runner-up`` with the futility stop;
- ``fixed``: always K_max (the baseline every ratio is against);
- ``paper``: ``hoeffding``, the paper's section 9 rule as printed;
- ``trustgate``: ``theaios.trustgate.sequential.should_stop`` (PyPI ``theaios-trustgate``)
  applied to canonical classes, as its ``SequentialSampler`` drives it: 3 samples, then
  one at a time until ``should_stop`` holds or K_max is reached;
- ``esc``: Early-Stopping Self-Consistency (Li et al., ICLR 2024) with window 5: sample
  5 at a time, stop as soon as the 5 answers of a window all agree, at most K_max;
- ``adaptive``: Adaptive-Consistency (Aggarwal et al., EMNLP 2023) with its default Beta
  criterion at threshold 0.95: after every sample, stop once P(p1 > p2) >= 0.95 under the
  Beta(n1 + 1, n2 + 1) posterior of the top two counts, at most K_max.

ESC and Adaptive-Consistency claim no error level; their early stops count as
certifications for the wrong-mode rate (a stop on a leader that is not the true mode).

Data sets, each item an answer distribution over canonical classes with a known true
mode (items drawn with replacement in the batches each rule asks for):

- ``demo mix``: the demo's simulated model (quality 0.92 minus a per-question
  difficulty of 0, 0.05, 0.1, 0.25 or 0.45; wrong answers spread over five values): mostly
  easy items, some hard ones;
- ``stress grid``: the validation grid of ``relmon simulate stopping --grid`` (clear
  modes, near ties, exact ties, long tails), each distribution equally weighted;
- ``smollm2``: the empirical answer distributions of SmolLM2-135M on 48 questions
  (``bench/data/smollm2_answers.json``, 20 real answers each);
- ``smollm2 tune``: 80 more questions of four kinds (arithmetic, multiple choice, capitals,
  other short facts; ``bench/data/smollm2_tune.json``);
- ``smollm2 held-out``: 80 other questions of the same four kinds
  (``bench/data/smollm2_heldout.json``).

Tuned and held out: the shipped table was chosen on ``smollm2`` and ``smollm2 tune`` only
(:func:`monitor.core.stopping_optimum.tune_table` on ``OPTIMUM_STREAMS`` fixed streams an
item, seed 0: the largest pooled saving among the tables with exact level <= delta that
certify, and certify before K_max, no less than the e-value table on each tuning set).
``smollm2 held-out`` is never used to choose anything: it is the set the goals (>= 45%
saved, worst item <= delta, certified early no lower than before, within 2 points of the
best single table) are read on (``bench/smollm2_answers.py`` says how the questions were
split before recording).

The oracle (:mod:`monitor.core.stopping_optimum`), on each real set: among the rules of
the shipped rule's class (certification region on the leader's and runner-up's counts,
monotone, futility stop) whose exact level at the two-class tie is <= delta and which
certify at least the e-value table's share of items, and before K_max at least its share
(the constraints the shipped table was chosen under), on the same fixed answer streams
(``OPTIMUM_STREAMS`` per item): the best single table (the comparator: a deterministic
rule, chosen with hindsight on that set) and the randomised LP optimum (a mixture of
tables; reported for transparency, not a target: it flips a coin per item between tables,
so whether an item is certified would depend on the coin). The shipped and e-value tables'
rows on those streams are printed beside them.

Reported per rule: calls per item and its ratio to fixed K_max, certified share,
wrong-mode rate (certified with a leader that is not the true mode, over all items; an
exact tie has no true mode, so any certification there is wrong) and its largest value
on a single item (what delta bounds, item by item), the share of items
whose top answer is not the true mode (any rule, certified or not) and top-answer
accuracy. Deterministic for a given seed.

    .venv/bin/python bench/stopping_bench.py [--reps 400] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib
from scipy import special

from monitor.app.simulate.real_stopping import RealItem, load_answer_file, replay_top
from monitor.app.simulate.sequential import GRID, describe_distribution
from monitor.core.stopping import (
    DEFAULT_FUTILITY,
    DEFAULT_RULE,
    Decision,
    StoppingRule,
    TruncatedRule,
    get_stopping_rule,
)
from monitor.core.stopping_boundary import DEFAULT_POINT_MASS, truncated_boundary
from monitor.core.stopping_optimum import (
    TableOutcomes,
    TableRow,
    enumerate_tables,
    evaluate_table,
    make_streams,
    optimum,
    tune_table,
)

K0, K_MAX, DELTA = 3, 20, 0.05
DEMO_QUALITY = 0.92
DEMO_WRONG = (1, -1, 10, -10, 2)  # the demo model's spread of wrong answers
DEMO_DIFFICULTIES = (0.0, 0.0, 0.0, 0.05, 0.1, 0.25, 0.45)  # as its QuestionBank draws them
DATA = Path(__file__).resolve().parent / "data"
SMOLLM2 = DATA / "smollm2_answers.json"
REAL_SETS = {
    "smollm2": SMOLLM2,
    "smollm2 tune": DATA / "smollm2_tune.json",
    "smollm2 held-out": DATA / "smollm2_heldout.json",
}
OPTIMUM_STREAMS = 200


class TrustGateRule:
    """TrustGate's sequential stop on canonical classes, in relmon's rule interface.

    ``should_stop`` takes a list of answers; the classes' indices stand for the canonical
    answers, so two surface forms of one answer count as one (relmon's canonicalization
    comes first, as the brief of the comparison asks).
    """

    name = "trustgate"

    def __init__(self, *, k_max: int, delta: float) -> None:
        from theaios.trustgate.sequential import should_stop

        self._should_stop = should_stop
        self._k0 = min(3, k_max)  # SequentialSampler's first batch
        self._k_max = k_max
        self._delta = delta

    @property
    def k0(self) -> int:
        return self._k0

    @property
    def k_max(self) -> int:
        return self._k_max

    @property
    def delta(self) -> float:
        return self._delta

    def certified(self, counts: Iterable[int]) -> bool:
        c = [int(x) for x in counts]
        labels = [str(i) for i, n in enumerate(c) for _ in range(n)]
        return bool(self._should_stop(labels, k=len(labels), delta=self._delta))

    def decide(self, counts: Iterable[int]) -> Decision:
        c = [int(x) for x in counts]
        k = sum(c)
        if k < self._k0:
            return Decision(stop=False, certified=False, more=self._k0 - k)
        if self.certified(c):
            return Decision(stop=True, certified=True, more=0)
        if k >= self._k_max:
            return Decision(stop=True, certified=False, more=0)
        return Decision(stop=False, certified=False, more=1)


class _PeerRule:
    """A published rule driven through relmon's interface (``decide`` on class counts)."""

    name = "peer"

    def __init__(self, *, k_max: int) -> None:
        self._k_max = k_max

    @property
    def k0(self) -> int:
        return 1

    @property
    def k_max(self) -> int:
        return self._k_max

    @property
    def delta(self) -> float:
        return float("nan")  # no error level is claimed

    def certified(self, counts: Iterable[int]) -> bool:
        return False


class EarlyStoppingSCRule(_PeerRule):
    """ESC: windows of ``window`` samples; stop when one window's answers all agree.

    ``decide`` sees cumulative counts, so the rule keeps the counts at the last window's
    start (reset when an item starts with no counts).
    """

    name = "esc"

    def __init__(self, *, k_max: int, window: int = 5) -> None:
        super().__init__(k_max=k_max)
        self._window = window
        self._start: list[int] = []

    def decide(self, counts: Iterable[int]) -> Decision:
        c = [int(x) for x in counts]
        k = sum(c)
        start = self._start if k and len(self._start) == len(c) else [0] * len(c)
        self._start = c
        window = [a - b for a, b in zip(c, start, strict=True)]
        if window and max(window) == sum(window) == self._window:
            return Decision(stop=True, certified=True, more=0)
        if k >= self._k_max:
            return Decision(stop=True, certified=False, more=0)
        return Decision(stop=False, certified=False, more=min(self._window, self._k_max - k))


class AdaptiveConsistencyRule(_PeerRule):
    """Adaptive-Consistency's Beta criterion: P(p1 > p2 | n1, n2) >= ``threshold``, where
    the probability is the mass above 1/2 of Beta(n1 + 1, n2 + 1), checked after every
    sample."""

    name = "adaptive"

    def __init__(self, *, k_max: int, threshold: float = 0.95) -> None:
        super().__init__(k_max=k_max)
        self._threshold = threshold

    def decide(self, counts: Iterable[int]) -> Decision:
        c = sorted((int(x) for x in counts if x > 0), reverse=True)
        k = sum(c)
        if c:
            n1, n2 = c[0], c[1] if len(c) > 1 else 0
            if float(special.betainc(n2 + 1, n1 + 1, 0.5)) >= self._threshold:
                return Decision(stop=True, certified=True, more=0)
        if k >= self._k_max:
            return Decision(stop=True, certified=False, more=0)
        return Decision(stop=False, certified=False, more=1)


def rules() -> dict[str, StoppingRule]:
    common = {"k0": K0, "k_max": K_MAX, "delta": DELTA}
    return {
        "default": get_stopping_rule(DEFAULT_RULE, futility=DEFAULT_FUTILITY, **common),
        "evalue": get_stopping_rule(
            "truncated", futility=True, point_mass=DEFAULT_POINT_MASS, **common
        ),
        "previous": get_stopping_rule("runner-up", futility=True, **common),
        "fixed": get_stopping_rule("fixed", **common),
        "paper": get_stopping_rule("hoeffding", **common),
        "trustgate": TrustGateRule(k_max=K_MAX, delta=DELTA),
        "esc": EarlyStoppingSCRule(k_max=K_MAX, window=5),
        "adaptive": AdaptiveConsistencyRule(k_max=K_MAX, threshold=0.95),
    }


def demo_mix() -> list[RealItem]:
    """The demo model's answer distributions, one item per difficulty of its question bank
    (0 three times out of seven, 0.05, 0.1, 0.25 and 0.45 once each)."""
    items = []
    for i, difficulty in enumerate(DEMO_DIFFICULTIES):
        right = DEMO_QUALITY - difficulty
        probs = {"0": right} | {str(w): (1 - right) / len(DEMO_WRONG) for w in DEMO_WRONG}
        classes = tuple(sorted(probs))
        items.append(
            RealItem(
                f"demo-{i}-difficulty-{difficulty:g}",
                classes,
                tuple(probs[c] for c in classes),
                frozenset({"0"}),
            )
        )
    return items


def stress_grid() -> list[RealItem]:
    items = []
    for i, (kind, dist) in enumerate(GRID):
        classes = tuple(f"c{j}" for j in range(len(dist)))
        items.append(
            RealItem(
                f"{kind}:{describe_distribution(dist)}#{i}",
                classes,
                tuple(dist),
                frozenset({"c0"}),  # the first class is always (one of) the most likely
            )
        )
    return items


def measure(items: Sequence[RealItem], reps: int, seed: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, rule in rules().items():
        calls = certified = early = wrong = top_off = right = 0
        worst = 0.0
        for i, item in enumerate(items):
            mode = item.true_mode
            wrong_before = wrong
            for r in range(reps):
                used, cert, top = replay_top(rule, item, np.random.default_rng([seed, i, r]))
                calls += used
                certified += cert
                early += cert and used < K_MAX
                wrong += cert and (mode is None or top != mode)
                top_off += mode is None or top != mode
                right += top in item.acceptable
            worst = max(worst, (wrong - wrong_before) / reps)
        n = len(items) * reps
        out[name] = {
            "calls_per_item": calls / n,
            "ratio_to_fixed": calls / n / K_MAX,
            "certified": certified / n,
            "certified_early": early / n,
            "wrong_mode": wrong / n,
            "wrong_among_certified": wrong / certified if certified else 0.0,
            "worst_item_wrong_mode": worst,
            "top_not_mode": top_off / n,
            "top_accuracy": right / n,
        }
    return out


TUNING_SETS = ("smollm2", "smollm2 tune")
"""The real sets the shipped table may be chosen on (never ``smollm2 held-out``)."""


def _row(r: TableRow) -> dict[str, float]:
    return {
        "calls_per_item": r.calls,
        "saving": 1 - r.calls / K_MAX,
        "certified": r.certified,
        "certified_early": r.certified_early,
        "wrong_mode": r.wrong,
        "worst_item_wrong_mode": max(r.per_item_wrong),
    }


def optimum_rows(items: Sequence[RealItem], seed: int) -> tuple[dict[str, Any], TableOutcomes]:
    """The oracle (best single table, randomised LP optimum) beside the shipped and the
    e-value tables on the same fixed streams; and every table's outcomes (for tuning)."""
    streams = make_streams(
        [it.probabilities for it in items],
        k_max=K_MAX,
        streams_per_item=OPTIMUM_STREAMS,
        seed=seed,
    )
    outcomes = enumerate_tables(streams, K0)
    default = rules()["default"]
    assert isinstance(default, TruncatedRule)
    shipped_table = default.boundary.needed
    evalue_table = truncated_boundary(K_MAX, K0, DELTA, DEFAULT_POINT_MASS).needed
    shipped = evaluate_table(streams, shipped_table, K0)
    evalue = evaluate_table(streams, evalue_table, K0)
    best = optimum(
        outcomes,
        delta=DELTA,
        certified_at_least=evalue.certified,
        certified_early_at_least=evalue.certified_early,
    )
    mixed = TableRow(best.calls, best.certified, best.certified_early, best.wrong, (0.0,))
    per_item = np.zeros(len(items))
    for table, weight in zip(best.tables, best.weights, strict=True):
        per_item += weight * np.asarray(evaluate_table(streams, table, K0).per_item_wrong)
    single = evaluate_table(streams, best.best_table, K0)
    return {
        "streams_per_item": OPTIMUM_STREAMS,
        "tables": len(outcomes.tables),
        "shipped_table": [int(v) for v in shipped_table if v <= K_MAX],
        "shipped_level": float(outcomes.level[outcomes.index(shipped_table)]),
        "evalue_table": [int(v) for v in evalue_table if v <= K_MAX],
        "optimum_tables": [[*t] for t in best.tables],
        "optimum_weights": list(best.weights),
        "optimum_level": best.level,
        "best_table": [*best.best_table],
        "best_table_level": float(outcomes.level[outcomes.index(best.best_table)]),
        "shipped": _row(shipped),
        "evalue": _row(evalue),
        "optimum": _row(mixed) | {"worst_item_wrong_mode": float(per_item.max())},
        "best_table_row": _row(single),
    }, outcomes


def tuning(outcomes: dict[str, tuple[TableOutcomes, int]], seed: int) -> dict[str, Any]:
    """The documented procedure re-run on the tuning sets: the table it chooses."""
    chosen = tune_table(
        [outcomes[name] for name in TUNING_SETS],
        baseline=truncated_boundary(K_MAX, K0, DELTA, DEFAULT_POINT_MASS).needed,
        delta=DELTA,
    )
    default = rules()["default"]
    assert isinstance(default, TruncatedRule)
    return {
        "sets": list(TUNING_SETS),
        "streams_per_item": OPTIMUM_STREAMS,
        "seed": seed,
        "chosen": [*chosen],
        "shipped": [int(v) for v in default.boundary.needed if v <= K_MAX],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400, help="replays per item")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="few replays (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.reps = 3
    start_machine = benchlib.machine()
    datasets = {
        "demo mix": demo_mix(),
        "stress grid": stress_grid(),
        **{name: load_answer_file(path) for name, path in REAL_SETS.items()},
    }
    report: dict[str, Any] = {
        "benchmark": "stopping",
        "k0": K0,
        "k_max": K_MAX,
        "delta": DELTA,
        "reps": args.reps,
        "seed": args.seed,
        "machine": start_machine,
        "datasets": {},
    }
    enumerated: dict[str, tuple[TableOutcomes, int]] = {}
    for name, items in datasets.items():
        rows = measure(items, args.reps, args.seed)
        report["datasets"][name] = {"items": len(items), "rules": rows}
        if name in REAL_SETS:
            opt, outcomes = optimum_rows(items, args.seed)
            report["datasets"][name]["optimum"] = opt
            enumerated[name] = (outcomes, len(items))
            print(f"{name}: best single table {opt['best_table_row']}, shipped {opt['shipped']}")
        print(f"{name}: {len(items)} items x {args.reps} replays")
        for rule, row in rows.items():
            print(
                f"  {rule:10s} {row['calls_per_item']:6.2f} calls/item "
                f"(x{row['ratio_to_fixed']:.2f} of fixed K_max)  certified {row['certified']:.3f}"
                f" (early {row['certified_early']:.3f})"
                f"  wrong mode {row['wrong_mode']:.4f}  top != mode {row['top_not_mode']:.4f}"
                f"  top acc. {row['top_accuracy']:.3f}"
            )
    report["tuning"] = tuned = tuning(enumerated, args.seed)
    print(f"tuning procedure on {TUNING_SETS}: {tuned['chosen']} (shipped {tuned['shipped']})")
    if args.json:
        benchlib.write_json(report, args.json)


if __name__ == "__main__":
    main()
