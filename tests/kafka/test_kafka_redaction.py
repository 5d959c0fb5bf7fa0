"""Redaction on the Kafka review backend: the review item published on the review topic
carries the redacted query and candidates, never the raw prompt or answer. The answer's
e-mail address and API key would not survive the ``text`` canonicalizer in a form the
rules match: the answers are redacted before they are canonicalized."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from monitor.app.runner import start_service
from monitor.config import load_settings
from tests.kafka import new_topic, read_all, unique
from tests.security import ModelThread

pytestmark = pytest.mark.timeout(120)

PROMPT = "Refund for jane.roe@example.com, card 5555 5555 5555 4444, EMP-204518"
ANSWER = (
    "Sure: card 5555-5555-5555-4444 refunded for EMP-204518; receipt sent to "
    "jane.roe@example.com, signed with sk-live-Zq8Xw3Vb7Nm2Lk4Jh6Gf."
)


async def test_review_topic_gets_redacted_items(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = {
        k: await new_topic(kafka_bootstrap, k) for k in ("traffic", "review", "verdict", "dlq")
    }
    model = ModelThread(ANSWER)
    url = model.start()
    settings = load_settings(
        None,
        tasks=[
            {
                "name": "refunds",
                "canonicalizer": "text",
                "endpoint": {"base_url": url, "model": "m", "timeout_s": 10},
                "k_max": 3,
                "k0": 3,
                "sampling_rate": 1.0,
                "review_rate": 1.0,
            }
        ],
        metrics={"port": 0},
        traffic={"mode": "mirror", "port": 0},
        review={"backend": "kafka"},
        kafka={
            "enabled": True,
            "bootstrap_servers": kafka_bootstrap,
            "traffic_topic": topics["traffic"],
            "review_topic": topics["review"],
            "verdict_topic": topics["verdict"],
            "dead_letter_topic": topics["dlq"],
            "group_id": unique("redact"),
        },
        redaction={"rules": [{"name": "employee", "pattern": r"(?i)EMP-?\d{6}"}]},
        state_dir=tmp_path / "state",
    )
    running = await start_service(settings)
    try:
        assert running.traffic_server is not None
        port = running.traffic_server.bound_port
        body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": "k-redact-1"},
            ) as resp,
        ):
            assert resp.status == 202
        [record] = await read_all(kafka_bootstrap, topics["review"], at_least=1, timeout_s=60)
    finally:
        await running.close(5)
        model.stop()
    item = json.loads(record.value)
    assert item["item_id"] == "refunds:k-redact-1"
    assert item["query"] == "Refund for [email], card [card], [redacted]"
    [candidate] = item["candidates"]
    assert candidate["answer"] == (
        "sure card card refunded for redacted receipt sent to email signed with secret"
    )
    raw = record.value.decode()
    squashed = "".join(ch for ch in raw.casefold() if ch.isalnum())
    for fragment in ("jane.roe", "janeroe", "5555", "204518", "Zq8Xw3Vb7Nm2Lk4Jh6Gf"):
        assert fragment not in raw
        assert fragment.casefold() not in squashed
