"""PostgreSQL outages against a running relmon (``tests/postgres/test_store_outage.py``):
a cluster of the test's own that can be stopped, killed (``kill -9``), frozen
(``SIGSTOP``) and started again on the same port, and relmon (mirror, a simulated model,
``store.backend: postgres``) scoring a steady stream of requests meanwhile."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp

from monitor.app.demo.model import QuestionBank, SimulatedModel
from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from tests.ports import free_port
from tests.postgres import PostgresCluster, _as_postgres, postgres_bin
from tests.waiting import wait_until, wait_until_sync

__all__ = [
    "Fault",
    "OutageCluster",
    "Outcome",
    "Relmon",
    "main",
    "outage_cluster",
    "run_outage",
]

Fault = Literal["stop", "kill9", "sigstop"]


@dataclass
class OutageCluster(PostgresCluster):
    """A cluster that can fail: :meth:`fail` then :meth:`recover`."""

    def _ctl(self, *args: str) -> None:
        data = str(self.directory / "data")
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    *("-D", data, "-o", options, "-l", str(self.directory / "log")),
                    *args,
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        self._ctl("-w", "start")
        wait_until_sync(self.ready, timeout_s=60, what="PostgreSQL back")

    def ready(self) -> bool:
        probe = [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0

    def _pids(self) -> list[int]:
        """The postmaster and every process it started."""
        postmaster = int((self.directory / "data" / "postmaster.pid").read_text().splitlines()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def fail(self, fault: Fault) -> None:
        if fault == "stop":
            self._ctl("-m", "fast", "-w", "stop")
        elif fault == "kill9":
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until_sync(lambda: not self.ready(), timeout_s=30, what="PostgreSQL gone")
        else:
            self._frozen = self._pids()
            for pid in self._frozen:
                os.kill(pid, signal.SIGSTOP)

    def recover(self, fault: Fault) -> None:
        if fault == "sigstop":
            for pid in self._frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            wait_until_sync(self.ready, timeout_s=60, what="PostgreSQL thawed")
        else:
            self.start()

    def stop_for_good(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("-m", "immediate", "stop")


def outage_cluster() -> Generator[OutageCluster, None, None]:
    """A cluster of its own (a generator for a fixture)."""
    bin_dir = postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="relmon-pg-outage-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    subprocess.run(
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                *("-D", str(directory / "data"), "-A", "trust", "-U", "postgres"),
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    cluster = OutageCluster(directory, free_port(), bin_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop_for_good()
        shutil.rmtree(directory, ignore_errors=True)


_databases = itertools.count()


@dataclass
class Relmon:
    """A relmon run on the cluster's database, re-startable on the same state_dir."""

    config: Path
    traffic_port: int
    running: Running | None = None

    @classmethod
    def configure(cls, tmp_path: Path, dsn: str, model_url: str) -> Relmon:
        traffic = free_port()
        config = tmp_path / "relmon.yaml"
        config.write_text(
            f"""
tasks:
  - name: arithmetic
    canonicalizer: numeric
    endpoint: {{base_url: "{model_url}", model: sim-arith-1, timeout_s: 5}}
    k_max: 6
    sampling_rate: 1.0
    review_rate: 1.0
budget: {{calls_per_minute: 100000, max_in_flight: 8, queue_size: 1000}}
metrics: {{port: {free_port()}}}
review: {{port: {free_port()}, token: "outage-test-token-123456"}}
traffic: {{port: {traffic}, mode: mirror}}
store: {{backend: postgres, dsn: "{dsn}", sync_s: 0.5}}
state_dir: "{tmp_path / "state"}"
query_hash_key: "0123456789abcdef0123456789abcdef"
""",
            encoding="utf-8",
        )
        return cls(config, traffic)

    async def start(self) -> Running:
        self.running = await start_service(load_settings(self.config))
        return self.running

    async def close(self) -> None:
        if self.running is not None:
            await self.running.close(5)
            self.running = None

    def value(self, name: str, **labels: str) -> float:
        assert self.running is not None
        return self.running.registry.get_sample_value(name, labels) or 0.0

    async def readyz(self, http: aiohttp.ClientSession) -> tuple[int, list[str]]:
        assert self.running is not None
        port = self.running.settings.metrics.port
        async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            body = await resp.json()
            return resp.status, list(body.get("reasons", []))


LABELS = {"model": "sim-arith-1", "task": "arithmetic"}


@dataclass
class Outcome:
    """What one outage did."""

    sent: int = 0
    scored: float = 0.0
    queued: int = 0
    dropped: float = 0.0
    kept: float = 0.0
    """Items that went through the outbox (relmon_review_submit_failures_total)."""
    outbox_peak: float = 0.0
    on_disk: int = 0
    """Items in the on-disk outbox while relmon was stopped (``restart_relmon``)."""
    down_reasons: list[str] = field(default_factory=list)
    ready_after_s: float | None = None
    """From PostgreSQL's return (pg_isready answers) to /readyz 200."""
    drained_after_s: float | None = None
    """From PostgreSQL's return to an empty outbox."""


async def _send(port: int, rate_per_s: float, stop: asyncio.Event, outcome: Outcome) -> None:
    bank = QuestionBank(size=50, seed=5)
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            question = bank.questions[outcome.sent % len(bank.questions)][0]
            body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": question}]}
            async with http.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": f"outage-{os.getpid()}-{time.time_ns()}"},
            ) as resp:
                assert resp.status == 202
            outcome.sent += 1
            await asyncio.sleep(1 / rate_per_s)


async def run_outage(
    cluster: OutageCluster,
    tmp_path: Path,
    fault: Fault,
    *,
    outage_s: float,
    rate_per_s: float,
    restart_relmon: bool = False,
) -> Outcome:
    """Traffic at ``rate_per_s``; PostgreSQL fails (``fault``) for ``outage_s``; with
    ``restart_relmon`` relmon is stopped during the outage and started again after the
    store's return. Counts what was scored and what reached the review queue."""
    database = f"relmon_outage_{next(_databases)}"
    dsn = cluster.create_database(database)
    model = SimulatedModel(quality=0.9, drift_after_s=None, bank=QuestionBank(size=50, seed=5))
    relmon = Relmon.configure(tmp_path, dsn, await model.start())
    outcome = Outcome()
    scored_before_restart = 0.0
    stop = asyncio.Event()
    try:
        await relmon.start()
        sender = asyncio.create_task(_send(relmon.traffic_port, rate_per_s, stop, outcome))
        async with aiohttp.ClientSession() as http:
            await asyncio.sleep(2.0)
            await asyncio.to_thread(cluster.fail, fault)
            down_at = time.monotonic()
            while time.monotonic() - down_at < outage_s:
                status, reasons = await relmon.readyz(http)
                if status == 503 and reasons:
                    outcome.down_reasons = reasons
                outcome.outbox_peak = max(
                    outcome.outbox_peak, relmon.value("relmon_review_outbox_items", **LABELS)
                )
                await asyncio.sleep(0.25)
            if restart_relmon:
                stop.set()
                await sender
                assert relmon.running is not None
                await relmon.running.sync_traffic()
                await wait_until(
                    lambda: relmon.running is not None and relmon.running.service.in_flight == 0,
                    timeout_s=30,
                    what="the items in flight scored",
                )
                scored_before_restart = relmon.value(
                    "relmon_items_total", outcome="scored", **LABELS
                )
                outcome.kept = relmon.value("relmon_review_submit_failures_total", **LABELS)
                await relmon.close()  # the items wait on disk
                outcome.on_disk = len(list((tmp_path / "state" / "review-outbox").glob("*.json")))
                await asyncio.to_thread(cluster.recover, fault)
                back = time.monotonic()
                await relmon.start()
            else:
                await asyncio.to_thread(cluster.recover, fault)
                back = time.monotonic()
            while outcome.ready_after_s is None or outcome.drained_after_s is None:
                status, _ = await relmon.readyz(http)
                now = time.monotonic() - back
                if status == 200 and outcome.ready_after_s is None:
                    outcome.ready_after_s = now
                if outcome.drained_after_s is None and (
                    relmon.value("relmon_review_outbox_items", **LABELS) == 0
                ):
                    outcome.drained_after_s = now
                if now > 60:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            stop.set()
            await sender
        running = relmon.running
        assert running is not None
        await running.sync_traffic()
        await wait_until(
            lambda: running.service.in_flight == 0 and len(running.service.reviews.outbox) == 0,
            timeout_s=60,
            what="every item scored and written",
        )
        outcome.scored = relmon.value("relmon_items_total", outcome="scored", **LABELS)
        outcome.scored += scored_before_restart
        outcome.dropped = relmon.value("relmon_review_outbox_dropped_total", **LABELS)
        outcome.kept += relmon.value("relmon_review_submit_failures_total", **LABELS)
        outcome.queued = int(cluster.psql("SELECT count(*) FROM review_items", database))
    finally:
        stop.set()
        await relmon.close()
        await model.stop()
    return outcome


def main() -> None:
    """``python -m tests.postgres.outage --fault stop --outage-s 30 --rate 4``: one
    outage, its numbers as a JSON line (scored, queued, dropped, time to ready)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--fault", choices=["stop", "kill9", "sigstop"], default="stop")
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--restart-relmon", action="store_true")
    args = parser.parse_args()

    async def one() -> Outcome:
        clusters = outage_cluster()
        cluster = next(clusters)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                return await run_outage(
                    cluster,
                    Path(tmp),
                    args.fault,
                    outage_s=args.outage_s,
                    rate_per_s=args.rate,
                    restart_relmon=args.restart_relmon,
                )
        finally:
            clusters.close()

    outcome = asyncio.run(one())
    print(json.dumps({"fault": args.fault, **dataclasses.asdict(outcome)}))


if __name__ == "__main__":
    main()
