"""Verdicts over a size limit on the Kafka verdict topic, against a real broker and a
running relmon: each goes to the verdicts' dead-letter topic with the reason (the field
and its limit) in the ``relmon-error`` header and counts as
``relmon_verdicts_rejected_total{reason="invalid"}``; a 5 MB one too (its dead letter cut to the
verdict limit, the original size in a header), and the follower goes on with the next
verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.core.review import MAX_VERDICT_BYTES
from tests.kafka import produce, read_all
from tests.kafka.test_kafka_review import verdict
from tests.kafka.test_source_restart import start_on_kafka
from tests.kafka.test_verdict_restart import LABELS, rejected, review_item, reviews
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

HUGE = 5_000_000


async def test_verdicts_over_a_limit_are_dead_lettered_and_counted_invalid(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    running, topics, _ = await start_on_kafka(kafka_bootstrap, tmp_path)
    over = [
        {"item_id": "it-1", "accepted_ranks": [1], "reviewer": "r" * HUGE},
        {"item_id": "it-2", "none_of_these": True, "correct_answer": "4" * 4097},
        {"item_id": "it-3", "accepted_ranks": [1] * 201},
        {"item_id": "it-" + "9" * 1022, "accepted_ranks": [1]},
        {"item_id": "it-2", "accepted_ranks": [1], "reviewer": "r" * 257},
    ]
    values = [json.dumps(v).encode() for v in over]
    try:
        await wait_until(lambda: not running.not_ready(), timeout_s=60, what="relmon ready")
        await produce(kafka_bootstrap, topics["review"], [review_item(n) for n in (1, 2, 3)])
        await produce(kafka_bootstrap, topics["verdict"], values, max_request_size=2 * HUGE)
        # After the refused ones, good verdicts for the same items count.
        good = [verdict("it-1", 1, reviewer="ann"), verdict("it-2", 2), verdict("it-3")]
        await produce(kafka_bootstrap, topics["verdict"], good)
        await wait_until(
            lambda: (
                rejected(running, "invalid") == len(over)
                and reviews(running, "accepted", **LABELS) == 2
                and reviews(running, "none", **LABELS) == 1
            ),
            timeout_s=60,
            what="5 verdicts refused as invalid, then 3 applied",
        )
    finally:
        await running.close(10.0)
    letters = await read_all(kafka_bootstrap, topics["verdict-dlq"], at_least=len(over))
    headers = [dict(r.headers) for r in letters]
    assert [h["relmon-source-offset"] for h in headers] == [b"0", b"1", b"2", b"3", b"4"]
    errors = [h["relmon-error"].decode() for h in headers]
    for error, field, limit in zip(
        errors,
        ["verdict of", "correct_answer", "accepted_ranks", "item_id", "reviewer"],
        [f"{MAX_VERDICT_BYTES} bytes", "4096", "200", "1024", "256"],
        strict=True,
    ):
        assert field in error and limit in error, error
    # The 5 MB verdict is over the whole-verdict limit: its dead letter keeps the start.
    assert headers[0]["relmon-value-truncated-from"] == str(len(values[0])).encode()
    assert letters[0].value == values[0][:MAX_VERDICT_BYTES]
    assert [r.value for r in letters[1:]] == values[1:]
