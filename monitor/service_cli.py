"""``relmon run``, ``relmon check-config`` and ``relmon demo``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import structlog

from monitor.config import effective_settings, load_settings

__all__ = ["add_service_parsers"]


def _run(args: argparse.Namespace) -> int:
    from monitor.runner import configure_logging, run_service

    settings = load_settings(args.config)
    configure_logging(settings.log_format)
    return asyncio.run(
        run_service(settings, drain=args.drain, idle_s=args.idle_s, metrics_out=args.metrics_out)
    )


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    print(json.dumps(effective_settings(settings), indent=2, sort_keys=True))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from monitor.demo import run_demo
    from monitor.runner import configure_logging

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
        )
    )


def add_service_parsers(sub: Any) -> None:
    run = sub.add_parser("run", help="run the monitoring service", description="Run the service.")
    run.add_argument("--config", type=Path, help="YAML settings file (tasks, sources, review)")
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
        "check-config", help="validate a config and print the effective settings (secrets masked)"
    )
    check.add_argument("--config", type=Path)
    check.set_defaults(handler=_check_config)

    demo = sub.add_parser(
        "demo", help="simulated model, traffic, reviewer and the service on one machine"
    )
    demo.add_argument("--state-dir", type=Path, help="keep state here (survives restarts)")
    demo.add_argument("--no-auto-review", action="store_true", help="review by hand at /review")
    demo.add_argument(
        "--drift-after", type=float, default=120.0, help="seconds until the model degrades"
    )
    demo.add_argument("--duration", type=float, help="stop after this many seconds")
    demo.add_argument("--summary-every", type=float, default=5.0)
    demo.add_argument("--rate", type=float, default=10.0, help="traffic requests per second")
    demo.add_argument("--metrics-port", type=int, default=9108)
    demo.add_argument("--review-port", type=int, default=9109)
    demo.add_argument("--traffic-port", type=int, default=9110)
    demo.add_argument("--verbose", action="store_true", help="log every item")
    demo.set_defaults(handler=_demo)
