"""``relmon run`` on a secured cluster, against a real Tansu broker.

- Mutual TLS with a private CA, end to end: every Kafka client relmon makes (traffic
  consumer and its dead-letter producer, review producer, replay of the review and
  verdict topics, verdict follower and its dead-letter producer) gets through a TLS
  listener that requires a client certificate signed by that CA.
- An untrusted CA, a missing client certificate, and a SASL SCRAM-SHA-512 login the
  broker refuses (plain and over TLS) stop ``relmon run`` at start with exit status 2
  and one error line naming the setting to check; the password is in no output.

Tansu 0.6.0 cannot serve TLS itself (see :mod:`tests.kafka.tls`): a TLS relay in front
of it does. With ``--authentication`` it requires SASL, but users cannot be created on
its in-memory storage once authentication is on (``tansu user create`` is refused for
not being authenticated, and a broker restarted with it has lost the users), so the
successful SASL login is covered by the unit tests of the options built
(tests/test_config_kafka_security.py); the refused one is tested here for real.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context
from prometheus_client.parser import text_string_to_metric_families

from monitor.canon import get_canonicalizer
from monitor.demo.model import QuestionBank, SimulatedModel, truth_of
from tests.kafka import (
    FAST_GROUP,
    arith_events,
    free_port,
    produce,
    read_all,
    relmon_config,
    relmon_topics,
    unique,
)
from tests.kafka.conftest import (
    ATTEMPTS,
    STARTUP_TIMEOUT_S,
    _wait_ready,
    spawn_broker,
    stop_broker,
)
from tests.kafka.tls import Pki, TlsRelay, make_pki

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_options(pki: Pki) -> dict[str, Any]:
    """The test's own clients: trust the CA, present the client certificate."""
    context = create_ssl_context(
        cafile=str(pki.ca), certfile=str(pki.client_cert), keyfile=str(pki.client_key)
    )
    return {"security_protocol": "SSL", "ssl_context": context}


async def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.returncode} during start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _broker_behind_tls(
    tmp_path: Path, pki: Pki, *, client_ca: Path | None, extra_args: tuple[str, ...] = ()
) -> tuple[str, subprocess.Popen[bytes], TlsRelay]:
    for attempt in range(ATTEMPTS):
        broker_port, relay_port = free_port(), free_port()
        proc = spawn_broker(
            broker_port, tmp_path, advertised_port=relay_port, extra_args=extra_args
        )
        try:
            relay = TlsRelay(relay_port, broker_port, pki, client_ca=client_ca).start()
        except OSError:
            await asyncio.to_thread(stop_broker, proc)
            continue
        bootstrap = f"127.0.0.1:{relay_port}"
        try:
            if extra_args:
                await _wait_listening(broker_port, proc)
            else:
                await _wait_ready(bootstrap, proc, **tls_options(pki))
            return bootstrap, proc, relay
        except (RuntimeError, KafkaError, OSError):
            relay.stop()
            await asyncio.to_thread(stop_broker, proc)
            if attempt == ATTEMPTS - 1:
                raise
    raise RuntimeError("no free ports for the broker and its TLS relay")


@pytest.fixture
async def mtls_kafka(tmp_path: Path, pki: Pki) -> AsyncIterator[str]:
    """A broker reached only through TLS that requires a client certificate."""
    bootstrap, proc, relay = await _broker_behind_tls(tmp_path, pki, client_ca=pki.ca)
    try:
        yield bootstrap
    finally:
        relay.stop()
        await asyncio.to_thread(stop_broker, proc)


def metrics_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def run_relmon(
    cfg: Path, log: Path, *, out: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``relmon run``; with ``out``, in drain mode writing the final metrics there. The
    quiet time that ends the drain (10 s) leaves the test time to answer the review
    items on a loaded machine."""
    args = [sys.executable, "-m", "monitor", "run", "--config", str(cfg)]
    if out is not None:
        args += ["--drain", "--idle-s", "10", "--metrics-out", str(out)]
    with log.open("ab") as handle:
        return subprocess.Popen(
            args, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ) | (env or {})
        )


async def finish(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    try:
        return await asyncio.to_thread(proc.wait, timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_run_over_mutual_tls_end_to_end(mtls_kafka: str, pki: Pki, tmp_path: Path) -> None:
    tls = tls_options(pki)
    topics = await relmon_topics(mtls_kafka, **tls)
    bank = QuestionBank(size=12, seed=5)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=3)
    url = await model.start()
    events = arith_events([q for q, _ in bank.questions], "t")
    await produce(mtls_kafka, topics["traffic"], [*events[:6], b"{not json", *events[6:]], **tls)
    cfg, out, log = tmp_path / "relmon.yaml", tmp_path / "m.prom", tmp_path / "relmon.log"
    security = {
        "security_protocol": "SSL",
        "tls": {
            "ca_file": str(pki.ca),
            "cert_file": str(pki.client_cert),
            "key_file": str(pki.client_key),
        },
        **FAST_GROUP,
        "max_poll_interval_ms": 60_000,
    }
    relmon_config(
        cfg, url, mtls_kafka, topics=topics, group=unique("tls"), port=free_port(), kafka=security
    )
    canon = get_canonicalizer("numeric")
    scores: dict[str, float] = {}
    proc = run_relmon(cfg, log, out=out)
    try:
        items = await read_all(mtls_kafka, topics["review"], at_least=12, timeout_s=120, **tls)
        assert len(items) == 12, log.read_text()[-3000:]
        verdicts = []
        for record in items:
            item = json.loads(record.value)
            truth = canon.canonicalize(str(truth_of(item["query"])))
            ranks = [c["rank"] for c in item["candidates"] if c["answer"] == truth]
            scores[item["item_id"]] = float(min(ranks)) if ranks else math.inf
            verdict = {"item_id": item["item_id"], "reviewer": "test"}
            verdict |= {"accepted_ranks": ranks} if ranks else {"none_of_these": True}
            verdicts.append(json.dumps(verdict).encode())
        await produce(mtls_kafka, topics["verdict"], [*verdicts, b"not a verdict"], **tls)
        assert await finish(proc, 150) == 0, log.read_text()[-3000:]
    finally:
        await model.stop()
    m = metrics_of(out.read_text())
    labels = (("model", "sim-arith-1"), ("task", "arithmetic"))
    assert m[("relmon_calibration_items", labels)] == 12
    values = list(scores.values())
    assert m[("relmon_reliability_level", labels)] == pytest.approx(
        sum(v <= 1 for v in values) / (len(values) + 1)
    )
    kafka_source = (("decision", "sampled"), ("source", "kafka"))
    assert m[("relmon_traffic_events_total", kafka_source)] == 12
    dead = await read_all(mtls_kafka, topics["dlq"], at_least=1, **tls)
    assert [r.value for r in dead] == [b"{not json"]
    dead = await read_all(mtls_kafka, topics["verdict-dlq"], at_least=1, **tls)
    assert [r.value for r in dead] == [b"not a verdict"]
    text = log.read_text()
    assert "PRIVATE KEY" not in text


async def _refused_start(
    tmp_path: Path, bootstrap: str, kafka: dict[str, Any], env: dict[str, str] | None = None
) -> str:
    """Run relmon against ``bootstrap`` with ``kafka`` settings; it must exit 2 at start.
    Returns everything it wrote."""
    topics = {k: unique(k) for k in ("traffic", "review", "verdict", "dlq", "verdict-dlq")}
    cfg, log = tmp_path / "relmon.yaml", tmp_path / "relmon.log"
    relmon_config(
        cfg,
        "http://127.0.0.1:9/v1",
        bootstrap,
        topics=topics,
        group=unique("refused"),
        port=free_port(),
        kafka=kafka,
    )
    proc = run_relmon(cfg, log, env=env)
    status = await finish(proc, 120)
    text = log.read_text()
    assert status == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("relmon: error: ")]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("untrusted-ca", "certificate was not accepted"),
        ("no-client-certificate", "closed the connection after the TLS handshake"),
    ],
)
async def test_tls_refused_at_start_exits_with_a_clear_error(
    mtls_kafka: str, pki: Pki, tmp_path: Path, case: str, expected: str
) -> None:
    tls: dict[str, Any] = {"ca_file": str(pki.other_ca if case == "untrusted-ca" else pki.ca)}
    if case == "untrusted-ca":
        tls |= {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    text = await _refused_start(tmp_path, mtls_kafka, {"security_protocol": "SSL", "tls": tls})
    errors = _error_lines(text)
    assert len(errors) == 1, text[-3000:]
    assert f"cannot reach Kafka at {mtls_kafka}" in errors[0]
    assert expected in errors[0] and "kafka.tls" in errors[0], errors[0]


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
async def test_sasl_login_refused_at_start_exits_clearly_without_the_password(
    tmp_path: Path, pki: Pki, protocol: str
) -> None:
    password = f"pw-{secrets.token_hex(8)}"
    if protocol == "SASL_SSL":
        bootstrap, proc, relay = await _broker_behind_tls(
            tmp_path, pki, client_ca=None, extra_args=("--authentication",)
        )
    else:
        for attempt in range(ATTEMPTS):
            port = free_port()
            proc = spawn_broker(port, tmp_path, extra_args=("--authentication",))
            try:
                await _wait_listening(port, proc)
                break
            except (RuntimeError, OSError):
                await asyncio.to_thread(stop_broker, proc)
                if attempt == ATTEMPTS - 1:
                    raise
        bootstrap, relay = f"127.0.0.1:{port}", None
    kafka: dict[str, Any] = {
        "security_protocol": protocol,
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": "relmon"},
    }
    if protocol == "SASL_SSL":
        kafka["tls"] = {"ca_file": str(pki.ca)}
    try:
        text = await _refused_start(
            tmp_path, bootstrap, kafka, env={"RELMON_KAFKA__SASL__PASSWORD": password}
        )
    finally:
        if relay is not None:
            relay.stop()
        await asyncio.to_thread(stop_broker, proc)
    errors = _error_lines(text)
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith(f"relmon: error: cannot reach Kafka at {bootstrap}: SASL ")
    assert "SASL SCRAM-SHA-512 authentication of user 'relmon' failed" in errors[0], errors[0]
    assert "kafka.sasl.username" in errors[0]
    assert password not in text
