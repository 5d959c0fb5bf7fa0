"""The Kafka source's fast path: an event's id, task and model, read without building it.

At a low sampling rate almost every traffic event is skipped, so the source asks the
service whether an event is sampled (``skip_unsampled(source, task, model, id)``) before
it parses the whole event. :func:`event_head` gives the three fields, decoded in C by
msgspec into typed structs that mirror :func:`monitor.core.events.parse_event`'s rules
(the request's messages and content parts, the response's first choice, the
timestamp), so that it answers only for a value ``parse_event`` accepts, with the same
``id``, ``task`` and ``model``. Whatever it cannot vouch for gives ``None`` and goes the
full way (``parse_event``, which decides and names the reason): a value over the size
limit, not UTF-8, not JSON, JSON that ``json.loads`` reads differently (a ``NaN``, a
lone surrogate, a byte-order mark), any field of the wrong shape. A malformed event is
therefore rejected and dead-lettered whether or not it would have been sampled: the
fast path never changes a decision, it only skips the work for events that are fine.

The two guards that the typed decoder does not give by itself:

- msgspec does not check the UTF-8 of strings it skips (fields relmon ignores), which
  ``json.loads`` does: a value that is not ASCII is decoded once to check it;
- msgspec reads integers of any length in skipped fields, ``json.loads`` refuses more
  than 4,300 digits: a value longer than that is searched for such a run of digits.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

import msgspec

from monitor.core.events import MAX_EVENT_BYTES, MAX_EVENT_ID_CHARS

__all__ = ["EventHead", "event_head"]

EventHead = tuple[str, str | None, str]
"""``(id, task, model)`` of an event that ``parse_event`` accepts."""

_MAX_INT_DIGITS = 4300
"""``sys.int_info.default_max_str_digits``: json.loads refuses longer integers."""
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (_MAX_INT_DIGITS + 1))


class _Part(msgspec.Struct, gc=False):
    text: str | msgspec.UnsetType = msgspec.UNSET


class _Message(msgspec.Struct, gc=False):
    role: str
    content: str | list[_Part] | None


class _Request(msgspec.Struct, gc=False):
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1)]
    model: Any = msgspec.UNSET


class _ChoiceMessage(msgspec.Struct, gc=False):
    content: str | None


class _Choice(msgspec.Struct, gc=False):
    message: _ChoiceMessage


class _Response(msgspec.Struct, gc=False):
    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]


class _Event(msgspec.Struct, gc=False):
    id: str | int
    request: _Request
    model: str | msgspec.UnsetType = msgspec.UNSET
    task: str | None = None
    ts: str | None = None
    response: _Response | None = None
    api: str = "openai.chat"  # another API's event goes the full way


_decode = msgspec.json.Decoder(_Event).decode


def event_head(value: bytes | None, max_bytes: int = MAX_EVENT_BYTES) -> EventHead | None:
    """``(id, task, model)`` of a record value that ``parse_event`` accepts, with the
    values it gives them; ``None`` when this cannot say so at once (see the module)."""
    if value is None or len(value) > max_bytes:
        return None
    if not value.isascii():
        try:
            value.decode()
        except UnicodeDecodeError:
            return None
    if len(value) > _MAX_INT_DIGITS and _LONG_DIGITS.search(value) is not None:
        return None
    try:
        event = _decode(value)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    if event.api != "openai.chat":
        return None
    item_id = event.id
    if isinstance(item_id, int):
        item_id = str(item_id)
    if not item_id or len(item_id) > MAX_EVENT_ID_CHARS:
        return None
    model = event.request.model if event.model is msgspec.UNSET else event.model
    if not isinstance(model, str) or not model:
        return None
    task = event.task
    if task == "":
        return None
    if event.ts is not None:
        try:
            datetime.fromisoformat(event.ts.replace("Z", "+00:00"))
        except ValueError:
            return None
    return item_id, task, model
