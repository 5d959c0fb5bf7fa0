"""relmon run, relmon check-config and relmon demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import structlog
import uvloop

from monitor.app.demo import run_demo
from monitor.app.logs import configure_logging
from monitor.app.probe import listener_problems, probe_endpoints, store_problems
from monitor.app.runner import run_service
from monitor.app.validation import validate_settings
from monitor.config import effective_settings, load_settings
from monitor.core.errors import ConfigError

__all__ = ["add_service_parsers"]


def _run(args: argparse.Namespace) -> int:

    settings = load_settings(args.config)
    configure_logging(settings.log_format)
    # uvloop unless traffic.uvloop is false: the proxy's data plane spent ~15% less CPU
    # per request on it (bench/proxy_saturation_bench.py --data-plane uvloop|asyncio).
    factory = uvloop.new_event_loop if settings.traffic.uvloop else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(
            run_service(
                settings, drain=args.drain, idle_s=args.idle_s, metrics_out=args.metrics_out
            )
        )


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    warnings = validate_settings(settings)  # exactly what `relmon run` checks at start
    store, pending = (
        asyncio.run(store_problems(settings)) if settings.store.backend == "postgres" else ([], [])
    )
    warnings += [f"{settings._source}: {w}" for w in pending]
    busy = listener_problems(settings) + store
    if busy:
        raise ConfigError("\n".join(f"{settings._source}: {p}" for p in busy))
    print(json.dumps(effective_settings(settings), indent=2, sort_keys=True))
    for warning in warnings:
        print(f"relmon: warning: {warning}", file=sys.stderr)
    if args.probe:
        lines = asyncio.run(probe_endpoints(settings))
        for line in lines:
            print(f"relmon: probe: {line}", file=sys.stderr)
        if any(": FAILED: " in line for line in lines):
            return 2
    return 0


def _demo(args: argparse.Namespace) -> int:
    print(
        f"relmon demo: starting; metrics will be at http://127.0.0.1:{args.metrics_port}/metrics"
        f", the review page at http://127.0.0.1:{args.review_port}/review",
        flush=True,
    )

    configure_logging("console")
    if not args.verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return asyncio.run(
        run_demo(
            state_dir=args.state_dir,
            auto_reviewer=not args.no_auto_review,
            drift_after_s=args.drift_after,
            duration_s=args.duration,
            summary_every_s=args.summary_every,
            rate_per_s=args.rate,
            metrics_port=args.metrics_port,
            review_port=args.review_port,
            traffic_port=args.traffic_port,
            model_port=args.model_port,
        )
    )


def add_service_parsers(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run the monitoring service",
        description="Run the service until SIGTERM or Ctrl-C. The settings are validated "
        "first, exactly as check-config does, before any port is bound.",
    )
    run.add_argument(
        "--config", type=Path, help="YAML settings file (tasks, sources, review, budget)"
    )
    run.add_argument(
        "--drain", action="store_true", help="exit once traffic, work and verdicts are idle"
    )
    run.add_argument(
        "--idle-s", type=float, default=3.0, help="quiet time that ends --drain (default 3)"
    )
    run.add_argument(
        "--metrics-out", type=Path, help="write the final /metrics exposition here at exit"
    )
    run.set_defaults(handler=_run)

    check = sub.add_parser(
        "check-config",
        help="validate a config and print the effective settings (secrets masked)",
        description="Run every check `relmon run` runs at start (fields, canonicalizers, "
        "the re-asked model, the review token, Kafka, the call budget) and check that each "
        "listener's port is free, without creating a file; print the effective settings as "
        "JSON with secrets masked. Problems: one line each naming the field, exit status 2. "
        "Warnings (the budget cannot fit tasks' expected_events_per_s): on stderr, exit "
        "status 0. With --probe, also send one small request to each task's endpoint, in "
        "the task's wire API as a re-ask goes, and say what came back (exit status 2 if one "
        "failed).",
    )
    check.add_argument("--config", type=Path, help="YAML settings file")
    check.add_argument(
        "--probe",
        action="store_true",
        help="send one small request to each task's model endpoint, in its wire API, and "
        "report the answer",
    )
    check.set_defaults(handler=_check_config)

    demo = sub.add_parser(
        "demo", help="simulated model, traffic, reviewer and the service on one machine"
    )
    demo.add_argument("--state-dir", type=Path, help="keep state here (survives restarts)")
    demo.add_argument("--no-auto-review", action="store_true", help="review by hand at /review")
    demo.add_argument(
        "--drift-after", type=float, default=120.0, help="seconds until the model degrades (120)"
    )
    demo.add_argument("--duration", type=float, help="stop after this many seconds")
    demo.add_argument(
        "--summary-every", type=float, default=5.0, help="seconds between summary lines (5)"
    )
    demo.add_argument("--rate", type=float, default=10.0, help="traffic requests per second")
    demo.add_argument("--metrics-port", type=int, default=9108, help="/metrics port (9108)")
    demo.add_argument("--review-port", type=int, default=9109, help="review API port (9109)")
    demo.add_argument(
        "--traffic-port",
        type=int,
        default=9110,
        help="traffic port: the inline proxy the demo's requests go through (9110)",
    )
    demo.add_argument(
        "--model-port",
        type=int,
        default=0,
        help="the simulated model's port (default 0: any free port; printed at start)",
    )
    demo.add_argument("--verbose", action="store_true", help="log every item")
    demo.set_defaults(handler=_demo)
