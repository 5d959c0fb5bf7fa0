"""The redaction rules (pure), their configuration, the service applying them to review
items, and the stdlib log redaction of credential headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.canon_registry import get_async_canonicalizer
from monitor.config import BudgetSettings, TaskSettings, load_settings, validate_settings
from monitor.consensus import Consensus
from monitor.errors import ConfigError
from monitor.events import TrafficEvent
from monitor.logs import redact_secrets
from monitor.metrics import Metrics
from monitor.redaction import BUILTIN_RULES, Redactor, luhn_valid
from monitor.runner import query_hash_key
from monitor.service import MonitorService, TaskRuntime
from monitor.stopping import get_stopping_rule
from monitor.testing import FakeModelClient, InMemoryStore
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
    # the canonical class "card 4111111111111111", redacted
    assert item.candidates == (("card [card]", 3),)


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
    with pytest.raises(ConfigError, match="either query_hash_key or query_hash_key_file"):
        validate_settings(both)
    missing = load_settings(
        None, tasks=task, review_token="t", query_hash_key_file=tmp_path / "nope"
    )
    with pytest.raises(ConfigError, match="query_hash_key_file: cannot read"):
        validate_settings(missing)
