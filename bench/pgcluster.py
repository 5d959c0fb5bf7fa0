"""A real PostgreSQL for the benchmarks: one throwaway cluster per run (Debian
``postgresql``, server binaries in /usr/lib/postgresql/<version>/bin), on 127.0.0.1 in a
temp dir, ``fsync=off``, stopped and removed at the end. ``initdb`` refuses root, so as
root the cluster runs as the ``postgres`` user.

bench/ stands on its own: this is the benchmarks' copy of the tests' cluster starter
(``tests/postgres``), with what ``store_replicas_bench.py`` needs and the outages of
``chaos.py`` (stop, ``kill -9``, start again).

    with running_cluster() as cluster:
        dsn = cluster.create_database("relmon_bench")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib

__all__ = ["PostgresCluster", "postgres_bin", "running_cluster"]


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


def _run(argv: list[str], what: str) -> None:
    """Run a server command (as ``postgres`` when root); its error output if it fails."""
    out = subprocess.run(
        _as_postgres(argv), check=False, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed ({out.returncode}): {out.stderr.strip()}")


@dataclass
class PostgresCluster:
    """A running cluster: its temp directory, its port on 127.0.0.1, its bin directory."""

    directory: Path
    port: int
    bin: Path

    @property
    def host_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def dsn(self, database: str) -> str:
        return f"{self.host_dsn}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL command; its unaligned output."""
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
        """Create database ``name``; its DSN."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def start_server(self) -> None:
        """Start the server (again), once it accepts connections."""
        start = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", _options(self)]
        _run([*start, "-l", str(self.directory / "log"), "-w", "start"], "pg_ctl start")
        _wait_ready(self.bin, self.port)

    def stop_server(self) -> None:
        """Stop the server as an operator does (``pg_ctl stop -m fast``)."""
        _run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"], "pg_ctl stop")

    def kill_server(self) -> None:
        """``kill -9`` the postmaster and every backend (a crash, the OOM killer), and
        wait until they are gone; the next :meth:`start_server` runs crash recovery."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [postmaster] + [
            int(stat.parent.name)
            for stat in Path("/proc").glob("[0-9]*/stat")
            if _parent(stat) == postmaster
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL processes {pids} still there 30 s after kill -9")
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _options(cluster: PostgresCluster) -> str:
    return f"-p {cluster.port} -k {cluster.directory} -c listen_addresses=127.0.0.1 -c fsync=off"


def _wait_ready(bin_dir: Path, port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    argv = [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)]
    while subprocess.run(argv, capture_output=True, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL on 127.0.0.1:{port} not ready after {timeout_s} s")
        time.sleep(0.1)


@contextlib.contextmanager
def running_cluster() -> Iterator[PostgresCluster]:
    """Start a cluster, yield it, then stop it and remove its directory."""
    bin_dir = postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="relmon-bench-pg-"))
    data = directory / "data"
    try:
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", "postgres")
        _run([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"], "initdb")
        cluster = PostgresCluster(directory, benchlib.free_port(), bin_dir)
        cluster.start_server()
        yield cluster
    finally:
        if data.exists():
            subprocess.run(
                _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                capture_output=True,
                check=False,
                timeout=120,
            )
        shutil.rmtree(directory, ignore_errors=True)
