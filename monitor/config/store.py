"""The ``store`` keys: where the calibration and the review queue live.

``sqlite`` (the default): a file in ``state_dir``, for one process. ``postgres``: a
database that every replica of a deployment shares, so that they hold one calibration
and one review queue (docs/operations.md, "One monitor per deployment"). The DSN is a
secret: ``store.dsn``, ``RELMON_STORE__DSN`` or ``store.dsn_file`` (a mounted Secret).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from monitor.config.secrets import read_secret

__all__ = ["StoreSettings"]


class StoreSettings(BaseModel):
    """``store``: the calibration store's backend (with ``review.backend: http``)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["sqlite", "postgres"] = "sqlite"
    dsn: SecretStr | None = None  # postgresql://user:password@host:5432/relmon
    dsn_file: Path | None = None
    sync_s: float = Field(2.0, gt=0, le=300)
    """How often a replica reads the verdicts the others stored (at most this late)."""

    def resolved_dsn(self) -> str | None:
        """``dsn``, else the contents of ``dsn_file``, else None."""
        if self.dsn is not None and self.dsn.get_secret_value().strip():
            return self.dsn.get_secret_value().strip()
        if self.dsn_file is not None:
            return read_secret(self.dsn_file, "store.dsn_file")
        return None
