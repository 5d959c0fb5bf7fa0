"""The OTLP/HTTP receiver: spans per second and CPU per span through ``relmon run``'s
``traffic.otlp`` against a bare aiohttp handler that only decodes the same requests, and
the latency ``forward_to`` adds in front of a collector.

Processes on 127.0.0.1: the bare handler (``ExportTraceServiceRequest.FromString`` of the
body, an empty ``ExportTraceServiceResponse``, 200), a simulated model, and two
``relmon run`` processes (``traffic.mode: off``, ``traffic.otlp`` on, one task sampling
1% of the spans that name ``bench-model``): one the last stop of the spans, one with
``forward_to`` the bare handler (as a collector). The load generator is Debian's ``wrk``
(one thread, closed loop, its own process) posting OTLP protobuf export requests of
``--spans`` spans (1 in ``--inference-every`` a GenAI chat span with its messages, the
others HTTP server spans, 10 spans a trace); a Lua script gives every request trace ids
of its own, so no two spans are alike and relmon samples 1% of the traces.

- Throughput: wrk at ``--connections`` connections against the bare handler and the
  first relmon, alternating (ABBA) in each repeat; spans/s, and CPU per span: the user +
  system time of the server's process (every thread) from ``/proc`` over the same run.
- Forwarding: wrk at one connection against the collector directly and through the
  second relmon, alternating; the added p50 and p99 (relmon's minus the direct one's,
  within the repeat).

Medians over the repeats; goals: spans/s at least 0.8 of the bare handler's, CPU per span
at most 1.25 of it. Afterwards relmon's span counters are read: every span sent counted.

    .venv/bin/python bench/otlp_bench.py [--seconds 5] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

# The first 8 bytes of every trace id in the template; wrk's script replaces them per
# request (random bytes, found nowhere else in the body: checked when it is built).
MARKER = bytes.fromhex("9d3f51c2e07a6b84")
SPANS_PER_TRACE = 10
GOALS = {"spans_per_s": 0.8, "cpu_per_span": 1.25}

LUA = """-- OTLP export requests: the template's trace ids made unique per request
local f = assert(io.open(%(body)s, "rb"))
local body = f:read("*a")
f:close()
local marker = %(marker)s
local parts, at = {}, 1
while true do
  local s, e = string.find(body, marker, at, true)
  if not s then break end
  parts[#parts + 1] = string.sub(body, at, s - 1)
  at = e + 1
end
parts[#parts + 1] = string.sub(body, at)
local counter = %(start)d
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-protobuf"
request = function()
  counter = counter + 1
  local c, id = counter, {}
  for k = 1, 8 do
    id[k] = string.char(c %% 256)
    c = math.floor(c / 256)
  end
  return wrk.format(nil, nil, nil, table.concat(parts, table.concat(id)))
end
"""


def _attrs(pairs: dict[str, str | int]) -> list[common_pb2.KeyValue]:
    out = []
    for key, value in pairs.items():
        any_value = (
            common_pb2.AnyValue(int_value=value)
            if isinstance(value, int)
            else common_pb2.AnyValue(string_value=value)
        )
        out.append(common_pb2.KeyValue(key=key, value=any_value))
    return out


def _chat_attributes(i: int) -> dict[str, str | int]:
    """A GenAI-semconv chat span's, its messages captured (numeric task: a sum)."""
    a, b = 17 + i, 25
    user = [{"role": "user", "parts": [{"type": "text", "content": f"What is {a} + {b}?"}]}]
    out = [{"role": "assistant", "parts": [{"type": "text", "content": str(a + b)}]}]
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "bench-model",
        "gen_ai.response.model": "bench-model",
        "gen_ai.usage.input_tokens": 14,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.input.messages": json.dumps(user),
        "gen_ai.output.messages": json.dumps(out),
    }


def _http_attributes(i: int) -> dict[str, str | int]:
    return {
        "http.request.method": "GET",
        "http.route": "/api/items/{id}",
        "url.path": f"/api/items/{1000 + i}",
        "url.scheme": "http",
        "http.response.status_code": 200,
        "server.address": "checkout.internal",
        "server.port": 8080,
        "network.protocol.version": "1.1",
        "user_agent.original": "Mozilla/5.0 (X11; Linux x86_64) bench",
    }


def export_request(spans: int, inference_every: int) -> bytes:
    """One ``ExportTraceServiceRequest``: ``spans`` spans, every ``inference_every``-th a
    chat span, trace ids ``MARKER`` + the trace's number."""
    t0 = 1_764_000_000_000_000_000
    out = []
    for i in range(spans):
        chat = i % inference_every == inference_every // 2
        attributes = _chat_attributes(i) if chat else _http_attributes(i)
        trace = MARKER + (i // SPANS_PER_TRACE).to_bytes(8, "big")
        out.append(
            trace_pb2.Span(
                trace_id=trace,
                span_id=(0x1000 + i).to_bytes(8, "big"),
                parent_span_id=b""
                if i % SPANS_PER_TRACE == 0
                else (0x1000 + i - 1).to_bytes(8, "big"),
                name="chat bench-model" if chat else "GET /api/items/{id}",
                kind=trace_pb2.Span.SPAN_KIND_CLIENT if chat else trace_pb2.Span.SPAN_KIND_SERVER,
                start_time_unix_nano=t0 + i * 1_000_000,
                end_time_unix_nano=t0 + i * 1_000_000 + 800_000,
                attributes=_attrs(attributes),
                status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_OK),
            )
        )
    resource = resource_pb2.Resource(
        attributes=_attrs(
            {
                "service.name": "checkout",
                "service.version": "1.4.2",
                "telemetry.sdk.language": "python",
                "telemetry.sdk.name": "opentelemetry",
                "telemetry.sdk.version": "1.38.0",
            }
        )
    )
    scope = common_pb2.InstrumentationScope(name="bench", version="1.0")
    request = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource, scope_spans=[trace_pb2.ScopeSpans(scope=scope, spans=out)]
            )
        ]
    )
    body = request.SerializeToString()
    if body.count(MARKER) != spans:
        raise AssertionError("the trace id marker occurs elsewhere in the body")
    return body


def wrk_script(path: Path, body: Path, start: int) -> Path:
    """wrk's Lua script posting ``body`` with trace ids of its own from ``start`` on."""
    marker = "".join(f"\\{b}" for b in MARKER)
    path.write_text(LUA % {"body": json.dumps(str(body)), "marker": f'"{marker}"', "start": start})
    return path


async def _serve(role: str) -> None:
    from aiohttp import web

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if role == "model":
        from monitor.app.demo.model import SimulatedModel

        model = SimulatedModel(drift_after_s=None, seed=3)
        await model.start()
        print(f"PORT {model.bound_port}", flush=True)
        await stop.wait()
        await model.stop()
        return
    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    async def export(request: web.Request) -> web.Response:
        trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read())
        return web.Response(body=empty, content_type="application/x-protobuf")

    app = web.Application(client_max_size=8_388_608)
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


def _spawn(role: str) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", role]
    return benchlib.spawn_with_port(cmd, f"{role} server")


def cpu_seconds(pid: int) -> float:
    """User + system time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime: fields 14 and 15


def start_relmon(
    tmp: Path, model_port: int, forward_to: str | None, tree: Path
) -> tuple[Any, int, int]:
    """``relmon run`` of ``tree`` with only the OTLP receiver (``forward_to``: the
    collector every request goes on to); its process, OTLP port and metrics port."""
    ports = {k: benchlib.free_port() for k in ("metrics", "review", "traffic", "otlp")}
    otlp = f"otlp: {{enabled: true, port: {ports['otlp']}"
    otlp += f', forward_to: "{forward_to}"}}' if forward_to else "}"
    tmp.mkdir(parents=True)
    config = tmp / "relmon.yaml"
    benchlib.relmon_config(
        config,
        model_url=f"http://127.0.0.1:{model_port}/v1",
        state_dir=tmp / "state",
        ports=ports,
        traffic_mode='"off"',
        traffic_extra=otlp,
    )
    proc = benchlib.start_relmon(config, tmp / "relmon.log", ports["metrics"], tree)
    try:
        benchlib.wait_port(ports["otlp"], proc)
    except RuntimeError:
        benchlib.stop(proc)
        raise
    return proc, ports["otlp"], ports["metrics"]


def _summary(results: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: benchlib.median([x[k] for x in results]) for k in keys} | {
        "errors": sum(x["non_2xx"] + x["socket_errors"] for x in results)
    }


class Load:
    """wrk runs, each with trace ids no earlier run used."""

    def __init__(self, tmp: Path, body: Path, spans: int) -> None:
        self.tmp, self.body, self.spans, self.runs = tmp, body, spans, 0

    def __call__(
        self, url: str, connections: int, seconds: float, pid: int | None = None
    ) -> dict[str, float]:
        self.runs += 1
        script = wrk_script(self.tmp / f"run{self.runs}.lua", self.body, self.runs << 32)
        before = cpu_seconds(pid) if pid else 0.0
        res = benchlib.wrk(url, script, connections=connections, seconds=seconds)
        res["spans"] = res["requests"] * self.spans
        res["spans_per_s"] = res["requests_per_s"] * self.spans
        if pid:
            res["cpu_s"] = cpu_seconds(pid) - before
            res["cpu_us_per_span"] = res["cpu_s"] / max(res["spans"], 1) * 1e6
            res["cpu_busy"] = res["cpu_s"] / max(1, round(seconds))  # wrk's whole seconds
        return res


def _counted(metrics_port: int) -> float:
    text = benchlib.http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    return benchlib.metric_sum(text, "relmon_otlp_spans_total")


def _log(what: str, res: dict[str, float]) -> None:
    cpu = f"  {res['cpu_us_per_span']:.2f} CPU-µs/span" if "cpu_us_per_span" in res else ""
    print(
        f"  {what:28s} {res['spans_per_s']:10,.0f} spans/s  p50 {res['p50_ms']:.2f} ms  "
        f"p99 {res['p99_ms']:.2f} ms{cpu}",
        file=sys.stderr,
        flush=True,
    )


def run(
    *, seconds: float, repeats: int, connections: int, spans: int, inference_every: int, tree: Path
) -> dict[str, Any]:
    start_machine = benchlib.machine()
    body = export_request(spans, inference_every)
    with tempfile.TemporaryDirectory(prefix="relmon-otlp-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "body.bin").write_bytes(body)
        load = Load(tmp, tmp / "body.bin", spans)
        bare, bare_port = _spawn("bare")
        model, model_port = _spawn("model")
        started: list[tuple[Any, int, int]] = []
        try:
            collector = f"http://127.0.0.1:{bare_port}"
            with ThreadPoolExecutor(2) as pool:
                jobs = [
                    pool.submit(start_relmon, tmp / name, model_port, forward, tree)
                    for name, forward in (("receiver", None), ("forward", collector))
                ]
                for job in jobs:  # every one stopped below, even if another failed
                    with contextlib.suppress(RuntimeError):
                        started.append(job.result())
            if len(started) != 2:
                raise RuntimeError(f"relmon did not start; its logs are under {tmp}")
            (relmon, relmon_port, relmon_metrics), (_, fwd_port, _) = started
            urls = {
                "bare": f"{collector}/v1/traces",
                "relmon": f"http://127.0.0.1:{relmon_port}/v1/traces",
                "direct": f"{collector}/v1/traces",
                "forward": f"http://127.0.0.1:{fwd_port}/v1/traces",
            }
            pids = {"bare": bare.pid, "relmon": relmon.pid}
            sent = 0.0
            for target in ("bare", "relmon", "direct", "forward"):  # warm-up, not reported
                res = load(urls[target], connections, 1)
                sent += res["spans"] if target == "relmon" else 0.0
            runs: dict[str, list[dict[str, float]]] = {
                k: [] for k in ("bare", "relmon", "direct", "forward")
            }
            for r in range(repeats):
                flip = r % 2 == 1
                for target in ("relmon", "bare") if flip else ("bare", "relmon"):
                    res = load(urls[target], connections, seconds, pids[target])
                    runs[target].append(res)
                    sent += res["spans"] if target == "relmon" else 0.0
                    _log(f"run {r + 1} {target} ({connections} conn)", res)
                for target in ("forward", "direct") if flip else ("direct", "forward"):
                    res = load(urls[target], 1, seconds)
                    runs[target].append(res)
                    _log(f"run {r + 1} {target} (1 conn)", res)
            # relmon counts a request's spans before it answers: all there at once.
            counted = _counted(relmon_metrics)
        finally:
            for proc, _, _ in started:
                benchlib.stop(proc)
            benchlib.stop(model)
            benchlib.stop(bare)
    keys = ("spans_per_s", "requests_per_s", "p50_ms", "p99_ms")
    throughput: dict[str, Any] = {
        t: _summary(runs[t], (*keys, "cpu_us_per_span", "cpu_busy")) for t in ("bare", "relmon")
    }
    b, m = throughput["bare"], throughput["relmon"]
    throughput["ratio"] = {
        "spans_per_s": m["spans_per_s"] / b["spans_per_s"],
        "cpu_per_span": m["cpu_us_per_span"] / b["cpu_us_per_span"],
    }
    throughput["goals"] = GOALS
    throughput["met"] = {
        "spans_per_s": throughput["ratio"]["spans_per_s"] >= GOALS["spans_per_s"],
        "cpu_per_span": throughput["ratio"]["cpu_per_span"] <= GOALS["cpu_per_span"],
    }
    forward: dict[str, Any] = {t: _summary(runs[t], keys) for t in ("direct", "forward")}
    added = [
        (f["p50_ms"] - d["p50_ms"], f["p99_ms"] - d["p99_ms"])
        for d, f in zip(runs["direct"], runs["forward"], strict=True)
    ]
    forward["added"] = {
        "p50_ms": benchlib.median([a[0] for a in added]),
        "p99_ms": benchlib.median([a[1] for a in added]),
    }
    return {
        "benchmark": "otlp",
        "load_generator": "wrk 1 thread, closed loop, its own process",
        "seconds": seconds,
        "repeats": repeats,
        "connections": connections,
        "spans_per_request": spans,
        "inference_every": inference_every,
        "request_bytes": len(body),
        "sampling_rate": 0.01,
        "machine": start_machine,
        "code": benchlib.commit_of(tree),
        "throughput": throughput,
        "forward": forward,
        "spans_sent_to_relmon": sent,
        "relmon_spans_counted": counted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--spans", type=int, default=100, help="spans per export request")
    parser.add_argument(
        "--inference-every", type=int, default=100, help="1 span in this many is a chat span"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=benchlib.ROOT,
        help="the checkout whose relmon runs (default this one; another: "
        "git archive COMMIT | tar -x -C DIR)",
    )
    parser.add_argument("--code", help="what --tree holds, for the report (default: its commit)")
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--serve", choices=["bare", "model"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.quick:
        args.seconds, args.repeats, args.connections = 1.0, 1, 4
    started = time.monotonic()
    report = run(
        seconds=args.seconds,
        repeats=args.repeats,
        connections=args.connections,
        spans=args.spans,
        inference_every=args.inference_every,
        tree=args.tree,
    )
    report["code"] = args.code or report["code"]
    report["quick"] = args.quick
    report["command"] = ".venv/bin/python bench/otlp_bench.py " + " ".join(sys.argv[1:])
    report["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        benchlib.write_json(report, args.json)
    t, f = report["throughput"], report["forward"]
    print(
        f"throughput: bare {t['bare']['spans_per_s']:,.0f} spans/s "
        f"{t['bare']['cpu_us_per_span']:.2f} CPU-µs/span | relmon "
        f"{t['relmon']['spans_per_s']:,.0f} spans/s {t['relmon']['cpu_us_per_span']:.2f} "
        f"CPU-µs/span | ratio spans/s x{t['ratio']['spans_per_s']:.2f} (goal >= 0.8), "
        f"CPU/span x{t['ratio']['cpu_per_span']:.2f} (goal <= 1.25)"
    )
    print(
        f"forward: direct p50 {f['direct']['p50_ms']:.2f} p99 {f['direct']['p99_ms']:.2f} ms | "
        f"through relmon p50 {f['forward']['p50_ms']:.2f} p99 {f['forward']['p99_ms']:.2f} ms"
        f" | added p50 {f['added']['p50_ms']:+.2f} p99 {f['added']['p99_ms']:+.2f} ms"
    )
    print(
        f"relmon counted {report['relmon_spans_counted']:,.0f} of "
        f"{report['spans_sent_to_relmon']:,.0f} spans"
    )


if __name__ == "__main__":
    main()
