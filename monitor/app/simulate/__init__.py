"""Synthetic validation of the method (paper appendix C): ``relmon simulate``.

Synthetic multinomial agents (:mod:`~monitor.app.simulate.agents`) answer items whose
acceptable class and answer distribution are known, and the answers go through the
real core: ranking with random tie-breaking, rank and cumulative-probability scores,
conformal thresholds and sequential stopping rules. The experiments
(:mod:`~monitor.app.simulate.experiments`) are pure functions of a
``numpy.random.Generator``; :mod:`~monitor.app.simulate.cli` prints them and
:mod:`~monitor.app.simulate.plots` draws them (optional matplotlib extra).
"""

__all__ = [
    "agents",
    "cli",
    "experiments",
    "mode_error",
    "plots",
    "sequential",
    "stopping",
    "tables",
]
