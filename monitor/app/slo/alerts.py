"""The reliability alerts: the lower bound, the anytime-valid alarm, the burn rates (the
multi-window, multi-burn-rate form of the SRE workbook), "too few reviews to know", and
the live coverage check. Each judges every replica on its own evidence and then takes
the worst replica of a deployment (``min`` of a level, ``max`` of an error ratio or an
alarm), so no healthy replica hides a failing one, and no deployment another."""

from __future__ import annotations

from monitor.app.slo.recording import Labels
from monitor.app.slo.render import Group, Rule
from monitor.app.slo.spec import BurnWindow, SloSpec

__all__ = ["WHO", "alert_annotations", "reliability_groups"]

WHO = "{{ $labels.task }} on {{ $labels.model }}{{ with $labels.namespace }} in {{ . }}{{ end }}"


def alert_annotations(spec: SloSpec, alert: str, summary: str, description: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook_url": spec.runbook(alert)}


def _burning(w: BurnWindow, spec: SloSpec) -> str:
    """One window pair, per replica: both windows above factor x budget."""
    f = w.factor_text()
    long, short = spec.duration(w.long_ms), spec.duration(w.short_ms)
    return (
        f"relmon_replica:sli_error:ratio_rate{long} > {f} * relmon_replica:error_budget:ratio\n"
        f"and relmon_replica:sli_error:ratio_rate{short} > {f} * relmon_replica:error_budget:ratio"
    )


def _burn_expr(windows: tuple[BurnWindow, ...], spec: SloSpec, lab: Labels) -> str:
    branches = [
        _burning(w, spec)
        + f"\nand relmon_replica:reviews:increase{spec.duration(w.long_ms)} >= {spec.min_reviews}"
        for w in windows
    ]
    body = "\n  or\n".join("  " + b.replace("\n", "\n  ") for b in branches)
    return f"max by ({lab.deployment}) (\n{body}\n)"


def _pairs_text(windows: tuple[BurnWindow, ...], spec: SloSpec) -> str:
    return " or ".join(
        f"{w.factor_text()}x ({spec.duration(w.long_ms)} and {spec.duration(w.short_ms)})"
        for w in windows
    )


def _burn_rules(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    fast, slow = _pairs_text(spec.page, spec), _pairs_text(spec.ticket, spec)
    comment = (
        f"SLO period {spec.period}: a burn rate b spends the error budget (1 - target) b "
        f"times faster than the period allows; each factor = the share of the budget a pair "
        f"may spend x period / its long window. A pair fires on a replica only with at "
        f"least {spec.min_reviews} reviewed items in its long window (else "
        f"RelmonTooFewReviews). An error ratio cannot exceed 1, so a factor b fires only "
        f"when b x (1 - target) < 1; the lower-bound alert and the alarm cover low targets."
    )
    return (
        Rule(
            "RelmonErrorBudgetBurnFast",
            _burn_expr(spec.page, spec, lab),
            alert=True,
            comment=comment,
            labels={"severity": "critical"},
            annotations=alert_annotations(
                spec,
                "RelmonErrorBudgetBurnFast",
                f"{WHO}: top-answer error budget burning fast",
                f"Wrong top answers are using the error budget at more than {fast} the "
                f"sustainable rate, on at least {spec.min_reviews} reviewed items; the error "
                "ratio is {{ $value | humanizePercentage }}.",
            ),
        ),
        Rule(
            "RelmonErrorBudgetBurnSlow",
            _burn_expr(spec.ticket, spec, lab),
            alert=True,
            labels={"severity": "warning"},
            annotations=alert_annotations(
                spec,
                "RelmonErrorBudgetBurnSlow",
                f"{WHO}: top-answer error budget burning",
                f"Wrong top answers are using the error budget at more than {slow} the "
                f"sustainable rate, on at least {spec.min_reviews} reviewed items; the error "
                "ratio is {{ $value | humanizePercentage }}.",
            ),
        ),
    )


def _too_few_expr(spec: SloSpec, lab: Labels) -> str:
    parts = []
    for w in spec.page + spec.ticket:
        burning = _burning(w, spec).replace("\n", "\n    ")
        parts.append(
            f"(\n  max by ({lab.deployment}) (\n    {burning}\n  )\n"
            f"  unless relmon:reviews:increase{spec.duration(w.long_ms)} >= {spec.min_reviews}\n)"
        )
    parts.append(
        f"(\n  max by ({lab.deployment}) (relmon_reliability_alarm == 1)\n"
        f"  unless max by ({lab.deployment}) (relmon_calibration_items) >= {spec.min_reviews}\n)"
    )
    seg = f"{lab.deployment}, segment"
    parts.append(
        f"(\n  max by ({seg}) (relmon_segment_reliability_alarm == 1)\n"
        f"  unless max by ({seg}) (relmon_segment_calibration_items) >= {spec.min_reviews}\n)"
    )
    return "\nor\n".join(parts)


def _too_few(spec: SloSpec, lab: Labels) -> Rule:
    return Rule(
        "RelmonTooFewReviews",
        _too_few_expr(spec, lab),
        alert=True,
        comment="A page held back: a burn-rate pair (page or ticket) is crossed, or the "
        f"alarm (of the task, or of a segment) is raised, but the deployment has fewer than "
        f"{spec.min_reviews} reviewed items (of the task, or of the segment) in that window "
        "(no replica has more). A warning, not a page.",
        labels={"severity": "warning"},
        annotations=alert_annotations(
            spec,
            "RelmonTooFewReviews",
            f"{WHO}: answers look wrong, but too few reviews to know",
            "The top-answer error ratio is above a burn-rate threshold, or the reliability "
            f"alarm is raised, but on fewer than {spec.min_reviews} reviewed items: too few "
            "reviews to know. relmon does not page on so little evidence; raise review_rate "
            "or get the review queue worked to find out.",
        ),
    )


def _below_target(spec: SloSpec, lab: Labels) -> Rule:
    return Rule(
        "RelmonReliabilityBelowTarget",
        f"""
        min by ({lab.deployment}) (
          relmon_reliability_lower_bound
          and relmon_calibration_effective_items >= {spec.min_effective_items}
        )
        < slo:objective:ratio
        """,
        alert=True,
        comment="Judged on the certified (95% one-sided) lower bound, not on the point "
        "value, of every replica whose window holds enough effective items; min by "
        "deployment: replicas share one calibration and export the same bound, and when "
        "one lags or diverges the lowest decides, never the best. The level does not "
        "exist before a task's first verdict, so nothing fires on an empty window.",
        for_=spec.d("15m"),
        labels={"severity": "critical"},
        annotations=alert_annotations(
            spec,
            "RelmonReliabilityBelowTarget",
            f"{WHO}: reliability cannot be certified at its target",
            "The 95% lower bound on the probability that the top answer is acceptable is "
            "{{ $value | humanizePercentage }}, below the task's target. relmon can no longer "
            "certify that {{ $labels.model }} meets its reliability target on "
            "{{ $labels.task }}.",
        ),
    )


def _alarm(spec: SloSpec, lab: Labels) -> Rule:
    return Rule(
        "RelmonReliabilityAlarm",
        f"""
        max by ({lab.deployment}) (
          relmon_reliability_alarm == 1
          and relmon_calibration_items >= {spec.min_reviews}
        )
        """,
        alert=True,
        comment="The anytime-valid e-detector (false-alarm rate controlled although it is "
        f"checked at every scrape), on a replica with at least {spec.min_reviews} reviewed "
        "items in its window; max by deployment: any replica's alarm.",
        labels={"severity": "critical"},
        annotations=alert_annotations(
            spec,
            "RelmonReliabilityAlarm",
            f"{WHO}: reliability dropped below target (anytime-valid alarm)",
            "The sequential change detector on reviewed items has crossed its threshold: "
            "the evidence that the share of accepted top answers fell below the target is "
            "strong enough to page, with the false-alarm rate controlled at every moment.",
        ),
    )


def _segment_alarm(spec: SloSpec, lab: Labels) -> Rule:
    return Rule(
        "RelmonSegmentReliabilityAlarm",
        f"""
        max by ({lab.deployment}, segment) (
          relmon_segment_reliability_alarm == 1
          and relmon_segment_calibration_items >= {spec.min_reviews}
        )
        """,
        alert=True,
        comment="The anytime-valid e-detector of one segment (tasks[].segments), at "
        "alarm_alpha / (max + 2): the false-alarm rate is held over all the segments of a "
        f"task together, not per segment. Behind the same volume gate as the task's alarm, "
        f"on the segment's own items: at least {spec.min_reviews} reviewed items of the "
        "segment in a replica's window; max by deployment and segment: any replica's alarm.",
        labels={"severity": "critical"},
        annotations=alert_annotations(
            spec,
            "RelmonSegmentReliabilityAlarm",
            f"{WHO}: reliability dropped below target in segment "
            "{{ $labels.segment }} (anytime-valid alarm)",
            "The sequential change detector on the reviewed items of segment "
            "{{ $labels.segment }} has crossed its threshold: the evidence that the share of "
            "accepted top answers in that segment fell below the task's target is strong "
            "enough to page, with the false-alarm rate controlled at every moment over all "
            "the task's segments together.",
        ),
    )


def _coverage(spec: SloSpec, lab: Labels) -> Rule:
    w6h = spec.d("6h")
    return Rule(
        "RelmonCoverageBelowPromise",
        f"""
        min by ({lab.deployment}, alpha) (
          relmon_replica:coverage:ratio_rate{w6h}
            < relmon_replica:coverage_target:ratio
              - 3 * sqrt(
                  relmon_replica:coverage_target:ratio * (1 - relmon_replica:coverage_target:ratio)
                  / on ({lab.replica}) group_left relmon_replica:reviews:increase{w6h}
                )
          and on ({lab.replica})
            relmon_replica:reviews:increase{w6h} >= {spec.min_coverage_verdicts}
        )
        """,
        alert=True,
        comment="Realised coverage over 6 hours below 1 - alpha by more than three binomial "
        "standard deviations, with n the applied verdicts (unweighted), per replica; min by "
        "deployment.",
        for_=spec.d("30m"),
        labels={"severity": "warning"},
        annotations=alert_annotations(
            spec,
            "RelmonCoverageBelowPromise",
            f"{WHO}: conformal sets at alpha={{{{ $labels.alpha }}}} cover less than promised",
            "Over the last 6 hours the served prediction sets at alpha={{ $labels.alpha }} "
            "contained an accepted answer for only {{ $value | humanizePercentage }} of the "
            "reviewed items, below 1 - alpha by more than noise (3 standard deviations).",
        ),
    )


def reliability_groups(spec: SloSpec) -> list[Group]:
    lab = Labels(spec)
    return [
        Group(
            "relmon-reliability",
            (
                _below_target(spec, lab),
                _alarm(spec, lab),
                _segment_alarm(spec, lab),
                _too_few(spec, lab),
                _coverage(spec, lab),
            ),
        ),
        Group("relmon-slo-burn", _burn_rules(spec, lab)),
    ]
