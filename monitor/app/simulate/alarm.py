"""The reliability alarm: false alarms and detection delay, against three naive rules.

Streams of reviewed items X_t = 1{top answer accepted} ~ Bernoulli(p_t). Four rules
look at the stream after every reviewed item (as a dashboard scraped that often would):

* ``e-detector``: :class:`monitor.core.alarm.EDetector` (alarm at 1/alpha_alarm), vectorised
  as :class:`StreamEDetector` (a test checks they agree);
* ``lower bound``: the naive rule "the one-sided Clopper-Pearson lower bound (1 - delta)
  of the reliability over the last ``window`` reviewed items is below the target",
  checked from the first reviewed item;
* ``lower bound, full window``: the same rule checked only once ``window`` items have
  been reviewed (the bound of a handful of items is below any useful target). It still
  fires on streams above the target: it asks for proof that reliability >= target, and
  its mirror image, "the upper bound is below the target", is the fixed-window test;
* ``fixed window``: a one-sided exact binomial test of "reliability >= target" at level
  delta on the last ``window`` reviewed items, repeated at every item.

Run length to a false alarm is measured on streams at and above the target up to
``horizon`` items (streams without an alarm are censored at the horizon, so the mean
reported is a lower bound on the true mean). Detection delay: ``pre`` items at the
target, then a drop of d points; the delay counts items after the change until the
alarm (streams that alarmed before the change are counted separately; ``detected`` is
the share of the others that alarmed by the horizon, NaN when there are none). Seconds
are delays divided by the reviewed-item rate (the demo reviews 2.5 items a second: 10
events/s, half sampled, half of those reviewed). Vectorised over streams; pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from monitor.app.simulate.tables import fmt, format_table
from monitor.core.alarm import DEFAULT_BETS, bet_grid
from monitor.core.errors import ConfigError, StateError

__all__ = [
    "AlarmResult",
    "DelayStats",
    "RuleStats",
    "StreamEDetector",
    "first_alarms",
    "run_alarm",
]

DEMO_REVIEWS_PER_S = 2.5
RULES = ("e-detector", "lower bound", "fixed window", "lower bound, full window")


class StreamEDetector:
    """:class:`monitor.core.alarm.EDetector` (uniform review) for many streams at once.

    Call it with one outcome per stream, shape (streams,); it returns the alarm flags.
    :attr:`value` is each stream's statistic (capped at 1e200: only the first crossing
    of the threshold matters here).
    """

    def __init__(self, tau: float, alpha: float) -> None:
        self.tau = tau
        self.threshold = 1.0 / alpha
        self.bets = np.asarray(bet_grid(tau, DEFAULT_BETS))
        self.m: np.ndarray | None = None

    @property
    def value(self) -> np.ndarray:
        if self.m is None:
            raise StateError("no outcome yet")
        v: np.ndarray = self.m.mean(axis=1)
        return v

    def __call__(self, x: np.ndarray) -> np.ndarray:
        m = self.m
        if m is None or m.shape[0] != x.shape[0]:
            m = np.ones((x.shape[0], self.bets.size))
        factor = 1.0 + self.bets[None, :] * (self.tau - x[:, None])
        self.m = np.minimum(np.maximum(m, 1.0) * factor, 1e200)
        flags: np.ndarray = self.value >= self.threshold
        return flags


def _windowed(
    tau: float, window: int, delta: float, kind: str
) -> Callable[[np.ndarray], np.ndarray]:
    # The fewest accepted among n items that does NOT fire, tabulated for n = 1..window.
    ns = np.arange(1, window + 1)
    min_n = window if kind == "lower bound, full window" else 1
    if kind.startswith("lower bound"):
        # CP lower bound at 1 - delta with s successes in n: beta.ppf(delta, s, n - s + 1).
        need = np.empty(window, dtype=int)
        for n in ns:
            s = np.arange(0, n + 1)
            lb = np.where(s > 0, stats.beta.ppf(delta, np.maximum(s, 1), n - s + 1), 0.0)
            ok = np.flatnonzero(lb >= tau)
            need[n - 1] = int(s[ok[0]]) if ok.size else n + 1
    else:
        # Reject "p >= tau" when P(Bin(n, tau) <= s) <= delta: fire when s <= crit.
        crit = np.asarray(stats.binom.ppf(delta, ns, tau)).astype(int)
        crit = np.where(stats.binom.cdf(crit, ns, tau) <= delta, crit, crit - 1)
        need = crit + 1
    hist: list[np.ndarray] = []

    def step(x: np.ndarray) -> np.ndarray:
        hist.append(x)
        if len(hist) > window:
            hist.pop(0)
        n = len(hist)
        s = np.sum(hist, axis=0)
        flags: np.ndarray = (s < need[n - 1]) & (n >= min_n)
        return flags

    return step


def _make(
    rule: str, tau: float, alpha: float, window: int, delta: float
) -> Callable[[np.ndarray], np.ndarray]:
    if rule == "e-detector":
        return StreamEDetector(tau, alpha)
    if rule not in RULES:
        raise ConfigError(f"unknown rule {rule!r}; available: {', '.join(RULES)}")
    return _windowed(tau, window, delta, rule)


def _num(x: float) -> float | None:
    """JSON-safe: ``None`` for a median beyond the horizon, or a delay or detection
    share never observed."""
    return float(x) if np.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class RuleStats:
    rule: str
    p: float
    runs: int
    alarmed: float
    mean_run_length: float
    median_run_length: float


@dataclass(frozen=True, slots=True)
class DelayStats:
    rule: str
    drop: float
    early: float
    detected: float
    mean_delay: float
    median_delay: float


@dataclass(frozen=True, slots=True)
class AlarmResult:
    tau: float
    alpha: float
    window: int
    delta: float
    horizon: int
    streams: int
    pre: int
    false_alarms: tuple[RuleStats, ...]
    delays: tuple[DelayStats, ...]
    reviews_per_s: float = DEMO_REVIEWS_PER_S

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "alarm",
            "target": self.tau,
            "alpha_alarm": self.alpha,
            "window": self.window,
            "delta": self.delta,
            "horizon": self.horizon,
            "streams": self.streams,
            "pre_change": self.pre,
            "reviews_per_s": self.reviews_per_s,
            "false_alarms": [
                {
                    "rule": r.rule,
                    "p": r.p,
                    "alarmed_by_horizon": r.alarmed,
                    "mean_run_length_censored": r.mean_run_length,
                    "median_run_length": _num(r.median_run_length),
                }
                for r in self.false_alarms
            ],
            "delays": [
                {
                    "rule": d.rule,
                    "drop": d.drop,
                    "alarmed_before_change": d.early,
                    "detected": _num(d.detected),
                    "mean_delay_items": _num(d.mean_delay),
                    "median_delay_items": _num(d.median_delay),
                    "mean_delay_s": _num(d.mean_delay / self.reviews_per_s),
                }
                for d in self.delays
            ],
        }

    def table(self) -> str:
        head = ["rule", "p", "false alarm by horizon", "mean run length >=", "median"]
        rows = [
            [
                r.rule,
                fmt(r.p, 3),
                fmt(r.alarmed, 4),
                fmt(r.mean_run_length, 0),
                fmt(r.median_run_length, 0) if np.isfinite(r.median_run_length) else "> horizon",
            ]
            for r in self.false_alarms
        ]
        t1 = format_table(
            head,
            rows,
            f"false alarms: target {self.tau:g}, alpha_alarm {self.alpha:g} (promise: mean run "
            f"length >= {1 / self.alpha:g}), window {self.window}, delta {self.delta:g}, "
            f"{self.streams} streams x {self.horizon} reviewed items",
        )
        head2 = [
            "rule",
            "drop",
            "alarm before change",
            "detected",
            "mean delay",
            "median",
            "mean s",
        ]
        rows2 = [
            [
                d.rule,
                fmt(d.drop, 2),
                fmt(d.early, 4),
                fmt(d.detected, 4),
                fmt(d.mean_delay, 1),
                fmt(d.median_delay, 0),
                fmt(d.mean_delay / self.reviews_per_s, 1),
            ]
            for d in self.delays
        ]
        t2 = format_table(
            head2,
            rows2,
            f"detection delay in reviewed items after {self.pre} items at the target "
            f"(seconds at {self.reviews_per_s:g} reviewed items/s, the demo's rate)",
        )
        return f"{t1}\n\n{t2}"


def first_alarms(
    rule: str,
    probs: np.ndarray,
    streams: int,
    *,
    tau: float,
    alpha: float,
    window: int,
    delta: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """First alarm time (1-based) per stream; ``len(probs) + 1`` when none."""
    step = _make(rule, tau, alpha, window, delta)
    horizon = probs.shape[0]
    first = np.full(streams, horizon + 1, dtype=int)
    for t in range(horizon):
        x = (rng.random(streams) < probs[t]).astype(float)
        fired = step(x) & (first > horizon)
        first[fired] = t + 1
    return first


def run_alarm(
    *,
    tau: float = 0.9,
    alpha: float = 0.01,
    window: int = 100,
    delta: float = 0.05,
    above: Sequence[float] = (0.0, 0.02, 0.05),
    drops: Sequence[float] = (0.05, 0.10, 0.20),
    streams: int = 500,
    horizon: int = 3000,
    pre: int = 200,
    seed: int = 0,
) -> AlarmResult:
    """False alarms at p = tau + a for a in ``above``; delays after each of ``drops``."""
    false_alarms = []
    for i, a in enumerate(above):
        p = min(1.0, tau + a)
        for j, rule in enumerate(RULES):
            first = first_alarms(
                rule,
                np.full(horizon, p),
                streams,
                tau=tau,
                alpha=alpha,
                window=window,
                delta=delta,
                rng=np.random.default_rng([seed, 0, i, j]),
            )
            fired = first <= horizon
            false_alarms.append(
                RuleStats(
                    rule,
                    p,
                    streams,
                    float(fired.mean()),
                    float(first.mean()),
                    float(np.median(first)) if fired.mean() > 0.5 else float("inf"),
                )
            )
    delays = []
    post = horizon
    for i, d in enumerate(drops):
        probs = np.concatenate([np.full(pre, tau), np.full(post, max(0.0, tau - d))])
        for j, rule in enumerate(RULES):
            first = first_alarms(
                rule,
                probs,
                streams,
                tau=tau,
                alpha=alpha,
                window=window,
                delta=delta,
                rng=np.random.default_rng([seed, 1, i, j]),
            )
            early = first <= pre
            late = (~early) & (first <= pre + post)
            delay = first[late] - pre
            delays.append(
                DelayStats(
                    rule,
                    d,
                    float(early.mean()),
                    # NaN (printed "-") when every stream alarmed before the change
                    float(late.sum() / (~early).sum()) if (~early).any() else float("nan"),
                    float(delay.mean()) if delay.size else float("nan"),
                    float(np.median(delay)) if delay.size else float("nan"),
                )
            )
    return AlarmResult(
        tau, alpha, window, delta, horizon, streams, pre, tuple(false_alarms), tuple(delays)
    )
