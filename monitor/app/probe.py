"""Checks ``relmon check-config`` makes beyond the settings themselves: whether each
listener's port is free (always), and what each task's model endpoint answers to one
small request (``--probe``). Every line names the field it is about; no key is shown.

The probe asks in the task's wire API (``endpoint.api``, else ``match.api``, else
OpenAI chat) the way a sampled request is re-asked: a small production request of that
API (:func:`probe_request`) goes through the task's re-ask rules
(:func:`~monitor.core.reask.reask_request`), the API's route and carried headers, and the
re-asking client, which sends the key the API's way and reads the answer as the API's."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from typing import Any, Final

from adapters.model.client import HttpModelClient, shown_url
from adapters.postgres.store import diagnose
from monitor.config import Settings, TaskSettings
from monitor.config.messages import task_label
from monitor.core.apis.registry import DEFAULT_API, GENERIC, carried, get_api
from monitor.core.errors import InputError, ModelCallError
from monitor.core.reask import reask_request
from monitor.engine.runtime import reask_policy

__all__ = ["listener_problems", "listeners", "probe_endpoints", "probe_request", "store_problems"]

PROBE_QUERY: Final = "Reply with the word: ok"
_PROBE_TOKENS: Final = 16  # OpenAI's Responses API refuses a max_output_tokens below 16
_FIELD_PATH: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
"""A ``query_path`` the probe can build a request for: plain field names (``input.text``)."""


def listeners(settings: Settings) -> Iterator[tuple[str, str, int]]:
    """(field, host, port) of every listener ``relmon run`` would open."""
    yield "metrics", settings.metrics.host, settings.metrics.port
    if settings.review.backend == "http":
        yield "review", settings.review.host, settings.review.port
    if settings.traffic.mode != "off":
        yield "traffic", settings.traffic.host, settings.traffic.port
    if settings.traffic.otlp.enabled:
        yield "traffic.otlp", settings.traffic.otlp.host, settings.traffic.otlp.port


def _bind_problem(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
        try:
            sock.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


def listener_problems(settings: Settings) -> list[str]:
    """A line for every listener whose address is taken or cannot be bound."""
    problems = []
    for name, host, port in listeners(settings):
        if port == 0:
            continue  # any free port
        problem = _bind_problem(host, port)
        if problem is not None:
            problems.append(f"{name}.port: {problem} (another process holds it?)")
    return problems


def probe_request(task: TaskSettings, api: str, model: str) -> dict[str, Any] | None:
    """A small production request of ``api`` asking :data:`PROBE_QUERY` for a few tokens;
    for ``generic``, the query put where the task's ``query_path`` reads it, None when
    that is not a plain field path (a JMESPath expression cannot be built backwards)."""
    user = [{"role": "user", "content": PROBE_QUERY}]
    if api == GENERIC:
        path = task.query_path or "@"
        if not _FIELD_PATH.fullmatch(path):
            return None
        body: Any = PROBE_QUERY
        for name in reversed(path.split(".")):
            body = {name: body}
        return dict(body)
    if api == "anthropic.messages":
        return {"model": model, "max_tokens": _PROBE_TOKENS, "messages": user}
    if api == "openai.responses":
        return {"model": model, "input": PROBE_QUERY, "max_output_tokens": _PROBE_TOKENS}
    if api == "gemini.generate_content":
        return {
            "contents": [{"role": "user", "parts": [{"text": PROBE_QUERY}]}],
            "generationConfig": {"maxOutputTokens": _PROBE_TOKENS},
        }
    if api == "openai.completions":
        return {"model": model, "prompt": PROBE_QUERY, "max_tokens": _PROBE_TOKENS}
    return {"model": model, "messages": user, "max_tokens": _PROBE_TOKENS}


async def _probe(index: int, settings: Settings) -> str:
    task = settings.tasks[index]
    where = f"{task_label(index, task.name)}.endpoint"
    name = task.endpoint.api or task.match.api or DEFAULT_API
    model = task.endpoint.model or task.match.model or ""
    request = probe_request(task, name, model)
    if request is None:
        return (
            f"{where}: not probed: generic, query_path {task.query_path!r} is not a plain "
            "field path (such as input.text), so relmon cannot build a request for it"
        )
    api = get_api(name, task.generic_options)
    try:
        reask = reask_request(request, reask_policy(task), api.rules)
        route = carried(api.route(request, None, model), ())
    except InputError as exc:
        return f"{where}: FAILED: {name}, model {model}: {exc}"
    client = HttpModelClient(
        base_url=task.endpoint.base_url,
        model=model,
        api_key=task.endpoint.resolved_api_key(),
        max_tokens=_PROBE_TOKENS,
        timeout_s=task.endpoint.timeout_s,
        concurrency=1,
        max_retries=0,
        retries={"invalid": 0},
        breaker_threshold=1_000,
        forward=True,  # the re-ask as built, as the task's own client sends it
    )
    url = shown_url(task.endpoint.base_url.rstrip("/") + route.path)
    try:
        answers = await client.sample(reask.body, 1, api=api, route=route)
    except ModelCallError as exc:
        return f"{where}: FAILED: {name}, model {model}: {exc}"
    finally:
        await client.aclose()
    kind = "an empty answer" if not answers or not answers[0] else "an answer"
    return f"{where}: ok: {url} ({name}, model {model}) gave {kind}"


async def probe_endpoints(settings: Settings) -> list[str]:
    """One line per task: what its endpoint answered to one small request."""
    return list(await asyncio.gather(*(_probe(i, settings) for i in range(len(settings.tasks)))))


async def store_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """With ``store.backend: postgres``: whether the database can be used (wrong password,
    unreachable host, no such database), and warnings: the migrations a start would
    apply (not a problem: the first replica to start applies them, once)."""
    dsn = settings.store.resolved_dsn() if settings.store.backend == "postgres" else None
    if dsn is None:
        return [], []
    problem, pending = await diagnose(dsn)
    if problem is not None:
        return [f"store.dsn: {problem}"], []
    if not pending:
        return [], []
    versions = ", ".join(str(v) for v in pending)
    return [], [f"store: schema migrations {versions} will be applied at the next start"]
