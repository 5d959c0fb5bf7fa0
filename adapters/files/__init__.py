"""Local files: the on-disk review outbox under ``state_dir``."""

__all__: list[str] = []
