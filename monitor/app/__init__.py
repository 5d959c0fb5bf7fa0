"""The application: the composition root (:mod:`monitor.app.runner`, the one place that
picks adapters), the command line, the demo and the paper's simulations."""

__all__: list[str] = []
