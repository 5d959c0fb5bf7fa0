"""aiokafka's own log lines, rate-limited per logger and message template
(adapters.kafka.logs), and the count held back in relmon's JSON lines."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
import structlog

from adapters.kafka.logs import CLIENT_LOGGERS, ClientLogThrottle, throttle_client_logs
from monitor.app.logs import configure_logging


def record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, "f.py", 1, msg, args, None)


def test_one_line_per_logger_and_template_per_interval_whatever_the_arguments() -> None:
    now = [0.0]
    throttle = ClientLogThrottle(10.0, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"
    let_through = []
    for i in range(660):  # 60 lines a second for 11 s
        now[0] = i / 60
        r = record("aiokafka", template, 111 + i % 3, f"[Errno {i % 2}]")
        if throttle.filter(r):
            let_through.append(r)
    assert [getattr(r, "suppressed", 0) for r in let_through] == [0, 599]
    assert let_through[1].getMessage().startswith("Unable connect to node with id ")
    # Another template or another logger is another key.
    assert throttle.filter(record("aiokafka", "Unable to update metadata from %s", [111]))
    assert throttle.filter(record("aiokafka.conn", template, 1, "x"))
    assert throttle.suppressed_total == 599 + 59  # 59 held since the second line


def test_every_aiokafka_logger_gets_the_one_filter() -> None:
    import aiokafka.consumer.fetcher  # noqa: F401  (its logger exists once imported)

    throttle = throttle_client_logs()
    assert throttle_client_logs() is throttle
    for name in CLIENT_LOGGERS:
        filters = logging.getLogger(name).filters
        assert filters.count(throttle) == 1, name


def test_the_line_let_through_carries_the_count_in_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    try:
        configure_logging("json")
        logger = logging.getLogger("tests.kafka_logs")
        logger.propagate = True
        now = [0.0]
        throttle = ClientLogThrottle(10.0, clock=lambda: now[0])
        logger.addFilter(throttle)
        for i in range(50):
            now[0] = i * 0.5  # 25 s
            logger.error("Failed fetch messages from %s: %s", 111, "NodeNotReadyError")
        logger.removeFilter(throttle)
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
        structlog.configure(**config)  # later tests' lines go where they went before
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    assert [line.get("suppressed") for line in lines] == [None, 19, 19]
    assert all(line["logger"] == "tests.kafka_logs" for line in lines)
    assert lines[1]["event"] == "Failed fetch messages from 111: NodeNotReadyError"
