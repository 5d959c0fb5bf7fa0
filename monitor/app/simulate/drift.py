"""The live self-check and ACI under drift: realised coverage, window alone vs with ACI.

A stream of reviewed items (every item reviewed, one per time unit). Each item's rank
score is drawn from a categorical distribution over ranks 1..5 and ``inf`` (no
acceptable answer among the candidates); the distribution moves from ``before`` to
``after`` linearly between ``drift_start`` and ``drift_end`` (a slow degradation of the
model), then stays at ``after``. For each item, as relmon does live:

1. the threshold in force is read from the decay-weighted calibration window (and,
   with ACI, the threshold at the adaptive alpha_t);
2. the score arrives (the verdict) and is checked against that threshold: a miss is a
   served set that did not contain an acceptable answer (the self-check counters);
3. ACI updates alpha_{t+1} = alpha_t + gamma (alpha - err_t); the score joins the window.

Reported: realised coverage (1 - misses/checks) before the drift, during it, after it,
and over the whole stream, for the window alone and with ACI, and the mean set
threshold (the price of coverage: a larger threshold is a larger set). Gibbs & Candès
(2021) prove that ACI's long-run miss rate is within (max(alpha, 1-alpha) + gamma) /
(gamma T) of alpha for ANY sequence, drift or not; the window alone only promises
coverage while the stream is exchangeable. Repetition ``r`` uses
``default_rng([seed, r])``; pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from monitor.app.simulate.tables import fmt, format_table
from monitor.core.conformal import aci_update
from monitor.core.errors import ConfigError
from monitor.core.window import CalibrationWindow

__all__ = ["AFTER", "BEFORE", "DriftResult", "run_drift", "simulate_stream"]

RANKS = (1.0, 2.0, 3.0, 4.0, 5.0, math.inf)
BEFORE = (0.80, 0.10, 0.04, 0.02, 0.01, 0.03)
AFTER = (0.50, 0.15, 0.12, 0.09, 0.08, 0.06)
PHASES = ("before", "during", "after", "overall")


def _probs(t: int, start: int, end: int, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    s = 0.0 if t < start else 1.0 if t >= end else (t - start) / max(1, end - start)
    p: np.ndarray = (1 - s) * before + s * after
    normalised: np.ndarray = p / p.sum()
    return normalised


def simulate_stream(
    rng: np.random.Generator,
    *,
    alpha: float,
    gamma: float | None,
    steps: int,
    drift_start: int,
    drift_end: int,
    half_life: float,
    window: int,
    before: Sequence[float] = BEFORE,
    after: Sequence[float] = AFTER,
    warmup: int = 200,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(miss flags, thresholds served, scores) for ``steps`` items after a warm-up.

    The warm-up items (from ``before``) fill the window and are not checked.
    """
    b, a = np.asarray(before, float), np.asarray(after, float)
    win = CalibrationWindow(alphas=(alpha,), max_items=window, half_life_s=half_life)
    for i in range(warmup):
        score = RANKS[int(rng.choice(len(RANKS), p=b / b.sum()))]
        win.add(f"w{i}", score, 1.0, float(i - warmup))
    alpha_t = alpha
    misses = np.zeros(steps, dtype=bool)
    served = np.zeros(steps)
    scores = np.zeros(steps)
    for t in range(steps):
        now = float(t)
        threshold = win.threshold_at(alpha_t if gamma is not None else alpha, now)
        score = RANKS[int(rng.choice(len(RANKS), p=_probs(t, drift_start, drift_end, b, a)))]
        miss = score > threshold
        misses[t], served[t], scores[t] = miss, threshold, score
        if gamma is not None:
            alpha_t = aci_update(alpha_t, alpha, miss, gamma)
        win.add(f"i{t}", score, 1.0, now)
    return misses, served, scores


@dataclass(frozen=True, slots=True)
class DriftResult:
    alpha: float
    gamma: float
    steps: int
    drift_start: int
    drift_end: int
    half_life: float
    reps: int
    coverage: dict[str, dict[str, float]]
    """method -> phase -> realised coverage."""
    threshold: dict[str, dict[str, float]]
    """method -> phase -> mean served threshold (inf counted as 6, the full set)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "drift",
            "alpha": self.alpha,
            "gamma": self.gamma,
            "steps": self.steps,
            "drift": [self.drift_start, self.drift_end],
            "half_life_items": self.half_life,
            "reps": self.reps,
            "coverage": self.coverage,
            "mean_threshold": self.threshold,
        }

    def table(self) -> str:
        head = ["method", *[f"coverage {p}" for p in PHASES], "mean M* after"]
        rows = [
            [
                m,
                *[fmt(self.coverage[m][p], 4) for p in PHASES],
                fmt(self.threshold[m]["after"], 2),
            ]
            for m in self.coverage
        ]
        title = (
            f"drift: promise 1 - alpha = {1 - self.alpha:g}; items {self.steps}, drift from "
            f"item {self.drift_start} to {self.drift_end}, window half-life {self.half_life:g} "
            f"items, ACI gamma {self.gamma:g}, {self.reps} repetitions"
        )
        return format_table(head, rows, title)


def run_drift(
    *,
    alpha: float = 0.1,
    gamma: float = 0.01,
    steps: int = 4000,
    drift_start: int = 1000,
    drift_end: int = 1500,
    half_life: float = 1000.0,
    window: int = 2000,
    reps: int = 10,
    seed: int = 0,
) -> DriftResult:
    """Window alone vs window + ACI on the same draws (see the module docstring)."""
    if not 0 <= drift_start <= drift_end <= steps:
        raise ConfigError("need 0 <= drift_start <= drift_end <= steps")
    phases = {
        "before": slice(0, drift_start),
        "during": slice(drift_start, drift_end),
        "after": slice(drift_end, steps),
        "overall": slice(0, steps),
    }
    coverage: dict[str, dict[str, float]] = {}
    threshold: dict[str, dict[str, float]] = {}
    for method, g in (("window", None), ("window + ACI", gamma)):
        all_miss, all_thr = [], []
        for r in range(reps):
            miss, served, _ = simulate_stream(
                np.random.default_rng([seed, r]),
                alpha=alpha,
                gamma=g,
                steps=steps,
                drift_start=drift_start,
                drift_end=drift_end,
                half_life=half_life,
                window=window,
            )
            all_miss.append(miss)
            all_thr.append(np.minimum(served, 6.0))
        m, th = np.vstack(all_miss), np.vstack(all_thr)
        coverage[method] = {
            p: float(1.0 - m[:, s].mean()) if m[:, s].size else math.nan for p, s in phases.items()
        }
        threshold[method] = {
            p: float(th[:, s].mean()) if th[:, s].size else math.nan for p, s in phases.items()
        }
    return DriftResult(
        alpha, gamma, steps, drift_start, drift_end, half_life, reps, coverage, threshold
    )
