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
import functools
import json
import math
import os
import secrets
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiokafka.helpers import create_ssl_context
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from monitor.app.runner import start_service
from monitor.config import load_settings
from monitor.core.canon import get_canonicalizer
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
from tests.waiting import WaitError, accepts_tcp, wait_until

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
    """The broker accepts connections (with SASL on, no metadata without a login)."""
    await wait_until(
        accepts_tcp(port),
        timeout_s=STARTUP_TIMEOUT_S,
        what=f"the broker to listen on {port}",
        interval_s=0.1,
        alive=proc,
    )


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
        except (WaitError, OSError):
            relay.stop()
            await asyncio.to_thread(stop_broker, proc)
            if attempt == ATTEMPTS - 1:
                raise
    raise RuntimeError("no free ports for the broker and its TLS relay")


@pytest.fixture
async def mtls_cluster(tmp_path: Path, pki: Pki) -> AsyncIterator[tuple[str, TlsRelay]]:
    """A broker reached only through TLS that requires a client certificate:
    ``(bootstrap, the TLS relay)``."""
    bootstrap, proc, relay = await _broker_behind_tls(tmp_path, pki, client_ca=pki.ca)
    try:
        yield bootstrap, relay
    finally:
        relay.stop()
        await asyncio.to_thread(stop_broker, proc)


@pytest.fixture
def mtls_kafka(mtls_cluster: tuple[str, TlsRelay]) -> str:
    """The bootstrap address of :func:`mtls_cluster`."""
    return mtls_cluster[0]


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
            except WaitError:
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


async def test_every_client_shares_one_tls_context_and_the_group_gets_its_timeouts(
    mtls_kafka: str, pki: Pki, tmp_path: Path
) -> None:
    """In process: the traffic consumer and its dead-letter producer, the review producer,
    the verdict follower and its producer, and the replay all hold the same SSL context;
    only the traffic consumer (the one group member) gets the group timeouts."""
    topics = await relmon_topics(mtls_kafka, **tls_options(pki))
    cfg = tmp_path / "relmon.yaml"
    group = {
        "session_timeout_ms": 7000,
        "heartbeat_interval_ms": 700,
        "max_poll_interval_ms": 70_000,
        "rebalance_timeout_ms": 3000,
    }
    tls = {
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert),
        "key_file": str(pki.client_key),
    }
    relmon_config(
        cfg,
        "http://127.0.0.1:9/v1",
        mtls_kafka,
        topics=topics,
        group=unique("inproc"),
        port=free_port(),
        kafka={"security_protocol": "SSL", "tls": tls, **group},
        query_hash_key="k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y",
    )
    running = await start_service(load_settings(cfg))
    try:
        by_type = {type(s).__name__: s for s in running.sources}
        source, follower = by_type["KafkaEventSource"], by_type["KafkaVerdictConsumer"]
        clients = [
            source._consumer,
            source._producer,
            follower._consumer,
            follower._producer,
            running.service.review_queue._producer,  # type: ignore[attr-defined]
        ]
        # aiokafka's network client: ``_client`` of a consumer, ``client`` of a producer
        contexts = [getattr(c, "_client", None) or c.client for c in clients]
        context = contexts[0]._ssl_context
        assert isinstance(context, ssl.SSLContext)
        assert all(c._ssl_context is context for c in contexts)
        assert running.store.consumer_options["ssl_context"] is context  # type: ignore[attr-defined]
        consumer = source._consumer
        assert (
            consumer._session_timeout_ms,
            consumer._heartbeat_interval_ms,
            consumer._max_poll_interval_ms,
            consumer._rebalance_timeout_ms,
        ) == tuple(group.values())
        assert follower._consumer._session_timeout_ms == 10_000  # aiokafka's default
    finally:
        await running.close(5)


async def test_a_source_that_cannot_reconnect_logs_why(
    mtls_kafka: str, mtls_cluster: tuple[str, TlsRelay], pki: Pki, tmp_path: Path
) -> None:
    """The brokers' certificate is replaced by one from a CA relmon does not trust while
    it runs: the supervisor's restarts fail and one ``source_unreachable`` line says why;
    once the certificate is right again the source reconnects and takes events."""
    from adapters.kafka.clients import client_options, connection_problem
    from adapters.kafka.source import KafkaEventSource
    from monitor.app.supervision import supervise
    from monitor.config import KafkaSettings, KafkaTlsSettings
    from monitor.engine.ports import Admission
    from tests.kafka import event_bytes, new_topic

    tls = tls_options(pki)
    topic = await new_topic(mtls_kafka, "traffic-rotated", **tls)
    kafka = KafkaSettings(
        security_protocol="SSL",
        tls=KafkaTlsSettings(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key),
    )
    options = client_options(kafka)
    seen: list[str] = []

    def sink(event: Any, source: str) -> Admission:
        seen.append(event.id)
        return Admission("skipped")

    source = KafkaEventSource(
        mtls_kafka, topic, unique("rotated"), "unused-dlq", sink, lambda s, r: None,
        **options, **FAST_GROUP,
    )  # fmt: skip
    relay = mtls_cluster[1]
    await source.start()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(
            supervise(
                source,
                max_delay_s=1.0,
                explain=functools.partial(connection_problem, mtls_kafka, options),
            )
        )
        try:
            await produce(mtls_kafka, topic, [event_bytes("a0")], **tls)
            await wait_until(lambda: "a0" in seen, timeout_s=60, what="a0 at the sink")
            relay.use_certificate(make_pki(tmp_path / "other-pki"))
            source._fail("consuming failed: KafkaConnectionError")  # as a dropped connection does
            await wait_until(
                lambda: any(e["event"] == "source_unreachable" for e in logs),
                timeout_s=60,
                what="a source_unreachable log line",
            )
            assert not source.connected
            relay.use_certificate(pki)
            # restarts counts the tries, the failed ones included
            await wait_until(
                lambda: source.restarts >= 2 and source.connected,
                timeout_s=60,
                what="the source restarted (twice) and connected",
            )
            await produce(mtls_kafka, topic, [event_bytes("b0")], **tls)
            await wait_until(lambda: "b0" in seen, timeout_s=60, what="b0 at the sink")
        finally:
            await source.stop()
            await asyncio.wait_for(task, 30)
    why = [e for e in logs if e["event"] == "source_unreachable"]
    assert len(why) == 1, logs
    assert why[0]["source"] == "KafkaEventSource"
    assert "certificate was not accepted" in why[0]["why"]
    assert "kafka.tls.ca_file" in why[0]["why"]
