"""relmon with its OTLP receiver on, in front of the upstream fixture
(:mod:`tests.apis_e2e.upstream`), and the spans the tests send it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import yaml

from monitor.app.runner import Running, start_service
from monitor.config import load_settings
from tests.apis_e2e.conftest import api_task
from tests.apis_e2e.upstream import Upstream
from tests.ports import free_port

__all__ = ["OtlpRelmon", "chat_attributes", "otlp_relmon", "spans_total"]


class OtlpRelmon:
    def __init__(self, running: Running, port: int) -> None:
        self.running = running
        self.url = f"http://127.0.0.1:{port}"

    def value(self, name: str, **labels: str) -> float:
        return self.running.registry.get_sample_value(name, labels) or 0.0


def spans_total(r: OtlpRelmon, shape: str, outcome: str) -> float:
    return r.value("relmon_otlp_spans_total", shape=shape, outcome=outcome)


@contextlib.asynccontextmanager
async def otlp_relmon(
    tmp_path: Any,
    up: Upstream,
    *,
    task: dict[str, Any] | None = None,
    api: str = "chat",
    **otlp: Any,
) -> AsyncIterator[OtlpRelmon]:
    """relmon with ``traffic.mode: off`` and ``traffic.otlp`` on (``otlp``: more of its
    keys), one task re-asking the upstream in Chat Completions (``api``: another of
    :data:`~tests.apis_e2e.conftest.APIS`' keys; ``task``: more of its keys)."""
    port = free_port()
    config = {
        "tasks": [api_task(api, up, **(task or {}))],
        "traffic": {"mode": "off", "otlp": {"enabled": True, "port": port, "join_s": 0.2} | otlp},
        "metrics": {"port": 0},
        "review": {"port": 0, "token": "otlp-e2e-review-token-0123"},
        "budget": {"calls_per_minute": 6000, "max_in_flight": 8, "pace": False},
        "state_dir": str(tmp_path / "state"),
        "query_hash_key": "0123456789abcdef0123456789abcdef",
    }
    path = tmp_path / "relmon.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    running = await start_service(load_settings(path))
    try:
        yield OtlpRelmon(running, port)
    finally:
        await running.close(5.0)


def chat_attributes(
    question: str | None = "What is the capital of Italy?",
    answer: str = "Rome",
    model: str = "gpt-4.1",
) -> dict[str, Any]:
    """A GenAI-semconv chat span's attributes (no messages when ``question`` is None:
    content capture off)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": model,
    }
    if question is not None:
        user = [{"role": "user", "parts": [{"type": "text", "content": question}]}]
        out = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        attributes["gen_ai.input.messages"] = json.dumps(user)
        attributes["gen_ai.output.messages"] = json.dumps(out)
    return attributes
