"""A real LLM end to end: SmolLM2-135M on llama.cpp, HttpModelClient, sequential stopping.

One server per module (``llm_server``; its log is attached to failed tests' reports).
The prompts ask a 135M model for small sums in the form ``"a + b = c"``, which the
``numeric`` canonicalizer reads as ``c``: three worked examples make almost every
answer parseable, and the model is right on most but not all items (it is confidently
wrong on some subtractions), which is what a monitor has to cope with.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.model.client import HttpModelClient
from monitor.app.wiring import build_judge
from monitor.config.judge import JudgeSettings
from monitor.core.canon.base import INVALID
from monitor.core.canon.registry import get_canonicalizer
from monitor.core.consensus import count_classes, rank_classes
from monitor.core.judging import DEFAULT_JUDGE_TEMPLATE
from monitor.core.stopping import get_stopping_rule
from monitor.engine.judged import ask_judge
from tests.model.llama_server import LlamaServer, llama_server

pytestmark = pytest.mark.slow

SYSTEM = "You are a calculator. Reply with the equation and its result."
SHOTS = [("1 + 1", "2"), ("5 + 2", "7"), ("8 - 3", "5")]
QUESTIONS = [("2 + 3", "5"), ("4 * 3", "12"), ("9 + 8", "17"), ("10 - 4", "6"), ("20 - 7", "13")]
K0, K_MAX = 3, 10


def chat_request(expression: str) -> dict[str, Any]:
    """An OpenAI chat request as production traffic would carry it."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for shot, result in SHOTS:
        messages.append({"role": "user", "content": f"What is {shot}?"})
        messages.append({"role": "assistant", "content": f"{shot} = {result}"})
    messages.append({"role": "user", "content": f"What is {expression}?"})
    return {"model": "prod-model", "messages": messages, "stop": ["\n"], "stream": True}


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log_dir: Path = tmp_path_factory.mktemp("llama")
    with llama_server(log_dir=log_dir, n_threads=2, seed=1234) as server:
        print(f"\nllama server ready in {server.startup_s:.2f} s at {server.base_url}")
        yield server


def make_client(server: LlamaServer, outcomes: list[str], **options: Any) -> HttpModelClient:
    settings: dict[str, Any] = {
        "base_url": server.base_url,
        "model": server.model,
        "temperature": 0.7,
        "max_tokens": 16,
        "timeout_s": 60.0,
        "concurrency": 2,
        "max_retries": 1,
        "on_outcome": outcomes.append,
    }
    settings.update(options)
    return HttpModelClient(**settings)


async def test_single_completions_and_latency(llm_server: LlamaServer) -> None:
    outcomes: list[str] = []
    latencies = []
    answers: list[str] = []
    async with make_client(llm_server, outcomes) as client:
        for expression, _ in QUESTIONS:
            started = time.monotonic()
            answers += await client.sample(chat_request(expression), 1)
            latencies.append(time.monotonic() - started)
    assert outcomes == ["ok"] * len(QUESTIONS)
    assert len(answers) == len(QUESTIONS)
    assert all(isinstance(a, str) and "\n" not in a for a in answers)  # 'stop' was forwarded
    assert any(a.strip() for a in answers)
    print(
        f"\nstartup {llm_server.startup_s:.2f} s; latency per request: "
        f"median {np.median(latencies):.3f} s, max {max(latencies):.3f} s"
    )


async def test_server_ignores_n_and_the_client_tops_up(llm_server: LlamaServer) -> None:
    outcomes: list[str] = []
    async with make_client(llm_server, outcomes, supports_n=True) as client:
        answers = await client.sample(chat_request("2 + 3"), 3)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    assert outcomes == ["ok"] * 3  # one call asking n=3 got one choice; two more filled in


@dataclass
class ItemSummary:
    expression: str
    expected: str
    answers: list[str]
    classes: list[str]
    batches: list[int]
    certified: bool
    mode: str | None
    counts: dict[str, int]


async def test_sequential_sampling_finds_the_mode(llm_server: LlamaServer) -> None:
    rule = get_stopping_rule(k_max=K_MAX, k0=K0)
    canon = get_canonicalizer("numeric")
    outcomes: list[str] = []
    summaries: list[ItemSummary] = []
    started = time.monotonic()
    async with make_client(llm_server, outcomes) as client:
        for index, (expression, expected) in enumerate(QUESTIONS):
            request = chat_request(expression)
            answers: list[str] = []
            classes: list[str] = []
            batches: list[int] = []
            while True:
                decision = rule.decide(count_classes(classes).values())
                if decision.stop:
                    break
                batch = await client.sample(request, decision.more)
                assert len(batch) == decision.more
                batches.append(decision.more)
                answers += batch
                classes += [canon.canonicalize(a) for a in batch]
            consensus = rank_classes(classes, np.random.default_rng(index))
            summaries.append(
                ItemSummary(
                    expression,
                    expected,
                    answers,
                    classes,
                    batches,
                    decision.certified,
                    consensus.mode,
                    dict(zip(consensus.classes, consensus.counts, strict=True)),
                )
            )
    elapsed = time.monotonic() - started

    print(f"\n{'question':>8} {'expected':>8} {'k':>3} {'batches':<14} {'cert':<5} mode  counts")
    for s in summaries:
        print(
            f"{s.expression:>8} {s.expected:>8} {len(s.answers):>3} {s.batches!s:<14} "
            f"{s.certified!s:<5} {s.mode!s:<5} {s.counts}"
        )
    calls = sum(len(s.answers) for s in summaries)
    right = sum(c == s.expected for s in summaries for c in s.classes)
    print(
        f"{calls} calls in {elapsed:.1f} s ({elapsed / calls:.3f} s/call); "
        f"{right}/{calls} answers right; "
        f"{sum(s.mode == s.expected for s in summaries)}/{len(summaries)} modes right"
    )

    assert outcomes == ["ok"] * calls
    for s in summaries:
        assert all(isinstance(a, str) for a in s.answers)
        assert K0 <= len(s.answers) <= K_MAX
        assert s.batches[0] == K0  # the rule asks for k0 first, then what could certify
        assert any(c != INVALID for c in s.classes), s
        assert s.certified or len(s.answers) == K_MAX
    assert any(s.mode == s.expected for s in summaries)
    # sequential stopping saved calls on at least one item that the model agrees on
    assert any(s.certified and len(s.answers) < K_MAX for s in summaries)


async def test_service_end_to_end_on_the_real_model(
    llm_server: LlamaServer, tmp_path: Path
) -> None:
    """Events in → K re-asks to SmolLM2 with sequential stopping → numeric classes →
    review items → verdicts from the ground truth → metrics, which must equal an
    independent computation from the same verdicts."""
    import math

    from prometheus_client import CollectorRegistry

    from adapters.sqlite.store import SqliteStore
    from monitor.app.wiring import build_task
    from monitor.config import BudgetSettings, TaskSettings
    from monitor.core.events import parse_event
    from monitor.core.review import Verdict
    from monitor.engine.metrics import Metrics
    from monitor.engine.service import MonitorService

    questions = [*QUESTIONS, ("3 + 3", "6"), ("7 + 1", "8"), ("6 - 2", "4")]
    registry = CollectorRegistry()
    metrics = Metrics(registry, k_max=K_MAX)
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k0=K0,
        k_max=K_MAX,
        sampling_rate=1.0,
        review_rate=1.0,
        half_life_s=None,
        alphas=[0.1, 0.2, 0.3],
        endpoint={
            "base_url": llm_server.base_url,
            "model": llm_server.model,
            "temperature": 0.7,
            "max_tokens": 16,
            "concurrency": 2,
            "max_retries": 1,
        },
    )
    task = build_task(settings, metrics)  # the runner's own wiring: client, canonicalizer, rule
    client = task.client
    store = SqliteStore(tmp_path / "relmon.sqlite3")
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=metrics,
        budget=BudgetSettings(calls_per_minute=10_000, max_in_flight=2, queue_size=64),
    )
    try:
        await service.load()
        service.start()
        for i, (expression, _) in enumerate(questions):
            raw = {
                "id": f"q{i}",
                "model": "prod-model",
                "task": "arith",
                "request": chat_request(expression),
            }
            assert service.offer(parse_event(raw), "test").decision == "sampled"
        await service.drain()
        truth = {f"arith:q{i}": answer for i, (_, answer) in enumerate(questions)}
        scores = []
        while (item := await store.next_pending()) is not None:
            ranks = tuple(
                r + 1 for r, (c, _) in enumerate(item.candidates) if c == truth[item.item_id]
            )
            verdict = (
                Verdict(item.item_id, ranks) if ranks else Verdict(item.item_id, none_of_these=True)
            )
            outcome = await service.apply_verdict(verdict)
            assert outcome.status == "applied"
            scores.append(min(ranks) if ranks else math.inf)
            print(f"{item.item_id}: K={item.k} candidates={item.candidates} score={scores[-1]}")
        await service.stop(10)
    finally:
        await client.aclose()
        await store.aclose()
    n = len(scores)
    assert n == len(questions)
    labels = {"model": llm_server.model, "task": "arith"}
    level = registry.get_sample_value("relmon_reliability_level", labels)
    assert level == sum(1 for s in scores if s <= 1) / (n + 1)
    for alpha in (0.1, 0.2, 0.3):
        k = math.ceil(round((n + 1) * (1 - alpha), 9))
        expected = math.inf if k > n else sorted(scores)[k - 1]
        got = registry.get_sample_value(
            "relmon_conformal_threshold", {**labels, "alpha": f"{alpha:g}"}
        )
        assert got == expected, alpha
    samples = registry.get_sample_value("relmon_samples_per_item_sum", labels)
    ok_calls = registry.get_sample_value("relmon_model_calls_total", {**labels, "outcome": "ok"})
    assert samples is not None and K0 * n <= samples <= K_MAX * n
    assert ok_calls == samples
    assert sum(1 for s in scores if s <= 1) >= n // 2  # SmolLM2 gets most of these right


async def test_a_real_model_as_the_judge(llm_server: LlamaServer) -> None:
    """SmolLM2 as ``tasks[].judge``: every reply is read as a label or counted unusable,
    never an error, and the shipped prompt gets usable yes/no replies from it."""
    judge = build_judge(
        JudgeSettings(endpoint={"base_url": llm_server.base_url, "model": llm_server.model})
    )
    pairs = [("What is 2 + 2?", "4"), ("What is the capital of France?", "Paris")]
    pairs += [("What is 3 + 5?", "9"), ("What is the capital of Italy?", "Madrid")]
    try:
        labels = [await ask_judge(judge, DEFAULT_JUDGE_TEMPLATE, q, a) for q, a in pairs]
    finally:
        await judge.aclose()
    assert all(label in (True, False, None) for label in labels)
    assert sum(label is not None for label in labels) >= 2, labels
