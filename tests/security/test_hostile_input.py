"""Hostile input over real HTTP to a real ``relmon run``: a 4xx or a counted rejection,
never a 500 or a traceback, and the service keeps going.

Raw sockets send what HTTP client libraries refuse to send (header bytes that are not
UTF-8). Each rejection is checked in ``relmon_traffic_events_total{decision="rejected"}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.security import (
    PROMPT,
    TOKEN,
    ModelThread,
    RelmonProcess,
    clean_log,
    get,
    log_lines,
    post,
    raw_http,
)
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

AUTH = {"Authorization": f"Bearer {TOKEN}"}
REJECTED = {"source": "mirror", "decision": "rejected"}


@pytest.fixture(scope="module")
def relmon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelmonProcess]:
    model = ModelThread()
    url = model.start()
    proc = RelmonProcess(tmp_path_factory.mktemp("hostile"), url)
    try:
        yield proc.start()
    finally:
        proc.stop()
        model.stop()


@pytest.fixture(scope="module")
def item_id(relmon: RelmonProcess) -> str:
    """A review item to post verdicts to."""
    assert relmon.mirror(PROMPT, "hostile-item") == 202
    found: list[str] = []

    def waiting() -> bool:
        status, body = get(relmon.url("review", "/api/reviews/chat:hostile-item"), AUTH)
        if status == 200:
            found.append(json.loads(body)["item_id"])
        return bool(found)

    wait_until_sync(waiting, timeout_s=60, what="the review item chat:hostile-item")
    return found[0]


def _rejected_after(relmon: RelmonProcess, send: object) -> None:
    """``send()`` is answered 202 and adds exactly one rejection."""
    before = relmon.metric("relmon_traffic_events_total", **REJECTED)
    assert callable(send)
    assert send() == 202
    wait_until_sync(
        lambda: relmon.metric("relmon_traffic_events_total", **REJECTED) == before + 1,
        timeout_s=30,
        what="the rejection to be counted",
    )


@pytest.fixture(autouse=True)
def no_tracebacks(relmon: RelmonProcess) -> Iterator[None]:
    """What relmon logged during the test: JSON lines, no traceback, nothing failed."""
    with clean_log(relmon):
        yield


@pytest.mark.parametrize(
    "value", [b"Bearer \xff\xfe\xfd", b"Bearer " + TOKEN.encode() + b"\x80", b"\xc3\x28 x"]
)
def test_authorization_that_is_not_utf8_is_401(relmon: RelmonProcess, value: bytes) -> None:
    for path in (b"/api/reviews/next", b"/api/review-page/progress"):
        request = (
            b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
            b"Connection: close\r\n\r\n"
        )
        status, body = raw_http(relmon.ports["review"], request)
        assert status == 401, body
        assert json.loads(body)["error"] in ("invalid token", "missing bearer token")


@pytest.mark.parametrize(
    "body",
    [
        b'{"accepted_ranks": [' + b"9" * 5000 + b"]}",
        b'{"none_of_these": true, "reviewer": ' + b"1" * 5000 + b"}",
        b"[" * 30_000 + b"]" * 30_000,
        b'{"none_of_these": true, "correct_answer": "\\ud800"}',
        b'{"none_of_these": true, "reviewer": "\\udfff"}',
    ],
    ids=["5000-digit rank", "5000-digit reviewer", "nested", "surrogate answer", "surrogate"],
)
def test_garbage_verdicts_are_400(relmon: RelmonProcess, item_id: str, body: bytes) -> None:
    status, answer = post(relmon.url("review", f"/api/reviews/{item_id}"), body, AUTH)
    assert status == 400, answer
    page = relmon.url("review", f"/api/review-page/verdicts/{item_id}?session=s1")
    status, answer = post(page, body, AUTH)
    assert status == 400, answer


def test_request_id_that_is_not_utf8_is_a_counted_rejection(relmon: RelmonProcess) -> None:
    body = json.dumps({"model": "pii-model", "messages": [{"role": "user", "content": "hi"}]})

    def send() -> int:
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: req-\xff\xfe-1\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body.encode()
        )
        return raw_http(relmon.ports["traffic"], request)[0]

    _rejected_after(relmon, send)


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": 5}],
        [{"type": "text", "text": {"nested": ["garbage"]}}],
        [{"type": "text", "text": None}],
        ["not a part"],
        {"text": "a dict, not a list"},
        "lone surrogate \ud800",
    ],
    ids=["int", "dict", "null", "string part", "dict content", "surrogate"],
)
def test_content_that_is_not_text_is_a_counted_rejection(
    relmon: RelmonProcess, content: object
) -> None:
    rid = f"content-{abs(hash(json.dumps(content)))}"
    _rejected_after(relmon, lambda: relmon.mirror(content, rid))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "pii-model", "messages": [{"role": "user", "content": "x"}], "n": '
        + b"7" * 5000
        + b"}",
        b'{"model": "pii-model", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}',
    ],
    ids=["5000-digit number", "nested", "surrogate model"],
)
def test_malformed_mirror_bodies_are_counted_rejections(relmon: RelmonProcess, raw: bytes) -> None:
    url = relmon.url("traffic", "/v1/chat/completions")
    _rejected_after(relmon, lambda: post(url, raw, {"X-Request-Id": f"raw-{len(raw)}"})[0])


def test_the_service_still_works_afterwards(relmon: RelmonProcess, item_id: str) -> None:
    status, body = post(
        relmon.url("review", f"/api/reviews/{item_id}"), b'{"accepted_ranks": [1]}', AUTH
    )
    assert status == 200 and json.loads(body)["status"] in ("applied", "duplicate")
    assert get(relmon.url("metrics", "/healthz"))[0] == 200
    scored = relmon.metric("relmon_items_total", model="pii-model", task="chat", outcome="scored")
    assert scored >= 1


def test_log_is_json_only(relmon: RelmonProcess) -> None:
    assert relmon.stdout() == ""
    assert log_lines(relmon.stderr())


@pytest.mark.parametrize("port", ["metrics", "review", "traffic"])
@pytest.mark.parametrize("path", [b"/metrics", b"/api/reviews/next", b"/v1/chat/completions"])
def test_an_expect_header_that_is_not_utf8_is_417_not_echoed(
    relmon: RelmonProcess, port: str, path: bytes
) -> None:
    request = (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nExpect: zz-\xff\xfe-echo\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\n{}"
    )
    status, body = raw_http(relmon.ports[port], request)
    assert status == 417
    assert b"echo" not in body


HEADERS = [b"Authorization", b"Expect", b"X-Request-Id", b"X-Relmon-Task", b"Content-Type"]
HEADERS += [b"Cookie", b"Accept", b"Content-Encoding", b"X-Forwarded-For", b"Origin"]
PATHS = [b"/api/reviews/next", b"/api/reviews/chat:x", b"/api/review-page/progress"]
PATHS += [b"/api/review-page/release/x?session=s", b"/v1/chat/completions", b"/review"]
PATHS += [b"/openapi.json", b"/metrics", b"/readyz", b"/nowhere"]
# Header values: any byte but CR, LF and NUL (which end or break the header line).
VALUE = st.binary(max_size=24).map(lambda b: b.translate(None, b"\r\n\x00"))


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(
    port=st.sampled_from(["metrics", "review", "traffic"]),
    method=st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT"]),
    path=st.sampled_from(PATHS),
    headers=st.lists(st.tuples(st.sampled_from(HEADERS), VALUE), max_size=4),
    body=st.sampled_from([b"", b"{}", b'{"none_of_these": true}', b"\xff\xfe{", PROMPT.encode()]),
)
def test_random_header_bytes_never_give_a_5xx(
    *,
    relmon: RelmonProcess,
    port: str,
    method: bytes,
    path: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    lines = [b"Host: x", b"Connection: close", b"Content-Length: " + str(len(body)).encode()]
    lines += [name + b": " + value for name, value in headers]
    request = method + b" " + path + b" HTTP/1.1\r\n" + b"\r\n".join(lines) + b"\r\n\r\n" + body
    status, _ = raw_http(relmon.ports[port], request)
    assert 200 <= status < 500, (status, request[:200])
