"""``match.attributes``: a task that takes spans by their attributes, and nothing else."""

from __future__ import annotations

from monitor.app.probe import listeners
from monitor.config import Settings, TaskSettings
from monitor.core.events import TrafficEvent
from monitor.engine.routing import RoutedTask, TaskRouter

REQUEST = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


def _router(*tasks: dict[str, object]) -> TaskRouter[RoutedTask]:
    settings = [TaskSettings.model_validate(t) for t in tasks]
    return TaskRouter({s.name: RoutedTask(s) for s in settings})


def _event(attributes: dict[str, object] | None, model: str = "gpt-4.1") -> TrafficEvent:
    return TrafficEvent(id="e", model=model, request=REQUEST, attributes=attributes)


def test_attributes_match_spans_only_and_first() -> None:
    router = _router(
        {"name": "checkout", "match": {"attributes": {"service.name": "checkout", "tier": 2}}},
        {"name": "gpt", "match": {"model": "gpt-4.1"}},
        {"name": "rest"},
    )
    assert router.attribute_keys == {"service.name", "tier"}
    assert router.resolve(_event({"service.name": "checkout", "tier": 2})).name == "checkout"
    assert router.resolve(_event({"service.name": "checkout", "tier": "2"})).name == "gpt"
    assert router.resolve(_event({"service.name": "billing", "tier": 2})).name == "gpt"
    assert router.resolve(_event(None)).name == "gpt"  # a proxied request: no attributes
    assert router.resolve(_event(None, model="o3")).name == "rest"


def test_an_attribute_task_is_never_the_catch_all_nor_matched_by_model() -> None:
    router = _router({"name": "svc", "match": {"attributes": {"service.name": "a"}, "model": "m"}})
    assert router.resolve(_event(None, model="m")) is None
    assert router.resolve(_event({"service.name": "a"}, model="other")) is None
    assert router.resolve(_event({"service.name": "a"}, model="m")).name == "svc"
    assert router.candidate_rates == []


def test_check_config_knows_the_receiver_port() -> None:
    settings = Settings.model_validate(
        {
            "tasks": [{"name": "t"}],
            "traffic": {"mode": "off", "otlp": {"enabled": True, "port": 4999}},
        }
    )
    assert list(listeners(settings))[-1] == ("traffic.otlp", "127.0.0.1", 4999)
