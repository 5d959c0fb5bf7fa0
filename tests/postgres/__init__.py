"""A real PostgreSQL for the tests: one cluster per test session (Debian ``postgresql``,
server binaries in /usr/lib/postgresql/<version>/bin), on 127.0.0.1 in a temp dir,
stopped at the end. ``initdb`` refuses root, so as root the cluster runs as the
``postgres`` user. Each test gets a database of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ports import free_port
from tests.waiting import wait_until_sync

__all__ = ["Opener", "PostgresCluster", "postgres_bin", "running_cluster"]

Opener = Callable[[], Awaitable[Any]]
"""Opens a store on the test's database (SQLite or PostgreSQL: the ``opener`` fixture)."""


def postgres_bin() -> Path:
    """The newest installed server's bin directory."""
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise RuntimeError("no PostgreSQL server: install the Debian package postgresql")
    return versions[-1]


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresCluster:
    directory: Path
    port: int
    bin: Path

    @property
    def host_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def dsn(self, database: str) -> str:
        return f"{self.host_dsn}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-t", "-A", self.dsn(database), "-c", sql],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {out.stderr.strip()}")
        return out.stdout.strip()

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)


def running_cluster() -> Iterator[PostgresCluster]:
    """Start a cluster, yield it, stop it (a generator for a session fixture)."""
    bin_dir = postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="relmon-pg-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    data = directory / "data"
    subprocess.run(
        _as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = free_port()
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_postgres(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(directory / "log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    cluster = PostgresCluster(directory, port, bin_dir)
    try:
        wait_until_sync(
            lambda: (
                subprocess.run(
                    [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                    capture_output=True,
                    check=False,
                ).returncode
                == 0
            ),
            timeout_s=60,
            what=f"PostgreSQL on 127.0.0.1:{port}",
        )
        yield cluster
    finally:
        subprocess.run(
            _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
            capture_output=True,
            check=False,
            timeout=120,
        )
        shutil.rmtree(directory, ignore_errors=True)
