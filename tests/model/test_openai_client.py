"""HttpModelClient against real aiohttp servers on 127.0.0.1 (scripted per test)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from aiohttp import web

from adapters.model.client import (
    FORWARDED_FIELDS,
    OUTCOMES,
    HttpModelClient,
    build_body,
    parse_completion,
    parse_retry_after,
)
from monitor.core.apis.generic import GenericApi
from monitor.core.errors import ConfigError, InputError, ModelCallError
from tests.model.conftest import (
    ClientFactory,
    Endpoint,
    FakeClock,
    FakeSleep,
    chunked,
    raw,
    reply,
    status,
)

REQUEST = {
    "model": "prod-model",
    "messages": [{"role": "user", "content": "What is 2 + 3?"}],
    "stream": True,
    "n": 7,
    "seed": 42,
    "temperature": 0.0,
    "max_tokens": 999,
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "user": "someone",
    "top_p": 0.9,
    "stop": ["\n\n"],
}


# --- happy paths -------------------------------------------------------------------


async def test_single_sample_sends_the_documented_body(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    endpoint.script(reply("5"))
    client = make_client(temperature=0.7, max_tokens=16)
    assert await client.sample(REQUEST, 1) == ["5"]
    (sent,) = endpoint.requests
    assert sent == {
        "messages": REQUEST["messages"],
        "model": "test-model",
        "temperature": 0.7,
        "max_tokens": 16,
        "stream": False,
        "top_p": 0.9,
        "stop": ["\n\n"],
    }
    assert make_client.outcomes == ["ok"]
    assert endpoint.headers[0]["Content-Type"] == "application/json"


async def test_n_in_one_request_when_supported(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    client = make_client(supports_n=True)
    assert await client.sample(REQUEST, 3) == ["answer 0", "answer 1", "answer 2"]
    assert [r["n"] for r in endpoint.requests] == [3]
    assert make_client.outcomes == ["ok"]


async def test_endpoint_ignoring_n_is_topped_up_with_single_calls(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    endpoint.default = reply("4")  # one choice whatever n says (like llama.cpp)
    client = make_client(supports_n=True)
    assert await client.sample(REQUEST, 3) == ["4", "4", "4"]
    assert [r.get("n") for r in endpoint.requests] == [3, None, None]
    assert make_client.outcomes == ["ok"] * 3


async def test_without_n_sends_single_calls(endpoint: Endpoint, make_client: ClientFactory) -> None:
    client = make_client(supports_n=False)
    assert await client.sample(REQUEST, 5) == ["answer 0"] * 5
    assert len(endpoint.requests) == 5
    assert all("n" not in r for r in endpoint.requests)
    assert await client.sample(REQUEST, 0) == []
    with pytest.raises(ConfigError, match="n must be"):
        await client.sample(REQUEST, -1)


@pytest.mark.parametrize("concurrency", [1, 2, 4])
async def test_parallel_calls_respect_concurrency(
    endpoint: Endpoint, make_client: ClientFactory, concurrency: int
) -> None:
    # The first `concurrency` requests are held until that many are in flight at once;
    # a client that let more through would be caught sending them meanwhile.
    gate = endpoint.gate(concurrency)
    endpoint.script(*[gate] * concurrency)
    client = make_client(concurrency=concurrency)
    answers = await client.sample(REQUEST, 8)
    assert endpoint.gate_timeouts == 0  # the gate opened: `concurrency` were in flight
    assert sorted(answers) == ["answer 0"] * (8 - concurrency) + ["gated"] * concurrency
    assert len(endpoint.requests) == 8
    assert endpoint.max_in_flight == concurrency


async def test_content_null_is_an_empty_answer(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    endpoint.script(reply(None))
    client = make_client()
    assert await client.sample(REQUEST, 1) == [""]
    assert make_client.outcomes == ["ok"]


async def test_auth_header_sent_and_key_never_shown(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    secret = "sk-test-0123456789"
    client = make_client(api_key=secret)
    await client.sample(REQUEST, 1)
    assert endpoint.headers[0]["Authorization"] == f"Bearer {secret}"
    assert secret not in repr(client)
    endpoint.script(status(401, body=f"bad key {secret}"))
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 1)
    assert info.value.status == 401
    assert secret not in str(info.value)


async def test_no_auth_header_without_key(endpoint: Endpoint, make_client: ClientFactory) -> None:
    await make_client().sample(REQUEST, 1)
    assert "Authorization" not in endpoint.headers[0]


# --- failures and retries ---------------------------------------------------------


async def test_timeout_is_retried_then_fails(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep
) -> None:
    endpoint.default = endpoint.hang()
    client = make_client(timeout_s=0.2, max_retries=1, backoff_base_s=0.5)
    started = time.monotonic()
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 1)
    # Two attempts of 0.2 s, not of the factory's 5 s (that would be 10 s; the hang
    # itself never answers): generous for a loaded machine.
    assert time.monotonic() - started < 9.0
    assert info.value.retriable is True
    assert make_client.outcomes == ["timeout", "timeout"]
    assert len(endpoint.requests) == 2
    assert len(fake_sleep.delays) == 1 and 0.25 <= fake_sleep.delays[0] <= 0.5


async def test_server_error_then_success(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep
) -> None:
    endpoint.script(status(500), status(502))
    endpoint.default = reply("ok")
    client = make_client(backoff_base_s=1.0, backoff_max_s=30.0)
    assert await client.sample(REQUEST, 1) == ["ok"]
    assert make_client.outcomes == ["server_error", "server_error", "ok"]
    # equal jitter: attempt i waits in [d/2, d] with d = 1 * 2**i
    assert 0.5 <= fake_sleep.delays[0] <= 1.0
    assert 1.0 <= fake_sleep.delays[1] <= 2.0


async def test_retries_are_bounded(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep
) -> None:
    endpoint.default = status(503)
    client = make_client(max_retries=3, backoff_base_s=1.0, backoff_max_s=2.0)
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is True and info.value.status == 503
    assert make_client.outcomes == ["server_error"] * 4
    assert len(fake_sleep.delays) == 3
    assert max(fake_sleep.delays) <= 2.0  # capped at backoff_max_s


async def test_429_honours_retry_after_seconds(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep
) -> None:
    endpoint.script(status(429, {"Retry-After": "1"}))
    endpoint.default = reply("7")
    client = make_client(backoff_base_s=0.01)
    assert await client.sample(REQUEST, 1) == ["7"]
    assert fake_sleep.delays == [1.0]
    assert make_client.outcomes == ["rate_limited", "ok"]


async def test_429_honours_retry_after_date_and_caps_it(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep, fake_clock: FakeClock
) -> None:
    soon = format_datetime(datetime.fromtimestamp(fake_clock.time() + 3, UTC), usegmt=True)
    late = format_datetime(datetime.fromtimestamp(fake_clock.time() + 3600, UTC), usegmt=True)
    endpoint.script(status(429, {"Retry-After": soon}), status(429, {"Retry-After": late}))
    endpoint.default = reply("7")
    client = make_client(clock=fake_clock, backoff_max_s=10.0)
    assert await client.sample(REQUEST, 1) == ["7"]
    assert fake_sleep.delays == [3.0, 10.0]


async def test_408_is_a_retried_timeout(endpoint: Endpoint, make_client: ClientFactory) -> None:
    endpoint.script(status(408))
    endpoint.default = reply("x")
    assert await make_client().sample(REQUEST, 1) == ["x"]
    assert make_client.outcomes == ["timeout", "ok"]


@pytest.mark.parametrize("code", [400, 401, 404, 422])
async def test_client_errors_are_not_retried(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep, code: int
) -> None:
    endpoint.default = status(code, body='{"error": {"message": "no"}}')
    with pytest.raises(ModelCallError) as info:
        await make_client().sample(REQUEST, 1)
    assert info.value.retriable is False
    assert info.value.status == code
    assert len(endpoint.requests) == 1
    assert make_client.outcomes == ["client_error"]
    assert fake_sleep.delays == []


async def test_redirect_is_not_followed(endpoint: Endpoint, make_client: ClientFactory) -> None:
    endpoint.script(status(302, {"Location": "http://127.0.0.1:9/steal"}))
    with pytest.raises(ModelCallError) as info:
        await make_client(api_key="sk-x").sample(REQUEST, 1)
    assert info.value.status == 302
    assert make_client.outcomes == ["client_error"]


GARBAGE = {
    "html": raw(b"<html><body>502 Bad Gateway</body></html>", "text/html"),
    "truncated json": raw(b'{"choices": [{"message": {"content": "4'),
    "empty choices": raw(b'{"choices": []}'),
    "not an object": raw(b'["4"]'),
    "content is a number": raw(b'{"choices": [{"message": {"content": 4}}]}'),
    "content missing": raw(b'{"choices": [{"message": {"role": "assistant"}}]}'),
    "not utf-8": raw(b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'),
    "10 MiB with length": raw(b'{"choices": [' + b" " * (10 * 1024 * 1024) + b"]}"),
    "10 MiB chunked": chunked(10 * 1024 * 1024),
}


@pytest.mark.parametrize("name", list(GARBAGE))
async def test_garbage_is_invalid_response_retried_twice(
    endpoint: Endpoint, make_client: ClientFactory, name: str
) -> None:
    endpoint.default = GARBAGE[name]
    client = make_client(max_retries=3)
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is False
    assert "invalid response" in str(info.value)
    assert make_client.outcomes == ["invalid_response"] * 3
    assert len(endpoint.requests) == 3


async def test_two_bad_bodies_then_a_good_one_is_an_answer(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    """A proxy garbling two bodies in a row no longer abandons the item (default
    ``retries.invalid`` = 2); with ``invalid: 1`` it does, and ``invalid: 0`` never retries."""
    endpoint.script(GARBAGE["html"], GARBAGE["truncated json"])
    endpoint.default = reply("3")
    assert await make_client().sample(REQUEST, 1) == ["3"]
    assert make_client.outcomes == ["invalid_response", "invalid_response", "ok"]

    endpoint.script(GARBAGE["html"], GARBAGE["truncated json"])
    with pytest.raises(ModelCallError, match="invalid response"):
        await make_client(retries={"invalid": 1}).sample(REQUEST, 1)
    endpoint.script(GARBAGE["html"])
    with pytest.raises(ModelCallError, match="invalid response"):
        await make_client(retries={"invalid": 0}).sample(REQUEST, 1)
    assert await make_client(retries={"invalid": 0}).sample(REQUEST, 1) == ["3"]


async def test_retries_are_counted_per_outcome(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    """Each outcome has its own budget: 2 server errors, a 429 and 2 garbled bodies
    are all retried with error 2, rate_limited 1, invalid 2; a third 5xx is not."""
    endpoint.script(
        status(500), GARBAGE["html"], status(429), status(502), GARBAGE["html"], reply("ok")
    )
    client = make_client(
        retries={"error": 2, "rate_limited": 1, "invalid": 2, "timeout": 0}, breaker_threshold=9
    )
    assert await client.sample(REQUEST, 1) == ["ok"]
    endpoint.script(status(500), status(500), status(500), reply("late"))
    with pytest.raises(ModelCallError, match="HTTP 500") as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is True
    with pytest.raises(ConfigError, match="retries"):
        make_client(retries={"garbled": 1})
    with pytest.raises(ConfigError, match=r"retries\.error >= 0"):
        make_client(retries={"error": -1})


async def test_one_garbage_body_then_success(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    endpoint.script(GARBAGE["html"])
    endpoint.default = reply("3")
    assert await make_client().sample(REQUEST, 1) == ["3"]
    assert make_client.outcomes == ["invalid_response", "ok"]


async def test_body_limit_is_configurable(endpoint: Endpoint, make_client: ClientFactory) -> None:
    endpoint.default = reply("x" * 2000)
    with pytest.raises(ModelCallError, match="over 1000 bytes"):
        await make_client(max_response_bytes=1000).sample(REQUEST, 1)
    assert len((await make_client().sample(REQUEST, 1))[0]) == 2000


async def test_connection_refused(make_client: ClientFactory, fake_sleep: FakeSleep) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_client(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is True
    assert make_client.outcomes == ["connection_error"] * 3
    assert len(fake_sleep.delays) == 2


async def test_one_failed_call_fails_the_sample_and_cancels_the_rest(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    hang = endpoint.hang()
    endpoint.script(hang, hang, hang, status(400))
    client = make_client(concurrency=4, timeout_s=30.0)
    started = time.monotonic()
    with pytest.raises(ModelCallError) as info:
        await client.sample(REQUEST, 4)
    assert time.monotonic() - started < 20.0  # did not wait for the hanging calls (30 s)
    assert info.value.status == 400
    assert make_client.outcomes == ["client_error"]  # cancelled calls report nothing


async def test_bad_requests_never_reach_the_network(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    client = make_client()
    bad_requests: list[dict[str, object]] = [{"model": "m"}, {"messages": []}, {"messages": "hi"}]
    for bad in bad_requests:
        with pytest.raises(ModelCallError) as info:
            await client.sample(bad, 1)
        assert info.value.retriable is False
    with pytest.raises(ModelCallError, match="JSON"):
        await client.sample({"messages": [{"role": "user", "content": object()}]}, 1)
    assert endpoint.requests == []
    assert make_client.outcomes == []


# --- circuit breaker ---------------------------------------------------------------


def _state(client: HttpModelClient) -> str:
    return client.circuit_state


async def test_circuit_opens_fails_fast_and_half_opens(
    endpoint: Endpoint, make_client: ClientFactory, fake_clock: FakeClock
) -> None:
    endpoint.default = status(500)
    client = make_client(
        max_retries=0, breaker_threshold=3, breaker_cooldown_s=10.0, clock=fake_clock
    )
    for _ in range(3):
        with pytest.raises(ModelCallError):
            await client.sample(REQUEST, 1)
    assert _state(client) == "open"
    with pytest.raises(ModelCallError, match="circuit open") as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is True
    assert len(endpoint.requests) == 3  # the fast failure never reached the server
    assert make_client.outcomes == ["server_error"] * 3 + ["circuit_open"]

    fake_clock.advance(9.9)
    with pytest.raises(ModelCallError, match="circuit open"):
        await client.sample(REQUEST, 1)
    fake_clock.advance(0.1)
    assert _state(client) == "half_open"
    with pytest.raises(ModelCallError, match="HTTP 500"):  # the trial fails: open again
        await client.sample(REQUEST, 1)
    assert _state(client) == "open"
    assert len(endpoint.requests) == 4

    fake_clock.advance(10.0)
    endpoint.default = reply("back")
    assert await client.sample(REQUEST, 1) == ["back"]  # the trial succeeds: closed
    assert _state(client) == "closed"
    assert await client.sample(REQUEST, 2) == ["back", "back"]
    assert make_client.outcomes[-5:] == ["circuit_open", "server_error", "ok", "ok", "ok"]


async def test_half_open_lets_one_trial_through(
    endpoint: Endpoint, make_client: ClientFactory, fake_clock: FakeClock
) -> None:
    endpoint.default = status(500)
    client = make_client(
        max_retries=0, breaker_threshold=1, breaker_cooldown_s=5.0, clock=fake_clock
    )
    with pytest.raises(ModelCallError):
        await client.sample(REQUEST, 1)
    fake_clock.advance(5.0)
    arrived, answer, slow = asyncio.Event(), asyncio.Event(), reply("slow")

    async def held(request: web.Request) -> web.StreamResponse:
        arrived.set()
        await answer.wait()
        return await slow(request)

    endpoint.default = held
    trial = asyncio.create_task(client.sample(REQUEST, 1))
    await asyncio.wait_for(arrived.wait(), 30)  # the trial is in flight
    with pytest.raises(ModelCallError, match="circuit open"):
        await client.sample(REQUEST, 1)
    answer.set()
    assert await trial == ["slow"]
    assert _state(client) == "closed"


async def test_breaker_opening_mid_retry_stops_retrying(
    endpoint: Endpoint, make_client: ClientFactory, fake_clock: FakeClock
) -> None:
    endpoint.default = status(503)
    client = make_client(max_retries=5, breaker_threshold=2, clock=fake_clock)
    with pytest.raises(ModelCallError, match="circuit open"):
        await client.sample(REQUEST, 1)
    assert make_client.outcomes == ["server_error", "server_error", "circuit_open"]


async def test_client_errors_do_not_open_the_circuit(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    endpoint.default = status(400)
    client = make_client(breaker_threshold=2)
    for _ in range(4):
        with pytest.raises(ModelCallError, match="HTTP 400"):
            await client.sample(REQUEST, 1)
    assert _state(client) == "closed"


async def test_unreadable_answers_do_not_open_the_circuit(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    """An answer the endpoint gave that relmon cannot read (what the request asked may
    make it so: a stream) is no endpoint failure: retried, counted, the call failed, but
    the breaker stays closed (a client must not be able to stop monitoring)."""
    endpoint.default = raw(b"data: not json\n\n", "text/event-stream")
    client = make_client(breaker_threshold=2)
    for _ in range(4):
        with pytest.raises(ModelCallError, match="invalid response") as info:
            await client.sample(REQUEST, 1)
        assert not info.value.retriable
    assert _state(client) == "closed"
    assert make_client.outcomes == ["invalid_response"] * 12  # 1 + 2 retries, 4 times
    endpoint.default = status(502)  # endpoint failures still open it
    with pytest.raises(ModelCallError, match="circuit open"):
        await client.sample(REQUEST, 1)
    assert _state(client) == "open"


async def test_a_streamed_answer_to_a_generic_reask_is_read_as_a_stream(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    """A generic body that asks its service to stream is resent as it is; the answer is
    what ``answer_path`` finds in the last event holding it, as production's is read."""
    stream = b'data: {"delta": "Ca"}\n\ndata: {"delta": "iro"}\n\n'
    stream += b'data: {"result": {"answer": "Cairo"}}\n\n'
    endpoint.default = raw(stream, "text/event-stream")
    api = GenericApi(query_path="q", answer_path="result.answer")
    route = api.route({}, "/chat/completions", None)
    client = make_client(forward=True)
    body = {"q": "Capital of Egypt?", "stream": True}
    assert await client.sample(body, 3, api=api, route=route) == ["Cairo"] * 3
    assert endpoint.requests == [body] * 3  # as it is: stream and all
    endpoint.default = raw(b'data: {"delta": "Ca"}\n\n', "text/event-stream")
    with pytest.raises(ModelCallError, match="events hold no answer"):
        await client.sample(body, 1, api=api, route=route)
    assert _state(client) == "closed"


# --- rate limit, lifecycle, configuration ------------------------------------------


async def test_rate_limit_spaces_calls(
    endpoint: Endpoint, make_client: ClientFactory, fake_sleep: FakeSleep, fake_clock: FakeClock
) -> None:
    client = make_client(rate_limit_per_s=2.0, clock=fake_clock)
    for _ in range(4):
        await client.sample(REQUEST, 1)
    assert fake_sleep.delays == [0.5, 1.0]  # a burst of 2, then 1 token per 0.5 s
    fake_clock.advance(10.0)
    fake_sleep.delays.clear()
    await client.sample(REQUEST, 1)
    assert fake_sleep.delays == []  # refilled


async def test_aclose_is_idempotent_and_final(
    endpoint: Endpoint, make_client: ClientFactory
) -> None:
    client = make_client()
    await client.aclose()  # before any call: nothing was opened
    await client.aclose()
    with pytest.raises(ModelCallError, match="closed") as info:
        await client.sample(REQUEST, 1)
    assert info.value.retriable is False
    async with HttpModelClient(base_url=endpoint.base_url, model="m") as other:
        assert await other.sample(REQUEST, 1) == ["answer 0"]


@pytest.mark.parametrize(
    "options",
    [
        {"base_url": "ftp://x"},
        {"model": ""},
        {"concurrency": 0},
        {"timeout_s": 0},
        {"max_retries": -1},
        {"rate_limit_per_s": 0.0},
        {"breaker_threshold": 0},
        {"backoff_base_s": 5.0, "backoff_max_s": 1.0},
        {"max_response_bytes": 0},
    ],
)
def test_bad_settings_are_config_errors(options: dict[str, object]) -> None:
    settings: dict[str, object] = {"base_url": "http://127.0.0.1:1/v1", "model": "m"}
    settings.update(options)
    with pytest.raises(ConfigError):
        HttpModelClient(**settings)  # type: ignore[arg-type]


# --- pure helpers ------------------------------------------------------------------


def test_parse_completion() -> None:
    body = {"choices": [{"message": {"content": "a"}}, {"message": {"content": None}}]}
    assert parse_completion(json.dumps(body).encode()) == ["a", ""]
    for bad in (b"", b"null", b'{"choices": "x"}', b'{"choices": [1]}', b"[" * 100_000):
        with pytest.raises(InputError):
            parse_completion(bad)


def test_parse_retry_after() -> None:
    now = 1_800_000_000.0
    in_90s = format_datetime(datetime.fromtimestamp(now + 90, UTC), usegmt=True)
    past = format_datetime(datetime.fromtimestamp(now - 90, UTC), usegmt=True)
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after(in_90s, now) == pytest.approx(90.0)
    assert parse_retry_after(past, now) == 0.0
    assert parse_retry_after(None, now) is None
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("-5", now) is None


def test_build_body_keeps_only_documented_fields() -> None:
    body = build_body(REQUEST, model="m", temperature=1.0, max_tokens=8)
    assert set(body) == {"messages", "model", "temperature", "max_tokens", "stream"} | (
        FORWARDED_FIELDS & set(REQUEST)
    )
    assert body["stream"] is False
    assert "n" not in body and "seed" not in body and "tools" not in body


def test_outcomes_are_the_metric_label_values() -> None:
    assert OUTCOMES == (
        "ok",
        "timeout",
        "rate_limited",
        "server_error",
        "client_error",
        "invalid_response",
        "connection_error",
        "circuit_open",
    )
