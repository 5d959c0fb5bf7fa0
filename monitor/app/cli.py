"""relmon: conformal reliability monitoring for LLMs.

Every expected failure (bad arguments, bad input files, bad configuration) is reported
on stderr as ``relmon: error: ...`` lines (one per problem) with exit status 2; never
a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from monitor import __version__
from monitor.app.certify_cli import add_certify_parser
from monitor.app.service_cli import add_service_parsers
from monitor.app.simulate.cli import add_simulate_parser
from monitor.app.slo_cli import add_slo_parser
from monitor.app.verdicts_cli import add_verdicts_parser
from monitor.core.errors import RelmonError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in relmon's one-line form."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"relmon: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:

    parser = _Parser(prog="relmon", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"relmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_certify_parser(sub)
    add_simulate_parser(sub)
    add_service_parsers(sub)
    add_verdicts_parser(sub)
    add_slo_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        status: int = args.handler(args)
    except RelmonError as exc:
        for line in str(exc).splitlines() or [""]:
            print(f"relmon: error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `relmon ... | head`
        return 0
    return status
