"""The statistics core: pure functions and small classes over numpy arrays.

No I/O, no asyncio, no logging, no metrics (``lint-imports`` checks it); randomness and
time are passed in. This is relmon's small public API for offline use::

    from monitor.core import conformal_threshold, rank_classes, reliability_level

- canonicalization: :mod:`monitor.core.canon` (answers to classes, ``INVALID``);
- ranking and scores: :mod:`monitor.core.consensus`, :mod:`monitor.core.scores`;
- conformal thresholds, reliability level and its lower bound: :mod:`monitor.core.conformal`;
- the drift-weighted window: :mod:`monitor.core.window`;
- sequential stopping: :mod:`monitor.core.stopping`; the alarm: :mod:`monitor.core.alarm`;
- events, review items and verdicts as data: :mod:`monitor.core.events`,
  :mod:`monitor.core.review`; the error tree: :mod:`monitor.core.errors`.
"""

from monitor.core.conformal import (
    conformal_threshold,
    conformal_thresholds,
    reliability_level,
    reliability_lower_bound,
)
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import RelmonError
from monitor.core.scores import item_score, set_size
from monitor.core.stopping import get_stopping_rule
from monitor.core.window import CalibrationWindow

__all__ = [
    "CalibrationWindow",
    "Consensus",
    "RelmonError",
    "conformal_threshold",
    "conformal_thresholds",
    "get_stopping_rule",
    "item_score",
    "rank_classes",
    "reliability_level",
    "reliability_lower_bound",
    "set_size",
]
