"""PostgreSQL: the calibration store and review queue that several replicas share."""

__all__: list[str] = []
