"""The proxy as users see it, with wrk: relmon's added latency at moderate load, its
requests/s at saturation and the CPU it spends per request, beside nginx ``proxy_pass``.

Processes on 127.0.0.1: the upstream (``--upstream aiohttp``, the default: the small
aiohttp server of ``proxy_latency_bench.py`` answering a fixed chat-completion JSON; or
``--upstream nginx``: nginx, one worker, answering the same JSON with ``return``, the
cheapest upstream there is, where the proxies alone are the bottleneck); ``relmon run``
in proxy mode in front of it (the whole service: one task, 1% of the traffic sampled
and re-asked of the same upstream); nginx ``proxy_pass`` (one
worker, keep-alive connections to the upstream) in front of the same upstream; and
Debian's ``wrk`` (one thread, closed loop, a 1.7 KB chat-completion request body).

* Moderate load: ``--latency-connections`` (8) connections; each repeat runs wrk against
  the upstream directly, relmon and nginx, one after the other in a rotating order, so
  the three targets run within the same seconds. Added latency: a target's p50 (p99)
  minus the direct call's p50 (p99) of the same repeat. Each target runs two windows in
  a row: the first, right after it sat idle while the others ran, is reported apart
  (``after_idle``: relmon's re-ask budget refilled meanwhile, and a lull's first
  sampled requests start a burst of items), the second is the steady one.
* Saturation: ``--connections`` (32) connections against relmon and nginx in
  alternating order: requests/s, and the CPU-seconds (user + system, every thread and
  worker of the proxy process) per 10,000 requests, read from ``/proc``.

``--data-plane uvloop|asyncio`` puts the proxy's data plane alone in relmon's place (its
TrafficServer with ``relmon run``'s fast path, the 1% sampled requests handed to
nothing: no service around it) on that event loop; ``--with-data-plane`` adds it (on
uvloop) as one more target. ``--traffic-extra "data_plane: process"`` runs relmon's
listener in a process of its own (the CPU counted is both processes').
``--with-lean`` adds ``bench/lean_proxy.py`` (the leanest Python proxy: what the
interpreter reaches here) and ``--baseline-tree PATH`` the same relmon (data plane or
whole service) from another checkout, say the code before a change (``git worktree add
PATH COMMIT``), as targets of the same run: before/after ratios from one run.

``--apis chat,responses,anthropic,gemini,completions,mixed`` (with ``--upstream nginx``)
measures each wire API relmon reads in one run: wrk sends that API's request (about the
chat request's size, the API's own headers) to its path, the static nginx upstream
answers the API's documented JSON (a regex ``location`` per API on the end of the path,
which the re-asks reach too), ``mixed`` sends the five in turn from one wrk script.
relmon's task is the catch-all one (1% of every API sampled, each event re-asked in its
own API to the same upstream). Each repeat gives every API a turn, in a rotating order:
its windows as above, relmon's counters read around it. Per API: the four ratios against
nginx and the goals they meet, and relmon's CPU per request, added p50 and requests/s
against its own for chat in the same repeat (paired).

``--routes 4`` (with ``--apis``, say ``mixed``) measures the proxy's routes: relmon with
``traffic.routes`` (``bench/proxy_routes.py``: a route per API, by path prefix or by API,
completions left to ``traffic.upstream_url``) and nginx with the same ``location``
blocks, each route to an upstream port of its own (a server block of the static upstream
each), beside relmon with one upstream (``one_route``) in the same repeats: the ratios
against nginx for both relmons, relmon's with routes against its own with one upstream,
and relmon's answers by route.

Reported: medians over ``--repeats`` repeats and the ratios relmon/nginx. With
``--profile FILE`` py-spy samples relmon during its first saturation run and the
hottest functions (by own time and by inclusive time) go into the JSON document.

    .venv/bin/python bench/proxy_saturation_bench.py [--seconds 3] [--repeats 5] [--json FILE]
        [--upstream nginx --apis chat,responses,anthropic,gemini,completions,mixed]
        [--upstream nginx --apis mixed --routes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from proxy_latency_bench import start_nginx
from proxy_routes import ROUTES, nginx_routes_config, routes_traffic

from adapters.traffic.traffic import TrafficServer
from monitor.config import TaskSettings
from monitor.config.schema import TrafficSettings
from monitor.engine.ports import Admission
from monitor.engine.routing import HeaderTaskResolver, HeadSkip, RoutedTask, TaskRouter

TARGETS = ("direct", "relmon", "nginx")
PROXIES = ("relmon", "nginx")
OTHERS = ("before", "lean", "plane", "one_route")
"""The targets measured beside relmon and nginx when asked (each against nginx too);
``one_route``: with ``--routes``, relmon as without them (one upstream)."""
_SYSTEM = "You are a careful assistant. Answer with one number and nothing else. " * 18
REQUEST = json.dumps(
    {
        "model": "bench-model",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": _SYSTEM.strip()},
            {"role": "user", "content": "What is 6 times 7?"},
        ],
    }
).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer app-key"}
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "bench-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
    }
)
CHAT_PATH = "/v1/chat/completions"


# -- every wire API (--apis) ------------------------------------------------------------


@dataclass(frozen=True)
class WireCase:
    """One wire API as the bench sends it: its production path, a request of about the
    chat request's size (the same system text and question) with that API's headers, the
    JSON answer the static upstream gives (the API's documented shape) and the nginx
    location that answers it: a regex on the end of the path, so that a re-ask reaches
    it too (a catch-all task's ``base_url`` ends in ``/v1``: Anthropic's re-ask goes to
    ``/v1/v1/messages``, Gemini's to ``/v1/v1beta/models/…:generateContent``)."""

    api: str
    path: str
    body: bytes
    headers: dict[str, str]
    answer: str
    location: str


_QUESTION = "What is 6 times 7?"
_JSON = {"Content-Type": "application/json"}
_USAGE = {"input_tokens": 20, "output_tokens": 1}
APIS: dict[str, WireCase] = {
    "chat": WireCase("openai.chat", CHAT_PATH, REQUEST, HEADERS, COMPLETION, "/chat/completions$"),
    "responses": WireCase(
        "openai.responses",
        "/v1/responses",
        json.dumps(
            {
                "model": "bench-model",
                "temperature": 0,
                "instructions": _SYSTEM.strip(),
                "input": [{"role": "user", "content": _QUESTION}],
            }
        ).encode(),
        HEADERS,
        json.dumps(
            {
                "id": "resp_bench",
                "object": "response",
                "created_at": 1700000000,
                "status": "completed",
                "model": "bench-model",
                "output": [
                    {
                        "type": "message",
                        "id": "msg_bench",
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "42", "annotations": []}],
                    }
                ],
                "usage": _USAGE | {"total_tokens": 21},
            }
        ),
        "/responses$",
    ),
    "anthropic": WireCase(
        "anthropic.messages",
        "/v1/messages",
        json.dumps(
            {
                "model": "bench-model",
                "max_tokens": 16,
                "temperature": 0,
                "system": _SYSTEM.strip(),
                "messages": [{"role": "user", "content": _QUESTION}],
            }
        ).encode(),
        _JSON | {"x-api-key": "app-key", "anthropic-version": "2023-06-01"},
        json.dumps(
            {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "bench-model",
                "content": [{"type": "text", "text": "42"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": _USAGE,
            }
        ),
        "/v1/messages$",
    ),
    "gemini": WireCase(
        "gemini.generate_content",
        "/v1beta/models/bench-model:generateContent",
        json.dumps(
            {
                "systemInstruction": {"parts": [{"text": _SYSTEM.strip()}]},
                "contents": [{"role": "user", "parts": [{"text": _QUESTION}]}],
                "generationConfig": {"temperature": 0, "maxOutputTokens": 16},
            }
        ).encode(),
        _JSON | {"x-goog-api-key": "app-key"},
        json.dumps(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": "42"}]},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 20,
                    "candidatesTokenCount": 1,
                    "totalTokenCount": 21,
                },
                "modelVersion": "bench-model",
            }
        ),
        ":generateContent$",
    ),
    "completions": WireCase(
        "openai.completions",
        "/v1/completions",
        json.dumps(
            {
                "model": "bench-model",
                "temperature": 0,
                "max_tokens": 16,
                "prompt": f"{_SYSTEM.strip()}\n\nQuestion: {_QUESTION}\nAnswer:",
            }
        ).encode(),
        HEADERS,
        json.dumps(
            {
                "id": "cmpl-bench",
                "object": "text_completion",
                "created": 1700000000,
                "model": "bench-model",
                "choices": [{"index": 0, "text": "42", "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
            }
        ),
        "/completions$",  # after chat's: nginx tries regex locations in order
    ),
}
MIXED = "mixed"
"""Every API of :data:`APIS` in turn, one request each, from one wrk script."""
CHOICES = (*APIS, MIXED)
VS_CHAT_TOLERANCE = 1.10
"""An API "costs no more than a chat request" when relmon's CPU per request and added
p50 for it are at most this many times chat's (paired within a repeat, the median over
the repeats): a 10% margin for the measurement (nginx's own ratios, beside them, show
how far a proxy whose cost is the same for every API moves)."""


def parse_apis(text: str) -> list[str]:
    """``--apis``: names of :data:`CHOICES`, comma-separated, in order, once each."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHOICES]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give each of {', '.join(CHOICES)} at most once, comma-separated"
        )
    return names


def _lua(value: str) -> str:
    """A Lua string literal (JSON's escapes of ASCII text are Lua's)."""
    return json.dumps(value)


def mixed_script(path: Path, names: Sequence[str] = tuple(APIS)) -> Path:
    """A wrk Lua script sending the requests of ``names`` in turn (each its own path,
    headers and body; built once, in ``init``)."""
    lua = ["local requests = {}", "init = function(args)"]
    for name in names:
        case = APIS[name]
        headers = ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in case.headers.items())
        lua.append(
            f'  requests[#requests + 1] = wrk.format("POST", {_lua(case.path)}, '
            f"{{{headers}}}, {_lua(case.body.decode())})"
        )
    lua += ["end", "local i = 0", "request = function()", "  i = i % #requests + 1"]
    lua += ["  return requests[i]", "end"]
    path.write_text("\n".join(lua) + "\n")
    return path


def _nginx_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def start_static_upstream(
    prefix: Path, port: int, apis: bool = False, more_ports: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """nginx answering every request with :data:`COMPLETION` (one worker, keep-alive);
    with ``apis``, a path ending as one of :data:`APIS`' with that API's answer;
    ``more_ports``: the same answers from a server block of its own on each (the
    upstreams of ``--routes``)."""
    for d in ("logs", "tmp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    body = _nginx_string(COMPLETION)
    by_api = "".join(
        f"        location ~ {case.location} "
        f"{{ default_type application/json; return 200 '{_nginx_string(case.answer)}'; }}\n"
        for case in (APIS.values() if apis else ())
    )
    servers = "".join(
        f"""    server {{
        listen 127.0.0.1:{p};
{by_api}        location / {{ default_type application/json; return 200 '{body}'; }}
    }}
"""
        for p in (port, *more_ports)
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
    keepalive_requests 1000000;
{servers}}}
"""
    )
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "logs/error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for p in (port, *more_ports):
        benchlib.wait_port(p, proc, deadline_s=30)
    return proc


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU-seconds of ``pids`` (each process: all its threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _family(pid: int) -> list[int]:
    """``pid`` and its children (nginx's master and worker)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, kids)]


def _profile_summary(raw: Path, top: int = 15) -> dict[str, Any]:
    """py-spy's collapsed stacks -> the hottest functions by own and inclusive samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [
            f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in stack.split(";")
        ]
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    share = lambda c: [[k, round(v / total, 4)] for k, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "own": share(own), "inclusive": share(inclusive)}


def _wrk_cpu(url: str, script: Path, conns: int, seconds: float, pids: list[int]) -> dict[str, Any]:
    before = _cpu_s(pids)
    res = benchlib.wrk(url, script, connections=conns, seconds=seconds)
    cpu = _cpu_s(pids) - before
    return res | {"cpu_s": cpu, "cpu_s_per_10k": cpu / max(res["requests"], 1) * 10_000}


def _measure(
    urls: dict[str, str], pids: dict[str, list[int]], script: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Each repeat: every target at moderate load, one after the other in a rotating
    order, two windows each: the first right after the target sat idle while the others
    ran (reported apart), then the steady one; then the proxies at saturation."""
    latency: list[dict[str, Any]] = []
    after_idle: list[dict[str, Any]] = []
    saturation: list[dict[str, Any]] = []
    last: dict[str, float] = {}  # when each target's last window ended
    _warm_up(urls, script, args, last)
    for r in range(args.repeats):
        rep, idle, sat = _repeat(urls, pids, script, args, r, last, args.profile is not None)
        latency.append(rep)
        after_idle.append(idle)
        saturation.append(sat)
    return latency, after_idle, saturation


def _warm_up(
    urls: dict[str, str], script: Path, args: argparse.Namespace, last: dict[str, float]
) -> None:
    """Every target once, not reported."""
    for target, url in urls.items():
        benchlib.wrk(url, script, connections=args.connections, seconds=1)
        last[target] = time.monotonic()


def _repeat(  # noqa: PLR0917  (one repeat's inputs)
    urls: dict[str, str],
    pids: dict[str, list[int]],
    script: Path,
    args: argparse.Namespace,
    r: int,
    last: dict[str, float],
    profile: bool,
    label: str = "",
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Repeat ``r`` (its order of the targets): its latency windows, steady and after
    idle, and its saturation runs. ``last``: when each target's last window ended
    (updated); ``profile``: py-spy relmon's saturation run of the first repeat."""
    targets = tuple(urls)
    proxies = targets[1:]
    n = len(targets)
    order = targets[r % n :] + targets[: r % n]
    rep: dict[str, Any] = {}
    idle: dict[str, Any] = {}
    for t in order:
        idle_s = time.monotonic() - last[t]
        idle[t], rep[t] = (
            benchlib.wrk(
                urls[t], script, connections=args.latency_connections, seconds=args.seconds
            )
            for _ in range(2)
        )
        idle[t]["idle_s"] = idle_s
        last[t] = time.monotonic()
    sat: dict[str, Any] = {}
    k = r % len(proxies)
    for t in proxies[k:] + proxies[:k]:
        if profile and r == 0 and t == "relmon":
            sat[t] = _profiled(urls[t], script, pids[t][0], args)
        else:
            sat[t] = _wrk_cpu(urls[t], script, args.connections, args.seconds, pids[t])
        last[t] = time.monotonic()
    print(
        f"  repeat {r + 1}{label}: p50 "
        + " ".join(f"{t} {rep[t]['p50_ms']:.3f}" for t in targets)
        + " ms | p99 after idle "
        + " ".join(f"{t} {idle[t]['p99_ms']:.3f}" for t in targets)
        + " ms | sat "
        + " ".join(f"{t} {sat[t]['requests_per_s']:,.0f}" for t in proxies)
        + " req/s | cpu/10k "
        + " ".join(f"{t} {sat[t]['cpu_s_per_10k']:.2f}" for t in proxies)
        + " s",
        file=sys.stderr,
        flush=True,
    )
    return rep, idle, sat


def _profiled(url: str, script: Path, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    raw = Path(str(args.profile) + ".raw")
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-p",
            str(pid),
            "-r",
            "250",
            "-d",
            str(int(args.seconds) + 1),
            "-f",
            "raw",
            "-o",
            str(raw),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    res = _wrk_cpu(url, script, args.connections, args.seconds, [pid])
    spy.wait(timeout=120)
    summary = _profile_summary(raw)
    args.profile.write_text(json.dumps(summary, indent=2) + "\n")
    return res | {"profiled": True}


GOALS: dict[str, Callable[[float], bool]] = {
    "added_p50": lambda r: r <= 2.0,
    "added_p99": lambda r: r <= 2.0,
    "requests_per_s": lambda r: r >= 0.7,
    "cpu_per_request": lambda r: r <= 2.0,
}
"""Issue 22's goals for relmon against nginx, each ratio's test."""


def _ratios(
    added: dict[str, Any],
    nginx_added: dict[str, Any],
    sat: dict[str, Any],
    nginx_sat: dict[str, Any],
) -> dict[str, float | None]:
    """A target against nginx: added p50 and p99 (None when nginx added nothing
    measurable), requests/s and CPU per request."""
    return {
        "added_p50": added["p50_ms"] / nginx_added["p50_ms"] if nginx_added["p50_ms"] > 0 else None,
        "added_p99": added["p99_ms"] / nginx_added["p99_ms"] if nginx_added["p99_ms"] > 0 else None,
        "requests_per_s": sat["requests_per_s"] / nginx_sat["requests_per_s"],
        "cpu_per_request": sat["cpu_s_per_10k"] / nginx_sat["cpu_s_per_10k"],
    }


def _repeat_ratios(lat: dict[str, Any], sat: dict[str, Any]) -> dict[str, float | None]:
    """relmon against nginx within one repeat (the targets minutes apart at most): paired
    ratios, which the host's drift from one repeat to the next does not move."""
    added = {
        t: {k: lat[t][k] - lat["direct"][k] for k in ("p50_ms", "p99_ms")}
        for t in ("relmon", "nginx")
    }
    return _ratios(added["relmon"], added["nginx"], sat["relmon"], sat["nginx"])


def _summarize(latency: list[dict[str, Any]], saturation: list[dict[str, Any]]) -> dict[str, Any]:
    med = benchlib.median
    out: dict[str, Any] = {"latency": {}, "saturation": {}}
    targets = tuple(latency[0])
    for t in targets:
        out["latency"][t] = {k: med([rep[t][k] for rep in latency]) for k in ("p50_ms", "p99_ms")}
        out["latency"][t]["errors"] = sum(
            rep[t]["non_2xx"] + rep[t]["socket_errors"] for rep in latency
        )
    for t in targets[1:]:
        out["latency"][f"{t}_added"] = {
            k: med([rep[t][k] - rep["direct"][k] for rep in latency]) for k in ("p50_ms", "p99_ms")
        }
        out["saturation"][t] = {
            k: med([s[t][k] for s in saturation])
            for k in ("requests_per_s", "cpu_s_per_10k", "p99_ms")
        }
        out["saturation"][t]["errors"] = sum(
            s[t]["non_2xx"] + s[t]["socket_errors"] for s in saturation
        )
    na, ns = out["latency"]["nginx_added"], out["saturation"]["nginx"]
    out["ratios"] = _ratios(out["latency"]["relmon_added"], na, out["saturation"]["relmon"], ns)
    pairs = zip(latency, saturation, strict=True)
    out["repeat_ratios"] = [_repeat_ratios(lat, sat) for lat, sat in pairs]
    out["repeats_meeting_goals"] = {
        key: sum(1 for r in out["repeat_ratios"] if r[key] is not None and met(r[key]))
        for key, met in GOALS.items()
    }
    for other in OTHERS:  # also against nginx, in the same run
        if other in targets:
            oa, os_ = out["latency"][f"{other}_added"], out["saturation"][other]
            out[f"{other}_ratios"] = _ratios(oa, na, os_, ns)
    return out


def _after_idle(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first window after each target sat idle: its added latency (medians over the
    repeats), how long it had been idle, and the proxies' added p99 against nginx's."""
    med = benchlib.median
    targets = tuple(windows[0])
    out: dict[str, Any] = {
        "idle_s": {t: med([w[t]["idle_s"] for w in windows]) for t in targets},
        "added": {
            t: {k: med([w[t][k] - w["direct"][k] for w in windows]) for k in ("p50_ms", "p99_ms")}
            for t in targets[1:]
        },
    }
    nginx_p99 = out["added"]["nginx"]["p99_ms"]
    out["added_p99_ratio"] = {
        t: a["p99_ms"] / nginx_p99 if nginx_p99 > 0 else None for t, a in out["added"].items()
    }
    return out


def _start_relmon(
    args: argparse.Namespace, tmp: Path, up_port: int, tree: Path, traffic_extra: str
) -> tuple[subprocess.Popen[bytes], int, int | None]:
    """relmon from ``tree``: its data plane alone (``--data-plane``) or ``relmon run``
    in proxy mode (with ``--apis``, its task the catch-all one: every API's events); the
    process, its traffic port and its metrics port (None: the data plane alone)."""
    if args.data_plane:
        cmd = [sys.executable, str(tree / "bench" / Path(__file__).name), "--serve-data-plane"]
        cmd += [args.data_plane, f"http://127.0.0.1:{up_port}"]
        proc, port = benchlib.spawn_with_port(
            cmd, "data plane", env={**os.environ, "PYTHONPATH": str(tree)}
        )
        return proc, port, None
    proc, ports = benchlib.start_relmon_service(
        tmp,
        f"http://127.0.0.1:{up_port}/v1",
        tree,
        traffic_mode="proxy",
        upstream_url=f"http://127.0.0.1:{up_port}",
        traffic_extra=traffic_extra,
        **({"match": "{}"} if args.apis else {}),
    )
    return proc, ports["traffic"], ports["metrics"]


@contextlib.contextmanager
def _servers(
    args: argparse.Namespace, tmp: Path
) -> Iterator[tuple[dict[str, str], dict[str, list[int]], int | None]]:
    """The upstream and every target, stopped on exit: each target's origin
    (``http://127.0.0.1:PORT``, ``direct`` the upstream's), the processes whose CPU counts
    for each proxy, and relmon's metrics port (None: the data plane alone)."""
    nginx_port = benchlib.free_port()
    # --routes: an upstream port per route (a server block of the static upstream each)
    route_ports = {r.name: benchlib.free_port() for r in ROUTES} if args.routes > 1 else {}
    if args.upstream == "nginx":
        up_port = benchlib.free_port()
        upstream = start_static_upstream(
            tmp / "upstream", up_port, apis=bool(args.apis), more_ports=list(route_ports.values())
        )
    else:
        cmd = [sys.executable, str(Path(__file__).with_name("proxy_latency_bench.py"))]
        upstream, up_port = benchlib.spawn_with_port([*cmd, "--serve-upstream"], "upstream")
    relmon = nginx = lean = before = plane = one_route = None
    try:
        extra = args.traffic_extra
        if route_ports:
            extra = ", ".join(x for x in (extra, routes_traffic(route_ports)) if x)
        relmon, port, metrics_port = _start_relmon(
            args, tmp / "relmon", up_port, benchlib.ROOT, extra
        )
        conf = None
        if route_ports:
            conf = nginx_routes_config(tmp / "nginx", nginx_port, route_ports, up_port)
        nginx = start_nginx(tmp / "nginx", nginx_port, up_port, conf)
        origins = {
            "direct": f"http://127.0.0.1:{up_port}",
            "relmon": f"http://127.0.0.1:{port}",
            "nginx": f"http://127.0.0.1:{nginx_port}",
        }
        # A process and its children: nginx's workers, relmon's data plane process.
        pids = {"relmon": _family(relmon.pid), "nginx": _family(nginx.pid)}
        if args.plain_baseline:
            args.baseline_tree = benchlib.plain_copy(tmp / "plain")
        if args.baseline_tree is not None:
            extra = args.traffic_extra
            if args.baseline_traffic_extra is not None:
                extra = args.baseline_traffic_extra
            before, before_port, _ = _start_relmon(
                args, tmp / "before", up_port, args.baseline_tree, extra
            )
            origins["before"] = f"http://127.0.0.1:{before_port}"
            pids["before"] = _family(before.pid)
        if args.with_lean:
            cmd = [sys.executable, str(Path(__file__).with_name("lean_proxy.py")), str(up_port)]
            lean, lean_port = benchlib.spawn_with_port(cmd, "lean proxy")
            origins["lean"] = f"http://127.0.0.1:{lean_port}"
            pids["lean"] = [lean.pid]
        if args.with_data_plane:
            cmd = [sys.executable, __file__, "--serve-data-plane", "uvloop"]
            plane, plane_port = benchlib.spawn_with_port(
                [*cmd, f"http://127.0.0.1:{up_port}"], "data plane"
            )
            origins["plane"] = f"http://127.0.0.1:{plane_port}"
            pids["plane"] = [plane.pid]
        if route_ports:  # relmon as without --routes, beside: its one upstream
            one_route, one_port, _ = _start_relmon(
                args, tmp / "one_route", up_port, benchlib.ROOT, args.traffic_extra
            )
            origins["one_route"] = f"http://127.0.0.1:{one_port}"
            pids["one_route"] = _family(one_route.pid)
        yield origins, pids, metrics_port
    finally:
        for proc in (nginx, relmon, lean, before, plane, one_route):
            if proc is not None:
                benchlib.stop(proc)
        benchlib.stop(upstream)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.apis:
        return run_apis(args)
    start_machine = benchlib.machine()
    with tempfile.TemporaryDirectory(prefix="relmon-proxy-sat-") as tmp_name:
        tmp = Path(tmp_name)
        script = benchlib.wrk_script(tmp / "post.lua", REQUEST, HEADERS)
        with _servers(args, tmp) as (origins, pids, _):
            urls = {t: origin + CHAT_PATH for t, origin in origins.items()}
            latency, after_idle, saturation = _measure(urls, pids, script, args)
    report: dict[str, Any] = {
        "benchmark": "proxy_saturation",
        "load_generator": "wrk 1 thread, closed loop, its own process",
        "request_bytes": len(REQUEST),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "latency_connections": args.latency_connections,
        "connections": args.connections,
        "traffic_extra": args.traffic_extra,
        "baseline_traffic_extra": args.baseline_traffic_extra,
        "data_plane": args.data_plane,
        "fast_path": "relmon run's fast path (1% hash-sampled, those handed to nothing)",
        "upstream": args.upstream,
        "with_lean": args.with_lean,
        "with_data_plane": args.with_data_plane,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "plain_baseline": args.plain_baseline,
        "compiled": {
            "relmon": benchlib.compiled(),
            "before": benchlib.compiled(args.baseline_tree) if args.baseline_tree else None,
        },
        "machine": start_machine,
        "repeat_results": {
            "latency": latency,
            "latency_after_idle": after_idle,
            "saturation": saturation,
        },
    }
    report |= _summarize(latency, saturation)
    report["after_idle"] = _after_idle(after_idle)
    if args.profile is not None:
        report["profile"] = json.loads(args.profile.read_text())
    report["label"] = args.label
    report["before"] = []
    for path in args.before:  # earlier runs shown beside this one (each with its own ratios)
        doc = json.loads(path.read_text())
        keep = ("label", "latency", "saturation", "ratios", "machine", "profile", "upstream")
        report["before"].append({k: doc[k] for k in keep if k in doc})
    return report


# -- every wire API (--apis): one run, relmon and nginx per API ----------------------------


def run_apis(args: argparse.Namespace) -> dict[str, Any]:
    """``--apis``: the same measurement for each API of ``args.apis`` in one run, against
    one relmon (a catch-all task sampling 1% of every API, the re-asks in each event's own
    API to the same upstream) and one nginx, the APIs in a rotating order within each
    repeat; relmon's counters read before and after each API's turn."""
    start_machine = benchlib.machine()
    names: list[str] = args.apis
    with tempfile.TemporaryDirectory(prefix="relmon-proxy-apis-") as tmp_name:
        tmp = Path(tmp_name)
        scripts = {
            name: mixed_script(tmp / "mixed.lua")
            if name == MIXED
            else benchlib.wrk_script(tmp / f"{name}.lua", APIS[name].body, APIS[name].headers)
            for name in names
        }
        with _servers(args, tmp) as (origins, pids, metrics_port):
            urls = {
                name: {t: origin + _path_of(name) for t, origin in origins.items()}
                for name in names
            }
            scrape = None
            if metrics_port is not None:
                metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
                scrape = lambda: relmon_counts(benchlib.http_get(metrics_url))  # noqa: E731
            results, counts = _measure_apis(urls, pids, scripts, args, scrape)
    wire: dict[str, Any] = {
        name: {"api": c.api, "path": c.path, "request_bytes": len(c.body)}
        for name, c in APIS.items()
    }
    wire[MIXED] = {"api": "every API in turn", "path": "each API's", "apis": list(APIS)}
    report: dict[str, Any] = {
        "benchmark": "proxy_apis",
        "load_generator": "wrk 1 thread, closed loop, its own process",
        "apis": names,
        "wire": {name: wire[name] for name in names},
        "seconds": args.seconds,
        "repeats": args.repeats,
        "latency_connections": args.latency_connections,
        "connections": args.connections,
        "traffic_extra": args.traffic_extra,
        "data_plane": args.data_plane,
        "task": (
            "one catch-all task (no match: every API's events), 1% hash-sampled, "
            "endpoint.api unset (each event re-asked in its own API) with base_url the "
            "upstream's /v1"
        ),
        "upstream": args.upstream,
        "with_lean": args.with_lean,
        "with_data_plane": args.with_data_plane,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "plain_baseline": args.plain_baseline,
        "compiled": {
            "relmon": benchlib.compiled(),
            "before": benchlib.compiled(args.baseline_tree) if args.baseline_tree else None,
        },
        "machine": start_machine,
        "label": args.label,
    }
    report |= summarize_apis(results, counts)
    if args.routes > 1:
        report |= {"benchmark": "proxy_routes", "routes": args.routes}
        report |= {"route_table": ROUTE_TABLE} | summarize_routes(results)
    return report


ROUTE_TABLE = [
    *({"name": r.name, "match": r.match, "nginx_location": r.location} for r in ROUTES),
    {"name": "default", "match": "the rest (completions)", "nginx_location": "/"},
]
"""``--routes 4``: relmon's routes (``traffic.routes``, then ``traffic.upstream_url``: the
``default`` route) and nginx's locations, each route to an upstream port of its own."""


def _pair(r: dict[str, list[dict[str, Any]]], target: str, base: str) -> dict[str, Any]:
    """An API's windows with ``target`` in relmon's place and ``base`` in nginx's (the
    others left out): :func:`api_summary` of one target against another."""

    def lat(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"direct": w["direct"], "relmon": w[target], "nginx": w[base]} for w in windows]

    return {
        "latency": lat(r["latency"]),
        "latency_after_idle": lat(r["latency_after_idle"]),
        "saturation": [{"relmon": w[target], "nginx": w[base]} for w in r["saturation"]],
    }


def summarize_routes(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """``--routes``: per API, relmon with one upstream (``one_route``) against nginx, as
    ``per_api`` has relmon with the routes; and relmon with the routes against itself with
    one upstream (the ratios paired within each repeat, their medians)."""
    vs_one = api_summary({n: _pair(r, "relmon", "one_route") for n, r in results.items()})
    return {
        "one_route_per_api": api_summary(
            {n: _pair(r, "one_route", "nginx") for n, r in results.items()}
        ),
        "vs_one_route": {
            n: {"paired_ratios": s["paired_ratios"], "repeat_ratios": s["repeat_ratios"]}
            for n, s in vs_one.items()
        },
    }


def summarize_apis(
    results: dict[str, dict[str, list[dict[str, Any]]]], counts: dict[str, list[Counts]]
) -> dict[str, Any]:
    """The figures of an ``--apis`` run from its windows (``results``: per API, as
    :func:`_measure_apis` returns them) and relmon's counters over each API's turns."""
    return {
        "repeat_results": results,
        "relmon_counts": counts,
        "relmon_counts_total": {name: sum_counts(c) for name, c in counts.items()},
        "per_api": api_summary(results),
        "vs_chat": vs_chat(results) if "chat" in results else None,
        "vs_chat_tolerance": VS_CHAT_TOLERANCE,
    }


def _path_of(name: str) -> str:
    """The path wrk's URL names (the mixed script sets each request's own)."""
    return "/" if name == MIXED else APIS[name].path


Counts = dict[str, dict[str, float]]


def _measure_apis(
    urls: dict[str, dict[str, str]],
    pids: dict[str, list[int]],
    scripts: dict[str, Path],
    args: argparse.Namespace,
    scrape: Callable[[], Counts] | None,
) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], dict[str, list[Counts]]]:
    """Each repeat: every API in a rotating order, each taking one repeat of
    :func:`_measure`'s (its targets' latency windows, then the proxies at saturation);
    relmon's counters over each API's turn (``scrape``: read them)."""
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"latency": [], "latency_after_idle": [], "saturation": []} for name in urls
    }
    counts: dict[str, list[Counts]] = {name: [] for name in urls}
    last: dict[str, float] = {}  # when each target (of any API) last had a window
    for name, by_target in urls.items():
        _warm_up(by_target, scripts[name], args, last)
    names = tuple(urls)
    for r in range(args.repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            before = scrape() if scrape is not None else None
            rep, idle, sat = _repeat(
                urls[name], pids, scripts[name], args, r, last, False, f" {name:>11}"
            )
            results[name]["latency"].append(rep)
            results[name]["latency_after_idle"].append(idle)
            results[name]["saturation"].append(sat)
            if scrape is not None and before is not None:
                counts[name].append(counts_delta(before, scrape()))
    return results, counts


_COUNTED: dict[str, tuple[str, str]] = {
    "requests": ("relmon_traffic_requests_total", "api"),
    "decisions": ("relmon_traffic_events_total", "decision"),
    "items": ("relmon_items_total", "outcome"),
    "model_calls": ("relmon_model_calls_total", "outcome"),
    "not_reasked": ("relmon_not_reasked_total", "reason"),
    "routes": ("relmon_proxy_requests_total", "route"),  # answers relayed, by route
}
"""relmon's counters read around each API's turn: (metric, the label counted by)."""


def relmon_counts(text: str) -> Counts:
    """From a Prometheus exposition, each of :data:`_COUNTED` summed by its label."""
    out: Counts = {}
    for key, (metric, label) in _COUNTED.items():
        by: dict[str, float] = {}
        for labels, value in benchlib.metric_values(text, metric).items():
            m = re.search(rf'\b{label}="([^"]*)"', labels)
            if m is not None:
                by[m.group(1)] = by.get(m.group(1), 0.0) + value
        out[key] = by
    return out


def counts_delta(before: Counts, after: Counts) -> Counts:
    """What the counters added between two reads (the values that moved)."""
    return {
        key: {
            k: v - before.get(key, {}).get(k, 0.0)
            for k, v in by.items()
            if v != before.get(key, {}).get(k, 0.0)
        }
        for key, by in after.items()
    }


def sum_counts(deltas: Sequence[Counts]) -> Counts:
    out: Counts = {}
    for delta in deltas:
        for key, by in delta.items():
            total = out.setdefault(key, {})
            for k, v in by.items():
                total[k] = total.get(k, 0.0) + v
    return out


def api_summary(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per API: :func:`_summarize`'s figures (medians, the ratios of the medians against
    nginx's and the paired ratios of each repeat), the medians of the paired ratios and
    the goals they meet, and its windows after idle."""
    out: dict[str, Any] = {}
    for name, r in results.items():
        s = _summarize(r["latency"], r["saturation"])
        s["paired_ratios"] = {
            key: _median_or_none([rep[key] for rep in s["repeat_ratios"]]) for key in GOALS
        }
        s["goals_met"] = {
            key: s["paired_ratios"][key] is not None and met(s["paired_ratios"][key])
            for key, met in GOALS.items()
        }
        s["after_idle"] = _after_idle(r["latency_after_idle"])
        out[name] = s
    return out


VS_CHAT_KEYS = ("cpu_per_request", "added_p50", "requests_per_s")


def _median_or_none(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return benchlib.median(kept) if kept else None


def vs_chat(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per API, each proxy against itself serving chat in the same repeat (paired): its
    CPU per request, added p50 and requests/s for the API over the same for chat; the
    medians over the repeats, and whether relmon's CPU per request and added p50 stay
    within :data:`VS_CHAT_TOLERANCE` of chat's (nginx's show what the API's own bytes
    cost a proxy that reads none of them)."""
    chat = results["chat"]
    out: dict[str, Any] = {}
    for name, r in results.items():
        paired = []
        rows = zip(r["latency"], r["saturation"], chat["latency"], chat["saturation"], strict=True)
        for lat, sat, lat0, sat0 in rows:
            row: dict[str, dict[str, float | None]] = {}
            for t in PROXIES:
                added = lat[t]["p50_ms"] - lat["direct"]["p50_ms"]
                added0 = lat0[t]["p50_ms"] - lat0["direct"]["p50_ms"]
                row[t] = {
                    "cpu_per_request": sat[t]["cpu_s_per_10k"] / sat0[t]["cpu_s_per_10k"],
                    "added_p50": added / added0 if added0 > 0 else None,
                    "requests_per_s": sat[t]["requests_per_s"] / sat0[t]["requests_per_s"],
                }
            paired.append(row)
        medians = {
            t: {k: _median_or_none([row[t][k] for row in paired]) for k in VS_CHAT_KEYS}
            for t in PROXIES
        }
        relmon = medians["relmon"]
        out[name] = medians | {
            "repeat_ratios": paired,
            "no_more_than_chat": {
                k: relmon[k] is not None and relmon[k] <= VS_CHAT_TOLERANCE
                for k in ("cpu_per_request", "added_p50")
            },
        }
    return out


def _print_apis(report: dict[str, Any]) -> None:
    routes = report.get("routes", 1) > 1
    for name, s in report["per_api"].items():
        _print_api(f"{name}, {report['routes']} routes" if routes else name, s)
    for name, s in report.get("one_route_per_api", {}).items():
        _print_api(f"{name}, one route", s)
    for name, v in report.get("vs_one_route", {}).items():
        y = v["paired_ratios"]
        print(
            f"{name:>11}, {report['routes']} routes / one route, relmon, paired: added p50 "
            f"{_times(y['added_p50'])}, p99 {_times(y['added_p99'])}, req/s "
            f"x{y['requests_per_s']:.2f}, CPU x{y['cpu_per_request']:.2f}"
        )
    chat = report.get("vs_chat") or {}
    for name, v in chat.items():
        r = v["relmon"]
        print(
            f"{name:>11} / chat, relmon: CPU per request {_times(r['cpu_per_request'])}, added "
            f"p50 {_times(r['added_p50'])} (nginx: CPU {_times(v['nginx']['cpu_per_request'])})"
        )


def _print_api(name: str, s: dict[str, Any]) -> None:
    """One API's line: relmon against nginx (paired ratios) and the goals it meets."""
    a, n = s["latency"]["relmon_added"], s["latency"]["nginx_added"]
    sat, y = s["saturation"], s["paired_ratios"]
    print(
        f"{name:>11}: relmon added p50 +{a['p50_ms']:.3f} (nginx +{n['p50_ms']:.3f}) ms "
        f"p99 +{a['p99_ms']:.3f} (+{n['p99_ms']:.3f}) ms | "
        f"{sat['relmon']['requests_per_s']:,.0f} ({sat['nginx']['requests_per_s']:,.0f}) "
        "req/s | "
        f"{sat['relmon']['cpu_s_per_10k']:.2f} ({sat['nginx']['cpu_s_per_10k']:.2f}) "
        f"CPU-s per 10k || /nginx, paired: added p50 {_times(y['added_p50'])}, p99 "
        f"{_times(y['added_p99'])}, req/s x{y['requests_per_s']:.2f}, CPU "
        f"x{y['cpu_per_request']:.2f}; goals met {sum(s['goals_met'].values())} of 4"
    )


def fast_path_server(upstream_url: str) -> TrafficServer:
    """relmon's TrafficServer in proxy mode on a free port, with relmon run's fast path for
    the bench's task (sampling 1%), the sampled requests handed to nothing."""
    task = TaskSettings.model_validate(
        {
            "name": "bench",
            "match": {"model": "bench-model"},
            "sampling_rate": 0.01,
            "endpoint": {"base_url": upstream_url + "/v1", "model": "bench-model"},
        }
    )
    router = TaskRouter({"bench": RoutedTask(task)})
    return TrafficServer(
        sink=lambda event, source: Admission("skipped"),
        reject=lambda source, reason: None,
        task_resolver=HeaderTaskResolver(router, "X-Relmon-Task"),
        mode="proxy",
        port=0,
        upstream_url=upstream_url,
        skip=HeadSkip(router),
        relay=lambda *handed: None,
        max_sampling_rate=router.max_rate,
        offer_batch_s=TrafficSettings.model_fields["offer_batch_s"].default,
    )


async def _serve_data_plane(upstream_url: str) -> None:
    """The proxy's data plane alone (:func:`fast_path_server`), until SIGTERM."""
    server = fast_path_server(upstream_url)
    await server.start()
    print(f"PORT {server.bound_port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32, help="saturation load")
    parser.add_argument("--latency-connections", type=int, default=8, help="moderate load")
    parser.add_argument(
        "--upstream", choices=["aiohttp", "nginx"], default="aiohttp", help="the upstream server"
    )
    parser.add_argument(
        "--data-plane",
        choices=["uvloop", "asyncio"],
        help="measure the proxy's data plane alone (no service) on this event loop",
    )
    parser.add_argument("--serve-data-plane", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also measure relmon from this checkout (the code before a change)",
    )
    parser.add_argument(
        "--plain-baseline",
        action="store_true",
        help="also measure this code as plain Python (a copy without the compiled modules)",
    )
    parser.add_argument(
        "--with-lean",
        action="store_true",
        help="also measure bench/lean_proxy.py (the floor a Python proxy reaches here)",
    )
    parser.add_argument(
        "--with-data-plane",
        action="store_true",
        help="also measure this tree's data plane alone, its fast path as relmon run's",
    )
    parser.add_argument("--traffic-extra", default="", help="more traffic keys, YAML flow")
    parser.add_argument(
        "--baseline-traffic-extra",
        help="the baseline's traffic keys instead (e.g. this tree inline against process)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy relmon; summary to this file")
    parser.add_argument("--label", default="this run", help="this run's name in the report")
    parser.add_argument(
        "--before",
        type=Path,
        action="append",
        default=[],
        help="an earlier run's JSON to show beside this one (repeatable)",
    )
    parser.add_argument(
        "--apis",
        type=parse_apis,
        help=f"measure each of these wire APIs, comma-separated: {','.join(CHOICES)} "
        "(mixed: every API in turn); needs --upstream nginx",
    )
    parser.add_argument(
        "--routes",
        type=int,
        choices=[1, len(ROUTES)],
        default=1,
        help=f"with --apis: 1, one upstream; {len(ROUTES)}: relmon's traffic.routes and "
        "nginx's locations, a route per API (completions: the default), each to an upstream "
        "port of its own, beside relmon with one upstream",
    )
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.serve_data_plane:
        loop, url = args.serve_data_plane
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None)
        with runner:
            runner.run(_serve_data_plane(url))
        return
    if args.apis and args.upstream != "nginx":
        parser.error("--apis needs --upstream nginx (the upstream that answers every API)")
    if args.routes > 1 and (not args.apis or args.data_plane):
        parser.error("--routes needs --apis (and relmon run, not --data-plane)")
    if args.apis and (args.profile is not None or args.before):
        parser.error("--apis takes neither --profile nor --before")
    if args.quick:
        args.seconds, args.repeats = 1.0, 1
    report = run(args)
    if args.json:
        benchlib.write_json(report, args.json)
    if args.apis:
        _print_apis(report)
        return
    lat, sat = report["latency"], report["saturation"]
    for t in sat:
        a, s = lat[f"{t}_added"], sat[t]
        print(
            f"{t:>6}: added p50 +{a['p50_ms']:.3f} ms p99 +{a['p99_ms']:.3f} ms | "
            f"{s['requests_per_s']:,.0f} req/s | {s['cpu_s_per_10k']:.2f} CPU-s per 10k"
        )
    for name, key in (("relmon", "ratios"), *((o, f"{o}_ratios") for o in OTHERS)):
        if key in report:
            y = report[key]
            print(
                f"{name:>6}/nginx: added p50 {_times(y['added_p50'])}, added p99 "
                f"{_times(y['added_p99'])}, req/s x{y['requests_per_s']:.2f}, "
                f"CPU per request x{y['cpu_per_request']:.2f}"
            )
    met, n = report["repeats_meeting_goals"], len(report["repeat_ratios"])
    print(
        f"relmon/nginx within each of the {n} repeats, goal met in: added p50 "
        f"{met['added_p50']}, added p99 {met['added_p99']}, req/s {met['requests_per_s']}, "
        f"CPU per request {met['cpu_per_request']}"
    )


def _times(ratio: float | None) -> str:
    """A ratio as printed; n/a when nginx added nothing measurable (a noisy short run)."""
    return "n/a" if ratio is None else f"x{ratio:.2f}"


if __name__ == "__main__":
    main()
