"""The ``llm`` canonicalizer against a real local judge server over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from adapters.canon.llm import NO_ANSWER, LlmCanonicalizer, parse_judge_reply
from monitor.core.canon import (
    INVALID,
    AsyncCanonicalizer,
    Canonicalizer,
    McqCanonicalizer,
    QueryContext,
    as_async,
)
from monitor.core.errors import CanonicalizationError, ConfigError, ModelCallError
from tests.canon_io import HttpJudgeClient, JudgeServer

QUERY = QueryContext(query="What is the capital of France?")


@pytest.fixture
async def judge() -> AsyncIterator[JudgeServer]:
    server = JudgeServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(judge: JudgeServer) -> AsyncIterator[HttpJudgeClient]:
    made = HttpJudgeClient(judge.url)
    yield made
    await made.aclose()


def test_parse_judge_reply() -> None:
    assert parse_judge_reply("Paris") == "Paris"
    assert parse_judge_reply('  "Paris"  \nbecause it is the capital') == "Paris"
    assert parse_judge_reply("\n\nCore answer: Paris.") == "Paris."
    assert parse_judge_reply("Answer - `42`") == "42"
    assert parse_judge_reply("**B**") == "B"
    for nothing in ("", "  \n ", '""', NO_ANSWER, "no answer.", "Answer: NO ANSWER"):
        assert parse_judge_reply(nothing) is None, nothing


async def test_maps_answers_through_the_judge(judge: JudgeServer, client: HttpJudgeClient) -> None:
    canon = LlmCanonicalizer(client, model="judge-1", max_words=5)
    assert canon.name == "llm"
    assert isinstance(canon, AsyncCanonicalizer)
    assert not isinstance(canon, Canonicalizer)
    assert as_async(canon) is canon
    answers = ["The capital is Paris.", "Paris", "It's Paris, of course!", "I think it's Lyon", " "]
    assert await canon.canonicalize_many(answers, QUERY) == [
        "paris",
        "paris",
        "paris",
        "lyon",
        INVALID,
    ]
    assert len(judge.requests) == 4  # the blank answer is INVALID without a call
    for body in judge.requests:
        assert body["temperature"] == 0
        assert body["model"] == "judge-1"
        assert body["max_tokens"] == 4 * 5 + 8
        system, user = body["messages"]
        assert system["role"] == "system"
        assert "at most 5 words" in system["content"]
        assert NO_ANSWER in system["content"]
        assert "What is the capital of France?" in user["content"]


async def test_request_without_a_query(judge: JudgeServer, client: HttpJudgeClient) -> None:
    canon = LlmCanonicalizer(client)
    assert await canon.canonicalize_many(["Paris, France"]) == ["paris"]
    (body,) = judge.requests
    assert "model" not in body
    assert "<question>" not in body["messages"][1]["content"]
    assert canon.judge_request("x")["messages"][1]["content"].startswith("Response:")


async def test_identical_answers_are_judged_once(
    judge: JudgeServer, client: HttpJudgeClient
) -> None:
    canon = LlmCanonicalizer(client)
    answers = ["Paris"] * 5 + ["I think it's Lyon"] * 3 + ["Paris "]
    first = await canon.canonicalize_many(answers, QUERY)
    assert first == ["paris"] * 5 + ["lyon"] * 3 + ["paris"]
    assert judge.calls == {"Paris": 1, "I think it's Lyon": 1}
    # Across calls: the LRU answers the same (query, answer) without the judge ...
    assert await canon.canonicalize_many(answers[::-1], QUERY) == first[::-1]
    assert sum(judge.calls.values()) == 2
    # ... but another question is another key.
    other = QueryContext(query="Where is the Louvre?")
    assert await canon.canonicalize_many(["Paris"], other) == ["paris"]
    assert judge.calls["Paris"] == 2


async def test_the_cross_call_cache_is_bounded(judge: JudgeServer, client: HttpJudgeClient) -> None:
    uncached = LlmCanonicalizer(client, cache_size=0)
    await uncached.canonicalize_many(["Paris", "Paris"])
    await uncached.canonicalize_many(["Paris"])
    assert judge.calls["Paris"] == 2  # once per call, never across calls
    small = LlmCanonicalizer(client, cache_size=1)
    await small.canonicalize_many(["A1", "B1"])  # one of them evicts the other
    await small.canonicalize_many(["A1", "B1"])
    assert judge.calls["A1"] + judge.calls["B1"] == 3


async def test_judge_failure_fails_the_whole_call(
    judge: JudgeServer, client: HttpJudgeClient
) -> None:
    canon = LlmCanonicalizer(client, concurrency=2)
    answers = ["SLOW 1", "SLOW 2", "EXPLODE", "SLOW 3", "Paris"]
    with pytest.raises(ModelCallError) as failure:
        await canon.canonicalize_many(answers, QUERY)
    assert failure.value.retriable
    assert failure.value.status == 500
    # Still usable, and the failed answer was not cached.
    assert await canon.canonicalize_many(["Paris"], QUERY) == ["paris"]
    with pytest.raises(ModelCallError):
        await canon.canonicalize_many(["EXPLODE"], QUERY)
    assert judge.calls["EXPLODE"] == 2


async def test_a_judge_reply_without_a_completion_is_a_model_call_error(
    client: HttpJudgeClient,
) -> None:
    with pytest.raises(ModelCallError, match="instead of a completion"):
        await LlmCanonicalizer(client).canonicalize_many(["NOCHOICES"])


async def test_an_unreachable_judge_is_a_model_call_error(judge: JudgeServer) -> None:
    url = judge.url
    await judge.stop()
    gone = HttpJudgeClient(url)
    try:
        with pytest.raises(ModelCallError, match="unreachable"):
            await LlmCanonicalizer(gone).canonicalize_many(["Paris"])
    finally:
        await gone.aclose()


async def test_empty_or_no_answer_from_the_judge_is_invalid(
    judge: JudgeServer, client: HttpJudgeClient
) -> None:
    canon = LlmCanonicalizer(client)
    answers = ["Hmm.", "I cannot answer that.", "The capital is Paris.", ""]
    assert await canon.canonicalize_many(answers, QUERY) == [INVALID, INVALID, "paris", INVALID]
    assert set(judge.calls) == {"Hmm.", "I cannot answer that.", "The capital is Paris."}


async def test_judge_calls_are_bounded(judge: JudgeServer, client: HttpJudgeClient) -> None:
    canon = LlmCanonicalizer(client, concurrency=2)
    answers = [f"SLOW {i}" for i in range(6)]
    assert await canon.canonicalize_many(answers) == [f"slow {i}" for i in range(6)]
    assert judge.max_in_flight == 2


async def test_then_canonicalizer_and_options(judge: JudgeServer, client: HttpJudgeClient) -> None:
    options = QueryContext(query="Capital of France?", options={"A": "Lyon", "B": "Paris"})
    mcq = LlmCanonicalizer(client, then="mcq")
    assert await mcq.canonicalize_many(["I'd go with B, Paris."], options) == ["B"]
    assert "A) Lyon\nB) Paris" in judge.requests[-1]["messages"][1]["content"]
    letters = LlmCanonicalizer(client, then=McqCanonicalizer(letters="AB"))
    assert await letters.canonicalize_many(["The answer is forty-two."]) == [INVALID]
    as_number = LlmCanonicalizer(client, then="numeric")
    assert await as_number.canonicalize_many(["The answer is forty-two."]) == ["42"]


async def test_bad_input_and_options(client: HttpJudgeClient) -> None:
    canon = LlmCanonicalizer(client)
    with pytest.raises(CanonicalizationError, match="answer 0 is a NoneType"):
        await canon.canonicalize_many([None])  # type: ignore[list-item]
    bad: list[dict[str, object]] = [
        {"max_words": 0},
        {"cache_size": -1},
        {"concurrency": 0},
        {"max_tokens": 0},
        {"model": ""},
        {"then": "nope"},
        {"then": McqCanonicalizer(), "then_options": {"letters": "AB"}},
        {"then": 42},
    ]
    for options in bad:
        with pytest.raises(ConfigError):
            LlmCanonicalizer(client, **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ModelClient"):
        LlmCanonicalizer(object())  # type: ignore[arg-type]


async def test_aclose_closes_only_an_owned_client(judge: JudgeServer) -> None:
    kept, owned = HttpJudgeClient(judge.url), HttpJudgeClient(judge.url)
    await LlmCanonicalizer(kept).aclose()
    await LlmCanonicalizer(owned, owns_client=True).aclose()
    assert not kept.closed
    assert owned.closed
    await kept.aclose()
