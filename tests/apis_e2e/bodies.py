"""The upstream fixture's answers, built from the official SDKs' own types and dumped as
each API sends them: JSON bodies, and SSE streams in each API's documented event order.

Every answer is decided by the question (:func:`answer_for`), so that K re-asks agree and
an item scores, and what an SDK parses can be compared with what was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from anthropic.types import (
    Message,
    MessageDeltaUsage,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
    TextDelta,
    Usage,
)
from anthropic.types.raw_message_delta_event import Delta
from google.genai import types as gtypes
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

__all__ = [
    "ANSWERS",
    "CREATED",
    "agent_json",
    "answer_for",
    "chat_json",
    "chat_sse",
    "completion_json",
    "completion_sse",
    "gemini_json",
    "gemini_sse",
    "message_json",
    "message_sse",
    "response_json",
    "response_sse",
]

CREATED = 1_764_000_000
ANSWERS = (
    ("France", "Paris"),
    ("Italy", "Rome"),
    ("Japan", "Tokyo"),
    ("Spain", "Madrid"),
    ("Germany", "Berlin"),
    ("Peru", "Lima"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
)


def answer_for(question: str) -> str:
    """The one answer to a question: the capital of the country it names."""
    for country, capital in ANSWERS:
        if country in question:
            return capital
    return "I do not know"


def _pieces(text: str, size: int = 2) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _frame(payload: dict[str, Any], event: str | None = None, end: str = "\n\n") -> bytes:
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}{end}".encode()


# --- OpenAI Chat Completions ------------------------------------------------------------


def chat_json(answer: str, model: str, n: int = 1) -> dict[str, Any]:
    choices = [
        Choice(
            index=i,
            finish_reason="stop",
            message=ChatCompletionMessage(role="assistant", content=answer),
        )
        for i in range(n)
    ]
    completion = ChatCompletion(
        id="chatcmpl-up1",
        object="chat.completion",
        created=CREATED,
        model=model,
        choices=choices,
    )
    return completion.model_dump(mode="json", exclude_none=True)


def chat_sse(answer: str, model: str) -> Iterator[bytes]:
    def chunk(delta: ChoiceDelta, finish: Any = None) -> bytes:
        c = ChatCompletionChunk(
            id="chatcmpl-up1",
            object="chat.completion.chunk",
            created=CREATED,
            model=model,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)],
        )
        return _frame(c.model_dump(mode="json", exclude_none=True))

    yield chunk(ChoiceDelta(role="assistant", content=""))
    for piece in _pieces(answer):
        yield chunk(ChoiceDelta(content=piece))
    yield chunk(ChoiceDelta(), "stop")
    yield b"data: [DONE]\n\n"


# --- OpenAI Responses -------------------------------------------------------------------


def _response(answer: str | None, model: str, status: str) -> Response:
    output: list[Any] = []
    if answer is not None:
        text = ResponseOutputText(type="output_text", text=answer, annotations=[])
        output.append(
            ResponseOutputMessage(
                id="msg_up1", type="message", role="assistant", status="completed", content=[text]
            )
        )
    return Response(
        id="resp_up1",
        object="response",
        created_at=CREATED,
        model=model,
        status=status,  # type: ignore[arg-type]
        output=output,
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
    )


def response_json(answer: str, model: str) -> dict[str, Any]:
    return _response(answer, model, "completed").model_dump(mode="json", exclude_none=True)


def response_sse(answer: str, model: str) -> Iterator[bytes]:
    """``response.created``, ``response.in_progress``, the message item and its text part
    (``response.output_text.delta`` pieces), ``response.completed``."""
    seq = iter(range(1000))
    start = _response(None, model, "in_progress")
    final = _response(answer, model, "completed")
    message = final.output[0]
    assert isinstance(message, ResponseOutputMessage)
    part = message.content[0]
    common = {"item_id": message.id, "output_index": 0, "content_index": 0}
    events: list[Any] = [
        ResponseCreatedEvent(type="response.created", sequence_number=next(seq), response=start),
        ResponseInProgressEvent(
            type="response.in_progress", sequence_number=next(seq), response=start
        ),
        ResponseOutputItemAddedEvent(
            type="response.output_item.added",
            output_index=0,
            sequence_number=next(seq),
            item=message.model_copy(update={"content": [], "status": "in_progress"}),
        ),
        ResponseContentPartAddedEvent(
            type="response.content_part.added",
            sequence_number=next(seq),
            part=part.model_copy(update={"text": ""}),
            **common,
        ),
    ]
    events += [
        ResponseTextDeltaEvent(
            type="response.output_text.delta",
            sequence_number=next(seq),
            delta=piece,
            logprobs=[],
            **common,
        )
        for piece in _pieces(answer)
    ]
    events += [
        ResponseTextDoneEvent(
            type="response.output_text.done",
            sequence_number=next(seq),
            text=answer,
            logprobs=[],
            **common,
        ),
        ResponseContentPartDoneEvent(
            type="response.content_part.done", sequence_number=next(seq), part=part, **common
        ),
        ResponseOutputItemDoneEvent(
            type="response.output_item.done",
            output_index=0,
            sequence_number=next(seq),
            item=message,
        ),
        ResponseCompletedEvent(
            type="response.completed", sequence_number=next(seq), response=final
        ),
    ]
    for e in events:
        yield _frame(e.model_dump(mode="json", exclude_none=True), e.type)


# --- Anthropic Messages -----------------------------------------------------------------


def _message(answer: str, model: str) -> Message:
    return Message(
        id="msg_up1",
        type="message",
        role="assistant",
        model=model,
        content=[TextBlock(type="text", text=answer)],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=Usage(input_tokens=12, output_tokens=3),
    )


def message_json(answer: str, model: str) -> dict[str, Any]:
    return _message(answer, model).model_dump(mode="json")


def message_sse(answer: str, model: str) -> Iterator[bytes]:
    """``message_start``, ``content_block_start``, ``content_block_delta`` pieces (a
    ``ping`` between), ``content_block_stop``, ``message_delta``, ``message_stop``."""
    final = _message(answer, model)
    start = final.model_copy(update={"content": [], "stop_reason": None})
    events: list[Any] = [
        RawMessageStartEvent(type="message_start", message=start),
        RawContentBlockStartEvent(
            type="content_block_start", index=0, content_block=TextBlock(type="text", text="")
        ),
    ]
    events += [
        RawContentBlockDeltaEvent(
            type="content_block_delta", index=0, delta=TextDelta(type="text_delta", text=piece)
        )
        for piece in _pieces(answer)
    ]
    events += [
        RawContentBlockStopEvent(type="content_block_stop", index=0),
        RawMessageDeltaEvent(
            type="message_delta",
            delta=Delta(stop_reason="end_turn", stop_sequence=None),
            usage=MessageDeltaUsage(output_tokens=3),
        ),
        RawMessageStopEvent(type="message_stop"),
    ]
    for i, e in enumerate(events):
        yield _frame(e.model_dump(mode="json"), e.type)
        if i == 1:
            yield _frame({"type": "ping"}, "ping")


# --- Gemini generateContent (REST: camel case) ------------------------------------------


def _gemini(texts: list[str], model: str, finish: bool) -> dict[str, Any]:
    candidates = [
        gtypes.Candidate(
            content=gtypes.Content(role="model", parts=[gtypes.Part(text=text)]),
            index=i,
            finish_reason=gtypes.FinishReason.STOP if finish else None,
        )
        for i, text in enumerate(texts)
    ]
    response = gtypes.GenerateContentResponse(
        candidates=candidates,
        model_version=model,
        response_id="gem-up1",
        usage_metadata=gtypes.GenerateContentResponseUsageMetadata(
            prompt_token_count=8, candidates_token_count=2, total_token_count=10
        ),
    )
    out: dict[str, Any] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def gemini_json(answer: str, model: str, n: int = 1) -> dict[str, Any]:
    return _gemini([answer] * n, model, True)


def gemini_sse(answer: str, model: str) -> Iterator[bytes]:
    """``?alt=sse``: one ``data:`` event per response chunk, the last with its
    ``finishReason`` (CRLF line ends, as the Gemini API writes them)."""
    pieces = _pieces(answer)
    for i, piece in enumerate(pieces):
        yield _frame(_gemini([piece], model, i == len(pieces) - 1), end="\r\n\r\n")


# --- OpenAI Completions (legacy) --------------------------------------------------------


def completion_json(answer: str, model: str, n: int = 1) -> dict[str, Any]:
    completion = Completion(
        id="cmpl-up1",
        object="text_completion",
        created=CREATED,
        model=model,
        choices=[
            CompletionChoice(index=i, text=answer, finish_reason="stop", logprobs=None)
            for i in range(n)
        ],
    )
    return completion.model_dump(mode="json", exclude_none=True)


def completion_sse(answer: str, model: str) -> Iterator[bytes]:
    pieces = _pieces(answer)
    for i, piece in enumerate(pieces):
        chunk = completion_json(piece, model)
        if i < len(pieces) - 1:
            chunk["choices"][0]["finish_reason"] = None  # as the API streams it
        yield _frame(chunk)
    yield b"data: [DONE]\n\n"


# --- an agent service's own endpoint (generic) ------------------------------------------


def agent_json(answer: str, path: str) -> dict[str, Any]:
    return {"id": "run-1", "path": path, "result": {"answer": answer, "confidence": "high"}}


def agent_sse(answer: str, path: str) -> Iterator[bytes]:
    """An agent service's stream: the answer's pieces as deltas, then a final event that
    carries the whole answer (what a generic ``answer_path`` like ``result.answer`` reads)."""
    for piece in _pieces(answer):
        yield _frame({"type": "delta", "delta": piece})
    yield _frame({"type": "done", **agent_json(answer, path)})
