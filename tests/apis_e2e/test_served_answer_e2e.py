"""The served answer counted, end to end: each official SDK calls relmon's proxy, the
upstream answers, relmon reads the answer the client got (JSON or SSE), and, the re-ask
being the production request unchanged, counts it as the first of the item's draws: one
re-ask fewer, ``relmon_samples_per_item`` counting it, the review item offering it, a
verdict judging it into ``relmon_served_answer_acceptable_ratio``. A request whose
re-ask differs (Responses' ``store`` left to its default, true) keeps its K re-asks and
still offers and counts its served answer."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
from google.genai import types as gtypes

from monitor.core.review import Verdict
from tests.apis_e2e.conftest import (
    MODELS,
    PROD_KEY,
    TASK_KEYS,
    gemini_client,
    relmon,
    review_item,
    rid,
    value,
)
from tests.apis_e2e.upstream import Upstream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ANSWERS = {
    "chat": "Paris",
    "responses": "Tokyo",
    "messages": "Nairobi",
    "gemini": "Rome",
    "completions": "Lima",
    "responses-stored": "Madrid",
}


async def _ask_every_api(url: str) -> None:
    """One request per API, each as its SDK sends it, with no field relmon changes."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=PROD_KEY, max_retries=0)
    try:
        await client.chat.completions.create(
            model="gpt-4.1",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0.8,
            max_tokens=16,
            extra_headers=rid("served-chat"),
        )
        await client.responses.create(  # streamed: the served answer read from SSE
            model="gpt-4.1-mini",
            input="What is the capital of Japan?",
            store=False,
            stream=True,
            extra_headers=rid("served-responses"),
        )
        await client.responses.create(  # store left to its default: re-asked with false
            model="gpt-4.1-mini",
            input="What is the capital of Spain?",
            extra_headers=rid("served-responses-stored"),
        )
        await client.completions.create(
            model="gpt-3.5-turbo-instruct",
            prompt="Q: What is the capital of Peru?\nA:",
            max_tokens=8,
            temperature=0.9,
            extra_headers=rid("served-completions"),
        )
    finally:
        await client.close()
    claude = anthropic.AsyncAnthropic(base_url=url, api_key=PROD_KEY, max_retries=0)
    try:
        await claude.messages.create(
            model="claude-haiku-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "What is the capital of Kenya?"}],
            extra_headers=rid("served-messages"),
        )
    finally:
        await claude.close()
    async with gemini_client(url) as gemini:
        config = gtypes.GenerateContentConfig(
            temperature=0.9, http_options=gtypes.HttpOptions(headers=rid("served-gemini"))
        )
        await gemini.aio.models.generate_content(
            model="gemini-2.0-flash", contents="What is the capital of Italy?", config=config
        )


async def test_every_api_counts_its_served_answer(tmp_path: Path, upstream: Upstream) -> None:
    async with relmon(tmp_path, upstream, "proxy") as r:
        await _ask_every_api(r.url)
        for name, answer in ANSWERS.items():
            task = "responses" if name == "responses-stored" else name
            item = await review_item(r.running, task, f"served-{name}")
            assert item.served_rank == 1, name  # the top class: every draw agrees
            assert item.candidates[0][0].lower() == answer.lower(), item.candidates
            stored = name == "responses-stored"
            assert bool(item.reask_changes) is stored, (name, item.reask_changes)
            # Verdict: the served (and top) answer acceptable.
            outcome = await r.running.service.apply_verdict(Verdict(item.item_id, (1,)))
            assert outcome.status == "applied"
        for task in ("chat", "responses", "messages", "gemini", "completions"):
            labels = {"model": MODELS[task], "task": task}
            served = 2.0 if task == "responses" else 1.0
            assert value(r.running, "relmon_served_answers_total", **labels) == served, task
            disagreed = value(r.running, "relmon_served_answer_disagreements_total", **labels)
            assert disagreed == 0.0, task
            draws = value(r.running, "relmon_samples_per_item_sum", **labels)
            reasks = len(upstream.received(key=TASK_KEYS[task]))
            drawn = 1.0  # one item per task whose re-ask was the request unchanged
            assert reasks == draws - drawn, (task, reasks, draws)
            r.running.service.publish()
            ratio = value(r.running, "relmon_served_answer_acceptable_ratio", **labels)
            assert ratio == 1.0, task
            bound = value(r.running, "relmon_served_answer_acceptable_lower_bound", **labels)
            assert 0.0 < bound < 1.0, task
