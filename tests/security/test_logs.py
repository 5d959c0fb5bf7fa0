"""What a real ``relmon run`` writes: one JSON object a line, aiohttp's own error lines
included; no credential from a malformed request; no prompt or answer text in the logs
or the metrics unless ``log_prompts`` is on; a keyed query hash whose key is generated
once (0600) and reused; review items redacted before they are stored."""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
from pathlib import Path

import pytest

from monitor.core.events import query_text
from tests.security import (
    PROMPT,
    SECRETS,
    TOKEN,
    ModelThread,
    RelmonProcess,
    get,
    log_lines,
    raw_http,
)
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

BEARER = b"secret-xyz-credential"
MALFORMED = [
    # a bad request line, then the credential
    b"GET /\xff\x01 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + BEARER + b"\r\n\r\n",
    # a header line without a colon after the credential
    b"GET / HTTP/1.1\r\nAuthorization: Bearer " + BEARER + b"\r\nno colon here\r\n\r\n",
    # a header too long to parse, holding the credential
    b"GET / HTTP/1.1\r\nCookie: session=" + BEARER + b"x" * 20_000 + b"\r\n\r\n",
    # a bad HTTP version
    b"POST /v1/chat/completions HTTP/9.x\r\nX-Api-Key: " + BEARER + b"\r\n\r\n",
    # a body length that is not a number
    b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer " + BEARER + b"\r\n"
    b"Content-Length: ten\r\n\r\n",
]


def _item_lines(text: str) -> list[dict[str, object]]:
    return [line for line in log_lines(text) if line.get("event") == "item"]


def _scored(relmon: RelmonProcess) -> float:
    return relmon.metric("relmon_items_total", model="pii-model", task="chat", outcome="scored")


def _run_traffic(relmon: RelmonProcess, n: int, prefix: str) -> None:
    for i in range(n):
        assert relmon.mirror(PROMPT, f"{prefix}-{i}") == 202
    wait_until_sync(lambda: _scored(relmon) >= n, timeout_s=60, what=f"{n} items scored")


@pytest.fixture(scope="module")
def model() -> object:
    m = ModelThread()
    url = m.start()
    yield url
    m.stop()


def test_malformed_requests_log_json_without_the_credential(tmp_path: Path, model: str) -> None:
    relmon = RelmonProcess(tmp_path, model).start()
    try:
        for port in relmon.ports.values():
            for request in MALFORMED:
                status, _ = raw_http(port, request)
                assert status in (0, 400, 413, 431, 505), (port, request[:40], status)
        # The service still answers, with the same credential in a well-formed request.
        status, _ = get(relmon.url("review", "/api/reviews/next"), {"Authorization": "Bearer x"})
        assert status == 401
    finally:
        assert relmon.stop() == 0
    err = relmon.stderr()
    lines = log_lines(err)  # every line is one JSON object
    assert relmon.stdout() == ""
    assert BEARER.decode() not in err and BEARER.decode() not in relmon.stdout()
    assert "Traceback" not in err
    library = [line for line in lines if str(line.get("logger", "")).startswith("aiohttp")]
    assert library, "aiohttp's error lines did not come through the JSON log"
    assert all(line["level"] == "warning" and "error" in line for line in library)


def test_no_prompt_or_answer_in_logs_or_metrics_and_the_hash_is_keyed(
    tmp_path: Path, model: str
) -> None:
    relmon = RelmonProcess(tmp_path, model).start()
    try:
        _run_traffic(relmon, 3, "quiet")
        metrics = relmon.metrics()
        status, body = get(
            relmon.url("review", "/api/reviews/chat:quiet-0"), {"Authorization": f"Bearer {TOKEN}"}
        )
    finally:
        assert relmon.stop() == 0
    err = relmon.stderr()
    for fragment in SECRETS:
        assert fragment not in err, fragment
        assert fragment not in metrics, fragment
    # What the reviewer sees is redacted: e-mail and phone in the query, e-mail and card
    # in the answers, which are redacted before the text canonicalizer (that would strip
    # the e-mail's punctuation, so that no rule could recognise it any more).
    assert status == 200
    item = json.loads(body)
    assert "[email]" in item["query"] and "[phone]" in item["query"]
    assert "PROMPT-quokka-4412" in item["query"] and "alice" not in item["query"]
    assert [c["answer"] for c in item["candidates"]] == ["answerokapi5521 mail email card card"]
    # The logged query is HMAC-SHA256 under the generated key, 0600 in the state dir.
    key_file = relmon.state / "query-hash.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_bytes().strip()
    request = {"messages": [{"role": "user", "content": PROMPT}]}
    expected = hmac.new(key, query_text(request).encode(), hashlib.sha256).hexdigest()[:16]
    assert {line["query"] for line in _item_lines(err)} == {expected}
    unkeyed = hashlib.sha256(PROMPT.encode()).hexdigest()[:16]
    assert unkeyed not in err
    assert key.decode() not in err  # the key itself is never logged

    # Debug logging on (log_prompts), same state dir: the key is reused, and now the
    # prompt and the answer are in the log (never in the metrics).
    debug = RelmonProcess(tmp_path, model, extra="log_prompts: true", state=relmon.state).start()
    try:
        _run_traffic(debug, 2, "loud")
        metrics = debug.metrics()
    finally:
        assert debug.stop() == 0
    assert key_file.read_bytes().strip() == key
    lines = _item_lines(debug.stderr())
    assert lines and all(line["query"] == PROMPT for line in lines)
    # the top class: the (redacted) answer as the text canonicalizer normalised it
    assert all(line["answer"] == "answerokapi5521 mail email card card" for line in lines)
    for fragment in SECRETS:
        assert fragment not in metrics, fragment


def test_a_configured_key_is_used_and_no_file_is_written(tmp_path: Path, model: str) -> None:
    relmon = RelmonProcess(tmp_path, model, extra='query_hash_key: "k-0123456789abcdef"').start()
    try:
        _run_traffic(relmon, 1, "keyed")
    finally:
        assert relmon.stop() == 0
    assert not (relmon.state / "query-hash.key").exists()
    request = {"messages": [{"role": "user", "content": PROMPT}]}
    expected = hmac.new(
        b"k-0123456789abcdef", query_text(request).encode(), hashlib.sha256
    ).hexdigest()[:16]
    assert [line["query"] for line in _item_lines(relmon.stderr())] == [expected]
    assert "k-0123456789abcdef" not in relmon.stderr()
