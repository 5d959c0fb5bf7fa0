"""The ``Expect`` header on every relmon port, and unmatched paths answered as JSON.

aiohttp's default handler of ``Expect`` answers an unknown value with ``417 Unknown
Expect: <value>``: it echoes a client's header back, and a value that is not UTF-8 makes
it fail with a 500 and a traceback before any middleware runs, on every port, without
authentication. :func:`install` gives every route of an application
:func:`expect_continue` instead (``100 Continue`` for ``100-continue``, a fixed 417
otherwise) and adds a last route for unmatched paths that answers 404, or 405 with
``Allow``, as JSON, so that those too never reach aiohttp's default handler.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.http import HttpVersion11

__all__ = ["expect_continue", "install"]


async def expect_continue(request: web.BaseRequest) -> None:
    """``100 Continue`` for ``Expect: 100-continue`` (HTTP/1.1), 417 for anything else."""
    if request.version != HttpVersion11:
        return
    if request.headers.get("Expect", "").strip().lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # as aiohttp does: the body has not started
        return
    raise web.HTTPExpectationFailed(
        text='{"error": "only Expect: 100-continue is supported"}',
        content_type="application/json",
    )


def install(app: web.Application) -> None:
    """Use :func:`expect_continue` on every route of ``app`` (call after adding them,
    before the app starts) and answer unmatched paths with JSON 404/405."""
    resources = list(app.router.resources())

    async def unmatched(request: web.Request) -> web.StreamResponse:
        allowed: set[str] = set()
        for resource in resources:
            _, methods = await resource.resolve(request)
            allowed |= methods
        if allowed:
            return web.json_response(
                {"error": "method not allowed"},
                status=405,
                headers={"Allow": ",".join(sorted(allowed))},
            )
        return web.json_response({"error": "not found"}, status=404)

    for route in app.router.routes():
        # aiohttp takes the handler only as add_route(expect_handler=...); the routes are
        # added in several places, so it is set here once for all of them.
        route._expect_handler = expect_continue
    app.router.add_route("*", "/{relmon_unmatched:.*}", unmatched, expect_handler=expect_continue)
