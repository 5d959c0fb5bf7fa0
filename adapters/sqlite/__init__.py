"""SQLite: the single-replica calibration store and review queue."""

__all__: list[str] = []
