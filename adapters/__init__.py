"""Adapters: one module per outside system (Kafka, HTTP, SQLite, the model API).

The statistics core in ``monitor`` never imports from here; adapters translate
library errors into ``monitor.core.errors`` at the boundary.
"""

__all__: list[str] = []
