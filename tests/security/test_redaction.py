"""The redaction rules (pure), their configuration, the service applying them to review
items, and the stdlib log redaction of credential headers.

Answers are redacted before they are canonicalized: a secret an answer holds, for every
shipped rule and every canonicalizer, never reaches the SQLite file, the logs or an
``llm`` judge; generated secrets in random free text never reach the review item."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from adapters.canon.registry import get_async_canonicalizer
from adapters.sqlite.store import SqliteStore
from monitor.app.logs import redact_secrets
from monitor.app.validation import validate_settings
from monitor.app.wiring import query_hash_key
from monitor.config import BudgetSettings, TaskSettings, load_settings
from monitor.core.canon import INVALID, AsyncCanonicalizer, Canonicalizer, get_canonicalizer
from monitor.core.consensus import Consensus
from monitor.core.errors import ConfigError
from monitor.core.events import TrafficEvent
from monitor.core.redaction import BUILTIN_RULES, Redactor, luhn_valid
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore
from tests.canon_io import HttpJudgeClient, JudgeServer
from tests.security import PROMPT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail jane.doe+x@mail.example.co.uk now", "mail [email] now"),
        ("key sk-proj-abcdefghijklmnop1234 end", "key [secret] end"),
        ("aws AKIAIOSFODNN7EXAMPLE end", "aws [secret] end"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123456789", "gh [secret]"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "Authorization: Bearer [secret]"),
        ("visa 4111 1111 1111 1111.", "visa [card]."),
        ("amex 3782-822463-10005", "amex [card]"),
        ("not a card 4111 1111 1111 1112", "not a card [number]"),
        ("call +44 20 7946 0958 or (555) 123-4567", "call [phone] or [phone]"),
        ("us 555-123-4567", "us [phone]"),
        ("What is 12*34? 408. In 2026-11-23, pi is 3.14159", None),
        ("order 12345", None),
    ],
)
def test_shipped_rules(text: str, expected: str | None) -> None:
    assert Redactor.default().redact(text) == (text if expected is None else expected)


_PIECES = [
    *"0123456789 -_.+@()/=~aK",
    "\u212a",  # Kelvin sign: IGNORECASE matches it to k
    "\u0131",  # dotless i
    "\u0130",  # dotted capital I
    "\u017f",  # long s
    "\u0660",  # Arabic-Indic zero: a digit to \\d
    *["akia", "AKIA", "Bearer ", "BEARER\t", "sk-", "pk_live_", "ghp_", "xoxb-", "api_"],
    *["example.com", "4111", "(555) ", "+44 "],
]
_NEAR_MISSES = st.lists(st.sampled_from(_PIECES), max_size=25).map("".join)


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.one_of(_NEAR_MISSES, st.text(max_size=60)))
@example("key A\u212aIA0123456789ABCDEF end")  # AKIA with a Kelvin sign: no "-", "_"
@example("AK\u0131A0123456789abcdef")  # and with a dotless i
@example("\u0660" * 13)  # 13 digits of another script
@example("Bearer abcdefgh")  # the shortest bearer token
@example("a@b.co")  # the shortest e-mail
@example("\u0660\u0661\u0662-\u0663\u0664\u0665-\u0666\u0667\u0668\u0669")  # a phone
def test_a_rule_skipped_by_its_hint_could_not_have_matched(text: str) -> None:
    for rule in BUILTIN_RULES.values():
        assert rule.hint is not None
        if not rule.hint(text):
            assert rule.pattern.search(text) is None, rule.name


def test_redact_all_keeps_the_order_and_redacts_a_repeated_text_once() -> None:
    done: dict[str, str] = {}
    r = Redactor.default()
    assert r.redact_all(["a@b.io", "x", "a@b.io"], done) == ["[email]", "x", "[email]"]
    assert done == {"a@b.io": "[email]", "x": "x"}
    done["y"] = "from an earlier batch"
    assert r.redact_all(["y"], done) == ["from an earlier batch"]


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("378282246310005")
    assert not luhn_valid("4111111111111112")


def test_custom_rules_and_a_subset_of_shipped_ones() -> None:
    settings = load_settings(
        None,
        redaction={
            "builtin_rules": ["email"],
            "rules": [{"name": "employee", "pattern": r"EMP-\d{6}", "replacement": "[employee]"}],
        },
    )
    r = settings.redaction.redactor()
    assert r.redact("EMP-123456 a@b.io 555-123-4567") == "[employee] [email] 555-123-4567"


@pytest.mark.parametrize(
    ("redaction", "message"),
    [
        ({"builtin_rules": ["emial"]}, "unknown shipped rule"),
        ({"rules": [{"name": "x", "pattern": "("}]}, "not a regular expression"),
        ({"rules": [{"name": "x"}]}, "pattern"),
    ],
)
def test_bad_redaction_config_names_the_field(redaction: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(None, redaction=redaction)
    assert "redaction" in str(info.value)


def test_redacted_candidates_stay_distinct_and_keep_their_counts() -> None:
    c = Consensus(("a@x.io", "b@y.io", "[email] (rank 2)", "42"), (4, 3, 2, 1))
    shown = Redactor.default().redact_consensus(c)
    assert shown.counts == c.counts
    assert len(set(shown.classes)) == 4
    assert shown.classes[0] == "[email]" and shown.classes[3] == "42"
    assert Redactor(list(BUILTIN_RULES.values()), answers=False).redact_consensus(c) is c


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=6, unique=True))
def test_redacted_candidates_are_always_a_valid_consensus(classes: list[str]) -> None:
    counts = tuple(range(len(classes), 0, -1))
    shown = Redactor.default().redact_consensus(Consensus(tuple(classes), counts))
    assert shown.counts == counts and len(set(shown.classes)) == len(classes)
    for text in shown.classes:
        text.encode("utf-8")  # storable: lone surrogates are repaired


@pytest.mark.parametrize(
    "line",
    [
        "b'GET / HTTP/1.1\\r\\nAuthorization: Bearer secret-xyz\\r\\n'",
        "<CIMultiDict('Authorization': 'Bearer secret-xyz')>",
        "cookie=secret-xyz",
        "Proxy-Authorization: Basic secret-xyz",
        "X-Api-Key: secret-xyz\nnext",
        "token secret-xyz",
    ],
)
def test_library_log_lines_lose_their_credentials(line: str) -> None:
    assert "secret-xyz" not in redact_secrets(line)


async def test_the_service_redacts_before_the_review_queue() -> None:
    store = InMemoryStore()
    answer = "Card: 4111-1111-1111-1111."
    service = MonitorService(
        [_task(answer)],
        store=store,
        review_queue=store,
        metrics=Metrics(CollectorRegistry(), k_max=3),
        budget=BudgetSettings(),
    )
    service.start()
    request = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
    admission = service.offer(TrafficEvent(id="r1", model="m", request=request), "mirror")
    assert admission.decision == "sampled" and admission.done is not None
    await admission.done
    await service.stop(5)
    [item] = store.items.values()
    assert item.query == "PROMPT-quokka-4412: write to [email] or call [phone]"
    # the answer redacted ("Card: [card].") before the text canonicalizer
    assert item.candidates == (("card card", 3),)


def _task(answer: str) -> TaskRuntime:
    settings = TaskSettings(
        name="t", endpoint={"model": "m"}, k_max=3, k0=3, sampling_rate=1.0, review_rate=1.0
    )
    return TaskRuntime(
        settings,
        get_async_canonicalizer("text"),
        get_stopping_rule(settings.stopping_rule, k0=3, k_max=3, delta=0.05),
        FakeModelClient(lambda query, i: answer),
    )


def test_kafka_backend_needs_a_usable_state_dir_for_the_generated_key(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    base = {
        "tasks": [{"name": "t", "endpoint": {"model": "m"}}],
        "kafka": {"enabled": True},
        "review": {"backend": "kafka"},
        "state_dir": a_file,
    }
    with pytest.raises(ConfigError, match=r"state_dir: .*query hash key"):
        validate_settings(load_settings(None, **base))
    # With the key configured, no state is written: the state dir is not needed.
    assert validate_settings(load_settings(None, **base, query_hash_key="k" * 32)) == []


def test_an_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    settings = load_settings(None, state_dir=tmp_path)
    (tmp_path / "query-hash.key").mkdir()  # exists, cannot be read as a file
    with pytest.raises(ConfigError, match="cannot read the query hash key"):
        query_hash_key(settings)
    other = load_settings(None, state_dir=tmp_path / "fresh")
    key = query_hash_key(other)
    assert len(key) == 64 and query_hash_key(other) == key  # generated once, reused


def test_query_hash_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-a-mounted-secret\n")
    settings = load_settings(None, state_dir=tmp_path / "state", query_hash_key_file=key_file)
    assert query_hash_key(settings) == b"from-a-mounted-secret"
    assert not (tmp_path / "state").exists()  # nothing generated
    task = [{"name": "t", "endpoint": {"model": "m"}}]
    both = load_settings(
        None, tasks=task, review_token="t", query_hash_key="k", query_hash_key_file=key_file
    )
    with pytest.raises(
        ConfigError, match=r"either query_hash_key \(or .*\) or query_hash_key_file"
    ):
        validate_settings(both)
    missing = load_settings(
        None, tasks=task, review_token="t", query_hash_key_file=tmp_path / "nope"
    )
    with pytest.raises(ConfigError, match="query_hash_key_file: cannot read"):
        validate_settings(missing)


# -- secrets in answers, through every canonicalizer, to SQLite, the logs, a judge --------

SECRET_OF_RULE = {
    "email": "jane.doe+q@mail.example.com",
    "api_key": "sk-proj-AbCdEfGhIjKlMnOp1234",
    "bearer": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.Zm9vYmFyYmF6",
    "card": "4111 1111 1111 1111",
    "phone": "+44 20 7946 0958",
    "long_number": "1234 5678 9012 3456 7",
}
"""One secret each shipped rule matches (the rule alone must catch it)."""

ANSWER_OF_CANONICALIZER = {
    "text": "Contact {s} today.",
    "regex": "Thinking... Final: write to {s} now",
    "json": '{{"contact": "{s}", "ok": true}}',
    "numeric": "Call {s}; the answer is 42.",
    "mcq": "The answer is B. Questions go to {s}",
    "embedding": "Contact {s} today.",
    "llm": "Contact {s} today.",
}
"""An answer holding the secret ``{s}``, for each canonicalizer."""


def _squash(text: str) -> str:
    """Letters and digits only, casefolded: what survives any canonical form of a secret."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _secret_part(secret: str) -> str:
    """The part of ``secret`` that must never be seen (the token of ``Bearer <token>``)."""
    return secret.removeprefix("Bearer ")


def _assert_hidden(secret: str, where: str, text: str) -> None:
    part = _secret_part(secret)
    assert part not in text, f"{part!r} in {where}"
    assert _squash(part) not in _squash(text), f"{part!r}, canonicalized, in {where}"


@pytest.fixture(scope="module")
def embedding() -> object:
    """The real offline embedding model, loaded once for the module (as tests/canon_io)."""
    from adapters.canon.embedding import EmbeddingCanonicalizer

    canon = EmbeddingCanonicalizer()
    canon.group(["warm up"])
    return canon


async def _build_canonicalizer(
    name: str, request: pytest.FixtureRequest, stack: contextlib.AsyncExitStack
) -> tuple[AsyncCanonicalizer, Canonicalizer | None, JudgeServer | None]:
    if name == "embedding":
        return request.getfixturevalue("embedding"), None, None
    if name == "llm":
        judge = JudgeServer()
        await judge.start()
        stack.push_async_callback(judge.stop)
        client = HttpJudgeClient(judge.url)
        stack.push_async_callback(client.aclose)
        return get_async_canonicalizer("llm", client=client), None, judge
    options: dict[str, Any] = {"pattern": r"(?s)Final: (.*)"} if name == "regex" else {}
    return get_async_canonicalizer(name, **options), get_canonicalizer(name, **options), None


async def _serve_one(
    canonicalizer: AsyncCanonicalizer,
    answer: Callable[[str, int], str],
    redactor: Redactor,
    store: Any,
    *,
    query: str = "How do I reach support?",
    sync: Canonicalizer | None = None,
) -> MonitorService:
    """One event through a real service (K = 3, always reviewed) into ``store``."""
    settings = TaskSettings(
        name="t", endpoint={"model": "m"}, k_max=3, k0=3, sampling_rate=1.0, review_rate=1.0
    )
    task = TaskRuntime(
        settings,
        canonicalizer,
        get_stopping_rule(settings.stopping_rule, k0=3, k_max=3, delta=0.05),
        FakeModelClient(answer),
        sync,
    )
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=Metrics(CollectorRegistry(), k_max=3),
        budget=BudgetSettings(),
        redactor=redactor,
    )
    service.start()
    request = {"model": "m", "messages": [{"role": "user", "content": query}]}
    admission = service.offer(TrafficEvent(id="r1", model="m", request=request), "mirror")
    assert admission.decision == "sampled" and admission.done is not None
    await admission.done
    assert await service.stop(30)
    assert service.stats.scored == 1 and service.stats.reviewed == 1
    return service


def _sqlite_dump(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("canon_name", list(ANSWER_OF_CANONICALIZER))
@pytest.mark.parametrize("rule", list(BUILTIN_RULES))
async def test_a_secret_in_the_answers_never_reaches_the_store_the_logs_or_a_judge(
    rule: str, canon_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    secret = SECRET_OF_RULE[rule]
    answer = ANSWER_OF_CANONICALIZER[canon_name].format(s=secret)
    redactor = Redactor.from_config([rule])  # the rule alone catches it
    async with contextlib.AsyncExitStack() as stack:
        canonicalizer, _, judge = await _build_canonicalizer(canon_name, request, stack)
        store = await SqliteStore.open(tmp_path / "relmon.sqlite3")
        try:
            with capture_logs() as logs:
                await _serve_one(
                    canonicalizer, lambda q, i: answer, redactor, store, query=f"Is {secret} ok?"
                )
            [item] = [i async for i in _pending(store)]
        finally:
            await store.aclose()
        if judge is not None:  # the judge model saw neither the answer's nor the query's secret
            assert judge.requests
            _assert_hidden(secret, "the judge's requests", json.dumps(judge.requests))
    _assert_hidden(secret, "the review item", json.dumps(item.to_json()))
    _assert_hidden(secret, "the SQLite file", _sqlite_dump(tmp_path / "relmon.sqlite3"))
    assert any(line["event"] == "item" for line in logs)
    _assert_hidden(secret, "the logs", repr(logs))
    [(candidate, count)] = item.candidates
    assert count == 3 and candidate != INVALID


async def _pending(store: SqliteStore) -> AsyncIterator[ReviewItem]:
    item = await store.next_pending()
    if item is not None:
        yield item


@pytest.mark.parametrize(
    ("canon_name", "answer", "shown"),
    [
        # raw answers redacted first: the canonicalizer sees "[email]"
        ("text", "Mail jane.doe@example.com now", "mail email now"),
        ("regex", "Final: key sk-AbCdEfGhIjKlMnOpQr", "key secret"),
        # only the canonical form redacted: a long number stays a readable answer
        ("numeric", "2**50 = 1125899906842624", "[number]"),
        (
            "json",
            '{"ts": 1700000000000, "to": "jane@example.com"}',
            '{"to":"[email]","ts":[number]}',
        ),
    ],
)
async def test_where_the_answers_are_redacted(canon_name: str, answer: str, shown: str) -> None:
    store = InMemoryStore()
    options: dict[str, Any] = {"pattern": r"Final: (.*)"} if canon_name == "regex" else {}
    await _serve_one(
        get_async_canonicalizer(canon_name, **options),
        lambda q, i: answer,
        Redactor.default(),
        store,
    )
    [item] = store.items.values()
    assert item.candidates == ((shown, 3),)


async def test_answers_differing_only_in_a_secret_are_one_class() -> None:
    store = InMemoryStore()
    await _serve_one(
        get_async_canonicalizer("text"),
        lambda q, i: f"Write to user{i}.name@example.com",
        Redactor.default(),
        store,
    )
    [item] = store.items.values()
    assert item.candidates == (("write to email", 3),)
    # without answer redaction the three addresses stay three classes (as canonicalized)
    store = InMemoryStore()
    await _serve_one(
        get_async_canonicalizer("text"),
        lambda q, i: f"Write to user{i}.name@example.com",
        Redactor(list(BUILTIN_RULES.values()), answers=False),
        store,
    )
    [item] = store.items.values()
    assert sorted(c for c, _ in item.candidates) == [
        f"write to user{i}nameexamplecom" for i in range(3)
    ]


@pytest.mark.parametrize("canon_name", ["text", "regex", "json"])
async def test_a_typed_correct_answer_with_the_secret_finds_its_redacted_candidate(
    canon_name: str,
) -> None:
    answers = {
        "text": ("Write to jane@example.com", "write to JANE@example.com!"),
        "regex": ("Final: write to jane@example.com", "Final: Write to jane@example.com."),
        "json": ('{"to": "jane@example.com"}', '{ "to" : "jane@example.com" }'),
    }[canon_name]
    options: dict[str, Any] = {"pattern": r"Final: (.*)"} if canon_name == "regex" else {}
    store = InMemoryStore()
    service = await _serve_one(
        get_async_canonicalizer(canon_name, **options),
        lambda q, i: answers[0] if i < 2 else "Something else entirely, sk-AbCdEfGhIjKlMnOpQr",
        Redactor.default(),
        store,
        sync=get_canonicalizer(canon_name, **options),
    )
    [item] = store.items.values()
    assert len(item.candidates) == 2
    verdict = Verdict(item_id=item.item_id, none_of_these=True, correct_answer=answers[1])
    outcome = await service.apply_verdict(verdict)
    assert outcome.status == "applied" and outcome.score == 1.0


# -- property: generated secrets in random free text ---------------------------------

_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _luhn_complete(digits: str) -> str:
    return next(digits + d for d in "0123456789" if luhn_valid(digits + d))


def _grouped(digits: str, sep: str) -> str:
    return sep.join(digits[i : i + 4] for i in range(0, len(digits), 4))


_emails = st.builds(
    "{}{}@{}.{}".format,
    st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=4, max_size=12),
    st.sampled_from(["", ".x", "+tag", "_1"]),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=10),
    st.sampled_from(["com", "org", "co.uk", "io"]),
)
_api_keys = st.one_of(
    st.builds(
        "{}{}".format,
        st.sampled_from(["sk-", "sk-proj-", "pk_live_", "rk-", "api_", "token-"]),
        st.text(_ALNUM, min_size=20, max_size=32),
    ),
    st.builds(
        "AKIA{}".format, st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=16)
    ),
    st.builds("ghp_{}".format, st.text(_ALNUM, min_size=36, max_size=36)),
    st.builds("xoxb-{}".format, st.text(_ALNUM, min_size=12, max_size=24)),
)
_bearers = st.builds("Bearer {}".format, st.text(_ALNUM + "._-", min_size=12, max_size=40)).filter(
    lambda s: len(_squash(s)) >= len("bearer") + 10
)
_cards = st.builds(
    lambda body, sep: _grouped(_luhn_complete("4" + body), sep),
    st.text("0123456789", min_size=14, max_size=14),
    st.sampled_from(["", " ", "-"]),
)
_phones = st.builds(
    "+{} {} {} {}".format,
    st.integers(1, 99),
    st.integers(10, 99),
    st.integers(1000, 9999),
    st.integers(1000, 9999),
)
_long_numbers = st.text("0123456789", min_size=13, max_size=19).map(lambda s: "9" + s)
_free_text = st.text("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ,.;:!?'\"()\n", min_size=0, max_size=40)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    st.one_of(_emails, _api_keys, _bearers, _cards, _phones, _long_numbers),
    _free_text,
    _free_text,
    st.sampled_from(["text", "regex"]),
)
def test_generated_secrets_in_free_text_never_reach_the_review_item(
    secret: str, before: str, after: str, canon_name: str
) -> None:
    answer = f"Final: {before} {secret} {after}"
    options: dict[str, Any] = {"pattern": r"(?s)Final: (.*)"} if canon_name == "regex" else {}
    store = InMemoryStore()
    with capture_logs() as logs:
        asyncio.run(
            _serve_one(
                get_async_canonicalizer(canon_name, **options),
                lambda q, i: answer,
                Redactor.default(),
                store,
            )
        )
    [item] = store.items.values()
    _assert_hidden(secret, "the review item", json.dumps(item.to_json()))
    _assert_hidden(secret, "the logs", repr(logs))
