"""The OTLP/HTTP receiver: ``POST /v1/traces`` and ``POST /v1/logs``, answered as the
OTLP/HTTP specification says (docs/opentelemetry.md, "Traces as a source").

A body is protobuf (``application/x-protobuf``) or the OTLP JSON mapping
(``application/json``), matched on the media type, optionally gzipped
(``Content-Encoding: gzip``). Answers: 200 with the ``Export…ServiceResponse`` in the
request's encoding (its ``partial_success`` counting what was rejected, and why); 400 for
a body that does not decode; 413 past ``max_body_bytes``, as sent or gunzipped; 415 for
another content type or encoding; 429 with ``Retry-After`` when relmon holds as many spans
as it may (:class:`~adapters.otlp.intake.OtlpIntake`), 503 while it stops; each refusal
counted by its status. A gzipped body is inflated up to ``max_body_bytes`` and no further
(a gzip bomb costs that much), and a body is decoded and read in a thread, so a request of
thousands of spans never holds the event loop the other sources answer on.

With ``forward_to``, every request (413 as sent aside: relmon never holds more) also goes
on unchanged, its body, content type and encoding as they came, to the same path there,
sent while relmon reads its own copy (never after); the client gets that collector's
answer, whatever relmon's own reading of it (which is never dropped silently: past its
room, the request's inference spans are counted ``dropped``). No request body is ever logged.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final

import aiohttp
from aiohttp import web

from adapters.otlp.intake import SOURCE, OtlpIntake, Reading, read_alone
from adapters.otlp.wire import JSON, PROTOBUF, decode, export_response, status_body
from monitor.core.failures import internal_error
from monitor.core.traces.otlp_json import OtlpDecodeError
from monitor.core.traces.spans import LogRecord, Span
from monitor.engine.logs import ThrottledLog

__all__ = ["OtlpReceiver"]

_log = ThrottledLog()
"""Lines a client or the downstream can cause, at most one per cause per interval."""

RETRY_AFTER_S: Final = 2
_HOP_BY_HOP: Final = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host")
)
_INVALID_ARGUMENT, _RESOURCE_EXHAUSTED, _UNAVAILABLE = 3, 8, 14  # google.rpc.Code


class _RefusedError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class OtlpReceiver:
    """The HTTP server (see the module): :meth:`start`, :meth:`stop`, :attr:`bound_port`;
    a supervised source (:class:`~monitor.engine.ports.Source`) whose :meth:`run` is its
    intake's, which releases the spans whose wait is over."""

    source_name = SOURCE
    topic: str | None = None

    def __init__(
        self,
        intake: OtlpIntake,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        max_body_bytes: int = 8_388_608,
        forward_to: str | None = None,
        forward_timeout_s: float = 10.0,
    ) -> None:
        self.intake = intake
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.forward_to = forward_to
        self.forward_timeout_s = forward_timeout_s
        self.stopping = False
        self.bound_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.add_routes([web.post("/v1/traces", self._traces), web.post("/v1/logs", self._logs)])
        if self.forward_to is not None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=self.forward_timeout_s),
            )
        # The body as sent: its gunzipped size is checked here, against max_body_bytes.
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.bound_port = sockets[0].getsockname()[1] if sockets else self.port

    @property
    def connected(self) -> bool:
        return self._runner is not None

    @property
    def stopped(self) -> bool:
        return self.intake.stopped

    @property
    def paused(self) -> bool:
        return self.intake.paused

    async def run(self) -> None:
        await self.intake.run()

    async def restart(self) -> None:
        await self.intake.restart()

    async def stop(self, timeout_s: float = 0.0) -> None:
        """No request taken any more, then every span held read and offered."""
        self.stopping = True
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.intake.stop(timeout_s)

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        return await self._export(request, "traces")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        return await self._export(request, "logs")

    async def _export(self, request: web.Request, kind: str) -> web.StreamResponse:
        media = request.content_type  # the media type, without its parameters
        answer_type = JSON if media == JSON else PROTOBUF
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            return self._refuse(413, f"body over {self.max_body_bytes} bytes", answer_type)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, f"body over {self.max_body_bytes} bytes", answer_type)
        # Sent on as it arrived, while relmon reads its own copy: never waiting on it.
        forward = None
        if self.forward_to is not None:
            forward = asyncio.ensure_future(self._forward(request, raw))
        try:
            answer = await self._read(kind, media, request.headers.get("Content-Encoding"), raw)
        except _RefusedError as refused:
            answer = self._refuse(refused.status, str(refused), answer_type)
            if forward is None or refused.status != 429:
                _log.warning(  # a client can send any number: rate-limited
                    "otlp_request_refused",
                    key=(kind, refused.status),
                    kind=kind,
                    status=refused.status,
                    reason=str(refused),
                )
        except Exception as exc:
            if forward is None:
                raise
            _log.error("otlp_read_failed", key=type(exc).__name__, error=internal_error(exc))
        if forward is not None:
            return await forward
        return answer

    async def _read(self, kind: str, media: str, encoding: str | None, raw: bytes) -> web.Response:
        """relmon's own reading of a request (its answer, or :class:`_RefusedError`)."""
        if media not in (PROTOBUF, JSON):
            raise _RefusedError(415, f"content type must be {PROTOBUF} or {JSON}")
        # Gunzipped, decoded and read in a thread: 10,000 spans take most of a second of
        # CPU, which the event loop (and the proxy or mirror on it) must not wait for.
        if kind == "traces":
            spans = await asyncio.to_thread(self._spans, media, encoding, raw)
            if self.stopping or not self.intake.connected:
                self._full(spans)
                raise _RefusedError(503, "relmon is stopping")
            if not self.intake.has_room(spans):
                self._full(spans)
                raise _RefusedError(429, "relmon holds as many spans as it may: retry later")
            rejected, why = self.intake.take_spans(spans)
        else:
            records = await asyncio.to_thread(self._records, media, encoding, raw)
            rejected, why = self.intake.take_records(records)
        return web.Response(body=export_response(kind, media, rejected, why), content_type=media)

    def _items(
        self, kind: str, media: str, encoding: str | None, raw: bytes
    ) -> list[Span] | list[LogRecord]:
        body = self._decoded(raw, (encoding or "identity").strip().lower())
        try:
            return decode(kind, media, body)
        except OtlpDecodeError as exc:
            raise _RefusedError(400, str(exc)) from None

    def _spans(self, media: str, encoding: str | None, raw: bytes) -> list[Reading]:
        """The request's spans, each read alone (no state touched: run in a thread)."""
        items = self._items("traces", media, encoding, raw)
        return read_alone([s for s in items if isinstance(s, Span)])

    def _records(self, media: str, encoding: str | None, raw: bytes) -> list[LogRecord]:
        items = self._items("logs", media, encoding, raw)
        return [r for r in items if isinstance(r, LogRecord)]

    def _full(self, spans: list[Reading]) -> None:
        """No room: a forwarded request's spans are counted dropped (its client will not
        send it again); another client retries after ``Retry-After``."""
        if self.forward_to is not None:
            self.intake.drop_spans(spans)

    def _decoded(self, raw: bytes, encoding: str) -> bytes:
        if encoding == "identity":
            body = raw
        elif encoding == "gzip":
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                body = inflate.decompress(raw, self.max_body_bytes + 1)
            except zlib.error:
                raise _RefusedError(400, "body is not gzip") from None
            if len(body) > self.max_body_bytes:
                raise _RefusedError(413, f"body over {self.max_body_bytes} bytes once gunzipped")
            if not inflate.eof:
                raise _RefusedError(400, "gzip body is cut short")
        else:
            raise _RefusedError(415, "Content-Encoding must be gzip or none")
        if len(body) > self.max_body_bytes:
            raise _RefusedError(413, f"body over {self.max_body_bytes} bytes")
        return body

    def _refuse(self, status: int, message: str, media: str) -> web.Response:
        """The answer to a request refused whole, counted by its status."""
        self.intake.refused(status)
        code = {429: _RESOURCE_EXHAUSTED, 413: _RESOURCE_EXHAUSTED, 503: _UNAVAILABLE}
        headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
        body = status_body(code.get(status, _INVALID_ARGUMENT), message, media)
        return web.Response(status=status, body=body, content_type=media, headers=headers)

    async def _forward(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """The request sent on unchanged; the downstream's answer (502 or 504 when it
        cannot be reached: the client's exporter retries)."""
        assert self._session is not None and self.forward_to is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers.pop("Content-Length", None)
        url = self.forward_to + request.path
        try:
            async with self._session.post(url, data=raw, headers=headers) as downstream:
                body = await downstream.read()
                kept = ("Content-Type", "Content-Encoding", "Retry-After")
                out = {k: downstream.headers[k] for k in kept if k in downstream.headers}
                return web.Response(status=downstream.status, body=body, headers=out)
        except TimeoutError:
            return web.Response(status=504, text="forward_to did not answer in time")
        except aiohttp.ClientError as exc:
            _log.warning("otlp_forward_failed", key=type(exc).__name__, error=type(exc).__name__)
            return web.Response(status=502, text="forward_to cannot be reached")
