"""What ``relmon check-config`` (and ``relmon run``) say about ``traffic.routes``: a route
an earlier one always takes the requests of (a problem: it is never used), a task whose
requests no route takes when there is no ``traffic.upstream_url`` (a problem: its
traffic would be refused), and a route no task monitors (a warning: relayed, never
sampled). A task's requests are judged at its API's usual path (``/v1/messages``, …)."""

from __future__ import annotations

from adapters.traffic.routing import RouteSpec, match_route, route_entry
from monitor.app.dataplane import route_specs
from monitor.config import Settings, TaskSettings
from monitor.config.messages import task_label
from monitor.core.apis.registry import GENERIC

__all__ = ["USUAL_PATHS", "route_problems"]

USUAL_PATHS = {
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
    "gemini.generate_content": "/v1beta/models/gemini-2.0-flash:generateContent",
    "openai.completions": "/v1/completions",
}
"""Each standard API's path as its official SDK calls it."""


def _task_path(t: TaskSettings) -> str | None:
    """The path of the task's requests; None when the task takes any API's."""
    api = t.match.api or t.endpoint.api
    if api == GENERIC:
        return t.match.path_prefix
    return USUAL_PATHS.get(api) if api is not None else None


def _label(i: int, spec: RouteSpec) -> str:
    return f"traffic.routes[{i}]" + (f" ({spec.label})" if spec.label != str(i) else "")


def _shadowed(specs: list[RouteSpec], i: int) -> int | None:
    """The earlier route that takes every request route ``i`` matches, if one does."""
    me = specs[i]
    for j, other in enumerate(specs[:i]):
        if me.api is not None and other.api == me.api:
            return j
        if (
            me.path_prefix is not None
            and other.path_prefix is not None
            and me.path_prefix.startswith(other.path_prefix)
        ):
            return j
    return None


def route_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """(problems, warnings) about ``traffic.routes``, each naming its field."""
    traffic = settings.traffic
    if traffic.mode != "proxy" or not traffic.routes:
        return [], []
    specs = route_specs(settings)
    entries = [route_entry(s) for s in specs]
    problems: list[str] = []
    warnings: list[str] = []
    for i, spec in enumerate(specs):
        j = _shadowed(specs, i)
        if j is not None:
            problems.append(
                f"{_label(i, spec)}: never used: {_label(j, specs[j])} comes first and "
                f"takes every request it matches; put the narrower route first"
            )
    reached: set[int] = set()
    any_api = False
    for k, t in enumerate(settings.tasks):
        path = _task_path(t)
        if path is None:
            any_api = True  # a task of any API: every route may carry its requests
            continue
        i = match_route(entries, path.encode())
        if i >= 0:
            reached.add(i)
        elif not traffic.upstream_url:
            api = t.match.api or t.endpoint.api
            problems.append(
                f"{task_label(k, t.name)}: no route sends its requests ({api}, at {path}) "
                "anywhere and traffic.upstream_url is not set: add a route that matches "
                f"them (match.api: {api}) or set traffic.upstream_url"
            )
    if not any_api:
        for i, spec in enumerate(specs):
            if i not in reached and _shadowed(specs, i) is None:
                what = f"api {spec.api}" if spec.api else f"path_prefix {spec.path_prefix}"
                warnings.append(
                    f"{_label(i, spec)}: no task monitors the requests it takes ({what}): "
                    "they are relayed to its upstream, never sampled"
                )
    return problems, warnings
