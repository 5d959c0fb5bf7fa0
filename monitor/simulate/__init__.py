"""Synthetic validation of the method (paper appendix C): ``relmon simulate``.

Synthetic multinomial agents (:mod:`~monitor.simulate.agents`) answer items whose
acceptable class and answer distribution are known, and the answers go through the
real core: ranking with random tie-breaking, rank and cumulative-probability scores,
conformal thresholds and sequential stopping rules. The experiments
(:mod:`~monitor.simulate.experiments`) are pure functions of a
``numpy.random.Generator``; :mod:`~monitor.simulate.cli` prints them and
:mod:`~monitor.simulate.plots` draws them (optional matplotlib extra).
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
