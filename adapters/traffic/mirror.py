"""The mirror's request handler on the traffic port's own HTTP server (:mod:`.wire`).

A ``POST`` of a wire API relmon reads (``…/chat/completions``, ``…/responses``,
``…/v1/messages``, ``…:generateContent``, ``…/completions``, under any path prefix, or a
``generic`` task's path prefix) is answered ``202 {"status":
"accepted"}`` as soon as the body is read; only then is the event decided and, when it
may be sampled, parsed and offered (:class:`~adapters.traffic.intake.Intake`), so the live
path (nginx ``mirror``, Envoy, Istio) never waits on relmon. A malformed body still gets
its 202 and is counted; a body over ``max_body_bytes`` is refused with 413 and counted
as ``"oversize"`` (the rest of it is read and dropped); any other request gets 404. A
log shipper may add the model's answer as a top-level ``"response"`` object: it becomes
the event's answer. Whatever one request raises is logged and counted once.
"""

from __future__ import annotations

import structlog

from adapters.traffic.exchange import ExchangeGuard
from adapters.traffic.intake import HeaderView, Intake, event_key
from adapters.traffic.proxy import event_guard, expect_answered, target_path
from adapters.traffic.request import Request, read_prefix
from adapters.traffic.wire import ServerConnection, error_response, http_date
from monitor.core.failures import internal_error, raised_at

__all__ = ["Mirror"]

_BODY = b'{"status": "accepted"}'
_log = structlog.get_logger("adapters.traffic.traffic")


def _accepted() -> bytes:
    return (
        b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: %d\r\nDate: %b\r\n\r\n%b" % (len(_BODY), http_date().encode(), _BODY)
    )


class Mirror:
    """The mirror's handler (see the module)."""

    def __init__(self, intake: Intake, max_body: int) -> None:
        self.intake = intake
        self.max_body = max_body

    async def handle(self, req: Request, client: ServerConnection) -> None:
        guard = event_guard(self.intake, req)
        try:
            await self._handle(req, client, guard)
        except Exception as exc:  # a bug; asyncio.CancelledError is not an Exception
            reason = internal_error(exc)
            _log.error("traffic_request_failed", error=reason, at=raised_at(exc))
            guard.count(reason)
            if not guard.started:
                message = f"relmon could not handle this request ({reason})"
                client.write(error_response(500, "Internal Server Error", message))

    async def _handle(self, req: Request, client: ServerConnection, guard: ExchangeGuard) -> None:
        if not expect_answered(req, client):  # 417 first, as on every relmon port
            return
        if not guard.event:
            message = (
                "only POST requests of a wire API relmon reads are mirrored: …/chat/"
                "completions, …/responses, …/v1/messages, …:generateContent, …/completions"
            )
            client.write(error_response(404, "Not Found", message))
            return
        length = req.content_length
        if length is None or length <= self.max_body:
            try:
                body, complete = await read_prefix(req.body, self.max_body)
            except ConnectionError:
                guard.count("truncated body")
                return
        else:
            body, complete = b"", False
        if not complete:
            guard.count("oversize")
            message = f"request body over {self.max_body} bytes"
            client.write(error_response(413, "Request Entity Too Large", message))
            return
        guard.started = True
        client.write(_accepted())  # the mirror has its answer before any parsing
        rid, draw = event_key(req.request_id)
        if draw is not None and self.intake.skipped_at_once(draw):
            return  # most requests, at the cost of one random number
        headers = HeaderView(req.headers)
        path = target_path(req.target)
        if not self.intake.skipped(headers, path, rid, draw):
            self.intake.offer(guard.count, headers, path, body, answer=None, rid=rid, draw=draw)
