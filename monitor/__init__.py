"""relmon: conformal reliability monitoring for LLMs in production.

The statistics core (``monitor.canon``, ``monitor.consensus``, ``monitor.scores``,
``monitor.conformal``, ``monitor.stopping``, ``monitor.stability``) is pure: no I/O,
randomness and time passed in. The command line lives in ``monitor.cli``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
