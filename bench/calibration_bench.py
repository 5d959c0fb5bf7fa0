"""Calibration cost: time per verdict and per scrape of the incremental calibration window
with 10k and 100k items, against recomputing from scratch; memory per window item.

For each size n the window (``monitor.core.window.CalibrationWindow``, the service's seven
default alphas, half-life 1 h, review probabilities 0.1 and 1) is filled to n items, so
every further verdict evicts the oldest. Measured:

- verdict: ``add`` of one verdict (the periodic exact recomputation included,
  amortized over a full turn of the window), and ``add`` + ``snapshot`` (what the
  service does per applied verdict: it publishes the gauges at once);
- scrape: ``snapshot(now)`` (thresholds, level, bound, n_eff).

The baseline recomputes from scratch, vectorised with numpy: the window's scores,
sampling times and review probabilities held in ring buffers (a verdict is an O(1)
write), each scrape computing every weight 2^-(age/h)/pi, one sort, the cumulative
masses, the thresholds, the level and the bound. Both give the same thresholds (checked).
Memory: ``tracemalloc`` around filling a window of n items with 36-character item ids
(the ids the window keeps alive are counted). Times are medians over ``--repeats``.

    .venv/bin/python bench/calibration_bench.py [--sizes 10000 100000] [--json FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib

from monitor.core.conformal import reliability_lower_bound
from monitor.core.window import CalibrationWindow

ALPHAS = (0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
HALF_LIFE = 3600.0
K_MAX = 20
PI_MIN = 0.1
DT = 0.5  # seconds between verdicts' sampling times


def _records(n: int, start: int, rng: np.random.Generator) -> list[tuple[str, float, float, float]]:
    """n (item id, score, pi, t): ranks mostly 1, a tail up to K_MAX, some +inf."""
    ranks = rng.choice(
        [1.0, 2.0, 3.0, 5.0, 8.0, 20.0, math.inf],
        p=[0.8, 0.08, 0.04, 0.03, 0.02, 0.01, 0.02],
        size=n,
    )
    pis = rng.choice([PI_MIN, 1.0], size=n)
    return [
        (str(uuid.UUID(int=int(rng.integers(2**63)) + i)), float(s), float(p), (start + i) * DT)
        for i, (s, p) in enumerate(zip(ranks, pis, strict=True))
    ]


class Naive:
    """From scratch at every scrape, over ring buffers of the last n verdicts."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.scores = np.zeros(n)
        self.t = np.zeros(n)
        self.pi = np.ones(n)
        self.size = 0
        self.pos = 0

    def add(self, score: float, pi: float, t: float) -> None:
        self.scores[self.pos], self.t[self.pos], self.pi[self.pos] = score, t, pi
        self.pos = (self.pos + 1) % self.n
        self.size = min(self.size + 1, self.n)

    def snapshot(self, now: float) -> dict[str, Any]:
        s, t, pi = self.scores[: self.size], self.t[: self.size], self.pi[: self.size]
        w = np.exp2(-(now - t) / HALF_LIFE) / pi
        test = 1.0 / PI_MIN
        order = np.argsort(s, kind="stable")
        s_sorted = s[order]
        total = float(w.sum())
        mass = np.cumsum(w[order]) / (total + test)
        last = np.append(s_sorted[1:] != s_sorted[:-1], True)
        thresholds = {}
        for alpha in ALPHAS:
            hit = np.flatnonzero(last & (mass >= (1.0 - alpha) - 1e-10))
            thresholds[alpha] = float(s_sorted[hit[0]]) if hit.size else math.inf
        good = float(w[s <= 1.0].sum())
        n_eff = total**2 / float((w * w).sum())
        bound = reliability_lower_bound(good / total * n_eff, n_eff, 0.05)
        return {"thresholds": thresholds, "level": good / (total + test), "bound": bound}


def _per_call(fn: Any, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``fn`` called ``calls`` times."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return benchlib.median(times)


def bench_size(n: int, repeats: int, verdicts: int) -> dict[str, Any]:
    rng = np.random.default_rng(n)
    fill = _records(n, 0, rng)
    more = _records(n, n, rng)  # enough fresh verdicts for a full turn of the window

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = [r[0] for r in fill]
    window = CalibrationWindow(
        alphas=ALPHAS, max_items=n, half_life_s=HALF_LIFE, min_inclusion_probability=PI_MIN
    )
    for r in fill:
        window.add(*r)
    del ids
    bytes_per_item = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()

    naive = Naive(n)
    for _, s, p, t in fill:
        naive.add(s, p, t)

    it = iter(more)
    now = [fill[-1][3]]

    def window_add() -> None:
        r = next(it)
        window.add(*r)
        now[0] = r[3]

    # A full turn of the window, so the periodic exact recomputation is included once.
    turn = min(n, len(more))
    start = time.perf_counter()
    for _ in range(turn):
        window_add()
    add_s = (time.perf_counter() - start) / turn

    extra = iter(_records(verdicts * repeats * 2, 2 * n, rng))

    def window_verdict() -> None:
        r = next(extra)
        window.add(*r)
        window.snapshot(r[3])

    def naive_verdict() -> None:
        r = next(extra)
        naive.add(r[1], r[2], r[3])
        naive.snapshot(r[3])

    # Bring the naive ring to the same verdicts as the window before comparing.
    for _, s, p, t in more[:turn]:
        naive.add(s, p, t)
    t_now = now[0]
    snap = window.snapshot(t_now)
    ref = naive.snapshot(t_now)
    agree = all(snap.thresholds[a] == ref["thresholds"][a] for a in ALPHAS) and math.isclose(
        snap.reliability_level, ref["level"], rel_tol=1e-6
    )

    scrape = _per_call(lambda: window.snapshot(t_now), 200, repeats)
    naive_scrape = _per_call(lambda: naive.snapshot(t_now), max(3, 2_000_000 // n // 10), repeats)
    verdict = _per_call(window_verdict, verdicts, repeats)
    naive_v = _per_call(naive_verdict, verdicts, repeats)
    return {
        "items": n,
        "thresholds_agree": agree,
        "add_us": add_s * 1e6,
        "verdict_us": verdict * 1e6,
        "naive_verdict_us": naive_v * 1e6,
        "verdict_speedup": naive_v / verdict,
        "scrape_us": scrape * 1e6,
        "naive_scrape_us": naive_scrape * 1e6,
        "scrape_speedup": naive_scrape / scrape,
        "bytes_per_item": bytes_per_item,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--verdicts", type=int, default=20, help="verdicts timed a repeat")
    parser.add_argument("--quick", action="store_true", help="small windows (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.verdicts = [500, 2000], 2, 5
    report: dict[str, Any] = {
        "benchmark": "calibration",
        "alphas": list(ALPHAS),
        "repeats": args.repeats,
        "machine": benchlib.machine(),
        "sizes": [],
    }
    for n in args.sizes:
        row = bench_size(n, args.repeats, args.verdicts)
        report["sizes"].append(row)
        print(
            f"n={n:>7,}: add {row['add_us']:.2f} us; verdict (add+snapshot) "
            f"{row['verdict_us']:.1f} us vs naive {row['naive_verdict_us']:.1f} us "
            f"(x{row['verdict_speedup']:.0f}); scrape {row['scrape_us']:.1f} us vs naive "
            f"{row['naive_scrape_us']:.1f} us (x{row['scrape_speedup']:.0f}); "
            f"{row['bytes_per_item']:.0f} bytes/item; thresholds agree: {row['thresholds_agree']}"
        )
    if args.json:
        benchlib.write_json(report, args.json)


if __name__ == "__main__":
    main()
