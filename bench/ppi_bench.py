"""Judge-assisted (prediction-powered) reliability bound: coverage and review savings.

For judges of several kinds (biased towards yes, too strict, constant, good) and for
equal and unequal review probabilities, over many seeds: how often the one-sided 95%
lower bound is at or below the true P(top answer acceptable), and how far under it
sits, for relmon's stratified PPI bound (``monitor.core.ppi``), for the plain normal PPI
interval (lambda = 1, the interval of the PPI paper) and for the human-only
Clopper-Pearson bound on the same reviews. Then the review savings: how many human
reviews the human-only bound needs to sit as close under p as the PPI bound does.

Deterministic (fixed seeds); about a minute. Run: ``.venv/bin/python bench/ppi_bench.py``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy import stats

from monitor.core.conformal import reliability_lower_bound
from monitor.core.ppi import ppi_reliability

DELTA = 0.05
Z = float(stats.norm.ppf(1 - DELTA))
JUDGES = [  # name, p, P(J=1 | Y=1), P(J=1 | Y=0)
    ("says yes to most wrong answers", 0.8, 0.95, 0.7),
    ("always says yes", 0.7, 1.0, 1.0),
    ("too strict", 0.85, 0.6, 0.02),
    ("good (98% / 4%)", 0.8, 0.98, 0.04),
    ("good, high level", 0.95, 0.99, 0.1),
]


def plain_ppi_bound(j: np.ndarray, y: np.ndarray, jr: np.ndarray, w: np.ndarray) -> float:
    """The PPI paper's normal interval, lambda = 1, inclusion-weighted rectifier."""
    mean_j = float(j.mean())
    rect = float(w @ (y - jr)) / float(w.sum())
    var = float(j.var()) / j.size + float((w * w) @ (y - jr - rect) ** 2) / float(w.sum()) ** 2
    return mean_j + rect - Z * float(np.sqrt(var))


def one_case(
    p: float, sens: float, fpr: float, *, unequal: bool, seeds: int, items: int
) -> dict[str, float]:
    rng = np.random.default_rng(20261125)
    ours, plain, human, n_rev = [], [], [], []
    for _ in range(seeds):
        y = (rng.random(items) < p).astype(float)
        j = np.where(y == 1, rng.random(items) < sens, rng.random(items) < fpr).astype(float)
        pi = np.where(j == 0, 0.3, 0.05) if unequal else np.full(items, 0.1)
        reviewed = rng.random(items) < pi
        w = 1.0 / pi[reviewed]
        est = ppi_reliability(j, np.ones(items), y[reviewed], j[reviewed], w, delta=DELTA)
        assert est is not None
        ours.append(est.lower_bound)
        plain.append(plain_ppi_bound(j, y[reviewed], j[reviewed], w))
        n_rev.append(int(reviewed.sum()))
        if not unequal:
            human.append(
                reliability_lower_bound(float(y[reviewed].sum()), float(reviewed.sum()), DELTA)
            )
    row = {
        "reviews": float(np.mean(n_rev)),
        "ppi_coverage": float(np.mean(np.array(ours) <= p)),
        "ppi_gap": float(p - np.mean(ours)),
        "plain_coverage": float(np.mean(np.array(plain) <= p)),
        "plain_gap": float(p - np.mean(plain)),
    }
    if human:
        row["human_coverage"] = float(np.mean(np.array(human) <= p))
        row["human_gap"] = float(p - np.mean(human))
    return row


def reviews_for_gap(p: float, gap: float, seeds: int) -> int:
    """Smallest number of reviews whose mean human-only bound sits within ``gap`` of p."""
    rng = np.random.default_rng(1)
    n = 10
    while n < 100_000:
        k = rng.binomial(n, p, size=seeds)
        mean_bound = np.mean([reliability_lower_bound(float(x), float(n), DELTA) for x in k])
        if p - mean_bound <= gap:
            return n
        n = int(n * 1.05) + 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print(
        f"{args.items} scored items a window, one-sided {1 - DELTA:.0%} bounds, "
        f"{args.seeds} seeds a row\n"
    )
    print(
        "| judge | p | review probability | reviews | PPI (relmon) coverage | under p "
        "| plain PPI coverage | under p | human-only coverage | under p |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, p, sens, fpr in JUDGES:
        for unequal in (False, True):
            row = one_case(p, sens, fpr, unequal=unequal, seeds=args.seeds, items=args.items)
            rows.append({"judge": name, "p": p, "unequal": unequal, **row})
            probs = "0.3 if the judge says no, else 0.05" if unequal else "0.1"
            human = (
                f"{row['human_coverage']:.3f} | {row['human_gap']:.4f}"
                if "human_gap" in row
                else "– | –"
            )
            print(
                f"| {name} | {p} | {probs} | {row['reviews']:.0f} | {row['ppi_coverage']:.3f} | "
                f"{row['ppi_gap']:.4f} | {row['plain_coverage']:.3f} | "
                f"{row['plain_gap']:.4f} | {human} |"
            )
    print("\nReview savings at equal bound distance (equal review probability 0.1):\n")
    print("| judge | reviews with the judge | human-only reviews for the same distance | saving |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        if row["unequal"]:
            continue
        needed = reviews_for_gap(row["p"], row["ppi_gap"], 400)
        row["human_reviews_for_same_gap"] = needed
        print(
            f"| {row['judge']} | {row['reviews']:.0f} | {needed} | "
            f"{1 - row['reviews'] / needed:.0%} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
