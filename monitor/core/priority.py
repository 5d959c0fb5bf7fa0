"""Uncertainty-prioritised review: how likely an item is to be sent to a reviewer. No I/O.

Reviews are the expensive, human part of monitoring. An item whose K answers agree
(margin 1) teaches the calibration little: its top answer is almost always right or
consistently wrong, and the window already holds many like it. An item with a split
vote is where the level's uncertainty lives. The inclusion probability therefore grows
with the uncertainty of the consensus, measured only from the answers (never a label):

    pi = pi_min + (pi_max - pi_min) * (1 - margin)

where margin = (n_1 - n_2) / K is the gap between the two most frequent classes. The
floor pi_min keeps every item reviewable, which is what makes the 1/pi weights of the
calibration window (and of the alarm and the SLI counter) unbiased for the traffic:
an item reviewed with probability pi stands for 1/pi items of traffic (covariate shift
with a known likelihood ratio, Tibshirani et al. 2019). The window's test weight is
1/pi_min, the largest weight an item can carry, which keeps the weighted threshold
valid.
"""

from __future__ import annotations

from monitor.core.consensus import Consensus
from monitor.core.errors import ConfigError

__all__ = ["prioritised_inclusion_probability"]


def prioritised_inclusion_probability(
    consensus: Consensus, *, floor: float, ceiling: float
) -> float:
    """pi in [floor, ceiling] from the consensus margin (see the module docstring)."""
    if not 0.0 < floor <= ceiling <= 1.0:
        raise ConfigError(f"need 0 < floor <= ceiling <= 1, got {floor}, {ceiling}")
    uncertainty = 1.0 - consensus.margin if consensus.classes else 1.0
    return min(ceiling, max(floor, floor + (ceiling - floor) * uncertainty))
