"""Building asynchronous canonicalizers by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.canon.embedding import PREFIX, EmbeddingCanonicalizer
from adapters.canon.llm import LlmCanonicalizer
from adapters.canon.registry import available_async_canonicalizers, get_async_canonicalizer
from monitor.core.canon import INVALID, AsyncCanonicalizer, QueryContext
from monitor.core.errors import ConfigError
from tests.canon_io import HttpJudgeClient, JudgeServer


@pytest.fixture
async def judge() -> AsyncIterator[JudgeServer]:
    server = JudgeServer()
    await server.start()
    yield server
    await server.stop()


class Factory:
    """A model_client_factory that records what it built."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.built: list[HttpJudgeClient] = []

    def __call__(self, *, endpoint: str, model: str | None, **options: Any) -> HttpJudgeClient:
        self.calls.append({"endpoint": endpoint, "model": model, **options})
        client = HttpJudgeClient(endpoint, model)
        self.built.append(client)
        return client


def test_available_names() -> None:
    names = available_async_canonicalizers()
    assert {"embedding", "llm", "text", "numeric", "mcq", "json", "regex"} <= set(names)
    assert names == sorted(names)


async def test_sync_names_are_wrapped() -> None:
    text = get_async_canonicalizer(" Text ")
    assert isinstance(text, AsyncCanonicalizer)
    assert text.name == "text"
    assert await text.canonicalize_many(["The Paris!", ""]) == ["paris", INVALID]
    numeric = get_async_canonicalizer("numeric", percent="fraction")
    assert await numeric.canonicalize_many(["50%"]) == ["0.5"]


def test_unknown_names_and_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown canonicalizer 'nope'") as err:
        get_async_canonicalizer("nope")
    for name in ("embedding", "json", "llm", "mcq", "numeric", "regex", "text"):
        assert name in str(err.value)
    with pytest.raises(ConfigError, match="bad options"):
        get_async_canonicalizer("text", shout=True)
    with pytest.raises(ConfigError, match="bad options"):
        get_async_canonicalizer("embedding", shout=True)
    with pytest.raises(ConfigError, match="threshold"):
        get_async_canonicalizer("embedding", threshold=2.0)
    with pytest.raises(ConfigError, match="must be a string"):
        get_async_canonicalizer(None)  # type: ignore[arg-type]


async def test_embedding_by_name() -> None:
    canon = get_async_canonicalizer("Embedding", threshold=0.9)
    assert isinstance(canon, EmbeddingCanonicalizer)
    assert canon.threshold == 0.9
    assert await canon.canonicalize_many(["Paris", "paris.", ""]) == [
        PREFIX + "Paris",
        PREFIX + "Paris",
        INVALID,
    ]


def test_llm_needs_a_judge() -> None:
    with pytest.raises(ConfigError, match="needs a judge"):
        get_async_canonicalizer("llm")
    with pytest.raises(ConfigError, match="needs a judge"):
        get_async_canonicalizer("llm", endpoint="  ", model_client_factory=Factory())
    with pytest.raises(ConfigError, match="no model_client_factory"):
        get_async_canonicalizer("llm", endpoint="http://127.0.0.1:9/v1")


async def test_llm_from_an_endpoint_owns_its_client(judge: JudgeServer) -> None:
    factory = Factory()
    canon = get_async_canonicalizer(
        "llm",
        endpoint=judge.url,
        model="judge-1",
        client_options={"api_key": "k"},
        model_client_factory=factory,
        max_words=3,
    )
    assert isinstance(canon, LlmCanonicalizer)
    assert factory.calls == [{"endpoint": judge.url, "model": "judge-1", "api_key": "k"}]
    assert await canon.canonicalize_many(["The capital is Paris."]) == ["paris"]
    assert "at most 3 words" in judge.requests[0]["messages"][0]["content"]
    await canon.aclose()
    assert factory.built[0].closed


async def test_llm_with_a_client_leaves_it_to_the_caller(judge: JudgeServer) -> None:
    client = HttpJudgeClient(judge.url)
    try:
        canon = get_async_canonicalizer("llm", client=client, then="numeric")
        assert await canon.canonicalize_many(["The answer is forty-two."]) == ["42"]
        assert isinstance(canon, LlmCanonicalizer)
        await canon.aclose()
        assert not client.closed
        with pytest.raises(ConfigError, match="not both"):
            get_async_canonicalizer("llm", client=client, endpoint=judge.url)
    finally:
        await client.aclose()


def test_bad_llm_options_build_no_client() -> None:
    factory = Factory()
    for options in ({"max_words": 0}, {"shout": True}, {"then": "nope"}):
        with pytest.raises(ConfigError):
            get_async_canonicalizer(
                "llm", endpoint="http://127.0.0.1:9/v1", model_client_factory=factory, **options
            )
    with pytest.raises(ConfigError, match="client_options must be a mapping"):
        get_async_canonicalizer(
            "llm", endpoint="http://127.0.0.1:9/v1", model_client_factory=factory, client_options=1
        )
    assert factory.calls == []


async def test_llm_then_embedding_clusters_the_extractions(judge: JudgeServer) -> None:
    factory = Factory()
    canon = get_async_canonicalizer(
        "llm",
        endpoint=judge.url,
        model="judge-1",
        model_client_factory=factory,
        then="embedding",
        then_options={"threshold": 0.85},
    )
    answers = ["The capital is Paris.", "It's Paris, of course!", "I think it's Lyon", "Hmm."]
    labels = ["Paris, France"]
    assert isinstance(canon, LlmCanonicalizer)
    got = await canon.canonicalize_many([*answers, *labels], QueryContext(query="Capital?"))
    # The judge extracts "Paris", "Paris.", "Lyon", "" and "Paris"; embedding clusters them.
    assert got == [PREFIX + "Paris", PREFIX + "Paris", PREFIX + "Lyon", INVALID, PREFIX + "Paris"]
    await canon.aclose()


async def test_answer_pattern_before_llm_gives_the_judge_only_the_extract(
    judge: JudgeServer,
) -> None:
    """A task's answer_pattern with ``llm``: the regex's group of each raw answer goes to
    the judge; an answer without a match is INVALID and costs no judge call."""
    factory = Factory()
    canon = get_async_canonicalizer(
        "regex",
        pattern=r"Answer: (.*)",
        then="llm",
        then_options={"endpoint": judge.url, "model": "judge-1"},
        model_client_factory=factory,
    )
    answers = [
        "Let me think. Answer: The capital is Paris.",
        "no marker here",
        "Answer: I think it's Lyon",
        "Answer: <INVALID>",
    ]
    got = await canon.canonicalize_many(answers, QueryContext(query="Capital?"))
    assert got == ["paris", INVALID, "lyon", "invalid"]
    judged = [r["messages"][-1]["content"] for r in judge.requests]
    assert len(judged) == 3
    assert not any("Let me think" in c or "no marker" in c for c in judged)
    assert await canon.canonicalize_many(["nothing"]) == [INVALID]
    assert len(judge.requests) == 3
    # it owns the judge's client, through the llm canonicalizer
    await canon.aclose()  # type: ignore[attr-defined]
    assert factory.built[0].closed


async def test_answer_pattern_before_embedding_clusters_the_extracts() -> None:
    canon = get_async_canonicalizer(
        "regex", pattern=r"Final: (?P<answer>.*)", then="embedding", then_options={}
    )
    got = await canon.canonicalize_many(["Steps... Final: Paris", "Final: paris.", "Paris"])
    assert got == [PREFIX + "Paris", PREFIX + "Paris", INVALID]


def test_answer_pattern_before_an_io_canonicalizer_checks_everything_first() -> None:
    factory = Factory()
    llm = {"endpoint": "http://127.0.0.1:9/v1"}
    with pytest.raises(ConfigError, match="bad pattern"):
        get_async_canonicalizer(
            "regex", pattern="(", then="llm", then_options=llm, model_client_factory=factory
        )
    with pytest.raises(ConfigError, match="bad options"):
        get_async_canonicalizer(
            "regex",
            pattern="x",
            shout=1,
            then="llm",
            then_options=llm,
            model_client_factory=factory,
        )
    assert factory.calls == []
    for options in ({"then": "numerc"}, {"then": "llm", "then_options": {**llm, "then": "numerc"}}):
        with pytest.raises(ConfigError, match="unknown canonicalizer 'numerc'") as err:
            get_async_canonicalizer("regex", pattern="x", model_client_factory=factory, **options)
        for name in ("embedding", "json", "llm", "mcq", "numeric", "regex", "text"):
            assert name in str(err.value)
