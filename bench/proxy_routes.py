"""The proxy's routes in ``proxy_saturation_bench.py --routes 4``: four routes, one per wire
API of the mixed traffic but completions, each to an upstream port of its own, and nginx
with the same four ``location`` blocks to the same ports; what no route takes (the
completions requests) goes to the default upstream in both (relmon's
``traffic.upstream_url``, nginx's ``location /``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROUTES", "Route", "nginx_routes_config", "routes_traffic"]


@dataclass(frozen=True)
class Route:
    """One route: its name (relmon's ``route`` label), its match in relmon's
    configuration (``traffic.routes[].match``) and nginx's ``location`` for the same
    requests."""

    name: str
    match: dict[str, str]
    location: str


ROUTES = (
    Route("chat", {"path_prefix": "/v1/chat"}, "/v1/chat"),
    Route("responses", {"path_prefix": "/v1/responses"}, "/v1/responses"),
    # relmon matches a wire API by the end of the path: nginx's regex on the same end.
    Route("anthropic", {"api": "anthropic.messages"}, "~ /v1/messages$"),
    Route("gemini", {"path_prefix": "/v1beta"}, "/v1beta"),
)


def routes_traffic(ports: dict[str, int]) -> str:
    """relmon's ``traffic.routes`` (YAML flow style, for ``traffic_extra``): each of
    :data:`ROUTES` to ``127.0.0.1:ports[name]``."""
    items = ", ".join(
        f"{{name: {r.name}, match: {json.dumps(r.match)}, "
        f'upstream_url: "http://127.0.0.1:{ports[r.name]}"}}'
        for r in ROUTES
    )
    return f"routes: [{items}]"


def nginx_routes_config(prefix: Path, port: int, ports: dict[str, int], default_port: int) -> Path:
    """nginx as :func:`proxy_latency_bench.nginx_config` writes it (one worker, keep-alive
    to each upstream, no access log), with an ``upstream`` and a ``location`` per route of
    :data:`ROUTES` and ``location /`` to ``default_port``."""
    for d in ("logs", "tmp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    upstreams = {**{r.name: ports[r.name] for r in ROUTES}, "default": default_port}
    blocks = "".join(
        f"    upstream {name} {{ server 127.0.0.1:{p}; keepalive 64; }}\n"
        for name, p in upstreams.items()
    )
    locations = [(r.location, r.name) for r in ROUTES] + [("/", "default")]
    proxied = "".join(
        f"        location {where} {{ proxy_pass http://{name}; proxy_http_version 1.1; "
        'proxy_set_header Connection ""; }\n'
        for where, name in locations
    )
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
{blocks}    server {{
        listen 127.0.0.1:{port};
{proxied}    }}
}}
"""
    )
    return conf
