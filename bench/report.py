"""Write bench/RESULTS.md from the benchmarks' JSON results (``bench/results/*.json``).

``make bench`` runs the benchmarks, each writing its JSON document, then this script;
``make soak`` writes ``soak.json`` and runs it too. A section whose document is missing
says so. Every figure is printed next to the baseline measured in the same run.

    .venv/bin/python bench/report.py [--results DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib

SECTIONS = (
    "run",
    "mirror",
    "proxy",
    "proxy_saturation",
    "proxy_apis",
    "proxy_routes",
    "proxy_data_plane",
    "dataplane_cpu",
    "loop_stall",
    "model_client",
    "isolation",
    "stopping",
    "calibration",
    "soak",
    "core",
    "kafka_scale",
    "kafka_ingest",
    "store_replicas",
    "ppi",
    "chaos_before",
    "chaos",
    "otlp",
)


def _load(results: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name in SECTIONS:
        path = results / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def _machine_line(m: dict[str, Any], end: dict[str, Any] | None = None) -> str:
    load = " / ".join(f"{x:g}" for x in m["loadavg"])
    text = (
        f"{m['cpu']}, {m['cores']} cores, {m.get('memory_gb')} GB, Python {m['python']}, "
        f"{m['os']}; {m['date']}; code at {m.get('commit', 'unknown')}; "
        f"load average (1/5/15 min) {load} at the start"
    )
    if end is not None:
        text += ", " + " / ".join(f"{x:g}" for x in end["loadavg"]) + " at the end"
    return text


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _x(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"×{v:.{digits}f}"


def _ran(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return f"Ran {m['date']} (load average {m['loadavg'][0]:g} at the start)."


def _range(s: dict[str, Any]) -> str:
    """The p99's range over the repeats: how much the machine moved it."""
    if "p99_ms_min" not in s:
        return ""
    return f" ({s['p99_ms_min']:.1f}–{s['p99_ms_max']:.1f})"


def mirror(doc: dict[str, Any]) -> list[str]:
    out = [
        "## 1. Mirror ingest",
        "",
        "relmon's mirror (`relmon run`, the whole service: default 1% sampling, budget 600 "
        "calls/min, the sampled events re-asked of a simulated model) against a bare aiohttp "
        "handler that reads the body and answers 202. Load generator: Debian's `wrk` (one "
        "thread, closed loop, its own process), both targets in alternating order in each "
        f"repeat; medians over {doc['repeats']} repeats of {doc['seconds']:g} s. "
        f"{_ran(doc)}",
        "",
    ]
    rows = []
    for load, label in (
        ("saturation", f"{doc['connections']} connections (saturation)"),
        ("one_connection", "1 connection (no queueing)"),
    ):
        s = doc[load]
        rows.append(
            [
                label,
                f"{s['bare']['requests_per_s']:,.0f}",
                f"{s['relmon']['requests_per_s']:,.0f}",
                _x(s["ratio"]["requests_per_s"]),
                f"{s['bare']['p50_ms']:.2f} / {s['bare']['p99_ms']:.2f}{_range(s['bare'])}",
                f"{s['relmon']['p50_ms']:.2f} / {s['relmon']['p99_ms']:.2f}{_range(s['relmon'])}",
                _x(s["ratio"]["p99"]),
                f"{s['bare']['errors']:.0f} / {s['relmon']['errors']:.0f}",
            ]
        )
    out += _table(
        [
            "load",
            "bare req/s",
            "relmon req/s",
            "req/s ratio",
            "bare p50 / p99 ms (p99 range)",
            "relmon p50 / p99 ms (p99 range)",
            "p99 ratio",
            "errors bare / relmon",
        ],
        rows,
    )
    c = doc["relmon_events_counted"]
    out += [
        "",
        f"relmon counted {sum(c.values()):,.0f} mirror events for the "
        f"{doc['requests_sent_to_relmon']:,.0f} requests wrk reported complete (wrk does not "
        "count the requests in flight when a run ends): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in c.items())
        + ".",
        "",
        "The requests/s ratio is the steadier figure: a p99 on this shared machine moves "
        "with other processes' bursts (see its range over the repeats).",
        "",
        *_mirror_before(doc),
        "Reproduce: `.venv/bin/python bench/mirror_bench.py`",
        "",
    ]
    return out


def _mirror_before(doc: dict[str, Any]) -> list[str]:
    """Earlier runs (``--before``), each with the ratios of its own run."""
    out = []
    for b in doc.get("before", []):
        sat, one = b["saturation"], b["one_connection"]
        out += [
            f"{b['label']} (ran {b['machine']['date']}, load average "
            f"{b['machine']['loadavg'][0]:g}): {sat['relmon']['requests_per_s']:,.0f} against "
            f"{sat['bare']['requests_per_s']:,.0f} req/s at saturation, "
            f"{_x(sat['ratio']['requests_per_s'])}; one connection "
            f"{_x(one['ratio']['requests_per_s'])}.",
            "",
        ]
    return out


def proxy(doc: dict[str, Any]) -> list[str]:
    out = [
        "## 2. Proxy overhead",
        "",
        "Open-loop load (an aiohttp client in its own process, "
        f"{doc['rate_per_s']:g} requests/s in total, {doc['duration_s']:g} s a repeat, the "
        f"first {doc['warmup_s']:g} s dropped) cycling in random order through the upstream "
        "directly, relmon's proxy (`relmon run`, 1% sampled) and nginx `proxy_pass` (Debian, "
        "one worker, keep-alive to the upstream), all in front of the same upstream. "
        f"Medians over {doc['repeats']} repeats. {_ran(doc)}",
        "",
    ]
    d = doc["direct"]
    rows = [
        [
            "direct",
            f"{d['p50_ms']:.3f}",
            f"{d['p99_ms']:.3f}",
            "",
            "",
            "",
            "",
            f"{d['errors']}",
        ]
    ]
    for target in ("relmon", "nginx"):
        t, a = doc[target], doc[f"{target}_added"]
        rows.append(
            [
                "relmon proxy" if target == "relmon" else "nginx proxy_pass",
                f"{t['p50_ms']:.3f}",
                f"{t['p99_ms']:.3f}",
                f"+{a['p50_ms']:.3f}",
                f"+{a['p99_ms']:.3f}",
                f"+{a['paired_median_ms']:.3f}",
                f"+{a['paired_p99_ms']:.3f}" if "paired_p99_ms" in a else "n/a",
                f"{t['errors']}",
            ]
        )
    out += _table(
        [
            "path",
            "p50 ms",
            "p99 ms",
            "added p50 ms",
            "added p99 ms",
            "added, paired median ms",
            "added, paired p99 ms",
            "errors",
        ],
        rows,
    )
    v = doc["relmon_vs_nginx"]
    out += [
        "",
        f"relmon against nginx: p50 {_x(v['p50_ratio'])}, p99 {_x(v['p99_ratio'])}; added "
        f"latency p50 {_x(v['added_p50_ratio'])}, p99 {_x(v['added_p99_ratio'])} of nginx's. "
        "Against the upstream directly: relmon p50 "
        f"{_x(doc['relmon_added']['p50_ratio_to_direct'])}, p99 "
        f"{_x(doc['relmon_added']['p99_ratio_to_direct'])}; nginx p50 "
        f"{_x(doc['nginx_added']['p50_ratio_to_direct'])}, p99 "
        f"{_x(doc['nginx_added']['p99_ratio_to_direct'])}. The load generator's own "
        f"scheduling lag (p99 {doc['scheduler_lag_p99_ms']:.2f} ms) is in every figure alike. "
        "*Paired*: the difference to the direct call of the same triple (started within "
        "a few milliseconds of each other), which cancels the stalls the machine puts on "
        "all three: the steadiest figures here.",
        "",
        "Reproduce: `.venv/bin/python bench/proxy_latency_bench.py`",
        "",
    ]
    return out


def _sat_row(label: str, d: dict[str, Any]) -> list[str]:
    return _target_row(label, d, "relmon")


def _target_row(label: str, d: dict[str, Any], target: str) -> list[str]:
    """One target of a run (relmon, the baseline tree's relmon, the lean proxy) beside
    the same run's nginx."""
    lat, sat = d["latency"], d["saturation"]
    r, n = lat[f"{target}_added"], lat["nginx_added"]
    x = d["ratios"] if target == "relmon" else d[f"{target}_ratios"]
    return [
        label,
        f"+{r['p50_ms']:.3f} / +{n['p50_ms']:.3f}",
        _x(x["added_p50"]),
        f"+{r['p99_ms']:.3f} / +{n['p99_ms']:.3f}",
        _x(x["added_p99"]),
        f"{sat[target]['requests_per_s']:,.0f} / {sat['nginx']['requests_per_s']:,.0f}",
        _x(x["requests_per_s"]),
        f"{sat[target]['cpu_s_per_10k']:.2f} / {sat['nginx']['cpu_s_per_10k']:.2f}",
        _x(x["cpu_per_request"]),
    ]


_SAT_HEADER = [
    "target",
    "added p50 ms target / nginx",
    "ratio",
    "added p99 ms target / nginx",
    "ratio",
    "req/s at saturation target / nginx",
    "ratio",
    "CPU-s per 10k target / nginx",
    "ratio",
]


def _same_run(doc: dict[str, Any]) -> list[str]:
    """The targets measured in one run: this code, the baseline tree's, the lean proxy."""
    built = doc.get("compiled", {})
    how = {True: ", compiled", False: ", plain Python", None: ""}
    rows = [_target_row(f"relmon, this code{how[built.get('relmon')]}", doc, "relmon")]
    if "before_ratios" in doc and doc.get("plain_baseline"):
        rows.append(_target_row("relmon, this code as plain Python", doc, "before"))
    elif "before_ratios" in doc:
        tree = Path(doc.get("baseline_tree") or "the baseline tree").name
        label = f"relmon, code before the change ({tree}{how[built.get('before')]})"
        rows.append(_target_row(label, doc, "before"))
    if "lean_ratios" in doc:
        rows.append(_target_row("`bench/lean_proxy.py`, the leanest Python proxy", doc, "lean"))
    if "plane_ratios" in doc:
        label = "relmon's data plane alone (`relmon run`'s fast path, no service)"
        rows.append(_target_row(label, doc, "plane"))
    return _table(_SAT_HEADER, rows)


def proxy_data_plane(doc: dict[str, Any]) -> list[str]:
    return [
        "### The data plane alone beside nginx, in one run",
        "",
        f"The same measurement with relmon's data plane alone ({doc['data_plane']}: its "
        f"traffic listener, {doc.get('fast_path', 'every event skipped')}, no service "
        "around it) in front of "
        f"{doc['upstream']}, beside a baseline (this code as plain Python, or the code "
        "before a change) and `bench/lean_proxy.py` "
        "(no relmon code: httptools on uvloop, every request relayed from the protocol "
        "callbacks, nothing else a proxy must do), every target in the same run. Medians "
        f"over {doc['repeats']} repeats of {doc['seconds']:g} s. {_ran(doc)}",
        "",
        *_same_run(doc),
        "",
        "Reproduce: `.venv/bin/python bench/proxy_saturation_bench.py --data-plane uvloop "
        "--upstream nginx --with-lean --plain-baseline` (or `--baseline-tree DIR`, DIR: "
        "`git archive COMMIT | tar -x -C DIR`)",
        "",
    ]


def proxy_saturation(doc: dict[str, Any]) -> list[str]:
    out = [
        "### The proxy beside nginx, with wrk",
        "",
        f"Debian's `wrk` (one thread, closed loop, a {doc['request_bytes']:,}-byte chat "
        f"request) against the upstream ({doc['upstream']}) directly, relmon's proxy "
        "(`relmon run`, 1% sampled) and nginx `proxy_pass` (one worker, keep-alive to the "
        f"upstream) in front of the same upstream. Added latency at "
        f"{doc['latency_connections']} connections: a target's p50 (p99) minus the direct "
        "call's in the same repeat, the three targets one after the other in a rotating "
        f"order; saturation at {doc['connections']} connections: requests/s and the "
        "CPU-seconds (user + system, every thread and worker) the proxy process spends per "
        f"10,000 requests. Medians over {doc['repeats']} repeats of {doc['seconds']:g} s. "
        f"{_ran(doc)}",
        "",
    ]
    same_run = "before_ratios" in doc or "lean_ratios" in doc
    if same_run and not doc.get("before"):  # no earlier runs: the one table
        out += _same_run(doc)
        return [*out, *_goals(doc)]
    rows = [_sat_row(b["label"], b) for b in doc.get("before", [])]
    rows.append(_sat_row(doc.get("label", "this run"), doc))
    out += _table(
        [
            "relmon",
            "added p50 ms relmon / nginx",
            "ratio",
            "added p99 ms relmon / nginx",
            "ratio",
            "req/s at saturation relmon / nginx",
            "ratio",
            "CPU-s per 10k relmon / nginx",
            "ratio",
        ],
        rows,
    )
    if same_run:
        out += ["", "In the same run:", "", *_same_run(doc)]
    return [*out, *_goals(doc)]


def _per_repeat(doc: dict[str, Any]) -> list[str]:
    """How many repeats met each goal, relmon against nginx within the repeat."""
    met = doc.get("repeats_meeting_goals")
    if not met:
        return []
    n = len(doc["repeat_ratios"])
    return [
        "",
        f"Within each of this run's {n} repeats (relmon against nginx in the same repeat, "
        f"minutes apart at most), the goal was met in: added p50 {met['added_p50']} of {n}, "
        f"added p99 {met['added_p99']} of {n}, requests/s {met['requests_per_s']} of {n}, "
        f"CPU per request {met['cpu_per_request']} of {n}.",
    ]


_AFTER_IDLE_OTHERS = {
    "before": "the code before the change",
    "plane": "the data plane alone",
    "lean": "the lean proxy",
}


def _after_idle(doc: dict[str, Any]) -> list[str]:
    """The first window after each target sat idle, reported apart from the table."""
    idle = doc.get("after_idle")
    if not idle:
        return []
    relmon, nginx = idle["added"]["relmon"], idle["added"]["nginx"]
    ratios = idle["added_p99_ratio"]
    others = [
        f"{name} {_x(ratios[key])}" for key, name in _AFTER_IDLE_OTHERS.items() if key in ratios
    ]
    return [
        "",
        "The table holds each target's steady window. Its first window of a repeat, right "
        "after it sat idle while the others ran (relmon: "
        f"{idle['idle_s']['relmon']:.0f} s), is measured apart: there relmon added "
        f"+{relmon['p99_ms']:.3f} ms at p99 against nginx's +{nginx['p99_ms']:.3f} "
        f"({_x(ratios['relmon'])}; p50 +{relmon['p50_ms']:.3f} against "
        f"+{nginx['p50_ms']:.3f})"
        + (f"; in their first windows, {', '.join(others)}" if others else "")
        + ". While relmon sees no traffic its re-ask budget (`budget.calls_per_minute`, a "
        "token bucket) refills, and the first sampled requests after the lull are admitted "
        "as items up to the calls it saved. Each item holds the event loop a dozen times, "
        "and each time the requests in flight wait: started at once, enough of them fall in "
        "one window to reach the p99. With `budget.pace` (the default) they start no "
        "faster than the budget refills an item's fewest calls (0.6 s apart at the "
        "default budget), about as many to a window as in steady traffic.",
    ]


def _goals(doc: dict[str, Any]) -> list[str]:
    return [
        *_per_repeat(doc),
        *_after_idle(doc),
        "",
        "Goals: added latency at most ×2 nginx's (p50 and p99), requests/s at least ×0.7, "
        "CPU per request at most ×2. Each row is one run; the ratios are within the run "
        "(load average at each run's start: "
        + ", ".join(
            f"{b.get('label', 'this run')} {b['machine']['loadavg'][0]:g}"
            for b in [*doc.get("before", []), doc]
        )
        + "). A p99 difference below 0 (nginx's p99 under the direct call's) is noise and "
        "gives no ratio.",
        "",
        "Reproduce: `.venv/bin/python bench/proxy_saturation_bench.py`",
        "",
    ]


_GOAL_NAMES = {
    "added_p50": "added p50",
    "added_p99": "added p99",
    "requests_per_s": "req/s",
    "cpu_per_request": "CPU per request",
}


def _goals_cell(met: dict[str, bool]) -> str:
    missed = [_GOAL_NAMES[k] for k, ok in met.items() if not ok]
    return f"{len(met) - len(missed)} of {len(met)}" + (
        f" (not {', '.join(missed)})" if missed else ""
    )


def _api_label(doc: dict[str, Any], name: str) -> str:
    if name == "mixed":
        return "mixed: the five in turn"
    return f"{name} (`{doc['wire'][name]['api']}`)"


def _signed(v: float) -> str:
    return f"{v:+.3f}"


def _api_row(label: str, d: dict[str, Any]) -> list[str]:
    """One API's relmon beside the same turn's nginx, with the goals it meets."""
    lat, sat, x = d["latency"], d["saturation"], d["paired_ratios"]
    r, n = lat["relmon_added"], lat["nginx_added"]
    rs, ns = sat["relmon"], sat["nginx"]
    met, count = d["repeats_meeting_goals"], len(d["repeat_ratios"])
    return [
        label,
        f"{_signed(r['p50_ms'])} / {_signed(n['p50_ms'])}",
        _x(x["added_p50"]),
        f"{_signed(r['p99_ms'])} / {_signed(n['p99_ms'])}",
        _x(x["added_p99"]),
        f"{rs['requests_per_s']:,.0f} / {ns['requests_per_s']:,.0f}",
        _x(x["requests_per_s"]),
        f"{rs['cpu_s_per_10k']:.2f} / {ns['cpu_s_per_10k']:.2f}",
        _x(x["cpu_per_request"]),
        _goals_cell(d["goals_met"]),
        " · ".join(str(met[k]) for k in _GOAL_NAMES) + f" of {count}",
    ]


def proxy_apis(doc: dict[str, Any]) -> list[str]:
    """One wrk run per wire API (``--apis``): relmon beside nginx for each, and each
    API's cost to relmon against chat's, in the same repeats."""
    names, per_api = doc["apis"], doc["per_api"]
    wires = ", ".join(
        f"{name} `POST {doc['wire'][name]['path']}` ({doc['wire'][name]['request_bytes']:,} bytes)"
        for name in names
        if name != "mixed"
    )
    out = [
        "### Every wire API beside nginx, with wrk",
        "",
        "The measurement above for each wire API relmon reads, all in one run: one "
        f"`relmon run` in proxy mode and one nginx `proxy_pass` in front of the same "
        f"static upstream ({doc['upstream']}, a `location` per API answering that API's "
        "documented JSON, matched by the end of the path so that the re-asks reach it too). "
        f"relmon's task: {doc['task']}. wrk sends each API's request, the same system text "
        f"and question in that API's shape and headers: {wires}; *mixed*: one wrk script "
        "sending the five in turn. Within a repeat the APIs take turns in a rotating "
        "order, each turn the three targets' latency windows at "
        f"{doc['latency_connections']} connections, then the two proxies at saturation "
        f"at {doc['connections']}. The figures are medians over {doc['repeats']} repeats "
        f"of {doc['seconds']:g} s; every ratio is taken within a repeat (paired: the "
        "targets' windows of one API's turn, seconds apart) and the tables give the "
        "medians of those, which the machine's drift from one turn to the next moves "
        f"less (so a ratio may differ from the quotient of the medians beside it). "
        f"{_ran(doc)}",
        "",
    ]
    head = [
        "API",
        "added p50 ms relmon / nginx",
        "ratio",
        "added p99 ms relmon / nginx",
        "ratio",
        "req/s at saturation relmon / nginx",
        "ratio",
        "CPU-s per 10k relmon / nginx",
        "ratio",
        "goals met",
        "repeats meeting p50 · p99 · req/s · CPU",
    ]
    out += _table(head, [_api_row(_api_label(doc, name), per_api[name]) for name in names])
    out += [
        "",
        "Goals, for every API and for the mix: added latency at most ×2 nginx's (p50 and "
        "p99), requests/s at least ×0.7, CPU per request at most ×2 (*goals met*: by the "
        "ratios in the row; then how many repeats met each). A p99 difference below 0 "
        "(nginx's p99 under the direct call's) is noise and gives no ratio.",
        "",
    ]
    chat = doc.get("vs_chat")
    if chat:
        tol = doc["vs_chat_tolerance"]
        rows = []
        for name in names:
            v, r = chat[name], chat[name]["relmon"]
            ok = v["no_more_than_chat"]
            rows.append(
                [
                    _api_label(doc, name),
                    _x(r["cpu_per_request"]),
                    _x(r["added_p50"]),
                    _x(r["requests_per_s"]),
                    _x(v["nginx"]["cpu_per_request"]),
                    _x(v["nginx"]["added_p50"]),
                    "yes"
                    if all(ok.values())
                    else "no ("
                    + ", ".join(_GOAL_NAMES[k] for k, good in ok.items() if not good)
                    + ")",
                ]
            )
        out += [
            "Each API against chat, the same proxy in the same repeat (medians of the "
            "paired ratios): what a request of that API costs relmon (CPU per request, "
            "added p50, requests/s at saturation) over what a chat request costs it; "
            "nginx's own ratios show what the API's bytes cost a proxy that reads none of "
            f"them. *No more than chat*: relmon's CPU and added p50 at most ×{tol:.2f} "
            "chat's. On a shared machine one repeat's paired ratio moves by more than that "
            "(nginx's columns show how much for a proxy whose cost is the same for every "
            "API): read relmon's beside them.",
            "",
            *_table(
                [
                    "API",
                    "relmon CPU per request vs chat",
                    "relmon added p50 vs chat",
                    "relmon req/s vs chat",
                    "nginx CPU per request vs chat",
                    "nginx added p50 vs chat",
                    "relmon no more than chat",
                ],
                rows,
            ),
            "",
        ]
    counts = doc.get("relmon_counts_total") or {}
    if counts:
        rows = []
        for name in names:
            c = counts[name]
            dec, calls = c.get("decisions", {}), c.get("model_calls", {})
            seen = sum(c.get("requests", {}).values())
            sampled = dec.get("sampled", 0) + dec.get("dropped", 0)
            failed = sum(v for k, v in calls.items() if k != "ok")
            rows.append(
                [
                    _api_label(doc, name),
                    ", ".join(f"`{k}` {v:,.0f}" for k, v in c.get("requests", {}).items()),
                    f"{sampled:,.0f} ({sampled / seen:.2%})" if seen else "0",
                    f"{c.get('items', {}).get('scored', 0):,.0f}",
                    f"{calls.get('ok', 0):,.0f} / {failed:,.0f}",
                ]
            )
        out += [
            "What relmon did with each API's turns (its counters read before and after each "
            "turn, all repeats; items finish a little after their turn, so they may count in "
            "the next): the requests by the API relmon recognised, those its 1% sampled "
            "(handled, or dropped while the re-ask budget was spent), the items scored and "
            "their model calls (re-asks in the event's own API to the same upstream).",
            "",
            *_table(
                [
                    "API",
                    "requests by recognised API",
                    "sampled (share)",
                    "items scored",
                    "model calls ok / failed",
                ],
                rows,
            ),
            "",
        ]
    return [
        *out,
        "Reproduce: `.venv/bin/python bench/proxy_saturation_bench.py --upstream nginx "
        f"--apis {','.join(names)}`",
        "",
    ]


def _route_match(m: dict[str, str] | str) -> str:
    return m if isinstance(m, str) else ", ".join(f"`{k}: {v}`" for k, v in m.items())


def proxy_routes(doc: dict[str, Any]) -> list[str]:
    """``--routes``: relmon with a route per API beside nginx with a location per API, and
    beside relmon with one upstream, in one run."""
    names, n = doc["apis"], doc["routes"]
    routes = "; ".join(
        f"{r['name']}: {_route_match(r['match'])} (nginx `location {r['nginx_location']}`)"
        for r in doc["route_table"]
    )
    out = [
        f"### {n} routes beside nginx's {n} locations, with wrk",
        "",
        f"The measurement above through relmon with `traffic.routes` ({n} routes, first "
        "match wins, the rest to `traffic.upstream_url`, the `default` route) and nginx with "
        f"the same `location` blocks: {routes}. Each route goes to an upstream port of its "
        "own (a server block of the static upstream each, answering as above; relmon "
        "keeps a pool of connections per route, nginx an `upstream` with keep-alive per "
        "location). In the same run, relmon with one upstream (as above) takes the same "
        f"traffic. The figures are medians over {doc['repeats']} repeats of "
        f"{doc['seconds']:g} s; every ratio is paired within a repeat. {_ran(doc)}",
        "",
    ]
    head = [
        "traffic",
        "added p50 ms relmon / nginx",
        "ratio",
        "added p99 ms relmon / nginx",
        "ratio",
        "req/s at saturation relmon / nginx",
        "ratio",
        "CPU-s per 10k relmon / nginx",
        "ratio",
        "goals met",
        "repeats meeting p50 · p99 · req/s · CPU",
    ]
    rows = []
    for name in names:
        label = _api_label(doc, name)
        rows.append(_api_row(f"{label}; relmon with {n} routes", doc["per_api"][name]))
        rows.append(_api_row(f"{label}; relmon with one upstream", doc["one_route_per_api"][name]))
    out += _table(head, rows)
    out += [
        "",
        f"nginx has its {n} locations in both rows. Goals as above: added latency at most ×2 "
        "nginx's, requests/s at least ×0.7, CPU per request at most ×2.",
        "",
        f"relmon with {n} routes against itself with one upstream (paired):",
        "",
    ]
    rows = []
    for name in names:
        y = doc["vs_one_route"][name]["paired_ratios"]
        rows.append([_api_label(doc, name), *(_x(y[k]) for k in _GOAL_NAMES)])
    out += _table(["traffic", "added p50", "added p99", "req/s", "CPU per request"], rows)
    by_route = {
        name: (doc.get("relmon_counts_total") or {}).get(name, {}).get("routes", {})
        for name in names
    }
    if any(by_route.values()):
        out += [
            "",
            "Answers relmon relayed, by route (`relmon_proxy_requests_total`, all repeats): "
            + "; ".join(
                f"{_api_label(doc, name)}: "
                + ", ".join(f"`{k}` {v:,.0f}" for k, v in by_route[name].items())
                for name in names
            )
            + ".",
        ]
    return [
        *out,
        "",
        "Reproduce: `.venv/bin/python bench/proxy_saturation_bench.py --upstream nginx "
        f"--apis {','.join(names)} --routes {n}`",
        "",
    ]


RULE_LABELS = {
    "default": "relmon default (`truncated` + futility)",
    "evalue": "relmon default before tuning (`truncated` + futility, e-value table)",
    "previous": "relmon previous default (`runner-up` + futility)",
    "fixed": "fixed K_max (baseline)",
    "paper": "the paper's rule (`hoeffding`)",
    "trustgate": "TrustGate `sequential.should_stop`",
    "esc": "Early-Stopping Self-Consistency (window 5)",
    "adaptive": "Adaptive-Consistency (Beta, 0.95)",
}


def stopping(doc: dict[str, Any]) -> list[str]:
    out = [
        "## 3. Model calls per item",
        "",
        f"k0 = {doc['k0']}, K_max = {doc['k_max']}, δ = {doc['delta']:g}; every item "
        f"replayed {doc['reps']} times, every rule on the same random draws (seed "
        f"{doc['seed']}). TrustGate (PyPI `theaios-trustgate`) is applied to relmon's canonical "
        "classes: 3 samples, then one at a time until `should_stop` holds, as its "
        "`SequentialSampler` does. Early-Stopping Self-Consistency (Li et al., 2024) samples "
        "windows of 5 and stops when a window's answers all agree; Adaptive-Consistency "
        "(Aggarwal et al., 2023) stops after any sample once its Beta criterion "
        "P(p1 > p2) ≥ 0.95 (both at most K_max; their early stops count as certified). "
        "*Wrong mode*: certified with a leader that is not the true "
        "mode (share of all items); *worst item*: its largest rate on one item (what δ "
        "bounds, item by item). *Top ≠ mode*: the top-ranked answer after "
        "stopping is not the true mode, certified or not. Deterministic (no timing).",
        "",
    ]
    descriptions = {
        "demo mix": "the demo's simulated model: right with probability 0.92 minus a "
        "difficulty of 0 (3 in 7 items), 0.05, 0.1, 0.25 or 0.45, wrong answers spread over "
        "five values: mostly easy items, some hard",
        "stress grid": "the validation grid of `relmon simulate stopping --grid`: clear modes, "
        "near ties, exact ties, long tails, equally weighted",
        "smollm2": "real answers: SmolLM2-135M, 20 answers to each of 48 questions "
        "(`bench/data/smollm2_answers.json`), replayed from their empirical distributions; "
        "used to tune",
        "smollm2 tune": "real answers to 80 more questions, 20 of each kind: arithmetic, "
        "multiple choice, capitals, other short facts (`bench/data/smollm2_tune.json`); "
        "may be used to tune",
        "smollm2 held-out": "real answers to 80 other questions of the same four kinds "
        "(`bench/data/smollm2_heldout.json`), never used to tune: the goals are read here",
    }
    for name, data in doc["datasets"].items():
        out += [f"**{name}** ({data['items']} items; {descriptions.get(name, '')})", ""]
        rows = []
        for rule, r in data["rules"].items():
            rows.append(
                [
                    RULE_LABELS.get(rule, rule),
                    f"{r['calls_per_item']:.2f}",
                    _x(r["ratio_to_fixed"]),
                    f"{r['certified']:.3f}",
                    f"{r['certified_early']:.3f}" if "certified_early" in r else "n/a",
                    f"{r['wrong_mode']:.4f}",
                    f"{r['worst_item_wrong_mode']:.4f}" if "worst_item_wrong_mode" in r else "n/a",
                    f"{r['top_not_mode']:.4f}",
                    f"{r['top_accuracy']:.3f}",
                ]
            )
        out += _table(
            [
                "rule",
                "calls/item",
                "vs fixed K_max",
                "certified",
                "certified early",
                "wrong mode",
                "worst item",
                "top ≠ mode",
                "top-answer accuracy",
            ],
            rows,
        )
        out.append("")
        if "optimum" in data:
            out += _stopping_optimum(name, data)
    tuned = doc.get("tuning")
    if tuned:
        out += [
            f"*The shipped table's choice* (`tune_table`, on {' and '.join(tuned['sets'])} "
            f"only, {tuned['streams_per_item']} streams an item, seed {tuned['seed']}): the "
            "largest pooled saving among the tables with exact level ≤ δ that certify, and "
            "certify before K_max, no less than the e-value table on each tuning set; it "
            f"chooses {tuple(tuned['chosen'])}, shipped {tuple(tuned['shipped'])}.",
            "",
        ]
    out += ["Reproduce: `.venv/bin/python bench/stopping_bench.py`", ""]
    return out


def _stopping_optimum(name: str, data: dict[str, Any]) -> list[str]:
    """The oracle of the shipped rule's class beside the shipped rule (same streams)."""
    opt = data["optimum"]
    mix = ", ".join(
        f"{tuple(t)} × {w:.2f}"
        for t, w in zip(opt["optimum_tables"], opt["optimum_weights"], strict=True)
    )
    evalue = tuple(opt.get("evalue_table", opt["shipped_table"]))
    out = [
        f"*{name}: shipped table against the oracle* ({opt['streams_per_item']} fixed streams "
        f"an item, {opt['tables']:,} monotone tables; `monitor/core/stopping_optimum.py`). "
        "Rules certifying on a monotone region of (leader, runner-up) counts with the "
        "futility stop, level at the two-class tie ≤ δ, certifying at least the e-value "
        f"table's {evalue} share of items, and before K_max at least its share. *Best single "
        f"table (oracle)*: {tuple(opt['best_table'])}, the deterministic table with the "
        "largest saving chosen with hindsight on this set: the comparator. *Randomised LP "
        f"optimum*: the mixture {mix} (level {opt['optimum_level']:.4f}); not the target, "
        "because it flips a coin per item between tables, so whether an item is certified "
        f"would depend on the coin. Shipped: {tuple(opt['shipped_table'])}.",
        "",
    ]
    rows = []
    for key, label in (
        ("shipped", "relmon default (`truncated` + futility, shipped table), same streams"),
        ("evalue", f"e-value table {evalue} (default before tuning), same streams"),
        ("best_table_row", "best single table (oracle)"),
        ("optimum", "randomised LP optimum"),
    ):
        if key not in opt:
            continue
        r = opt[key]
        rows.append(
            [
                label,
                f"{r['calls_per_item']:.2f}",
                f"{r['saving']:.1%}",
                f"{r['certified']:.3f}",
                f"{r['certified_early']:.3f}",
                f"{r['wrong_mode']:.4f}",
                f"{r['worst_item_wrong_mode']:.4f}",
            ]
        )
    out += _table(
        [
            "rule",
            "calls/item",
            "saved vs K_max",
            "certified",
            "certified early",
            "wrong mode",
            "worst item",
        ],
        rows,
    )
    return [*out, ""]


def calibration(doc: dict[str, Any]) -> list[str]:
    out = [
        "## 4. Calibration",
        "",
        "The incremental calibration window against recomputing from scratch (numpy, one "
        "sort, every weight recomputed) on the same verdicts; "
        f"{len(doc['alphas'])} alphas, half-life 1 h, review probabilities 0.1 and 1, the "
        "window full so every verdict evicts one. *Verdict* is `add` + `snapshot` (the "
        "service publishes the gauges after every applied verdict); the baseline writes "
        "the verdict into ring buffers and recomputes. *Scrape* is `snapshot`. Medians over "
        f"{doc['repeats']} repeats. {_ran(doc)}",
        "",
    ]
    rows = []
    for r in doc["sizes"]:
        rows.append(
            [
                f"{r['items']:,}",
                f"{r['add_us']:.2f}",
                f"{r['verdict_us']:.0f}",
                f"{r['naive_verdict_us']:,.0f}",
                _x(r["verdict_speedup"], 1),
                f"{r['scrape_us']:.0f}",
                f"{r['naive_scrape_us']:,.0f}",
                _x(r["scrape_speedup"], 1),
                f"{r['bytes_per_item']:.0f}",
                "yes" if r["thresholds_agree"] else "NO",
            ]
        )
    out += _table(
        [
            "window",
            "add µs",
            "verdict µs",
            "recompute verdict µs",
            "speed-up",
            "scrape µs",
            "recompute scrape µs",
            "speed-up",
            "bytes/item",
            "same thresholds",
        ],
        rows,
    )
    out += [
        "",
        "Memory per item: `tracemalloc` over filling the window, the 36-character item ids "
        "it keeps alive included. A snapshot's cost is mostly the Clopper–Pearson bound "
        "(one beta quantile), the same at any window size.",
        "",
        "Reproduce: `.venv/bin/python bench/calibration_bench.py`",
        "",
    ]
    return out


def soak(doc: dict[str, Any] | None) -> list[str]:
    out = ["## 5. Overload soak", ""]
    if doc is None:
        return [*out, "Not run yet: `make soak` (10 minutes) writes this section.", ""]
    minutes = doc["seconds"] / 60
    f = doc["final"]
    out += [
        f"`make soak` ran for **{doc['seconds']:g} s ({minutes:.1f} min)** on "
        f"{doc['machine']['date']}, code at {doc['machine'].get('commit', 'unknown')} (load "
        f"average {doc['machine']['loadavg'][0]:g} at the start): mirrored traffic at "
        f"{doc['rate_per_s']:.0f} requests/s, sampling rate "
        f"{doc['sampling_rate']:g}, budget {doc['calls_per_minute_budget']} calls/min, the "
        f"simulated model answering in {doc['model_latency_ms']:g} ms. Offered load: "
        f"{doc['budget_factor_asked']:g}× the budget at the fewest samples an item can take; "
        f"measured {doc['offered_factor_measured']:.1f}× (the items took "
        f"{doc['mean_samples_per_item']:.1f} samples on average). Load generator: an "
        "aiohttp client, open loop, in its own process, opening a new connection whenever "
        "all are busy (as a mirroring proxy does) up to "
        + (f"{doc['max_connections']} connections" if doc.get("max_connections") else "no limit")
        + "; one request in ten also went to a bare aiohttp handler answering 202, the "
        "baseline for latency and memory in the same run.",
        "",
    ]
    rss_1 = doc["rss_after_1min_mb"]
    mean = doc.get("model_calls_per_minute_mean_after_1min")
    peak = doc["model_calls_per_minute_max_after_1min"]
    overflows = doc.get("listen_overflows_machine_wide")
    rows = [
        [
            "relmon's RSS start / after 1 min / max / end",
            f"{doc['rss_start_mb']:.1f} / "
            + (f"{rss_1:.1f}" if rss_1 is not None else "n/a")
            + f" / {doc['rss_max_mb']:.1f} / {doc['rss_end_mb']:.1f} MB",
        ],
        [
            "bare 202 handler's RSS start / max / end (baseline)",
            f"{doc['bare_rss_start_mb']:.1f} / {doc['bare_rss_max_mb']:.1f} / "
            f"{doc['bare_rss_end_mb']:.1f} MB",
        ],
        [
            "queue bounds held",
            f"{'yes' if doc['queue_bound_held'] else 'NO'}: at most "
            f"{doc['in_system_max']:.0f} items admitted and unfinished (bound: queue_size + "
            f"max_in_flight = {doc['in_system_bound']})",
        ],
        [
            "model-call budget held",
            f"{'yes' if doc['budget_held'] else 'NO'}: "
            + (
                f"{mean:.0f} calls/min on average after the first minute, the busiest minute "
                f"{peak:.0f}"
                if mean is not None and peak is not None
                else "n/a (run shorter than 2 min)"
            )
            + f" (budget {doc['calls_per_minute_budget']}; a minute may also hold the calls "
            "of items admitted before it began)",
        ],
        [
            "drops counted",
            f"{f['dropped']:,.0f} dropped ({doc['dropped_share_of_sampled']:.0%} of the sampled "
            f"events), {f['sampled']:,.0f} admitted, {f['skipped']:,.0f} skipped, "
            f"{f['rejected']:,.0f} rejected",
        ],
        [
            "every request answered 202",
            f"{'yes' if doc['all_answered'] else 'NO'}: {doc['sent']:,} sent, answers "
            + ", ".join(f"{k}: {v:,}" for k, v in doc["statuses"].items()),
        ],
        [
            "every 202 counted once",
            f"{'yes' if doc['all_counted_once'] else 'NO'}: {doc['counted']:,.0f} counted",
        ],
        ["items scored / abandoned", f"{f['scored']:,.0f} / {f['abandoned']:,.0f}"],
        [
            "mirror latency p50 / p99 / max",
            f"{doc['mirror_p50_ms']:.2f} / {doc['mirror_p99_ms']:.2f} / "
            f"{doc['mirror_max_ms']:,.1f} ms; {doc['mirror_over_1s']:,} requests over 1 s",
        ],
        [
            "bare 202 handler p50 / p99 / max (baseline)",
            f"{doc['bare_p50_ms']:.2f} / {doc['bare_p99_ms']:.2f} / "
            f"{doc['bare_max_ms']:,.1f} ms; {doc['bare_over_1s']:,} of "
            f"{doc['bare_requests']:,} over 1 s; mirror p99 "
            f"{_x(doc['mirror_p99_ratio_to_bare'])} of the baseline's",
        ],
        [
            "connections opened / listen-queue overflows",
            f"{doc['connections_opened']:,} / "
            + ("n/a" if overflows is None else f"{overflows:,} (machine-wide, during the run)"),
        ],
        ["relmon alive at the end", "yes" if doc["relmon_alive_at_end"] else "NO"],
    ]
    out += _table(["what", "result"], rows)
    out += [
        "",
        "Reproduce: `make soak` (`make soak SOAK_SECONDS=120` for a shorter run).",
        "",
    ]
    return out


def core(doc: dict[str, Any]) -> list[str]:
    out = [
        "## 6. Statistics core per item",
        "",
        f"{doc['items']} items × K = {doc['k']} answers; medians of {doc['repeats']} passes; "
        f"the baseline is `collections.Counter` on the raw strings. {_ran(doc)}",
        "",
    ]
    out += _table(
        ["step", "µs/item", "vs Counter"],
        [[r["name"], f"{r['us_per_item']:.1f}", _x(r["ratio"], 1)] for r in doc["rows"]],
    )
    return [*out, "", "Reproduce: `.venv/bin/python bench/core_bench.py`", ""]


def dataplane_cpu(doc: dict[str, Any]) -> list[str]:
    labels = {
        "relmon": "relmon, a request without `X-Request-Id` (sampled by a draw)",
        "relmon_with_id": "relmon, a request with `X-Request-Id` (hashed with the task)",
        "relmon_not_event": "relmon, a `POST` to another path (no sampling)",
        "lean": "`bench/lean_proxy.py` (baseline)",
    }
    rows = [
        [labels.get(name, name), f"{us:.2f}", _x(doc["vs_lean"][name])]
        for name, us in doc["us_per_request"].items()
    ]
    built = ", compiled" if doc.get("compiled") else ", plain Python"
    return [
        "### The data plane's Python per request, without sockets",
        "",
        f"relmon's traffic listener in proxy mode (`relmon run`'s fast path, 1% sampled{built}) "
        "and `bench/lean_proxy.py`'s protocols in one process, fed a chat request's bytes "
        "and then nginx's answer through transports that only count writes: the Python a "
        "request costs, with no system call. "
        f"{doc['requests']:,} requests a repeat, medians of {doc['repeats']} repeats, the "
        f"targets interleaved. {_ran(doc)}",
        "",
        *_table(["request", "µs per request", "vs lean"], rows),
        "",
        "Reproduce: `.venv/bin/python bench/dataplane_cpu_bench.py`",
        "",
    ]


def loop_stall(doc: dict[str, Any]) -> list[str]:
    """Section 2: the event-loop callbacks of a whole relmon run that held the live path."""
    before = doc.get("baseline_commit") or doc.get("baseline_tree")
    labels = {"relmon": "relmon (this code)", "before": f"before ({before})"}
    trees = doc["trees"]
    rows = [
        [
            labels.get(name, name),
            f"{s['long_callbacks_per_10k']:.1f}",
            f"{s['held_ms_per_10k']:.2f}",
            f"{s['p99_ms']:.3f}",
            f"{s['requests_per_s']:,.0f}",
        ]
        for name, s in trees.items()
    ]
    out = [
        "### What held the live path: the event loop's long callbacks",
        "",
        f"A whole `relmon run` in proxy mode (1% sampled, budget 600 calls a minute) in front "
        f"of nginx, wrk at {doc['connections']} connections for {doc['seconds']:g} s, on "
        "asyncio's own loop so that every callback can be timed: the callbacks that held "
        f"the loop over {doc['threshold_us']:g} µs, per 10,000 requests. Each held the "
        "requests then in flight; a change in relmon's own work stands out of this count's "
        "spread between repeats where wrk's p99 often cannot. Only many of them show in "
        "the added p99: a task that held the loop for 200 µs eight times every 0.6 s (more "
        "than the items below hold it) left relmon's added p99 where it was (0.26 against "
        "0.32 ms with no such task, medians of 12 repeats). A task's step is named by its "
        "coroutine and the stretch it ran: from where it had waited to where it waits next "
        "(function:line). "
        f"Medians of {doc['repeats']} repeats, the trees alternating. {_ran(doc)}",
        "",
        *_table(
            [
                "relmon run",
                f"callbacks over {doc['threshold_us']:g} µs",
                "ms held",
                "p99 (ms)",
                "requests/s",
            ],
            rows,
        ),
        "",
    ]
    for name, s in trees.items():
        calls = ", ".join(
            f"`{c['callback']}` {c['count']} ({c['ms']:.0f} ms)" for c in s["by_callback"][:4]
        )
        out.append(f"- {labels.get(name, name)}, the longest in all repeats: {calls}.")
    return [
        *out,
        "",
        "Reproduce: `.venv/bin/python bench/loop_stall_bench.py [--baseline-tree PATH]`",
        "",
    ]


def model_client(doc: dict[str, Any]) -> list[str]:
    labels = {
        "relmon": "relmon's model client (`HttpModelClient`)"
        + (", compiled" if doc.get("compiled") else ""),
        "aiohttp": "bare `aiohttp.ClientSession` (baseline)",
    }
    rows = [
        [
            labels.get(name, f"`HttpModelClient` of {name} (`{doc['trees'][name]}`)"),
            f"{s['cpu_us_per_call']:.1f}",
            f"{s['calls_per_s']:,.0f}",
            _x(doc["ratios_to_aiohttp"][name]["cpu_per_call"]),
        ]
        for name, s in doc["summary"].items()
    ]
    out = [
        "### The model client: CPU per re-ask call",
        "",
        "A sampled item's re-asks run on the event loop that serves the live traffic, so "
        "each call's CPU is taken from the proxy. Calls to nginx answering a fixed chat "
        f"completion, {doc['concurrency']} at a time, {doc['calls']:,} per target and "
        f"repeat, medians of {doc['repeats']} repeats, each target in its own process on "
        f"uvloop. {_ran(doc)}",
        "",
        *_table(["client", "CPU-µs per call", "calls/s", "CPU vs bare aiohttp"], rows),
    ]
    return [*out, "", "Reproduce: `.venv/bin/python bench/model_client_bench.py`", ""]


def isolation(doc: dict[str, Any]) -> list[str]:
    def cells(v: dict[str, Any]) -> list[str]:
        if v["added_p50_ms"] is None:
            return ["", "", ""]
        return [f"+{v['added_p50_ms']:.2f}", f"+{v['added_p99_ms']:.2f}", f"{v['max_ms']:.1f}"]

    rows = [
        [
            f"`{plane}`",
            *cells(doc[plane]["cold"]),
            *cells(doc[plane]["warm"]),
            f"{doc['items_scored'][plane]:.0f}",
        ]
        for plane in ("inline", "process")
    ]
    head = ["`traffic.data_plane`", "cold: added p50 ms", "p99", "slowest ms"]
    head += ["warm: added p50 ms", "p99", "slowest ms", "items scored"]
    out = [
        "### relmon's own work and the live requests: one process or two",
        "",
        "Two `relmon run` in proxy mode, the same configuration but for "
        f"`traffic.data_plane`, the `{doc['canonicalizer']}` canonicalizer (cache off: "
        "every item embeds its answers on the CPU), half the traffic sampled, in front of "
        "the demo's simulated model (a second one answers the re-asks). Open loop, "
        f"{doc['rate_per_s']:g} requests/s, half to relmon and half to the upstream "
        "directly (the added latency is against those), "
        f"{doc['duration_s']:g} s windows alternating between the two, {doc['repeats']} "
        "each. Cold: the first window (the model is loaded at start, its first encodes run "
        f"in it); warm: the median of the others. {_ran(doc)}",
        "",
        *_table(head, rows),
    ]
    return [*out, "", "Reproduce: `.venv/bin/python bench/isolation_bench.py`", ""]


def kafka_scale(doc: dict[str, Any] | None) -> list[str]:
    out = ["## 7. Kafka scale-out and replay", ""]
    if doc is None:
        return [
            *out,
            "No results yet: `make bench-kafka` (about 10 minutes, not part of `make bench`) "
            "writes this section.",
            "",
        ]
    m = doc["machine"]
    out += [
        f"`make bench-kafka` ran on {m['date']}, code at {m.get('commit', 'unknown')} (load "
        f"average {m['loadavg'][0]:g} at the start), on {doc['cpu_count']} cores shared by the "
        "Tansu broker (in memory), a simulated model, the load and every relmon replica"
        + (" (a `--quick` smoke run: its figures say nothing)." if doc.get("quick") else "."),
        "",
    ]
    r = doc.get("replicas")
    if r is not None:
        med = r["median_events_per_s"]
        out += [
            f"**Replicas.** {r['events']:,} events of about {r['event_bytes']} bytes in "
            f"{r['partitions']} partitions, drained by 1 and by 2 `relmon run` processes in "
            "a fresh consumer group each time (1% hash-sampled, decided from the id, task "
            "and model before an event is parsed; the sampled events re-asked of the "
            "model), and by a bare `AIOKafkaConsumer` loop (`json.loads` per record, "
            f"nothing else) in the same run; medians over {r['repeats']} alternating repeats, "
            "the group join not counted. relmon's rate is read off its `/metrics` every "
            "0.2 s, the bare loop's from its own records. A second replica on the same two "
            "cores cannot double anything: the ratio shows what the group split costs or "
            "gains.",
            "",
        ]
        out += _table(
            ["consumer", "events/s", "vs bare loop", "vs 1 replica"],
            [
                ["bare aiokafka loop (baseline)", f"{med['bare']:,.0f}", "×1.00", ""],
                ["1 relmon replica", f"{med['1']:,.0f}", _x(r["ratio_1_to_bare"]), "×1.00"],
                [
                    "2 relmon replicas",
                    f"{med['2']:,.0f}",
                    _x(r["ratio_2_to_bare"]),
                    _x(r["ratio_2_to_1"]),
                ],
            ],
        )
        out.append("")
    replay = doc.get("replay")
    if replay:
        out += [
            "**Replay at restart.** N review items and N verdicts on their topics; the time a "
            "restarted replica needs to rebuild its calibration from them "
            "(`KafkaCalibrationStore.load_records`: read both topics to the end, parse, score) "
            "against a bare `AIOKafkaConsumer` loop reading the same two topics with "
            "`json.loads` per record, alternating, medians.",
            "",
        ]
        out += _table(
            ["verdicts", "bare read s", "relmon replay s", "ratio", "relmon verdicts/s"],
            [
                [
                    f"{x['verdicts']:,}",
                    f"{x['bare_s']:.2f}",
                    f"{x['relmon_s']:.2f}",
                    _x(x["ratio"]),
                    f"{x['verdicts'] / x['relmon_s']:,.0f}",
                ]
                for x in replay
            ],
        )
        out.append("")
    return [*out, "Reproduce: `make bench-kafka`", ""]


def kafka_ingest(doc: dict[str, Any] | None) -> list[str]:
    """Section 7's subsection: one whole ``relmon run`` against the bare loop (issue 22)."""
    if doc is None or "ingest" not in doc:
        return []
    m, r = doc["machine"], doc["ingest"]
    trees = r.get("trees", {"relmon": "."})
    labels = ", ".join(f"`{label}`" for label in trees)
    out = [
        "### One whole `relmon run` against the bare loop (issue 22)",
        "",
        f"`bench/kafka_ingest_bench.py` ran on {m['date']}, code at "
        f"{m.get('commit', 'unknown')} (load average {m['loadavg'][0]:g} at the start): "
        f"{r['events']:,} events of about {r['event_bytes']} bytes in {r['partitions']} "
        "partitions drained from offset 0 in a fresh group by one `relmon run` process "
        f"(1% hash-sampled; runs of {labels}) and by a bare `AIOKafkaConsumer` loop "
        "(`getmany` + `json.loads`) in a process of its own, alternating, medians of "
        f"{r['repeats']} repeats. CPU per event is user + system time of the consumer's "
        'process from `/proc`, over the same span as its rate; "until done" also waits '
        "for the sampled items' model calls."
        + (" (A `--quick` smoke run: its figures say nothing.)" if doc.get("quick") else "")
        + (f" {doc['note']}" if doc.get("note") else ""),
        "",
    ]
    med, bare = r["median"], r["median"]["bare"]
    rows = [
        [
            "bare aiokafka loop (baseline)",
            f"{bare['events_per_s']:,.0f}",
            f"{bare['cpu_us_per_event']:.2f}",
            "×1.00",
            "×1.00",
            "",
        ]
    ]
    for label in trees:
        s, q = med[label], r["ratios"][label]
        rows.append(
            [
                f"`relmon run` ({label})",
                f"{s['events_per_s']:,.0f}",
                f"{s['cpu_us_per_event']:.2f}",
                _x(q["events_per_s"]),
                _x(q["events_per_cpu_s"]),
                f"{_x(q['done_events_per_s'])}, {_x(q['done_events_per_cpu_s'])}",
            ]
        )
    out += _table(
        [
            "consumer",
            "events/s",
            "CPU µs/event",
            "events/s vs bare",
            "events per CPU-s vs bare",
            "until done: both",
        ],
        rows,
    )
    command = doc.get("command", ".venv/bin/python bench/kafka_ingest_bench.py")
    out += [
        "",
        f"Reproduce: `{command}` (`make bench-kafka` runs it on the working tree alone; "
        "`--tree before=DIR` adds the code of DIR, such as `git archive HEAD | tar -x -C DIR`)",
        "",
    ]
    return out


def store_replicas(doc: dict[str, Any] | None) -> list[str]:
    out = ["## 8. Shared store: 3 replicas on PostgreSQL", ""]
    if doc is None:
        return [
            *out,
            "No results yet: `make bench-store` (about 2 minutes, not part of `make bench`) "
            "writes this section.",
            "",
        ]
    m, sq, pg = doc["machine"], doc["sqlite_1"], doc["postgres_3"]
    out += [
        f"`make bench-store` ran on {m['date']}, code at {m.get('commit', 'unknown')} (load "
        f"average {m['loadavg'][0]:g} at the start). Three relmon replicas (each a "
        "`MonitorService` with its store and its verdict follower, LISTEN/NOTIFY with the "
        "2 s poll as fallback) on one local PostgreSQL, against one replica on SQLite "
        "(WAL, `synchronous=FULL`), the baseline, in the same run. The replicas share one "
        "process and the database the same 2 cores; PostgreSQL runs with `fsync=off` as "
        "in the tests"
        + (" (a `--quick` smoke run: its figures say nothing)." if doc.get("quick") else "."),
        "",
        f"**Throughput.** {doc['verdicts']:,} verdicts, 8 at a time, spread over the "
        "replicas; the clock stops when every replica's window holds them all.",
        "",
    ]
    out += _table(
        ["store", "verdicts/s applied everywhere", "vs SQLite"],
        [
            ["SQLite, 1 replica (baseline)", f"{sq['verdicts_per_s']:,.0f}", "×1.00"],
            ["PostgreSQL, 3 replicas", f"{pg['verdicts_per_s']:,.0f}", _x(doc["throughput_ratio"])],
        ],
    )
    out += [
        "",
        "**Convergence.** One verdict at a time on a random replica: the time from the call "
        "until every replica exports the same level with it in its window (for SQLite, the "
        "call itself).",
        "",
    ]
    rows = [
        ("SQLite, 1 replica (baseline)", sq["convergence"]),
        ("PostgreSQL, 3 replicas, notices", pg["convergence"]),
        ("PostgreSQL, 3 replicas, polling only (`sync_s` 2 s)", pg["convergence_polling"]),
    ]
    out += _table(
        ["store", "verdicts", "median ms", "p99 ms", "max ms"],
        [
            [
                name,
                str(c["count"]),
                f"{c['median_ms']:.1f}",
                f"{c['p99_ms']:.1f}",
                f"{c['max_ms']:.1f}",
            ]
            for name, c in rows
        ],
    )
    return [*out, "", "Reproduce: `make bench-store`", ""]


def ppi(doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return [
            "## 9. Judge-assisted bound: coverage and width, any judge",
            "",
            "No results yet: `.venv/bin/python bench/ppi_bench.py` writes this section.",
            "",
        ]
    rows = doc["rows"]
    grid = [r for r in rows if r["items"] == doc["items"]]
    extra = [r for r in rows if r["items"] != doc["items"]]
    worst = min(rows, key=lambda r: r["relmon_coverage"])
    worst_prev = min(rows, key=lambda r: r["previous_coverage"])
    widest = max(rows, key=lambda r: r["relmon_vs_human"])
    out = [
        "## 9. Judge-assisted bound: coverage and width, any judge",
        "",
        f"`bench/ppi_bench.py`: simulated windows of {doc['items']:,} judged items, "
        f"{doc['seeds']:,} seeds a row, one-sided {1 - doc['delta']:.0%} bounds, every method "
        "on the same draws. *relmon*: `relmon_reliability_lower_bound_ppi` (Clopper–Pearson "
        "carried over to the judge's strata, one pseudo-failure shared); *previous*: the "
        "previous release's bound (Agresti–Coull per stratum, normal sum); *human-only*: "
        "`relmon_reliability_lower_bound` on the same reviews; *plain PPI*: the PPI paper's "
        "normal interval. *Coverage*: share of seeds whose bound is at or below the true "
        "level; *× human*: mean distance under the true level over the human-only one's "
        "(under ×1 is tighter). Review probabilities equal, or 3× where the judge says no. "
        f"Judges (P(yes | right), P(yes | wrong)): {_judges(doc)}.",
        "",
        f"Lowest coverage over every row: relmon {worst['relmon_coverage']:.3f} "
        f"({worst['judge']}, level {worst['p']}, {worst['reviews']:.0f} reviews); previous "
        f"{worst_prev['previous_coverage']:.3f} ({worst_prev['judge']}, level "
        f"{worst_prev['p']}, {worst_prev['reviews']:.0f} reviews). Widest against the "
        f"human-only bound: relmon {_x(widest['relmon_vs_human'])} ({widest['judge']}, level "
        f"{widest['p']}, {widest['reviews']:.0f} reviews, "
        f"{'3× where no' if widest['unequal'] else 'equal'}; the human-only bound covers "
        f"{widest['human_coverage']:.3f} there). Ran in {doc['seconds']:.0f} s.",
        "",
    ]
    head = [
        "level",
        "judge",
        "reviews",
        "probabilities",
        "relmon coverage",
        "× human",
        "previous coverage",
        "× human",
        "human-only coverage",
        "plain PPI coverage",
    ]

    def line(r: dict[str, Any]) -> list[str]:
        return [
            f"{r['p']:g}",
            r["judge"],
            f"{r['reviews']:.0f}" + ("" if r["items"] == doc["items"] else f" of {r['items']:,}"),
            "3× where no" if r["unequal"] else "equal",
            f"{r['relmon_coverage']:.3f}",
            _x(r["relmon_vs_human"]),
            f"{r['previous_coverage']:.3f}",
            _x(r["previous_vs_human"]),
            f"{r['human_coverage']:.3f}",
            f"{r['plain_coverage']:.3f}",
        ]

    out += ["**By judge**, over its rows (coverage: the lowest; × human: median and range):", ""]
    out += _table(
        ["judge", "relmon coverage", "relmon × human", "previous coverage", "previous × human"],
        [_by_judge(name, [r for r in rows if r["judge"] == name]) for name in doc["judges"]],
    )
    out += ["", "**Every row:**", ""]
    out += _table(head, [line(r) for r in grid + extra])
    return [*out, "", "Reproduce: `.venv/bin/python bench/ppi_bench.py` (about 15 minutes)", ""]


def _by_judge(name: str, rows: list[dict[str, Any]]) -> list[str]:
    def spread(key: str) -> str:
        values = sorted(r[key] for r in rows)
        middle = values[len(values) // 2]
        return f"{_x(middle)} ({_x(values[0])}–{_x(values[-1])})"

    return [
        name,
        f"{min(r['relmon_coverage'] for r in rows):.3f}",
        spread("relmon_vs_human"),
        f"{min(r['previous_coverage'] for r in rows):.3f}",
        spread("previous_vs_human"),
    ]


def _judges(doc: dict[str, Any]) -> str:
    return "; ".join(f"{name} ({a:g}, {b:g})" for name, (a, b) in doc["judges"].items())


CHAOS_COLUMNS = (
    "fault",
    "sent",
    "scored",
    "queued",
    "lost (not scored + not queued)",
    "verdicts applied / acked",
    "ready after (s)",
    "caught up after (s)",
    "log lines above info",
    "/readyz not ready: for how long, saying",
)


def chaos_table(rows: list[dict[str, Any]]) -> list[str]:
    """``bench/chaos.py``'s rows as a markdown table (the script prints the same)."""

    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f}"

    return _table(
        list(CHAOS_COLUMNS),
        [
            [
                f"{r['fault']} ({r['outage_s']:g} s)",
                str(r["sent"]),
                str(r["scored"]),
                str(r["queued"]),
                f"{r['lost']} ({r['not_scored']} + {r['scored_not_queued']})",
                f"{r['applied']} / {r['acked']}",
                s(r["ready_s"]),
                s(r["caught_up_s"]),
                str(r.get("log_lines_warning_or_error", "")),
                _not_ready(r),
            ]
            for r in rows
        ],
    )


def _not_ready(r: dict[str, Any]) -> str:
    said = "; ".join(r["readyz_while_not_ready"]).replace("|", "/")
    return f"{r['not_ready_s']:.1f} s: {said}" if said else "(stayed 200)"


def chaos(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    """Section 10: ``bench/chaos.py``, the code before a change beside the code after."""
    docs = [d for d in (before, after) if d is not None]
    if not docs:
        return []
    out = [
        "## 10. Outages of the store and the broker",
        "",
        "`bench/chaos.py`: one `relmon run` process per fault, every request sampled and "
        "every scored item sent to review, the demo's simulated model, an automated reviewer "
        "answering every item through the review API. PostgreSQL faults: mirrored traffic, "
        "`store.backend: postgres`; the server stopped (`pg_ctl stop -m fast`) or every "
        "process of it killed with `kill -9`, then started again. Kafka faults: traffic from "
        "a topic on Tansu (in memory; SQLite store); the broker cut off (a relay in front of "
        "it drops every connection and stops listening, its data kept) or rebuilt (killed; "
        "a new empty one started after the outage, the topic recreated with one partition "
        "more: offsets restart at 0). *sent*: requests the mirror answered 202 or events the "
        "broker acknowledged; *queued*: review items in relmon's store; *lost*: sent − queued "
        "(never scored + scored but never queued); *applied*: verdicts stored, of those the "
        "review API acknowledged; *ready after*: from the end of the fault to the first "
        "`/readyz` 200 after which it stayed 200 (0: it never left 200; never: not ready by the "
        "end); *caught up after*: from the end of the fault until relmon keeps up again, the "
        "first moment from which, at every later look, every item sent by then was in the "
        "review queue 2 s later (never: some are missing for good); *log lines above info*: "
        "relmon's warnings and errors over the whole run.",
        "",
    ]
    for doc in docs:
        m = doc["machine"]
        out += [
            f"**{doc['label']}** (code at {doc.get('code', 'unknown')}; ran {m['date']}, load "
            f"average {m['loadavg'][0]:g} at the start; {doc['rate_per_s']:g} requests/s, "
            f"{doc['warmup_s']:g} s before the fault, {doc['tail_s']:g} s of traffic after "
            f"it; {doc['seconds']:.0f} s in all): `{doc['command']}`",
            "",
            *chaos_table(doc["rows"]),
            "",
        ]
    if after is None:
        out += [
            "The code after the change: `.venv/bin/python bench/chaos.py --json "
            "bench/results/chaos.json` (the same faults and lengths) adds its table here.",
            "",
        ]
    return out


def otlp(doc: dict[str, Any] | None) -> list[str]:
    """Section 11: the OTLP/HTTP receiver beside a bare decoder, and ``forward_to``'s
    added latency."""
    if doc is None:
        return []
    t, f = doc["throughput"], doc["forward"]
    b, r, x, goals = t["bare"], t["relmon"], t["ratio"], t["goals"]
    out = [
        "## 11. OTLP/HTTP receiver",
        "",
        f"`bench/otlp_bench.py`: OTLP protobuf export requests of {doc['spans_per_request']} "
        f"spans ({doc['request_bytes']:,} bytes; 1 span in {doc['inference_every']} a GenAI "
        "chat span with its messages, the others HTTP server spans; trace ids new in every "
        "request) posted by Debian's `wrk` (one thread, closed loop, its own process) to "
        "`relmon run` with `traffic.otlp` alone (one task, sampling rate "
        f"{doc['sampling_rate']:g}, code at {doc.get('code', 'unknown')}) and to a bare "
        "aiohttp handler that decodes the body (`ExportTraceServiceRequest.FromString`) and "
        f"answers 200, alternating, at {doc['connections']} connections. CPU per span: user "
        "+ system time of the server's process from `/proc` over the same run. Medians over "
        f"{doc['repeats']} repeats of {doc['seconds']:g} s. {_ran(doc)}"
        + (" (A `--quick` smoke run: its figures say nothing.)" if doc.get("quick") else ""),
        "",
    ]
    out += _table(
        ["server", "spans/s", "CPU µs/span", "p50 / p99 ms", "errors"],
        [
            [
                label,
                f"{s['spans_per_s']:,.0f}",
                f"{s['cpu_us_per_span']:.2f}",
                f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f}",
                f"{s['errors']:.0f}",
            ]
            for label, s in (("bare decoder (baseline)", b), ("relmon's receiver", r))
        ],
    )
    verdict = {True: "met", False: "missed"}
    out += [
        "",
        f"relmon against the bare decoder: spans/s {_x(x['spans_per_s'])} (goal ≥ "
        f"×{goals['spans_per_s']:g}: {verdict[t['met']['spans_per_s']]}), CPU per span "
        f"{_x(x['cpu_per_span'])} (goal ≤ ×{goals['cpu_per_span']:g}: "
        f"{verdict[t['met']['cpu_per_span']]}). relmon counted "
        f"{doc['relmon_spans_counted']:,.0f} spans for the {doc['spans_sent_to_relmon']:,.0f} "
        "wrk reported sent (wrk does not count the requests in flight when a run ends). "
        f"The servers kept {b['cpu_busy']:.2f} (bare) and {r['cpu_busy']:.2f} (relmon) of a "
        "core busy: below 1, the machine (the load generator and other processes on the "
        "same 2 shared cores) bounds the rate, so CPU per span is the steadier ratio.",
        "",
        "`forward_to`: the same requests at one connection to the bare handler as a "
        "collector, directly and through a second `relmon run` forwarding to it, alternating; "
        "added: relmon's figure minus the direct one's in the same repeat.",
        "",
    ]
    d, w, a = f["direct"], f["forward"], f["added"]
    out += _table(
        ["path", "p50 ms", "p99 ms", "errors"],
        [
            [
                "client → collector",
                f"{d['p50_ms']:.2f}",
                f"{d['p99_ms']:.2f}",
                f"{d['errors']:.0f}",
            ],
            [
                "client → relmon → collector",
                f"{w['p50_ms']:.2f}",
                f"{w['p99_ms']:.2f}",
                f"{w['errors']:.0f}",
            ],
            ["added by relmon", f"+{a['p50_ms']:.2f}", f"+{a['p99_ms']:.2f}", ""],
        ],
    )
    command = doc.get("command", ".venv/bin/python bench/otlp_bench.py")
    return [*out, "", f"Reproduce: `{command}`", ""]


def render(docs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`bench/report.py`, from `bench/results/*.json`); the "
        "overload soak by `make soak`. Every figure stands next to a baseline measured in "
        "the same run, and the ratio between them is what to read: the machine is shared "
        "(2 cores, other engineers' test suites running at the same time), so absolute "
        "times move from run to run. Timings are medians over repeats.",
        "",
    ]
    run = docs.get("run")
    if run is not None:
        lines += [
            "Machine of the last `make bench` run: "
            + _machine_line(run["machine"], run.get("machine_end")),
            "",
        ]
    for name, fn in (
        ("mirror", mirror),
        ("proxy", proxy),
        ("stopping", stopping),
        ("calibration", calibration),
    ):
        if name in docs:
            lines += fn(docs[name])
        else:
            lines += [f"## {name}", "", "Not run: `make bench` writes this section.", ""]
        if name == "proxy" and "proxy_saturation" in docs:
            lines += proxy_saturation(docs["proxy_saturation"])
        if name == "proxy" and "proxy_apis" in docs:
            lines += proxy_apis(docs["proxy_apis"])
        if name == "proxy" and "proxy_routes" in docs:
            lines += proxy_routes(docs["proxy_routes"])
        if name == "proxy" and "proxy_data_plane" in docs:
            lines += proxy_data_plane(docs["proxy_data_plane"])
        if name == "proxy" and "dataplane_cpu" in docs:
            lines += dataplane_cpu(docs["dataplane_cpu"])
        if name == "proxy" and "loop_stall" in docs:
            lines += loop_stall(docs["loop_stall"])
        if name == "proxy" and "model_client" in docs:
            lines += model_client(docs["model_client"])
        if name == "proxy" and "isolation" in docs:
            lines += isolation(docs["isolation"])
    lines += soak(docs.get("soak"))
    if "core" in docs:
        lines += core(docs["core"])
    lines += kafka_scale(docs.get("kafka_scale"))
    lines += kafka_ingest(docs.get("kafka_ingest"))
    lines += store_replicas(docs.get("store_replicas"))
    lines += ppi(docs.get("ppi"))
    lines += chaos(docs.get("chaos_before"), docs.get("chaos"))
    lines += otlp(docs.get("otlp"))
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=benchlib.RESULTS)
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "RESULTS.md")
    parser.add_argument("--begin", action="store_true", help="record the machine: a run starts")
    parser.add_argument("--end", action="store_true", help="record the machine: a run ended")
    args = parser.parse_args()
    run = args.results / "run.json"
    if args.begin:
        args.results.mkdir(parents=True, exist_ok=True)
        run.write_text(json.dumps({"machine": benchlib.machine()}, indent=2) + "\n")
        return
    if args.end and run.exists():
        doc = json.loads(run.read_text())
        run.write_text(json.dumps(doc | {"machine_end": benchlib.machine()}, indent=2) + "\n")
    args.out.write_text(render(_load(args.results)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
