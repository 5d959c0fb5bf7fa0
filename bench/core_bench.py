"""Per-item cost of the statistics core, against a bare baseline measured in the same run.

For one item of K answers the service canonicalizes, ranks, asks the stopping rule and
scores. The baseline is the least any implementation must do: count the raw strings
with collections.Counter. Reported as ratios to that baseline (machines here are shared
and noisy, so absolute times mean little).

The last two rows price answer redaction on the hot path: with ``redaction.answers``
the service redacts every distinct answer of an item (every shipped rule) before the
``text`` canonicalizer sees it, so their difference is what redaction adds per item.

    .venv/bin/python bench/core_bench.py [--items N] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib

from monitor.core.canon import get_canonicalizer
from monitor.core.consensus import rank_classes
from monitor.core.redaction import Redactor
from monitor.core.scores import rank_score
from monitor.core.stopping import get_stopping_rule


def _items(n: int, k: int, rng: np.random.Generator) -> list[list[str]]:
    forms = ["{v}", "The answer is {v}.", "#### {v}", "${v}.00", "so we get {v} apples"]
    out = []
    for _ in range(n):
        truth = int(rng.integers(1, 10_000))
        values = rng.choice([truth, truth + 1, truth - 7], p=[0.7, 0.2, 0.1], size=k)
        out.append([forms[int(rng.integers(len(forms)))].format(v=int(v)) for v in values])
    return out


def _medians(steps: list[tuple[str, Callable[[], None]]], repeats: int) -> list[float]:
    """The median time of each step, the steps taking turns (one pass of each per round),
    so that a change of load on a shared machine weighs on every step alike."""
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for i, (_, fn) in enumerate(steps):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [benchlib.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="few items (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.items, args.repeats = 50, 2
    start_machine = benchlib.machine()
    items = _items(args.items, args.k, np.random.default_rng(0))
    canon = get_canonicalizer("numeric")
    text = get_canonicalizer("text")
    redactor = Redactor.default()
    rule = get_stopping_rule(k_max=args.k)

    def baseline() -> None:
        for answers in items:
            Counter(answers).most_common()

    def canonicalize() -> None:
        for answers in items:
            [canon.canonicalize(a) for a in answers]

    def full() -> None:
        rng = np.random.default_rng(1)
        for answers in items:
            classes = [canon.canonicalize(a) for a in answers]
            consensus = rank_classes(classes, rng)
            rule.decide(consensus.counts)
            rank_score(consensus, {classes[0]})

    def text_canonicalize() -> None:
        for answers in items:
            [text.canonicalize(a) for a in answers]

    def redact_text_canonicalize() -> None:
        for answers in items:
            [text.canonicalize(a) for a in redactor.redact_all(answers)]

    steps = [
        ("Counter baseline", baseline),
        ("numeric canonicalize", canonicalize),
        ("canonicalize+rank+stop+score", full),
        ("text canonicalize", text_canonicalize),
        ("redact+text canonicalize", redact_text_canonicalize),
    ]
    medians = _medians(steps, args.repeats)
    base = medians[0]
    rows = [(name, t) for (name, _), t in zip(steps, medians, strict=True)]
    print(f"{args.items} items x K={args.k}, median of {args.repeats} rounds")
    for name, t in rows:
        per_item = t / args.items * 1e6
        print(f"{name:<30} {per_item:9.1f} us/item  {t / base:7.1f}x baseline")
    if args.json:
        report = {
            "benchmark": "core",
            "items": args.items,
            "k": args.k,
            "repeats": args.repeats,
            "machine": start_machine,
            "rows": [
                {"name": name, "us_per_item": t / args.items * 1e6, "ratio": t / base}
                for name, t in rows
            ],
        }
        benchlib.write_json(report, args.json)


if __name__ == "__main__":
    main()
