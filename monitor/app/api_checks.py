"""The checks of a task's wire API settings (``relmon check-config``, as
:mod:`monitor.app.validation` runs them): ``endpoint.api`` against its ``base_url`` (a
base URL as that vendor's SDK takes it), and a ``generic`` task's paths, match and
declaration that its requests are safe to repeat (docs/apis/)."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from monitor.config.schema import TaskSettings
from monitor.core.apis.registry import GENERIC, get_api
from monitor.core.errors import ConfigError

__all__ = ["api_problems"]

_VERSIONED: Final = re.compile(r"/v\d+(?:(?:alpha|beta)\d*)?$")
"""A base URL path ending in an API version segment (``/v1``, ``/v1beta``)."""
_VENDOR_HOSTS: Final = {
    "api.anthropic.com": "anthropic.messages",
    "generativelanguage.googleapis.com": "gemini.generate_content",
    "api.openai.com": "openai.*",
}


def _base_url_problem(api: str, base_url: str) -> str | None:
    """What is wrong with ``base_url`` for ``api`` (a base URL as that vendor's SDK
    takes it: OpenAI-style with the version segment, Anthropic's and Gemini's without)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    vendor = _VENDOR_HOSTS.get((parts.hostname or "").lower())
    if vendor is not None and not (
        vendor == api or (vendor == "openai.*" and api.startswith("openai."))
    ):
        return f"{parts.hostname} speaks {vendor}, not {api}: set endpoint.api to match it"
    if api == "anthropic.messages" and _VERSIONED.search(path):
        return (
            f"relmon posts to base_url + /v1/messages, so {base_url!r} would call "
            f"{path}/v1/messages: give the base URL without its version segment, as the "
            "Anthropic SDK takes it (https://api.anthropic.com)"
        )
    if api == "gemini.generate_content" and (_VERSIONED.search(path) or "/models" in path):
        return (
            f"relmon posts to base_url + /v1beta/models/MODEL:generateContent (the "
            f"production request's own version), so give the base URL without a version "
            f"or model segment (https://generativelanguage.googleapis.com), not {base_url!r}"
        )
    return None


def api_problems(where: str, t: TaskSettings) -> list[str]:
    """The task's wire API settings: endpoint.api against its base_url, ``generic``'s
    paths, match and declaration that it is safe to repeat."""
    problems: list[str] = []
    api = t.endpoint.api
    if t.match.api is not None and api is not None and t.match.api != api:
        problems.append(
            f"{where}.match.api: {t.match.api} traffic cannot be re-asked in endpoint.api "
            f"{api} (a re-ask is made in the API production used)"
        )
    if api is not None:
        problem = _base_url_problem(api, t.endpoint.base_url)
        if problem is not None:
            problems.append(f"{where}.endpoint.base_url: {problem}")
        if t.endpoint.supports_n and get_api(api, t.generic_options).max_draws_per_call == 1:
            problems.append(
                f"{where}.endpoint.supports_n: {api} draws one answer a call (no n or "
                "candidateCount): remove supports_n"
            )
    if api == GENERIC:
        problems += _generic_problems(where, t)
    elif t.query_path is not None or t.answer_path is not None:
        field = "query_path" if t.query_path is not None else "answer_path"
        problems.append(f"{where}.{field}: only for endpoint.api: generic")
    return problems


def _generic_problems(where: str, t: TaskSettings) -> list[str]:
    problems = []
    if not t.endpoint.repeatable:
        problems.append(
            f"{where}.endpoint.repeatable: a generic endpoint (an agent service) may act "
            "(book, send, write) and relmon would repeat its request K times; set "
            "endpoint.repeatable: true only if repeating the request is safe"
        )
    if t.match.path_prefix is None:
        problems.append(
            f"{where}.match.path_prefix: required for endpoint.api: generic (the path of "
            "the agent service's requests; nothing else tells them apart)"
        )
    if t.answer_path is None:
        problems.append(f"{where}.answer_path: required for endpoint.api: generic (JMESPath)")
    try:
        get_api(GENERIC, t.generic_options)
    except ConfigError as exc:
        problems.append(f"{where}.{exc}")
    return problems
