"""Re-asks from a span, through a running relmon's OTLP receiver: what the span did not
record is listed and counted and keeps its served answer out of the draws, and a
tool-call answer to tool definitions the span did not record is not re-asked."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tests.apis_e2e.conftest import TASK_KEYS, review_item
from tests.apis_e2e.upstream import Upstream
from tests.otlp.harness import chat_attributes, otlp_relmon
from tests.traces.otlp import TRACE, span, traces_doc
from tests.waiting import wait_until

UNRECORDED = ("tools", "response_format", "tool_choice", "reasoning_effort")
"""What a GenAI-semconv chat span without tool definitions leaves out of its request."""
TOOL_CALL = chat_attributes() | {
    "gen_ai.output.messages": json.dumps(
        [
            {
                "role": "assistant",
                "parts": [
                    {
                        "type": "tool_call",
                        "id": "call_1",
                        "name": "get_weather",
                        "arguments": {"city": "Rome"},
                    }
                ],
            }
        ]
    )
}


async def test_unrecorded_fields_are_shown_and_a_tool_call_to_unknown_tools_is_not_reasked(
    tmp_path: Path, upstream: Upstream
) -> None:
    async with otlp_relmon(tmp_path, upstream) as r, aiohttp.ClientSession() as http:
        doc = traces_doc(
            span(chat_attributes(), span_id="00000000000000a1"),
            span(TOOL_CALL, span_id="00000000000000a2"),
        )
        headers = {"Content-Type": "application/json"}
        async with http.post(f"{r.url}/v1/traces", data=doc, headers=headers) as resp:
            assert resp.status == 200
            assert "partialSuccess" not in await resp.json()

        item = await review_item(r.running, "chat", f"{TRACE}-00000000000000a1")
        for name in UNRECORDED:
            assert item.reask_changes[name] == {"unrecorded": True}, name
            labels = {"model": "gpt-4.1", "task": "chat", "field": name, "change": "unrecorded"}
            assert r.value("relmon_reask_overrides_total", **labels) == 1
        # The served answer is offered for review but is not a draw: every draw a re-ask.
        assert item.served_rank == 1 and item.candidates[0][0].lower() == "rome"
        reasks = upstream.received(key=TASK_KEYS["chat"])
        assert len(reasks) == item.k
        assert all("tools" not in q.body for q in reasks)

        async def refused() -> bool:
            labels = {"model": "gpt-4.1", "task": "chat", "reason": "tools_unrecorded"}
            return r.value("relmon_not_reasked_total", **labels) == 1

        await wait_until(refused, timeout_s=10, what="the tool-call span not re-asked")
        events = r.value("relmon_traffic_events_total", source="otlp", decision="not_reasked")
        assert events == 1
        assert await r.running.store.get_review_item(f"chat:{TRACE}-00000000000000a2") is None
        assert len(upstream.received(key=TASK_KEYS["chat"])) == item.k  # nothing more asked
