"""The proxy's routes: which upstream each request goes to (``traffic.routes``, first match
wins; ``traffic.upstream_url`` takes the rest). A route matches a wire API (by the end of
the request's path, as :func:`~.intake.api_of_target` reads it) or a path prefix (the
request target's first bytes). With no route configured, :meth:`Routes.pick` returns the
default at once: the hot path of a one-upstream proxy does no more than before."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.traffic.exchange import Forwarding
from adapters.traffic.intake import api_of_target

__all__ = ["RouteEntry", "RouteSpec", "Routes", "match_route", "route_entry"]


@dataclass(frozen=True)
class RouteSpec:
    """One route as configured: its ``route`` label, what it matches (``api`` or
    ``path_prefix``), its upstream's origin, and the upstream settings it overrides."""

    label: str
    upstream_url: str
    api: str | None = None
    path_prefix: str | None = None
    connect_timeout_s: float | None = None
    read_timeout_s: float | None = None
    pool_size: int | None = None


RouteEntry = tuple[str, bytes]
"""What a route matches: ``(api, b"")`` or ``("", path prefix)``."""


def route_entry(spec: RouteSpec) -> RouteEntry:
    return (spec.api or "", (spec.path_prefix or "").encode())


def match_route(entries: list[RouteEntry], target: bytes) -> int:
    """The index of the first route matching the raw request ``target``; -1: none."""
    api: str | None = None
    api_read = False
    for i, (name, prefix) in enumerate(entries):
        if prefix:
            if target.startswith(prefix):
                return i
        else:
            if not api_read:
                api, api_read = api_of_target(target), True
            if api == name:
                return i
    return -1


class Routes:
    """The routes in order, each with its :class:`Forwarding` (its pool, ``Host``,
    timeouts and metrics), and the default (None: a request no route takes is refused)."""

    __slots__ = ("default", "entries", "forwarding", "max_body")

    def __init__(
        self,
        routes: list[tuple[RouteSpec, Forwarding]],
        default: Forwarding | None,
        max_body: int,
    ) -> None:
        self.entries = [route_entry(spec) for spec, _ in routes]
        self.forwarding = [fwd for _, fwd in routes]
        self.default = default
        self.max_body = max_body

    def pick(self, target: bytes) -> Forwarding | None:
        """The forwarding of the first route matching the raw request ``target``."""
        if not self.entries:
            return self.default
        i = match_route(self.entries, target)
        return self.default if i < 0 else self.forwarding[i]
