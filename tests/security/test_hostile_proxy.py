"""Hostile input through the inline proxy (``traffic.mode: proxy``) of a real
``relmon run``: the live path gets the upstream's own answer (the same status as the
upstream gives the same bytes directly) or a clear 4xx of its own, never a 5xx made by
relmon or a traceback, and what relmon cannot monitor is a counted rejection.

The mirror's hostile-input tests (``test_hostile_input.py``) cover the review API and
the mirror; the proxy is a different code path: it forwards every request to the
upstream before it samples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.security import ModelThread, RelmonProcess, clean_log, raw_http
from tests.security.test_hostile_input import HEADERS, VALUE
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REJECTED = {"source": "proxy", "decision": "rejected"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[ModelThread]:
    """The model relmon re-asks, and also the upstream the proxy forwards to (a test
    double: it answers garbage with its own 500, which the proxy must pass on)."""
    model = ModelThread()
    model.start()
    try:
        yield model
    finally:
        model.stop()


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream: ModelThread
) -> Iterator[RelmonProcess]:
    url = f"http://127.0.0.1:{upstream.port}"
    proc = RelmonProcess(
        tmp_path_factory.mktemp("hostile-proxy"),
        f"{url}/v1",
        traffic=f'mode: proxy, upstream_url: "{url}"',
    )
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture(autouse=True)
def no_tracebacks(proxy: RelmonProcess) -> Iterator[None]:
    """What relmon logged during the test: JSON lines, no traceback, nothing failed."""
    with clean_log(proxy):
        yield


def _request(headers: list[bytes], body: bytes) -> bytes:
    lines = [b"Host: x", b"Connection: close", b"Content-Length: " + str(len(body)).encode()]
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        + b"\r\n".join(lines + headers)
        + b"\r\n\r\n"
        + body
    )


def test_request_id_that_is_not_utf8_is_forwarded_and_a_counted_rejection(
    proxy: RelmonProcess,
) -> None:
    body = json.dumps({"model": "pii-model", "messages": [{"role": "user", "content": "hi"}]})
    before = proxy.metric("relmon_traffic_events_total", **REJECTED)
    request = _request(
        [b"Content-Type: application/json", b"X-Request-Id: req-\xff\xfe-1"], body.encode()
    )
    status, answer = raw_http(proxy.ports["traffic"], request)
    assert status == 200, answer  # the upstream's answer reached the client unchanged
    assert b"choices" in answer
    wait_until_sync(
        lambda: proxy.metric("relmon_traffic_events_total", **REJECTED) == before + 1,
        timeout_s=30,
        what="the rejection to be counted",
    )


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(
    headers=st.lists(st.tuples(st.sampled_from(HEADERS), VALUE), max_size=4),
    body=st.sampled_from([b"", b"{}", b"\xff\xfe{", b'{"messages": [{"content": 5}]}']),
)
def test_random_header_bytes_through_the_proxy_give_the_upstreams_own_answer(
    *,
    proxy: RelmonProcess,
    upstream: ModelThread,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    request = _request([n + b": " + v for n, v in headers], body)
    status, answer = raw_http(proxy.ports["traffic"], request)
    direct, _ = raw_http(upstream.port, request)
    # What the upstream says to these bytes, or a 4xx relmon answers itself before
    # forwarding (417 for an Expect other than 100-continue), never a 5xx of relmon's.
    relmons_4xx = 400 <= status < 500 and answer.startswith(b'{"error": ')
    assert status == direct or relmons_4xx, (status, direct, answer[:200], headers)


def test_the_proxy_still_forwards_and_samples_afterwards(proxy: RelmonProcess) -> None:
    body = json.dumps({"model": "pii-model", "messages": [{"role": "user", "content": "ok?"}]})
    sampled = {"source": "proxy", "decision": "sampled"}
    before = proxy.metric("relmon_traffic_events_total", **sampled)
    request = _request(
        [b"Content-Type: application/json", b"X-Request-Id: after-fuzz"], body.encode()
    )
    status, answer = raw_http(proxy.ports["traffic"], request)
    assert status == 200 and b"choices" in answer
    wait_until_sync(
        lambda: proxy.metric("relmon_traffic_events_total", **sampled) == before + 1,
        timeout_s=30,
        what="the request to be sampled",
    )
