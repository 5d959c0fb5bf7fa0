"""``relmon slo generate``: the Prometheus rules from the SLO spec."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from monitor.app.slo import generate, load_spec
from monitor.core.errors import ConfigError

__all__ = ["add_slo_parser"]

DEFAULT_SPEC = Path("deploy/slo/relmon-slo.yaml")


def _generate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if args.runbook_base_url:
        spec = replace(spec, runbook_base_url=args.runbook_base_url)
    if args.time_scale != 1:
        spec = spec.scaled(args.time_scale)
    files = generate(spec)
    if args.check:
        stale = [
            name
            for name, text in files.items()
            if not (args.out / name).is_file()
            or (args.out / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"relmon: {args.out / name} differs from what {args.spec} generates")
        return 1 if stale else 0
    if not args.out.is_dir():
        raise ConfigError(f"--out {args.out}: not a directory")
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / name}", file=sys.stderr)
    return 0


def add_slo_parser(sub: Any) -> None:
    slo = sub.add_parser("slo", help="Prometheus rules from relmon's SLO spec")
    slo_sub = slo.add_subparsers(dest="slo_command", required=True, parser_class=type(slo))
    gen = slo_sub.add_parser(
        "generate",
        help="write relmon-recording.rules.yml and relmon-alerts.rules.yml from the spec",
    )
    gen.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="the SLO spec (YAML)")
    gen.add_argument(
        "--out", type=Path, default=Path("deploy/prometheus"), help="directory of the rules"
    )
    gen.add_argument(
        "--runbook-base-url", default="", help="where deploy/RUNBOOK.md is served (overrides)"
    )
    gen.add_argument(
        "--time-scale",
        type=int,
        default=1,
        help="TEST VARIANT: divide every window, for: and offset by N (e.g. 60: 1h -> 1m)",
    )
    gen.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files differ"
    )
    gen.set_defaults(handler=_generate)
