"""The model client's CPU per call: what each re-ask costs the event loop that also
serves the live traffic (issue 22: a sampled item's calls delayed the proxy's requests).

The upstream is nginx answering a fixed chat completion (``proxy_saturation_bench``'s,
the cheapest server there is). Each target runs in a process of its own, on uvloop
(relmon's loop), makes ``--calls`` calls with 4 at a time after a warm-up, and reports
the CPU-seconds it spent (``time.process_time``) and the calls per second:

* ``relmon``: :class:`adapters.model.client.HttpModelClient` of this checkout (compiled
  when ``make compile`` has run);
* ``aiohttp``: a bare ``aiohttp.ClientSession`` posting the same body and parsing the
  JSON, no retries, breaker or limits: the floor of a client built on aiohttp, which
  relmon's was until this benchmark;
* ``--tree NAME=PATH``: ``HttpModelClient`` of another checkout (``git worktree add PATH
  COMMIT``), say the one before a change: before/after from the same run.

Targets run one after the other in a rotating order, ``--repeats`` times; medians and
ratios to ``aiohttp`` of the same run are reported.

    .venv/bin/python bench/model_client_bench.py [--calls 20000] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # no relmon module: a target process loads its tree's (--serve-one)

CONCURRENCY = 4


async def _calls(target: str, url: str, calls: int, tree: str) -> dict[str, float]:
    from proxy_saturation_bench import REQUEST  # after the tree's path is first

    request = json.loads(REQUEST)
    if target == "aiohttp":
        import aiohttp  # only this target loads it

        body = json.dumps({**request, "stream": False}).encode()
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONCURRENCY),
            headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
        )

        async def one() -> None:
            async with session.post(f"{url}/v1/chat/completions", data=body) as resp:
                answer = json.loads(await resp.read())
            assert answer["choices"][0]["message"]["content"] == "42"

        close = session.close
    else:
        try:
            from adapters.model import client as module  # the tree's
        except ImportError:  # a tree from before the wire APIs (adapters/openai)
            from adapters.openai import client as module  # type: ignore[no-redef]

        assert module.__file__ is not None and module.__file__.startswith(tree)
        HttpModelClient = getattr(module, "HttpModelClient", None) or module.OpenAIClient

        client = HttpModelClient(
            base_url=f"{url}/v1", model="bench-model", api_key="k", concurrency=CONCURRENCY,
            forward=True,
        )  # fmt: skip

        async def one() -> None:
            assert await client.sample(request, 1) == ["42"]

        close = client.aclose

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    await asyncio.gather(*(worker(200 // CONCURRENCY) for _ in range(CONCURRENCY)))  # warm-up
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(calls // CONCURRENCY) for _ in range(CONCURRENCY)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await close()
    done = calls // CONCURRENCY * CONCURRENCY
    return {"calls": done, "cpu_us_per_call": cpu / done * 1e6, "calls_per_s": done / wall}


def _run_target(target: str, tree: Path, url: str, calls: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--serve-one", target, url, str(calls), str(tree)],
        cwd=tree, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{target} failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH, another checkout")
    parser.add_argument("--serve-one", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1000 calls, 1 repeat")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.serve_one:
        target, url, calls, tree = args.serve_one
        sys.path.insert(0, tree)  # before the editable install's finder: that tree's code
        print(json.dumps(uvloop.run(_calls(target, url, int(calls), tree))))
        return
    if args.quick:
        args.calls, args.repeats = 1000, 1
    from proxy_saturation_bench import start_static_upstream

    trees = {"relmon": benchlib.ROOT, "aiohttp": benchlib.ROOT}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="relmon-model-bench-") as tmp:
        port = benchlib.free_port()
        upstream = start_static_upstream(Path(tmp) / "upstream", port)
        try:
            names = list(trees)
            for r in range(args.repeats):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    target = "aiohttp" if name == "aiohttp" else "relmon"
                    res = _run_target(target, trees[name], f"http://127.0.0.1:{port}", args.calls)
                    runs[name].append(res)
                    print(
                        f"  repeat {r + 1} {name}: {res['cpu_us_per_call']:.1f} CPU-us/call, "
                        f"{res['calls_per_s']:,.0f} calls/s",
                        flush=True,
                    )
        finally:
            benchlib.stop(upstream)
    summary = {
        name: {
            "cpu_us_per_call": benchlib.median([r["cpu_us_per_call"] for r in rs]),
            "calls_per_s": benchlib.median([r["calls_per_s"] for r in rs]),
        }
        for name, rs in runs.items()
    }
    base = summary["aiohttp"]
    ratios = {
        name: {
            "cpu_per_call": s["cpu_us_per_call"] / base["cpu_us_per_call"],
            "calls_per_s": s["calls_per_s"] / base["calls_per_s"],
        }
        for name, s in summary.items()
    }
    for name, s in summary.items():
        print(
            f"{name:>10}: {s['cpu_us_per_call']:.1f} CPU-us per call, {s['calls_per_s']:,.0f}"
            f" calls/s | x{ratios[name]['cpu_per_call']:.2f} the CPU of bare aiohttp"
        )
    doc: dict[str, Any] = {
        "benchmark": "model_client",
        "quick": args.quick,
        "calls": args.calls,
        "repeats": args.repeats,
        "concurrency": CONCURRENCY,
        "compiled": benchlib.compiled(),
        "trees": {name: str(path) for name, path in trees.items()},
        "runs": runs,
        "summary": summary,
        "ratios_to_aiohttp": ratios,
        "machine": benchlib.machine(),
    }
    benchlib.write_json(doc, args.json)


if __name__ == "__main__":
    main()
