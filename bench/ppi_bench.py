"""Judge-assisted (prediction-powered) reliability bound: coverage and width, any judge.

Simulated deployments: ``items`` judged items a window, true reliability ``p``, a judge
of one of seven kinds, humans reviewing a random subset with known probabilities (equal,
or three times more often where the judge says no), 30 to 300 reviews. For every cell
and seed, on the same draws:

- ``relmon``: the bound relmon exports, ``monitor.core.ppi.ppi_reliability``
  (stratified by the judge's label, Clopper-Pearson carried over to the strata's sum);
- ``previous``: the bound of the previous release (the same strata, each treated with
  Agresti-Coull, normal combination), kept here verbatim for comparison;
- ``human-only``: relmon's own ``relmon_reliability_lower_bound`` on the same reviews
  (Clopper-Pearson from effective counts, weights 1/pi);
- ``plain PPI``: the normal interval of the PPI paper (lambda = 1).

Reported per cell: coverage (share of seeds whose one-sided 95% bound is at or below p)
and the mean distance under p, as a ratio to the human-only one ("x0.70": 30% closer to
the truth than humans alone on the same reviews). Deterministic (fixed seeds).

    .venv/bin/python bench/ppi_bench.py [--seeds 2000] [--jobs 2]

About 15 minutes on 2 cores at 2,000 seeds; writes ``bench/results/ppi.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from monitor.core.conformal import reliability_lower_bound
from monitor.core.ppi import ppi_reliability

DELTA = 0.05
Z = float(stats.norm.ppf(1 - DELTA))
OUT = Path(__file__).resolve().parent / "results" / "ppi.json"
JUDGES = {  # name: (P(J=1 | Y=1), P(J=1 | Y=0))
    "good": (0.98, 0.04),
    "lenient": (0.95, 0.8),
    "lenient, yes to all right": (1.0, 0.8),
    "strict": (0.6, 0.02),
    "constant": (1.0, 1.0),
    "anti-correlated": (0.2, 0.8),
    "random": (0.5, 0.5),
}
LEVELS = (0.6, 0.85, 0.97)
REVIEWS = (30, 100, 300)
ITEMS = 3000
ISSUE_CELLS = (  # held-out cells measured outside the grid
    # the previous release's bound under-covered in these two
    (0.6, "lenient, yes to all right", 2000, 40, False),
    (0.85, "lenient, yes to all right", 5000, 250, False),
    # a random judge, reviews three times as likely where it says no: x1.13 (x1.19 held out)
    (0.97, "random", 2000, 40, True),
)


def previous_bound(
    j: np.ndarray, y: np.ndarray, jr: np.ndarray, w: np.ndarray, delta: float = DELTA
) -> float:
    """The previous release's bound: Agresti-Coull per judge stratum, normal sum."""
    z = float(stats.norm.ppf(1 - delta))
    p1 = float(j.mean())
    var_p1 = p1 * (1 - p1) / j.size
    overall = float(w @ y) / float(w.sum())
    adjusted, variance, rates = [], [], []
    for s in (1.0, 0.0):
        ws, ys = w[jr == s], y[jr == s]
        n = float(ws.sum() ** 2 / (ws * ws).sum()) if ws.size else 0.0
        rate = float(ws @ ys) / float(ws.sum()) if ws.size else 0.0
        rates.append(rate if ws.size else overall)
        a = (rate * n + z * z / 2) / (n + z * z)
        adjusted.append(a)
        variance.append(a * (1 - a) / (n + z * z))
    centre = p1 * adjusted[0] + (1 - p1) * adjusted[1]
    var = (
        p1 * p1 * variance[0]
        + (1 - p1) ** 2 * variance[1]
        + var_p1 * (adjusted[0] - adjusted[1]) ** 2
    )
    level = p1 * rates[0] + (1 - p1) * rates[1]
    return float(min(np.clip(centre - z * np.sqrt(var), 0.0, 1.0), level))


def plain_ppi_bound(j: np.ndarray, y: np.ndarray, jr: np.ndarray, w: np.ndarray) -> float:
    """The PPI paper's normal interval, lambda = 1, inclusion-weighted rectifier."""
    rect = float(w @ (y - jr)) / float(w.sum())
    var = float(j.var()) / j.size + float((w * w) @ (y - jr - rect) ** 2) / float(w.sum()) ** 2
    return float(j.mean()) + rect - Z * float(np.sqrt(var))


def human_bound(y: np.ndarray, w: np.ndarray) -> float:
    """relmon's human-only bound: Clopper-Pearson from effective counts."""
    n = float(w.sum() ** 2 / (w * w).sum())
    return reliability_lower_bound(float(w @ y) / float(w.sum()) * n, n, DELTA)


Cell = tuple[float, str, int, int, bool, int]
"""(p, judge, judged items, expected reviews, unequal probabilities, seeds)."""


def cell(spec: Cell) -> dict[str, Any]:
    p, judge, items, reviews, unequal, seeds = spec
    sens, fpr = JUDGES[judge]
    rng = np.random.default_rng([int(p * 1000), items, reviews, int(unequal), 20261127])
    bounds: dict[str, list[float]] = {"relmon": [], "previous": [], "human": [], "plain": []}
    n_rev = []
    for _ in range(seeds):
        y = (rng.random(items) < p).astype(float)
        j = np.where(y == 1, rng.random(items) < sens, rng.random(items) < fpr).astype(float)
        pi = np.where(j == 0, 3.0, 1.0) if unequal else np.ones(items)
        pi = np.minimum(pi * reviews / pi.sum(), 1.0)
        seen = rng.random(items) < pi
        if seen.sum() < 2:
            continue
        yr, jr, w = y[seen], j[seen], 1.0 / pi[seen]
        est = ppi_reliability(j, np.ones(items), yr, jr, w, delta=DELTA, min_reviews=0)
        assert est is not None
        bounds["relmon"].append(est.lower_bound)
        bounds["previous"].append(previous_bound(j, yr, jr, w))
        bounds["human"].append(human_bound(yr, w))
        bounds["plain"].append(plain_ppi_bound(j, yr, jr, w))
        n_rev.append(int(seen.sum()))
    b = {k: np.array(v) for k, v in bounds.items()}
    under = {k: float(np.mean(p - v)) for k, v in b.items()}
    return {
        "p": p,
        "judge": judge,
        "items": items,
        "reviews": float(np.mean(n_rev)),
        "unequal": unequal,
        "seeds": len(n_rev),
        **{f"{k}_coverage": float(np.mean(v <= p)) for k, v in b.items()},
        **{f"{k}_under": under[k] for k in b},
        "relmon_vs_human": under["relmon"] / under["human"],
        "previous_vs_human": under["previous"] / under["human"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cells: list[Cell] = [
        (p, judge, ITEMS, r, unequal, args.seeds)
        for p in LEVELS
        for judge in JUDGES
        for r in REVIEWS
        for unequal in (False, True)
    ] + [(*c, args.seeds) for c in ISSUE_CELLS]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(cell, cells))
    doc = {"seeds": args.seeds, "delta": DELTA, "items": ITEMS, "judges": JUDGES, "rows": rows}
    doc["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        print(
            f"{row['p']:.2f} {row['judge']:26s} {row['reviews']:5.0f} "
            f"{'3x where no' if row['unequal'] else 'equal':11s} "
            f"relmon {row['relmon_coverage']:.3f} x{row['relmon_vs_human']:.2f} | "
            f"previous {row['previous_coverage']:.3f} x{row['previous_vs_human']:.2f} | "
            f"human {row['human_coverage']:.3f} | plain {row['plain_coverage']:.3f}"
        )


if __name__ == "__main__":
    main()
