"""Checks ``relmon check-config`` makes beyond the settings themselves: whether each
listener's port is free (always), and what each task's model endpoint answers to one
small request (``--probe``). Every line names the field it is about; no key is shown."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

from adapters.model.client import HttpModelClient, shown_url
from adapters.postgres.store import diagnose
from monitor.config import Settings
from monitor.config.messages import task_label
from monitor.core.errors import ModelCallError

__all__ = ["listener_problems", "listeners", "probe_endpoints", "store_problems"]

_PROBE_MESSAGES = [{"role": "user", "content": "Reply with the word: ok"}]


def listeners(settings: Settings) -> Iterator[tuple[str, str, int]]:
    """(field, host, port) of every listener ``relmon run`` would open."""
    yield "metrics", settings.metrics.host, settings.metrics.port
    if settings.review.backend == "http":
        yield "review", settings.review.host, settings.review.port
    if settings.traffic.mode != "off":
        yield "traffic", settings.traffic.host, settings.traffic.port


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


async def _probe(index: int, settings: Settings) -> str:
    task = settings.tasks[index]
    where = f"{task_label(index, task.name)}.endpoint"
    model = task.endpoint.model or task.match.model or ""
    client = HttpModelClient(
        base_url=task.endpoint.base_url,
        model=model,
        api_key=task.endpoint.resolved_api_key(),
        temperature=0.0,
        max_tokens=8,
        timeout_s=task.endpoint.timeout_s,
        max_retries=0,
        retries={"invalid": 0},
        breaker_threshold=1_000,
    )
    url = shown_url(task.endpoint.base_url.rstrip("/") + "/chat/completions")
    try:
        answers = await client.sample({"messages": _PROBE_MESSAGES}, 1)
    except ModelCallError as exc:
        return f"{where}: FAILED: {exc}"
    finally:
        await client.aclose()
    kind = "an empty answer" if not answers or not answers[0] else "an answer"
    return f"{where}: ok: {url} (model {model}) gave {kind}"


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
