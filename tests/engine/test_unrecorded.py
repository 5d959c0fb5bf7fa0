"""A span's re-asks (docs/opentelemetry.md, "Re-asks from a span"), through the service
with fakes: the fields its span did not record are listed in the item's
``reask_changes`` and counted ``change="unrecorded"``, its served answer is offered for
review but is not a draw, and a tool-call answer to unrecorded tools is not re-asked."""

from __future__ import annotations

from dataclasses import replace

from monitor.core.reask import with_unrecorded
from monitor.core.review import ReviewItem
from monitor.testing import FakeModelClient
from tests.engine.test_served_answer import _event, _right, _run, _service

OVERRIDES = "relmon_reask_overrides_total"


def _labels(**extra: str) -> dict[str, str]:
    return {"model": "sim-1", "task": "arith", **extra}


async def test_unrecorded_fields_are_changes_and_the_served_answer_is_no_draw() -> None:
    client = FakeModelClient(lambda q, i: f"The answer is {_right(q)}.")
    service, store, registry = _service(client)
    span = replace(_event(1, "It is 8."), unrecorded=("tools", "response_format"))
    await _run(service, [span, _event(2, "It is 9.")])
    by_id = {i.item_id: i for i in store.items.values()}
    item, plain = by_id["arith:req-1"], by_id["arith:req-2"]

    assert item.reask_changes == {
        "tools": {"unrecorded": True},
        "response_format": {"unrecorded": True},
    }
    # Offered for review, outside the draws: every draw is a re-ask.
    assert item.served_rank == 1 and item.candidates == (("8", item.k),)
    assert plain.reask_changes == {} and plain.served_rank == 1
    assert client.calls == item.k + plain.k - 1  # only the plain item's answer was a draw
    for name in ("tools", "response_format"):
        assert registry.get_sample_value(OVERRIDES, _labels(field=name, change="unrecorded")) == 1
    assert registry.get_sample_value(OVERRIDES, _labels(field="tools", change="changed")) is None
    assert registry.get_sample_value(OVERRIDES, _labels(field="temperature", change="changed")) == 0
    served = registry.get_sample_value("relmon_served_answers_total", _labels())
    assert served == 2
    await service.stop(5.0)


async def test_a_tool_call_answer_to_unrecorded_tools_is_not_reasked() -> None:
    client = FakeModelClient(lambda q, i: "8")
    service, store, registry = _service(client)
    reason = _labels(reason="tools_unrecorded")
    await service.load()
    service.start()
    assert registry.get_sample_value("relmon_not_reasked_total", reason) == 0
    base = _event(1, "It is 8.")
    refused = replace(base, unrecorded=("tools",), served_tool_call=True)
    assert service.offer(refused, "otlp").decision == "not_reasked"
    # Tools recorded (only another field missing), or a text answer: re-asked.
    recorded = replace(_event(2, "8"), unrecorded=("response_format",), served_tool_call=True)
    text = replace(_event(3, "8"), unrecorded=("tools",))
    assert service.offer(recorded, "otlp").decision == "sampled"
    assert service.offer(text, "otlp").decision == "sampled"
    await service.drain()
    assert registry.get_sample_value("relmon_not_reasked_total", reason) == 1
    assert (
        registry.get_sample_value(
            "relmon_traffic_events_total", {"source": "otlp", "decision": "not_reasked"}
        )
        == 1
    )
    assert sorted(i.item_id for i in store.items.values()) == ["arith:req-2", "arith:req-3"]
    assert service.stats.by_decision["not_reasked"] == 1
    await service.stop(5.0)


def test_unrecorded_fields_join_the_task_changes_and_survive_the_review_item() -> None:
    changes = with_unrecorded({"top_k": {"to": 40}, "seed": {"from": 1}}, ("top_k", "tools"))
    assert changes == {
        "top_k": {"to": 40, "unrecorded": True},
        "seed": {"from": 1},
        "tools": {"unrecorded": True},
    }
    item = ReviewItem(
        item_id="t:1",
        model="m",
        task="t",
        query="q",
        candidates=(("a", 2),),
        k=2,
        inclusion_probability=1.0,
        sampled_at=0.0,
        reask_changes=changes,
    )
    doc = item.to_json()
    assert ReviewItem.from_json(doc).reask_changes == changes
    # Only a true marker is kept; other keys are not read.
    doc["reask_changes"] = {"tools": {"unrecorded": False, "note": "x"}, "stop": {"unrecorded": 1}}
    assert ReviewItem.from_json(doc).reask_changes == {"tools": {}, "stop": {}}
