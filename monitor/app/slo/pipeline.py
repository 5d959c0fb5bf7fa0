"""The calibration, pipeline and scrape alerts. Calibration alerts are per deployment
(its replicas share one calibration); process-health alerts (model calls, breaker,
drops, rejections, lost review items, source restarts, scrape health) are per replica:
each relmon process has its own, and a sum over replicas would let healthy ones dilute a
failing one."""

from __future__ import annotations

from monitor.app.slo.alerts import WHO, alert_annotations
from monitor.app.slo.recording import Labels
from monitor.app.slo.render import Group, Rule
from monitor.app.slo.spec import SloSpec

__all__ = ["pipeline_groups"]

_PROC = "relmon {{ $labels.pod }}{{ if not $labels.pod }}{{ $labels.instance }}{{ end }}"


def _alert(  # noqa: PLR0917 (an alert's six parts, in the order they are read)
    spec: SloSpec,
    name: str,
    expr: str,
    severity: str,
    summary: str,
    description: str,
    *,
    for_: str | None = None,
    comment: str = "",
) -> Rule:
    return Rule(
        name,
        expr,
        alert=True,
        comment=comment,
        for_=spec.d(for_) if for_ else None,
        labels={"severity": severity},
        annotations=alert_annotations(spec, name, summary, description),
    )


def _calibration(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    d, w1h, w6h = lab.deployment, spec.d("1h"), spec.d("6h")
    return (
        _alert(
            spec,
            "RelmonThresholdInflated",
            f"""
            max by ({d}, alpha) (relmon_conformal_threshold)
              > max by ({d}, alpha) (relmon_conformal_threshold offset {spec.d("1d")})
            """,
            "warning",
            f"{WHO}: conformal threshold at alpha={{{{ $labels.alpha }}}} grew since yesterday",
            "The threshold M* at alpha={{ $labels.alpha }} is {{ $value }}, larger than a day "
            "earlier: more candidate answers are needed to cover an acceptable one, which is "
            "how a less reliable model shows in the sets.",
            for_="1h",
            comment="M* grew against a day earlier (+Inf counts as larger than any finite "
            "value); max by deployment: the largest replica's threshold, now and then.",
        ),
        _alert(
            spec,
            "RelmonSetSizeInflated",
            f"relmon:set_size:mean{w1h} > 1.5 * relmon:set_size:mean{w1h} offset {spec.d('1d')}",
            "warning",
            f"{WHO}: mean prediction set size 1.5x a day earlier",
            'The mean set size at the task\'s target level is {{ $value | printf "%.2f" }}, '
            "more than 1.5 times the same hour a day earlier.",
            for_="1h",
        ),
        _alert(
            spec,
            "RelmonCalibrationStale",
            f"""
            relmon:reviews:increase{w6h} == 0
            and sum by ({d}) (increase(relmon_items_total{{outcome="scored"}}[{w6h}])) > 0
            and max by ({d}) (relmon_reviews_total offset {w6h}) >= 0
            """,
            "warning",
            f"{WHO}: no verdicts for 6 hours",
            "Items are being scored and sent to review but no verdict has been applied in 6 "
            "hours: the calibration window is ageing and the thresholds drift toward +Inf.",
            for_="30m",
            comment="Items scored, no verdict applied for 6 hours, and the series are at "
            "least 6 hours old (not a fresh start still awaiting reviews).",
        ),
        _alert(
            spec,
            "RelmonEffectiveItemsLow",
            f"min by ({d}) (relmon_calibration_effective_items) < {spec.min_effective_items}",
            "warning",
            f'{WHO}: only {{{{ $value | printf "%.0f" }}}} effective calibration items',
            "The decayed, review-weighted calibration window holds fewer than "
            f"{spec.min_effective_items} effective items: thresholds are wide (often +Inf) "
            "and the lower bound is loose.",
            for_="1h",
        ),
        _alert(
            spec,
            "RelmonReviewBacklogGrowing",
            f"""
            max by ({d}) (relmon_review_queue_depth) > 50
            and max by ({d}) (delta(relmon_review_queue_depth[{w1h}])) > 0
            """,
            "warning",
            f"{WHO}: review backlog of {{{{ $value }}}} and growing",
            "More than 50 review items are waiting and the queue grew over the last hour: "
            "reviewers are not keeping up with the review rate.",
            for_="1h",
        ),
    )


def _model_calls(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    r, w10m = lab.replica, spec.d("10m")
    return (
        _alert(
            spec,
            "RelmonModelErrorsHigh",
            f"""
            sum by ({r}) (rate(relmon_model_calls_total{{outcome!~"ok|circuit_open"}}[{w10m}]))
            /
            sum by ({r}) (rate(relmon_model_calls_total{{outcome!="circuit_open"}}[{w10m}]))
            > 0.1
            """,
            "warning",
            f"{WHO}: {{{{ $value | humanizePercentage }}}} of model calls fail on {_PROC}",
            "More than 10% of relmon's calls to the model endpoint failed (timeouts, 429, "
            "5xx, connection or invalid responses) over 10 minutes; items are abandoned.",
            for_="10m",
            comment="Per replica (each calls the endpoint on its own). Calls refused by the "
            "open circuit are not counted here (RelmonCircuitOpen is).",
        ),
        _alert(
            spec,
            "RelmonCircuitOpen",
            f"max by ({r}) (relmon_circuit_open) == 1",
            "warning",
            f"{WHO}: circuit to the model endpoint open on {_PROC}",
            "relmon stopped calling the model endpoint after repeated failures; no items "
            "are re-asked by this replica until it closes.",
            for_="5m",
            comment="Per replica: each has its own circuit breaker.",
        ),
    )


def _events(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    p, r, w15m = lab.process, lab.replica, spec.d("15m")
    return (
        _alert(
            spec,
            "RelmonEventsDropped",
            f"""
            sum by ({p}, source) (rate(relmon_traffic_events_total{{decision="dropped"}}[{w15m}]))
            /
            sum by ({p}, source) (
              rate(relmon_traffic_events_total{{decision=~"sampled|dropped"}}[{w15m}])
            )
            > 0.05
            """,
            "warning",
            f"{_PROC} drops {{{{ $value | humanizePercentage }}}} of sampled "
            "{{ $labels.source }} traffic",
            "More than 5% of the events chosen by the sampling rate were dropped because the "
            "call budget or the queue was full. The estimate stays unbiased, but it is built "
            "from fewer items than configured.",
            for_="15m",
        ),
        _alert(
            spec,
            "RelmonEventsRejected",
            f"""
            sum by ({p}, source) (rate(relmon_traffic_events_total{{decision="rejected"}}[{w15m}]))
            /
            sum by ({p}, source) (rate(relmon_traffic_events_total[{w15m}]))
            > 0.01
            """,
            "warning",
            f"{_PROC} rejects {{{{ $value | humanizePercentage }}}} of "
            "{{ $labels.source }} events as malformed",
            "More than 1% of incoming events could not be parsed (Kafka: sent to the "
            "dead-letter topic). A producer is probably sending a changed format.",
            for_="15m",
        ),
        _alert(
            spec,
            "RelmonReviewItemsLost",
            f"sum by ({r}) (increase(relmon_review_outbox_dropped_total[{w15m}])) > 0",
            "warning",
            f"{WHO}: scored items lost on {_PROC}, its review outbox is full",
            "The review store or topic refused writes for longer than the review outbox "
            "holds (review.outbox_max_items): scored items were dropped and will never be "
            "reviewed.",
            comment="Per replica: each keeps its own outbox. Any drop fires (it should stay 0).",
        ),
    )


def _consumers(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    p, w, w15m, w1h = lab.process, lab.workload, spec.d("15m"), spec.d("1h")
    restarts = "relmon_source_restarts_total"
    return (
        _alert(
            spec,
            "RelmonKafkaConsumerLagGrowing",
            f"""
            sum by ({w}, topic) (
              max by ({w}, topic, partition) (relmon_kafka_consumer_lag)
            ) > 1000
            and
            sum by ({w}, topic) (
              max by ({w}, topic, partition) (deriv(relmon_kafka_consumer_lag[{w15m}]))
            ) > 0
            """,
            "warning",
            "relmon{{ with $labels.namespace }} in {{ . }}{{ end }} is {{ $value }} records "
            "behind on {{ $labels.topic }} and falling further behind",
            "The consumer lag on {{ $labels.topic }} is above 1000 records and still grew "
            "over 15 minutes: relmon consumes slower than the topic is written.",
            for_="15m",
            comment="Per deployment (one consumer group): each traffic partition is owned by "
            "one replica, the review topics are followed by all, so max by partition counts "
            "each once.",
        ),
        _alert(
            spec,
            "RelmonSourceRestarting",
            f"""
            max by ({p}, source) (
              max_over_time({restarts}[{w1h}]) - min_over_time({restarts}[{w1h}]) > 2
              and resets({restarts}[{w1h}]) == 0
            )
            """,
            "warning",
            f"{_PROC}: its {{{{ $labels.source }}}} source was restarted "
            '{{ $value | printf "%.0f" }} times in the last hour',
            "relmon's {{ $labels.source }} source (kafka: the traffic consumer; verdicts: the "
            "verdict follower) failed and was restarted more than twice in an hour. It stops "
            "until each restart succeeds, so events or verdicts are handled late.",
            comment="More than 2 restarts within the hour, counted exactly: increase() "
            "extrapolates (2 restarts seen over part of the window read as 2.4 and fired). "
            "A counter reset (relmon itself restarted) is left to RelmonDown.",
        ),
    )


def _up(spec: SloSpec, lab: Labels) -> tuple[Rule, ...]:
    job = f'up{{job="{spec.scrape_job}"}}'
    return (
        _alert(
            spec,
            "RelmonDown",
            f"min by ({lab.process}) ({job}) == 0",
            "critical",
            f"{_PROC} is down",
            "Prometheus cannot scrape relmon at {{ $labels.instance }}: nothing is "
            "monitored by this replica, and with a single replica no reliability alert "
            "can fire.",
            for_="5m",
        ),
        _alert(
            spec,
            "RelmonAbsent",
            f"absent({job})",
            "critical",
            "relmon is not scraped at all",
            f'No scrape target with job="{spec.scrape_job}" exists: the monitor is not '
            "deployed, or its ServiceMonitor / scrape configuration is missing.",
            for_="10m",
        ),
    )


def pipeline_groups(spec: SloSpec) -> list[Group]:
    lab = Labels(spec)
    return [
        Group("relmon-calibration", _calibration(spec, lab)),
        Group(
            "relmon-pipeline",
            _model_calls(spec, lab) + _events(spec, lab) + _consumers(spec, lab),
        ),
        Group("relmon-up", _up(spec, lab)),
    ]
