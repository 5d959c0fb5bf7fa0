"""The SLO spec (``deploy/slo/relmon-slo.yaml``): read, checked, and scaled for tests.

Durations are Prometheus durations (``5m``, ``1h``, ``30d``). The burn factor of a window
pair is derived from the period, as the SRE workbook does: the share of the error budget
a page may spend in the long window, times period / long window (2% of 30 days in 1 hour
is a burn rate of 14.4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from monitor.core.errors import ConfigError

__all__ = [
    "BurnWindow",
    "SloSpec",
    "format_duration",
    "load_spec",
    "parse_duration",
]

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_duration(text: str) -> int:
    """``"5m"`` -> 300000 (milliseconds)."""
    match = _DURATION.match(str(text))
    if match is None:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 5m, 1h, 30d)")
    return int(match.group(1)) * dict(_UNITS)[match.group(2)]


def format_duration(ms: int) -> str:
    """300000 -> ``"5m"``: the largest unit that divides it."""
    if ms <= 0:
        raise ConfigError("a duration must be positive")
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("unreachable: 1 ms divides every integer")


@dataclass(frozen=True)
class BurnWindow:
    """One window pair of a multi-window, multi-burn-rate alert."""

    long_ms: int
    short_ms: int
    budget_spent: float
    period_ms: int

    @property
    def factor(self) -> float:
        return round(self.budget_spent * self.period_ms / self.long_ms, 6)

    @property
    def long(self) -> str:
        return format_duration(self.long_ms)

    @property
    def short(self) -> str:
        return format_duration(self.short_ms)

    def factor_text(self) -> str:
        return f"{self.factor:g}"


@dataclass(frozen=True)
class SloSpec:
    """Everything the rules are generated from."""

    errors: str
    total: str
    reviews: str
    objective_metric: str
    period_ms: int
    page: tuple[BurnWindow, ...]
    ticket: tuple[BurnWindow, ...]
    min_reviews: int
    min_effective_items: int
    min_coverage_verdicts: int
    deployment: tuple[str, ...]
    replica: tuple[str, ...]
    scrape_job: str
    runbook_base_url: str
    time_scale: int = 1
    """1 for the shipped rules; N divides every window, ``for:`` and offset by N (the
    test variant that end-to-end tests load: same rules, minutes become seconds)."""

    @property
    def period(self) -> str:
        return format_duration(self.period_ms)

    @property
    def windows(self) -> list[int]:
        """Every window an error ratio is recorded over, shortest first."""
        pairs = self.page + self.ticket
        return sorted({w.long_ms for w in pairs} | {w.short_ms for w in pairs})

    @property
    def slo_windows(self) -> list[int]:
        """The windows of the deployment's error ratio (dashboards, period): the shortest
        and every long window."""
        return sorted({self.windows[0]} | {w.long_ms for w in self.page + self.ticket})

    @property
    def long_windows(self) -> list[int]:
        """Every window a review count is recorded over (burn pairs' long windows and
        the 6 hours of the coverage check), shortest first."""
        return sorted({w.long_ms for w in self.page + self.ticket} | {6 * 3_600_000})

    def scaled(self, time_scale: int) -> SloSpec:
        """The test variant: every duration divided by ``time_scale``."""
        if time_scale < 1:
            raise ConfigError("--time-scale must be a positive integer")
        return replace(self, time_scale=time_scale)

    def duration(self, ms: int) -> str:
        """A duration of the shipped rules as this variant writes it."""
        scaled, rest = divmod(ms, self.time_scale)
        if rest:
            raise ConfigError(f"{format_duration(ms)} / {self.time_scale} is not a whole ms")
        return format_duration(scaled)

    def d(self, text: str) -> str:
        """``d("15m")``: a duration written in the shipped rules, in this variant."""
        return self.duration(parse_duration(text))

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_base_url}#{alert.lower()}"


def _windows(raw: Any, period_ms: int, where: str) -> tuple[BurnWindow, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: a non-empty list of {{long, short, budget_spent}}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"long", "short", "budget_spent"}:
            raise ConfigError(f"{where}[{i}]: needs exactly long, short and budget_spent")
        window = BurnWindow(
            long_ms=parse_duration(item["long"]),
            short_ms=parse_duration(item["short"]),
            budget_spent=float(item["budget_spent"]),
            period_ms=period_ms,
        )
        if window.short_ms >= window.long_ms:
            raise ConfigError(f"{where}[{i}]: the short window must be shorter than the long")
        if not 0 < window.budget_spent <= 1:
            raise ConfigError(f"{where}[{i}].budget_spent: a share of the budget in (0, 1]")
        out.append(window)
    return tuple(out)


def _positive_int(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key}: a positive integer")
    return value


def parse_spec(data: Any, source: str = "spec") -> SloSpec:
    """A spec from its parsed YAML; :class:`ConfigError` naming the field if wrong."""
    if not isinstance(data, dict) or data.get("version") != "relmon/slo/v1":
        raise ConfigError(f"{source}: not a relmon SLO spec (version: relmon/slo/v1)")
    try:
        period_ms = parse_duration(data["period"])
        sli, burn, labels = data["sli"], data["burn_rates"], data["labels"]
        spec = SloSpec(
            errors=str(sli["errors"]),
            total=str(sli["total"]),
            reviews=str(sli["reviews"]),
            objective_metric=str(data["objective_metric"]),
            period_ms=period_ms,
            page=_windows(burn.get("page"), period_ms, "burn_rates.page"),
            ticket=_windows(burn.get("ticket"), period_ms, "burn_rates.ticket"),
            min_reviews=_positive_int(data, "min_reviews"),
            min_effective_items=_positive_int(data, "min_effective_items"),
            min_coverage_verdicts=_positive_int(data, "min_coverage_verdicts"),
            deployment=tuple(str(x) for x in labels["deployment"]),
            replica=tuple(str(x) for x in labels["replica"]),
            scrape_job=str(data["scrape_job"]),
            runbook_base_url=str(data["runbook_base_url"]),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{source}: missing or malformed field {exc}") from None
    if spec.min_reviews < 20:
        raise ConfigError(f"{source}: min_reviews must be at least 20 (pages on noise)")
    return spec


def load_spec(path: Path) -> SloSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from None
    return parse_spec(data, str(path))
