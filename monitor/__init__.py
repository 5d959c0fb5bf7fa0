"""relmon: conformal reliability monitoring for LLMs in production.

The statistics core (``monitor.core.canon``, ``monitor.core.consensus``, ``monitor.core.scores``,
``monitor.core.conformal``, ``monitor.core.stopping``, ``monitor.core.stability``) is pure: no I/O,
randomness and time passed in. The command line lives in ``monitor.app.cli``.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
