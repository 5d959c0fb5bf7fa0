"""One span read as a model call: whether it is an inference span, its shape, and the
request and served answer of the wire API its provider speaks. No I/O.

An **inference span** names a model call: ``gen_ai.operation.name`` in
:data:`INFERENCE_OPERATIONS` (or no operation, a ``gen_ai.request.model`` and messages),
OpenInference ``openinference.span.kind = LLM``, OpenLLMetry ``llm.request.type`` in
``chat``, ``completion``. Any other span is ``not_inference``, read no further than those
attributes.

Its messages are read by the shapes of :data:`READERS`, in that order; the first that
holds messages wins (a span may carry OpenInference keys beside ``gen_ai.*``). A span
whose turns hold no content (content capture off) is ``no_content``; one whose recorded
messages are cut or of another schema is ``rejected`` with the reason
(:mod:`.recorded`); the rest is ``read`` into the API of its provider
(:func:`provider_api`), the request checked by that API as any traffic event's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from monitor.core.apis.registry import get_api
from monitor.core.errors import InputError
from monitor.core.traces.flat import read_openinference, read_openllmetry
from monitor.core.traces.genai import (
    JoinedEvent,
    read_genai,
    read_genai_events,
    read_operation_details,
)
from monitor.core.traces.recorded import FOREIGN, Recorded, UnreadableSpanError
from monitor.core.traces.spans import LogRecord, Span
from monitor.core.traces.wire import rebuild

__all__ = [
    "INFERENCE_OPERATIONS",
    "OUTCOMES",
    "READERS",
    "SHAPES",
    "SpanCall",
    "is_inference",
    "joined_events",
    "provider_api",
    "read_span",
    "span_model",
]

INFERENCE_OPERATIONS: Final = ("chat", "text_completion", "generate_content")
SHAPES: Final = ("genai", "genai_events", "openinference", "openllmetry", "other")
OUTCOMES: Final = ("read", "no_content", "not_inference", "rejected")
Reader = Callable[[Mapping[str, object], Sequence[JoinedEvent]], Recorded | None]
READERS: Final[tuple[Reader, ...]] = (
    read_genai,
    read_genai_events,
    read_openinference,
    read_openllmetry,
    read_operation_details,
)
"""The shapes' readers in precedence order (each returns None when its shape is absent)."""
_GEMINI: Final = ("gcp.gemini", "gcp.vertex_ai", "google")
_PLAIN_MODEL: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._@-")


@dataclass(frozen=True, slots=True)
class SpanCall:
    """What one span is to relmon. ``outcome`` in :data:`OUTCOMES`, ``shape`` in
    :data:`SHAPES`; ``reason`` for a rejected span (``truncated``, ``foreign``,
    ``media``, ``no_model``). A read span has its ``api``, ``model``, ``request`` (the
    API's body), ``served`` answer (None when unrecorded; ``served_tool_call`` when it is
    a tool-call answer), ``unrecorded`` answer-shaping fields, and ``path`` where the API
    keeps the model there (Gemini)."""

    outcome: str
    shape: str
    reason: str | None = None
    api: str | None = None
    model: str | None = None
    request: dict[str, Any] | None = None
    served: str | None = None
    served_tool_call: bool = False
    unrecorded: tuple[str, ...] = ()
    path: str | None = None
    start_ns: int = 0


def is_inference(attrs: Mapping[str, object]) -> bool | None:
    """Whether a span with these attributes is an inference span: True, False, or None
    when that depends on its messages (no operation, but a ``gen_ai.request.model``)."""
    operation = attrs.get("gen_ai.operation.name")
    if operation in INFERENCE_OPERATIONS:
        return True
    if attrs.get("openinference.span.kind") == "LLM":
        return True
    if attrs.get("llm.request.type") in ("chat", "completion"):
        return True
    if operation is None and isinstance(attrs.get("gen_ai.request.model"), str):
        return None
    return False


def _hint(attrs: Mapping[str, object]) -> str:
    """The shape a span's classifying attributes name, without reading messages."""
    if "openinference.span.kind" in attrs:
        return "openinference"
    if "llm.request.type" in attrs:
        return "openllmetry"
    if "gen_ai.operation.name" in attrs or "gen_ai.request.model" in attrs:
        return "genai"
    return "other"


def _completion(attrs: Mapping[str, object]) -> bool:
    operation = attrs.get("gen_ai.operation.name")
    return operation == "text_completion" or attrs.get("llm.request.type") == "completion"


def provider_api(attrs: Mapping[str, object]) -> str:
    """The wire API a span's provider speaks (``gen_ai.provider.name``, else
    ``gen_ai.system``, else ``llm.provider``): OpenAI's Chat Completions (its Responses
    API when ``openai.api.type`` says so, its Completions for a text completion),
    Anthropic's Messages, Gemini's ``generateContent``; any other provider is served
    through Chat Completions."""
    provider = next(
        (
            v
            for k in ("gen_ai.provider.name", "gen_ai.system", "llm.provider")
            if isinstance(v := attrs.get(k), str)
        ),
        "",
    ).lower()
    if provider == "anthropic":
        return "anthropic.messages"
    if provider in _GEMINI:
        return "gemini.generate_content"
    if provider == "openai" and attrs.get("openai.api.type") == "responses":
        return "openai.responses"
    return "openai.completions" if _completion(attrs) else "openai.chat"


def span_model(attrs: Mapping[str, object]) -> str | None:
    """``gen_ai.request.model``, else OpenInference's ``llm.model_name``, else
    ``gen_ai.response.model``."""
    for key in ("gen_ai.request.model", "llm.model_name", "gen_ai.response.model"):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def joined_events(span: Span, records: Sequence[LogRecord] = ()) -> list[JoinedEvent]:
    """The span's events and its joined log records, as the readers take them."""
    events = [JoinedEvent(e.name, e.time_ns, None, e.attributes) for e in span.events]
    events.extend(JoinedEvent(r.event_name, r.time_ns, r.body, r.attributes) for r in records)
    return events


def _recorded(span: Span, events: Sequence[JoinedEvent]) -> tuple[Recorded | None, str]:
    """The first shape holding messages, else the first present; else the hint."""
    first: Recorded | None = None
    for reader in READERS:
        rec = reader(span.attributes, events)
        if rec is not None and rec.has_messages:
            return rec, rec.shape
        first = first or rec
    return None, first.shape if first is not None else _hint(span.attributes)


def read_span(span: Span, records: Sequence[LogRecord] = ()) -> SpanCall:
    """``span`` (with the log records joined to it) as relmon reads it (see the module)."""
    attrs = span.attributes
    inference = is_inference(attrs)
    if inference is False:
        return SpanCall("not_inference", _hint(attrs), start_ns=span.start_ns)
    try:
        rec, shape = _recorded(span, joined_events(span, records))
    except UnreadableSpanError as exc:
        return SpanCall("rejected", _hint(attrs), reason=exc.reason, start_ns=span.start_ns)
    if rec is None:
        outcome = "not_inference" if inference is None else "no_content"
        return SpanCall(outcome, shape, start_ns=span.start_ns)
    model = span_model(attrs)
    if model is None:
        return SpanCall("rejected", shape, reason="no_model", start_ns=span.start_ns)
    api = provider_api(attrs)
    try:
        rebuilt = rebuild(rec, api)
    except UnreadableSpanError as exc:
        return SpanCall("rejected", shape, reason=exc.reason, start_ns=span.start_ns)
    path = None
    if api == "gemini.generate_content":
        model = model.removeprefix("models/")
        if set(model.lower()) <= _PLAIN_MODEL:
            path = f"/v1beta/models/{model}:generateContent"
    else:
        rebuilt.request["model"] = model
    try:
        get_api(api).check_request(rebuilt.request)
    except InputError:
        return SpanCall("rejected", shape, reason=FOREIGN, api=api, start_ns=span.start_ns)
    return SpanCall(
        "read",
        shape,
        api=api,
        model=model,
        request=rebuilt.request,
        served=rebuilt.served,
        served_tool_call=rebuilt.served_tool_call,
        unrecorded=rebuilt.unrecorded,
        path=path,
        start_ns=span.start_ns,
    )
