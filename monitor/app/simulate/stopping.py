"""Stopping-rule trials on a synthetic multinomial agent.

An error is a *certified wrong mode*: the rule certified a leader that is not the
unique most likely class. With an exact tie at the top there is no unique mode, so
every certification is an error. An item that reaches K_max uncertified is not an
error of the rule (it never claimed anything); it is counted in ``stopped_rate``'s
complement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from monitor.core.errors import ConfigError
from monitor.core.stopping import StoppingRule

__all__ = ["StoppingTrials", "parse_distribution", "run_stopping_trials"]


@dataclass(frozen=True, slots=True)
class StoppingTrials:
    """Outcome of ``trials`` items sampled under one rule."""

    trials: int
    mean_samples: float
    wrong_mode_rate: float
    stopped_rate: float
    samples_histogram: dict[int, int]

    def as_dict(self) -> dict[str, object]:
        return {
            "trials": self.trials,
            "mean_samples": self.mean_samples,
            "wrong_mode_rate": self.wrong_mode_rate,
            "stopped_rate": self.stopped_rate,
            "samples_histogram": {str(k): v for k, v in sorted(self.samples_histogram.items())},
        }


def parse_distribution(text: str) -> np.ndarray:
    """``"0.7,0.2,0.1"`` → probabilities; must be positive and sum to 1 (±1e-6), else a
    :class:`~monitor.core.errors.ConfigError`."""
    try:
        p = np.array([float(x) for x in text.split(",") if x.strip()], dtype=float)
    except ValueError:
        raise ConfigError(f"not a list of numbers: {text!r}") from None
    if p.size == 0 or not np.isfinite(p).all() or (p <= 0).any():
        raise ConfigError(f"probabilities must be positive numbers: {text!r}")
    if abs(p.sum() - 1.0) > 1e-6:
        raise ConfigError(f"probabilities must sum to 1, got {p.sum():g}: {text!r}")
    normalised: np.ndarray = p / p.sum()
    return normalised


def run_stopping_trials(
    rule: StoppingRule, dist: Sequence[float], trials: int, rng: np.random.Generator
) -> StoppingTrials:
    """Sample ``trials`` items from ``dist``, asking for samples in the rule's batches."""
    p = np.asarray(dist, dtype=float)
    top = p.max()
    modes = np.flatnonzero(np.isclose(p, top, rtol=0, atol=1e-12))
    true_mode = int(modes[0]) if modes.size == 1 else -1
    used = np.zeros(trials, dtype=int)
    wrong = stopped = 0
    for t in range(trials):
        counts = np.zeros(p.size, dtype=int)
        decision = rule.decide(counts)
        while not decision.stop:
            counts += rng.multinomial(decision.more, p)
            decision = rule.decide(counts)
        used[t] = counts.sum()
        if decision.certified:
            stopped += 1
            leaders = np.flatnonzero(counts == counts.max())
            # A certified leader is strict (a tie cannot certify); check it anyway.
            if leaders.size != 1 or leaders[0] != true_mode:
                wrong += 1
    values, freq = np.unique(used, return_counts=True)
    return StoppingTrials(
        trials=trials,
        mean_samples=float(used.mean()) if trials else 0.0,
        wrong_mode_rate=wrong / trials if trials else 0.0,
        stopped_rate=stopped / trials if trials else 0.0,
        samples_histogram={int(v): int(f) for v, f in zip(values, freq, strict=True)},
    )
