"""``generic``: an agent service's own JSON endpoint (docs/apis/generic.md).

Any JSON object is a request; a task says where its question and its answer are, as
JMESPath expressions (``tasks[].query_path``, ``tasks[].answer_path``; ``@``, the whole
body, when not set), compiled once when the task is built. The question is what the
``query_path`` finds: a string, or a list of strings newline-joined, or any other JSON
value as compact JSON with sorted keys (``@``: the body); a request in which it finds
nothing or no text (null, missing, ``[]``, ``{}``, ``""``, values that are all null or
blank) is refused. The answer is the ``answer_path``'s value in the response: a
string as it is; any other JSON value as compact JSON with its keys sorted, so equal
structures are one answer; nothing (null, missing) is no answer. Streamed, the answer is
that of the last event the ``answer_path`` finds something in (a service that streams
deltas needs an ``answer_path`` that picks its final event).

A re-ask is the body resent as it is (``reask.set`` and ``reask.drop`` still apply) to
the production path, normalised (:func:`~monitor.core.apis.paths.normalised_path`), and
only when it still lies under the task's ``match.path_prefix``
(:meth:`GenericApi.reask_path`; a path :func:`~monitor.core.apis.paths.unsafe_path`
refuses never is); without a production path (an event that names none), to the
``path_prefix`` itself. One answer a call. A body that asks the service to stream is
resent as it is, and the streamed answer is read as production's is
(:meth:`GenericApi.stream_answer`). Whether a service may be asked again at all is the
task's declaration (``endpoint.repeatable``), checked with the configuration.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import jmespath
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult

from monitor.core.apis.base import AuthScheme, Route, is_text, require
from monitor.core.apis.paths import normalised_path, under_prefix, unsafe_path
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import FieldRules

__all__ = ["GenericApi", "compiled_jmespath", "json_answer"]


def compiled_jmespath(option: str, expression: object) -> ParsedResult:
    """``expression`` compiled; a :class:`ConfigError` that starts with ``option`` (the
    task's field) and names the expression when it is not JMESPath."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigError(f"{option}: must be a JMESPath expression, not {expression!r}")
    try:
        return jmespath.compile(expression)
    except JMESPathError as e:
        where = getattr(e, "lex_position", None)
        at = f" at column {where}" if isinstance(where, int) else ""
        raise ConfigError(
            f"{option}: {expression!r} is not a JMESPath expression (a syntax error{at})"
        ) from None


def _search(expression: ParsedResult, document: Mapping[str, Any]) -> Any:
    """The expression's value in ``document``; None when it finds nothing or does not
    apply to it (a function given a value of the wrong type)."""
    try:
        return expression.search(document)
    except JMESPathError:
        return None


def _texts(value: Any) -> list[str] | None:
    """A string, or a non-empty list of strings, as a list; None otherwise."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def _has_text(value: Any) -> bool:
    """Whether a ``query_path`` value holds any text: a string that is not blank, a
    number or a boolean, here or anywhere inside a list or an object."""
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, bool | int | float):
        return True
    if isinstance(value, list):
        return any(_has_text(v) for v in value)
    if isinstance(value, dict):
        return any(_has_text(v) for v in value.values())
    return False


def json_answer(value: Any) -> str | None:
    """An ``answer_path`` value as an answer (see the module)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class GenericApi:
    """The ``generic`` API of one task (see the module): ``query_path`` and
    ``answer_path`` are JMESPath expressions, a :class:`ConfigError` when one does not
    compile; ``path_prefix``: the task's ``match.path_prefix``, under which its re-asks
    stay (None: any path :func:`~monitor.core.apis.paths.unsafe_path` accepts)."""

    __slots__ = ("_answer", "_query", "answer_path", "path_prefix", "query_path")

    name: Final = "generic"
    auth: Final[AuthScheme] = "bearer"
    max_draws_per_call: Final = 1
    rules: Final[FieldRules] = FieldRules(
        dropped=(), own=(), forced=(), temperature=None, model=None, built=None
    )

    def __init__(self, query_path: str, answer_path: str, path_prefix: str | None = None) -> None:
        self.query_path: Final = query_path
        self.answer_path: Final = answer_path
        self.path_prefix: Final = path_prefix
        self._query: Final = compiled_jmespath("query_path", query_path)
        self._answer: Final = compiled_jmespath("answer_path", answer_path)

    def recognises(self, path: str) -> bool:
        return False  # by the task's match.path_prefix, never by path alone

    def check_request(self, request: Mapping[str, Any]) -> None:
        require(isinstance(request, dict), "generic: the request must be a JSON object")
        require(
            _has_text(_search(self._query, request)),
            f"generic: query_path {self.query_path!r} found no text in the request",
        )
        require(is_text(self.query(request)), "generic: the query is not valid Unicode")

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        model = request.get("model")
        return model if isinstance(model, str) else None

    def query(self, request: Mapping[str, Any]) -> str:
        value = _search(self._query, request)
        texts = _texts(value)
        if texts is not None:
            return "\n".join(texts)
        return json_answer(value) or ""

    def answer(self, response: Mapping[str, Any]) -> str | None:
        return json_answer(_search(self._answer, response))

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        for event in reversed(events):
            value = _search(self._answer, event)
            if value is not None:
                return json_answer(value)
        return None

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        return None  # endpoint.repeatable is checked with the configuration

    def reask_path(self, path: str | None) -> str | None:
        """Where a re-ask of a request to ``path`` goes under the task's base URL: the
        path normalised, when it is safe and stays under ``path_prefix``; without a
        path, the prefix itself (``/`` without one); None: nowhere (not re-asked)."""
        if path is None:
            return self.path_prefix or "/"
        if unsafe_path(path):
            return None
        plain = normalised_path(path)
        if self.path_prefix is not None and not under_prefix(plain, self.path_prefix):
            return None
        return plain

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        where = self.reask_path(path)
        if where is None:
            raise InputError("generic: the production path is not one a re-ask may follow")
        return Route(self.name, where)

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        text = self.answer(response)
        if text is None:
            raise InputError(f"generic: answer_path {self.answer_path!r} found no answer")
        return [text]

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        if n != 1:
            raise ConfigError(f"generic: one answer a call, not {n}")
        return dict(body)
