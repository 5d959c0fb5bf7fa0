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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Imported when first asked for, not with the package: ``monitor.core.errors`` alone
# (which every module imports) must not load scipy (the traffic listener's own process
# imports no statistics at all).
_HOME = {
    "conformal_threshold": "conformal",
    "conformal_thresholds": "conformal",
    "reliability_level": "conformal",
    "reliability_lower_bound": "conformal",
    "Consensus": "consensus",
    "rank_classes": "consensus",
    "RelmonError": "errors",
    "item_score": "scores",
    "set_size": "scores",
    "get_stopping_rule": "stopping",
    "CalibrationWindow": "window",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'monitor.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"monitor.core.{home}"), name)
    globals()[name] = value
    return value


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
