"""``traffic``: where live requests come in (a mirror's copies or an inline proxy) and,
for the proxy, where each one goes: ``traffic.routes`` (first match wins), else
``traffic.upstream_url``."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from monitor.config.endpoint import _http_url
from monitor.core.apis.registry import API_NAMES, GENERIC

__all__ = ["DEFAULT_ROUTE", "OtlpSettings", "RouteMatch", "RouteSettings", "TrafficSettings"]

DEFAULT_ROUTE = "default"
"""The ``route`` label of ``traffic.upstream_url``, the route of every request no entry of
``traffic.routes`` matches."""
_ROUTE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
ROUTED_APIS = tuple(name for name in API_NAMES if name != GENERIC)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _origin(v: str | None) -> str | None:
    """An upstream's origin (scheme, host, port) and nothing else."""
    v = _http_url(v)
    parts = urlsplit(v) if v is not None else None
    if parts is not None and (parts.path.rstrip("/") or parts.query or parts.fragment):
        # A path would be joined in front of every request's own path: a client that
        # calls relmon at .../v1/chat/completions would reach /v1/v1/... upstream.
        extra = v[len(f"{parts.scheme}://{parts.netloc}") :]  # type: ignore[index]
        raise ValueError(
            f"give the upstream's origin only (scheme, host, port), without {extra!r}: "
            "the proxy forwards each request's own path and query unchanged, so a "
            "client calling relmon at .../v1/chat/completions reaches the upstream at "
            ".../v1/chat/completions"
        )
    return v


class RouteMatch(_Strict):
    """Which requests a route takes: those of one wire API (by path, as relmon reads
    them: ``anthropic.messages`` is ``…/v1/messages``), or those under a path prefix."""

    api: str | None = None
    path_prefix: str | None = None

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str | None) -> str | None:
        if v is not None and v not in ROUTED_APIS:
            raise ValueError(
                f"unknown api {v!r}; a route matches one of {', '.join(ROUTED_APIS)} "
                "(a generic task's requests: match.path_prefix)"
            )
        return v

    @field_validator("path_prefix")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must start with '/' (a request path), not {v!r}")
        return v

    @model_validator(mode="after")
    def _one(self) -> RouteMatch:
        if (self.api is None) == (self.path_prefix is None):
            raise ValueError("give exactly one of match.api and match.path_prefix")
        return self

    def describe(self) -> str:
        return f"api {self.api}" if self.api is not None else f"path_prefix {self.path_prefix}"


class RouteSettings(_Strict):
    """One upstream of the proxy. Each route has its own pool of connections; what it
    does not set is ``traffic``'s (timeouts, pool size)."""

    name: str | None = None  # the metrics' `route` label; its index when not given
    match: RouteMatch
    upstream_url: str
    upstream_connect_timeout_s: float | None = Field(None, gt=0)
    upstream_read_timeout_s: float | None = Field(None, gt=0)
    upstream_pool_size: int | None = Field(None, ge=1)

    @field_validator("upstream_url")
    @classmethod
    def _origin_only(cls, v: str) -> str:
        origin = _origin(v)
        assert origin is not None
        return origin

    @field_validator("name")
    @classmethod
    def _label(cls, v: str | None) -> str | None:
        if v is not None and (not _ROUTE_NAME.fullmatch(v) or v == DEFAULT_ROUTE):
            raise ValueError(
                f"{v!r}: a route's name is a metric label: 1-32 of a-z, 0-9, '_', '.', '-', "
                f"starting with a letter or digit, and not {DEFAULT_ROUTE!r} (the name of "
                "traffic.upstream_url's route)"
            )
        return v


class OtlpSettings(_Strict):
    """``traffic.otlp``: an OTLP/HTTP receiver of traces and logs (docs/opentelemetry.md,
    "Traces as a source"), beside the mirror or the proxy, or alone (``mode: off``)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(4318, ge=0, le=65535)
    # A request body past this (as sent, and once gunzipped) is refused with 413.
    max_body_bytes: int = Field(8_388_608, ge=1024)
    # Every request also goes on, unchanged, to this collector (its answer is the client's).
    forward_to: str | None = None
    forward_timeout_s: float = Field(10.0, gt=0)
    join_s: float = Field(5.0, ge=0, le=300)  # how long a span waits for its log records
    max_waiting_spans: int = Field(10_000, ge=1)  # spans waiting for records; more: released
    # Spans held in all (waiting for records or for relmon's budget); past it: 429.
    queue_size: int = Field(20_000, ge=1)

    @field_validator("forward_to")
    @classmethod
    def _forward_url(cls, v: str | None) -> str | None:
        v = _http_url(v)
        return None if v is None else v.rstrip("/")


class TrafficSettings(_Strict):
    mode: Literal["mirror", "proxy", "off"] = "mirror"
    host: str = "127.0.0.1"
    port: int = Field(9110, ge=0, le=65535)
    # proxy: the upstream of every request no route takes (the `default` route)
    upstream_url: str | None = None
    routes: list[RouteSettings] = []  # proxy: first match wins
    task_header: str = "X-Relmon-Task"
    max_body_bytes: int = Field(1_048_576, ge=1024)
    upstream_connect_timeout_s: float = Field(5.0, gt=0)  # proxy: opening a connection
    # proxy: no byte from the upstream while relmon reads it (not while a slow client holds it)
    upstream_read_timeout_s: float = Field(60.0, gt=0)
    client_send_timeout_s: float = Field(60.0, gt=0)  # a client taking no byte: cut
    upstream_pool_size: int = Field(256, ge=1)  # proxy: connections to each upstream at most
    uvloop: bool = True  # run relmon on uvloop (false: asyncio's own event loop)
    # "process": the mirror's or proxy's listener runs in a process of its own, so
    # relmon's own work never delays a live request (docs/deploy.md); "inline": one process
    data_plane: Literal["inline", "process"] = "inline"
    # The requests that may be sampled (1 in 100 at 1%) are parsed and offered together,
    # at most this long after the first (0: each at once, in the middle of live requests)
    offer_batch_s: float = Field(0.05, ge=0, le=1)
    otlp: OtlpSettings = OtlpSettings()

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @field_validator("upstream_url")
    @classmethod
    def _upstream_scheme(cls, v: str | None) -> str | None:
        return _origin(v)

    @model_validator(mode="after")
    def _proxy_needs_upstream(self) -> TrafficSettings:
        if self.mode == "proxy" and not self.upstream_url and not self.routes:
            raise ValueError("mode 'proxy' needs traffic.upstream_url or traffic.routes")
        if self.routes and self.mode != "proxy":
            raise ValueError("traffic.routes are the proxy's: set traffic.mode: proxy")
        names = [r.name for r in self.routes if r.name is not None]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"traffic.routes: the name(s) {', '.join(twice)} are given twice")
        return self

    def route_labels(self) -> list[str]:
        """Each route's ``route`` label (its name, else its index), in order."""
        return [r.name or str(i) for i, r in enumerate(self.routes)]
