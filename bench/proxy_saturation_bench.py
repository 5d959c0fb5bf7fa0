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

Reported: medians over ``--repeats`` repeats and the ratios relmon/nginx. With
``--profile FILE`` py-spy samples relmon during its first saturation run and the
hottest functions (by own time and by inclusive time) go into the JSON document.

    .venv/bin/python bench/proxy_saturation_bench.py [--seconds 3] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from proxy_latency_bench import start_nginx

from adapters.http.traffic import TrafficServer
from monitor.config import TaskSettings
from monitor.config.schema import TrafficSettings
from monitor.engine.ports import Admission
from monitor.engine.routing import HeaderTaskResolver, HeadSkip, RoutedTask, TaskRouter

TARGETS = ("direct", "relmon", "nginx")
PROXIES = ("relmon", "nginx")
OTHERS = ("before", "lean", "plane")
"""The targets measured beside relmon and nginx when asked (each against nginx too)."""
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


def start_static_upstream(prefix: Path, port: int) -> subprocess.Popen[bytes]:
    """nginx answering every request with :data:`COMPLETION` (one worker, keep-alive)."""
    for d in ("logs", "tmp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    body = COMPLETION.replace("\\", "\\\\").replace("'", "\\'")
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
    server {{
        listen 127.0.0.1:{port};
        location / {{ default_type application/json; return 200 '{body}'; }}
    }}
}}
"""
    )
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "logs/error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    benchlib.wait_port(port, proc, deadline_s=30)
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
    targets = tuple(urls)
    proxies = targets[1:]
    last: dict[str, float] = {}  # when each target's last window ended
    for target in targets:  # warm-up, not reported
        benchlib.wrk(urls[target], script, connections=args.connections, seconds=1)
        last[target] = time.monotonic()
    for r in range(args.repeats):
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
        latency.append(rep)
        after_idle.append(idle)
        sat: dict[str, Any] = {}
        k = r % len(proxies)
        for t in proxies[k:] + proxies[:k]:
            if args.profile is not None and r == 0 and t == "relmon":
                sat[t] = _profiled(urls[t], script, pids[t][0], args)
            else:
                sat[t] = _wrk_cpu(urls[t], script, args.connections, args.seconds, pids[t])
            last[t] = time.monotonic()
        saturation.append(sat)
        print(
            f"  repeat {r + 1}: p50 "
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
    return latency, after_idle, saturation


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
) -> tuple[subprocess.Popen[bytes], int]:
    """relmon from ``tree``: its data plane alone (``--data-plane``) or ``relmon run``
    in proxy mode; the process and its traffic port."""
    if args.data_plane:
        cmd = [sys.executable, str(tree / "bench" / Path(__file__).name), "--serve-data-plane"]
        cmd += [args.data_plane, f"http://127.0.0.1:{up_port}"]
        return benchlib.spawn_with_port(
            cmd, "data plane", env={**os.environ, "PYTHONPATH": str(tree)}
        )
    proc, ports = benchlib.start_relmon_service(
        tmp,
        f"http://127.0.0.1:{up_port}/v1",
        tree,
        traffic_mode="proxy",
        upstream_url=f"http://127.0.0.1:{up_port}",
        traffic_extra=traffic_extra,
    )
    return proc, ports["traffic"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    start_machine = benchlib.machine()
    with tempfile.TemporaryDirectory(prefix="relmon-proxy-sat-") as tmp_name:
        tmp = Path(tmp_name)
        script = benchlib.wrk_script(tmp / "post.lua", REQUEST, HEADERS)
        nginx_port = benchlib.free_port()
        if args.upstream == "nginx":
            up_port = benchlib.free_port()
            upstream = start_static_upstream(tmp / "upstream", up_port)
        else:
            cmd = [sys.executable, str(Path(__file__).with_name("proxy_latency_bench.py"))]
            upstream, up_port = benchlib.spawn_with_port([*cmd, "--serve-upstream"], "upstream")
        relmon = nginx = lean = before = plane = None
        try:
            relmon, port = _start_relmon(
                args, tmp / "relmon", up_port, benchlib.ROOT, args.traffic_extra
            )
            nginx = start_nginx(tmp / "nginx", nginx_port, up_port)
            path = "/v1/chat/completions"
            urls = {
                "direct": f"http://127.0.0.1:{up_port}{path}",
                "relmon": f"http://127.0.0.1:{port}{path}",
                "nginx": f"http://127.0.0.1:{nginx_port}{path}",
            }
            # A process and its children: nginx's workers, relmon's data plane process.
            pids = {"relmon": _family(relmon.pid), "nginx": _family(nginx.pid)}
            if args.plain_baseline:
                args.baseline_tree = benchlib.plain_copy(tmp / "plain")
            if args.baseline_tree is not None:
                extra = args.traffic_extra
                if args.baseline_traffic_extra is not None:
                    extra = args.baseline_traffic_extra
                before, before_port = _start_relmon(
                    args, tmp / "before", up_port, args.baseline_tree, extra
                )
                urls["before"] = f"http://127.0.0.1:{before_port}{path}"
                pids["before"] = _family(before.pid)
            if args.with_lean:
                cmd = [sys.executable, str(Path(__file__).with_name("lean_proxy.py")), str(up_port)]
                lean, lean_port = benchlib.spawn_with_port(cmd, "lean proxy")
                urls["lean"] = f"http://127.0.0.1:{lean_port}{path}"
                pids["lean"] = [lean.pid]
            if args.with_data_plane:
                cmd = [sys.executable, __file__, "--serve-data-plane", "uvloop"]
                plane, plane_port = benchlib.spawn_with_port(
                    [*cmd, f"http://127.0.0.1:{up_port}"], "data plane"
                )
                urls["plane"] = f"http://127.0.0.1:{plane_port}{path}"
                pids["plane"] = [plane.pid]
            latency, after_idle, saturation = _measure(urls, pids, script, args)
        finally:
            for proc in (nginx, relmon, lean, before, plane):
                if proc is not None:
                    benchlib.stop(proc)
            benchlib.stop(upstream)
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
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.serve_data_plane:
        loop, url = args.serve_data_plane
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None)
        with runner:
            runner.run(_serve_data_plane(url))
        return
    if args.quick:
        args.seconds, args.repeats = 1.0, 1
    report = run(args)
    if args.json:
        benchlib.write_json(report, args.json)
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
