"""From a request the traffic port received to an offered event, the cheap way first.

An event's item id and, usually, its task are known from the request's head alone
(``X-Request-Id``, the task header, the path): :meth:`Intake.take` asks the service's
fast path (``skip(source, task, event id)``, counting the event ``skipped``) before it
parses anything, so an unsampled request's JSON is never parsed. When the head names no
task, the task follows from the body's ``model``; the fast path then skips the request
only when it would be skipped whatever its model (``task=None``). Only a request that
may be sampled is parsed (msgspec) and offered to the sink, which decides again.

Item ids come from ``X-Request-Id`` when present (at most 256 characters), and such an
event is sampled by the hash of (task, id), as everywhere. A request without one (or
with an empty or longer one) can never be seen again: it gets a uniform *draw* instead
(:func:`event_key`), is sampled when the draw is under its task's rate, and only a
sampled one gets an id made up here, 128 random bits in hex (32 characters, as a uuid4's
hex). A draw at or above every task's rate (``max_rate``) is skipped at once, without
resolving the task: most of a busy port's requests cost one random number.
A request that may be sampled is parsed and offered in a batch with the ones after it
(``batch_s``, relmon run's ``traffic.offer_batch_s``), not in the middle of the live
requests: relmon's code run now and then, cold, took about ten times as long as the same
code run for several requests in a row, and each such pause sat in the latency of the
requests in flight.
Reject reasons are short fixed strings or the message of an
:class:`~monitor.core.errors.InputError`; neither ever holds prompt text. Nothing here
raises: whatever fails is counted once, through the exchange's ``count``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from adapters.traffic import messages
from monitor.core.apis.base import WireApi
from monitor.core.apis.registry import GENERIC, api_for_path, carried_headers, get_api
from monitor.core.errors import InputError
from monitor.core.events import (
    TrafficEvent,
    event_from_request,
    is_text,
    parse_event,
    served_answer,
)
from monitor.core.failures import internal_error, raised_at
from monitor.core.sampler import SampleKey
from monitor.engine.logs import ThrottledLog
from monitor.engine.ports import EventSink

__all__ = [
    "MAX_PENDING_BYTES",
    "MAX_PENDING_OFFERS",
    "MAX_REQUEST_ID",
    "NOT_UNICODE",
    "OFFERS_PER_TURN",
    "HeaderView",
    "Intake",
    "RejectCallback",
    "RelayCallback",
    "SeenCallback",
    "SkipCallback",
    "TaskResolver",
    "api_of_target",
    "event_key",
    "request_id",
]

TaskResolver = Callable[[Mapping[str, str], str, Mapping[str, Any]], str | None]
"""``(headers, path, request body) -> task`` (``None``: let the service decide)."""

RejectCallback = Callable[[str, str], None]
"""``reject(source, reason)`` for malformed traffic (counted in metrics)."""

SkipCallback = Callable[[str, str | None, SampleKey], bool]
"""``skip(source, task or None, key) -> True`` (counted ``skipped``) when the event would
not be sampled; ``key``: the event's id, or its draw (:func:`event_key`); ``task=None``:
whatever the model its body names."""

RelayCallback = Callable[
    [
        str,
        "HeaderView",
        str,
        bytes,
        "tuple[bytes, HeaderView] | None",
        "str | None",
        "float | None",
    ],
    None,
]
"""``relay(source, headers, path, body, answer, event id, draw)``: an event request
handed on unparsed, to be offered by another process (the traffic data plane's own
process sends it to the main one, where :meth:`Intake.offer` runs); it must not raise."""

SeenCallback = Callable[[str, str], None]
"""``seen(source, api)``: a request the port received, by the wire API its method and path
name (``unmonitored``: none relmon reads); counted, never raises."""

UNMONITORED: Final = "unmonitored"
# The standard APIs by the end of their path (monitor.core.apis: each API's ``recognises``,
# which tests/traffic checks this against): tried in this order, chat before completions.
_SUFFIXES: Final[list[tuple[bytes, str]]] = [
    (b"/chat/completions", "openai.chat"),
    (b"/responses", "openai.responses"),
    (b"/v1/messages", "anthropic.messages"),
    (b":generateContent", "gemini.generate_content"),
    (b":streamGenerateContent", "gemini.generate_content"),
    (b"/completions", "openai.completions"),
]


_GEMINI: Final = "gemini.generate_content"
_GEMINI_API: Final = get_api(_GEMINI)


def api_of_target(target: bytes) -> str | None:
    """The standard wire API of a ``POST`` to a raw request target (path and query), by
    the end of its path; None for any other path."""
    end = target.find(b"?")
    path = target if end < 0 else target[:end]
    if path.endswith(b"/"):
        path = path.rstrip(b"/")
    for suffix, name in _SUFFIXES:
        if path.endswith(suffix):
            if name == _GEMINI and not _GEMINI_API.recognises(path.decode("latin-1")):
                return None  # ``…:generateContent`` but not under ``models/NAME``
            return name
    return None


MAX_REQUEST_ID: Final = 256
MAX_PENDING_OFFERS = 1024
MAX_PENDING_BYTES = 16 * 1_048_576
"""Offers waiting for their batch (:attr:`Intake.batch_s`) past either bound are handled
at once."""
OFFERS_PER_TURN = 4
"""Offers of a batch handled in one turn of the event loop: the first runs cold, the
next ones warm, and live requests go between two turns."""
_log = ThrottledLog(name=__name__)
"""A bug a client's request ran into is logged, at most once per cause per interval."""
NOT_UNICODE: Final = "request body is not valid Unicode (UTF-8)"
_decode = msgspec.json.Decoder().decode
_EMPTY: Mapping[str, Any] = {}
# A request without X-Request-Id: its draw, and, when sampled, a random item id of 128
# bits, from a generator seeded by the OS at start (unique ids, not secrets; no system
# call per request as uuid4 makes).
_random: Final = random.Random()
_random_bits: Final = _random.getrandbits
_draw: Final = _random.random  # Final: compiled, a C global, not a dict lookup per request


_WANTED: dict[str, bytes] = {}


def _wanted(key: str) -> bytes:
    """A header name as the raw bytes it is compared with (the few names asked, up to 64
    remembered: a dict lookup, where an lru_cache call cost a proxied request more)."""
    want = _WANTED.get(key)
    if want is None:
        want = key.lower().encode("latin-1", "replace")
        if len(_WANTED) < 64:
            _WANTED[key] = want
    return want


def served_text(api: WireApi, response: Any) -> str | None:
    """The answer in a logged ``response`` (JSON or SSE text), when it is valid text."""
    text = served_answer(api, response)
    return text if text is None or is_text(text) else None


class HeaderView(Mapping[str, str]):
    """Raw ``(name, value)`` header bytes read as a case-insensitive mapping (first value
    wins), decoded as aiohttp does (UTF-8, undecodable bytes as lone surrogates). Built
    per request at no cost: a lookup scans the few headers a request has."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:
        """The ``(name, value)`` header bytes, as received."""
        return self._raw

    def __getitem__(self, key: str) -> str:
        want = _wanted(key)
        size = len(want)
        for name, value in self._raw:
            if len(name) == size and name.lower() == want:
                return value.decode("utf-8", "surrogateescape")
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]``, else ``default`` (no exception raised and caught when absent)."""
        want = _wanted(key)
        size = len(want)
        for name, value in self._raw:
            if len(name) == size and name.lower() == want:
                return value.decode("utf-8", "surrogateescape")
        return default

    def __iter__(self) -> Iterator[str]:
        return (n.decode("latin-1") for n, _ in self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def request_id(raw: bytes | None) -> str | None:
    """The event id: ``X-Request-Id`` stripped (random when absent, empty or too long);
    None when it is not UTF-8 (the event is then rejected when parsed)."""
    if raw is not None:
        rid = raw.strip().decode("utf-8", "surrogateescape")
        if not is_text(rid):
            return None
        if 0 < len(rid) <= MAX_REQUEST_ID:
            return rid
    return _random_bits(128).to_bytes(16, "little").hex()  # what randbytes(16) does


def event_key(raw: bytes | None) -> tuple[str | None, float | None]:
    """A request's event id and sampling draw, from its ``X-Request-Id`` (stripped):
    ``(id, None)`` with a usable one, sampled by hash; ``(None, draw)`` without one (or
    an empty or longer one), its id made up only if it is sampled
    (:meth:`Intake.offer`); ``(None, None)`` when it is not UTF-8 (rejected when
    parsed)."""
    if raw is not None:
        if raw.isascii():  # the usual id: valid text without checking
            rid = raw.strip().decode("ascii")
        else:
            rid = raw.strip().decode("utf-8", "surrogateescape")
            if not is_text(rid):
                return None, None
        if 0 < len(rid) <= MAX_REQUEST_ID:
            return rid, None
    return None, _draw()


_Pending = tuple[
    Callable[[str], None],
    HeaderView,
    str,
    bytes,
    tuple[bytes, HeaderView] | None,
    str | None,
    float | None,
]
"""An offer waiting for its batch: :meth:`Intake.offer`'s arguments."""


def _held(pending: _Pending) -> int:
    """The bytes a waiting offer holds: its body and its answer's."""
    answer = pending[4]
    return len(pending[3]) + (0 if answer is None else len(answer[0]))


class Intake:
    """Decides, parses and offers the events of one traffic source (``mirror``/``proxy``)."""

    def __init__(
        self,
        source: str,
        *,
        sink: EventSink,
        reject: RejectCallback,
        task_resolver: TaskResolver,
        skip: SkipCallback | None,
        relay: RelayCallback | None = None,
        max_rate: float = 1.0,
        batch_s: float = 0.0,
        seen: SeenCallback | None = None,
        generic: Sequence[tuple[str, WireApi]] = (),
    ) -> None:
        self.source = source
        self.seen = seen
        """Counts every request by API (:meth:`classify`)."""
        self.generic = [(prefix.encode("utf-8", "surrogateescape"), api) for prefix, api in generic]
        """The ``generic`` tasks' path prefixes, with their API: tried before the others."""
        self.sink = sink
        self.reject = reject
        self.task_resolver = task_resolver
        self.skip = skip
        self.relay = relay
        self.max_rate = max_rate
        """The highest sampling rate of any task (:func:`event_key`'s draws)."""
        self.batch_s = batch_s
        """How long an offer may wait to be handled with the next ones (0: at once)."""
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._flush: asyncio.Handle | None = None

    def classify(self, method: bytes, target: bytes) -> bool:
        """Whether a request is an event relmon reads (a ``POST`` of a wire API, by its
        path), counted by API (``seen``) either way."""
        name: str | None = None
        if method == b"POST":
            for prefix, _ in self.generic:
                if target.startswith(prefix):
                    name = GENERIC
                    break
            else:
                name = api_of_target(target)
        seen = self.seen
        if seen is not None:
            seen(self.source, UNMONITORED if name is None else name)
        return name is not None

    def api_of(self, path: str) -> WireApi | None:
        """The API of an event request's path (no query string)."""
        for prefix, api in self.generic:
            if path.encode("utf-8", "surrogateescape").startswith(prefix):
                return api
        return api_for_path(path)

    def skipped_at_once(self, draw: float) -> bool:
        """The fast path for a request without an id of its own: True (counted by the
        skip) when its draw is at or above every task's rate, whatever its task."""
        return (
            draw >= self.max_rate and self.skip is not None and self.skip(self.source, None, draw)
        )

    def skipped(
        self, headers: HeaderView, path: str, rid: str | None, draw: float | None = None
    ) -> bool:
        """The fast path: True when the service skipped the event (already counted).
        ``rid``, ``draw``: :func:`event_key`'s."""
        key: SampleKey | None = draw if draw is not None else rid
        if self.skip is None or key is None:  # None: not UTF-8, parsed and rejected
            return False
        return self.skip(self.source, self.task_resolver(headers, path, _EMPTY), key)

    def offer(
        self,
        count: Callable[[str], None],
        headers: HeaderView,
        path: str,
        raw: bytes,
        *,
        answer: tuple[bytes, HeaderView] | None,
        rid: str | None,
        draw: float | None = None,
    ) -> None:
        """Parse, build the event (with the answer's text from the upstream's ``answer``
        body and headers) and offer it; never raises: whatever fails is ``count``-ed.
        ``rid``, ``draw``: :func:`event_key`'s (an event with a draw gets its id here).
        With a ``relay``, the request is handed to it as it is instead.

        With ``batch_s``, the request waits for the ones sampled within ``batch_s`` after
        it (or for :meth:`flush`) and they are handled together, in order, a few
        (:data:`OFFERS_PER_TURN`) per turn of the event loop: code run now and then for
        one request ran about ten times slower, in the middle of the live requests, than
        the same code run for several in a row."""
        pending: _Pending = (count, headers, path, raw, answer, rid, draw)
        if self.batch_s <= 0:
            self._offer_now(pending)
            return
        self._pending.append(pending)
        self._pending_bytes += _held(pending)
        if len(self._pending) >= MAX_PENDING_OFFERS or self._pending_bytes >= MAX_PENDING_BYTES:
            self.flush()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.batch_s, self._turn)

    def flush(self) -> None:
        """Handle every waiting offer now, in the order they came (never raises)."""
        self._handle(len(self._pending))

    def _turn(self) -> None:
        """The batch's time is up: a few offers now, the rest in the next turns."""
        self._flush = None  # this turn's own handle, running: nothing to cancel
        self._handle(OFFERS_PER_TURN)
        if self._pending:
            self._flush = asyncio.get_running_loop().call_soon(self._turn)

    def _handle(self, n: int) -> None:
        handle, self._flush = self._flush, None
        if handle is not None:
            handle.cancel()
        taken, self._pending = self._pending[:n], self._pending[n:]
        for pending in taken:
            self._pending_bytes -= _held(pending)
            self._offer_now(pending)

    def _offer_now(self, pending: _Pending) -> None:
        count, headers, path, raw, answer, rid, draw = pending
        if draw is not None and rid is None:
            rid = request_id(None)
        if self.relay is not None:
            self.relay(self.source, headers, path, raw, answer, rid, draw)
            return
        try:
            api = self.api_of(path)
            if api is None:  # not reached: classify offers only these
                raise InputError("a path of no API relmon reads")
            text = None if answer is None else messages.answer_text(answer[0], answer[1], api)
            event = self.event(headers, path, raw, text, rid, draw, api)
            admission = self.sink(event, self.source)  # it counts its decision: nothing twice
            if admission.decision == "rejected":  # not counted: an API its task cannot speak
                count(admission.reason or "rejected")
        except InputError as exc:
            count(str(exc))
        except Exception as exc:  # a bug, here or in the sink
            reason = internal_error(exc)
            at = raised_at(exc)
            _log.error(
                "traffic_event_failed", key=(reason, at), source=self.source, error=reason, at=at
            )
            count(reason)

    def event(  # noqa: PLR0917  (the relayed request's fields)
        self,
        headers: HeaderView,
        path: str,
        raw: bytes,
        text: str | None,
        rid: str | None,
        draw: float | None = None,
        api: WireApi | None = None,
    ) -> TrafficEvent:
        """The event of a request (``api``: its API, by default the one of its path)."""
        wire = api if api is not None else self.api_of(path)
        if wire is None:
            raise InputError("a path of no API relmon reads")
        plain = messages.decoded(raw, headers.get("Content-Encoding", ""))
        if plain is None:
            raise InputError("request body in a content-encoding relmon cannot read")
        try:
            body = _decode(plain)
        except UnicodeDecodeError:  # msgspec's, for a string that is not UTF-8
            raise InputError(NOT_UNICODE) from None
        except (msgspec.DecodeError, RecursionError):  # also too deep, or 5,000 digits
            raise InputError("invalid JSON") from None
        if not isinstance(body, dict):
            raise InputError("request body is not a JSON object")
        logged = body.pop("response", None) if self.source == "mirror" else None
        if rid is None:
            raise InputError("X-Request-Id is not valid UTF-8")
        task = self.task_resolver(headers, path, body)
        carried = carried_headers(wire.name, headers.get)
        if logged is None:
            return event_from_request(
                rid,
                body,
                task=task,
                response_text=text,
                draw=draw,
                api=wire.name,
                path=path,
                headers=carried,
            )
        document = {"id": rid, "task": task, "request": body, "api": wire.name, "path": path}
        if isinstance(body.get("model"), str):
            document["model"] = body["model"]
        event = parse_event(document | {"response": logged})
        if wire.name == GENERIC:  # read by the task's answer_path, which parse_event lacks
            event = dataclasses.replace(event, response_text=served_text(wire, logged))
        return dataclasses.replace(event, draw=draw, headers=carried)
