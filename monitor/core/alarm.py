"""An anytime-valid reliability alarm: an e-detector on reviewed top answers. No I/O.

The stream is the reviewed items in the order their verdicts are applied, with
X_t = 1 when the item's top answer was accepted, and the item's inclusion probability
pi_t (known when it was scored). The null is "reliability >= tau": the top answer of
traffic is accepted with probability at least the target tau, whatever happened before.

Per reviewed item and for a bet lambda, with u_t = pi_min / pi_t in (0, 1]::

    e_t(lambda) = 1 + lambda * u_t * (tau - X_t),      0 <= lambda <= 1 / (1 - tau)

and per bet a CUSUM-style statistic M_t = max(M_{t-1}, 1) * e_t (M_0 = 1). The
detector's statistic is the average of M_t over a fixed grid of bets, and the alarm is
raised when it reaches 1 / alpha_alarm.

Why it is valid (the promise: average run length to a false alarm >= 1/alpha_alarm).

1. *Each factor is a fair-or-worse bet.* An item is reviewed with probability pi(f)
   that depends only on label-free features f, so among reviewed items features are
   tilted by pi: P(f | reviewed) = pi(f) p(f) / E[pi]. Hence, for the next reviewed
   item given everything before it,
   E[u (tau - X) | reviewed, past] = pi_min * sum_f p(f) pi(f)/E[pi] * (tau - r(f))/pi(f)
   = pi_min * (tau - E[X]) / E[pi] <= 0 under the null, where r(f) is the acceptance
   probability at f and E[X] the traffic reliability. So E[e_t | past] <= 1: the
   1/pi weighting (scaled by pi_min so that u <= 1) undoes the tilt that prioritised
   review introduces; without it, reviewing hard items more often would make a
   reliable model look unreliable. With uniform review u = 1 and this is the plain
   e_t = 1 + lambda (tau - X_t).
2. *Each factor is non-negative.* The smallest value is at X = 1, u = 1:
   1 - lambda (1 - tau) >= 0 exactly when lambda <= 1/(1 - tau), the range allowed.
3. *CUSUM is dominated by Shiryaev-Roberts, whose drift is one per step.* Let
   R_t = (R_{t-1} + 1) e_t, R_0 = 0 (the sum over start times j of prod_{i=j..t} e_i).
   Then M_t <= R_t for every t and E[R_t - t | past] <= R_{t-1} - (t - 1): R_t - t is a
   supermartingale. If N is the first t with R_t >= 1/alpha, optional stopping gives
   1/alpha <= E[R_N] <= E[N] (when E[N] is infinite there is nothing to prove). The
   CUSUM alarm cannot come before the R alarm, so its mean run length is >= 1/alpha.
   Averages over a fixed grid of bets keep both properties (they are linear), so the
   mixture has the same bound and its power adapts to the size of the drop.

The bound is on the mean (Shin, Ramdas & Rinaldo, "E-detectors", 2023); in practice
false alarms are much rarer (``relmon simulate alarm`` measures it). Validity needs the
order of verdicts to carry no information about their outcome beyond the past (a
reviewer who answers easy items first would break it) and inclusion probabilities that
were fixed before the label was seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from monitor.core.errors import ConfigError, InputError

__all__ = ["DEFAULT_BETS", "EDetector", "SplitDetectors", "bet_grid", "split_alpha"]

DEFAULT_BETS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
"""Bets as fractions of the largest allowed, lambda * (1 - tau)."""


def bet_grid(tau: float, fractions: Sequence[float] = DEFAULT_BETS) -> tuple[float, ...]:
    """The bets lambda = fraction / (1 - tau), each fraction in (0, 1]."""
    if not 0.0 < tau < 1.0:
        raise ConfigError(f"target must be in (0, 1), got {tau!r}")
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
        raise ConfigError("bet fractions must be in (0, 1]")
    return tuple(f / (1.0 - tau) for f in fractions)


@dataclass
class EDetector:
    """The e-detector of the module docstring for target ``tau`` and level ``alpha``.

    ``pi_min`` is the smallest inclusion probability the task can use (u = pi_min/pi).
    Feed it with :meth:`update`; read :attr:`value` and :attr:`alarm`.
    """

    tau: float
    alpha: float = 0.001
    pi_min: float = 1.0
    fractions: Sequence[float] = DEFAULT_BETS
    bets: tuple[float, ...] = field(init=False)
    stats: list[float] = field(init=False)
    n: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if not 0.0 < self.pi_min <= 1.0:
            raise ConfigError(f"pi_min must be in (0, 1], got {self.pi_min!r}")
        self.bets = bet_grid(self.tau, self.fractions)
        self.stats = [1.0] * len(self.bets)

    @property
    def threshold(self) -> float:
        return 1.0 / self.alpha

    @property
    def value(self) -> float:
        """The detector's statistic: the average of the per-bet CUSUMs (starts at 1)."""
        return math.fsum(self.stats) / len(self.stats)

    @property
    def alarm(self) -> bool:
        return self.value >= self.threshold

    def update(self, accepted: bool, inclusion_probability: float = 1.0) -> float:
        """One reviewed item: was its top answer accepted, and its inclusion probability."""
        pi = float(inclusion_probability)
        if not 0.0 < pi <= 1.0:
            raise InputError(f"inclusion probability must be in (0, 1], got {pi!r}")
        if pi < self.pi_min * (1.0 - 1e-9):
            raise InputError(f"inclusion probability {pi!r} is below the floor {self.pi_min!r}")
        u = min(1.0, self.pi_min / pi)
        step = self.tau - (1.0 if accepted else 0.0)
        self.stats = [
            max(m, 1.0) * (1.0 + lam * u * step)
            for m, lam in zip(self.stats, self.bets, strict=True)
        ]
        self.n += 1
        return self.value

    def reset(self) -> None:
        """Start again (after an acknowledged alarm, or a new model version)."""
        self.stats = [1.0] * len(self.bets)
        self.n = 0


def split_alpha(alpha: float, slots: int) -> float:
    """Bonferroni: the level of each of ``slots`` detectors that share ``alpha``.

    ``slots`` must be fixed before any data (for segments: the label values a task can
    have, ``max + 2``), never the number of detectors that happen to exist."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ConfigError(f"slots must be a whole number >= 1, got {slots!r}")
    return alpha / slots


@dataclass
class SplitDetectors:
    """One :class:`EDetector` per label (a segment), each at level ``alpha / slots``.

    Why the false-alarm rate holds over all labels together. Each detector's
    Shiryaev-Roberts process R^s (item 3 of the module docstring) moves only on its
    own label's items, and E[R^s_t | past] <= R^s_{t-1} + 1 then. So sum_s R^s_t - t is
    a supermartingale in t, the items of *all* labels; any detector at its threshold
    ``slots / alpha`` puts the sum there, so the mean number of items to the first
    false alarm of any label is >= slots / alpha >= 1 / alpha, however many labels
    there are and however the items are spread over them. Dropping a detector (its
    label left the window) sets its R^s to 0, which keeps the supermartingale. Over a
    horizon, the union bound gives P(any false alarm) <= sum of the labels' own
    probabilities, each for level alpha / slots.
    """

    tau: float
    alpha: float = 0.001
    pi_min: float = 1.0
    slots: int = 1
    fractions: Sequence[float] = DEFAULT_BETS
    detectors: dict[str, EDetector] = field(init=False, default_factory=dict)
    level: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = split_alpha(self.alpha, self.slots)
        bet_grid(self.tau, self.fractions)  # the settings checked before any label
        EDetector(self.tau, self.level, self.pi_min, self.fractions)

    @property
    def threshold(self) -> float:
        """Each label's threshold, slots / alpha."""
        return 1.0 / self.level

    def update(self, label: str, accepted: bool, inclusion_probability: float = 1.0) -> float:
        """One reviewed item of ``label``; that label's statistic after it."""
        detector = self.detectors.get(label)
        if detector is None:
            detector = EDetector(self.tau, self.level, self.pi_min, self.fractions)
        value = detector.update(accepted, inclusion_probability)  # raises before storing
        self.detectors[label] = detector
        return value

    def drop(self, label: str) -> None:
        """Forget ``label``'s detector (its statistic starts at 1 again)."""
        self.detectors.pop(label, None)

    def alarms(self) -> list[str]:
        """The labels whose alarm is raised."""
        return [label for label, d in self.detectors.items() if d.alarm]
