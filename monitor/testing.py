"""Fakes for tests of the service core (STYLE: fakes shipped with the package).

Real components are tested against real servers in tests/kafka, tests/traffic, tests/review and
tests/model; these stand-ins only serve tests of the service's own logic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from monitor.core.apis.base import Route, WireApi
from monitor.core.errors import ModelCallError
from monitor.core.events import query_text
from monitor.core.review import ReviewItem, Verdict
from monitor.engine.ports import CalibrationRecord, CircuitState, Judgement

__all__ = ["FakeModelClient", "InMemoryStore", "ManualClock"]


class ManualClock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeModelClient:
    """Answers with ``answer(query, call_index)``, the query read in the call's API;
    raises when it returns an exception. ``routes`` keeps each call's (api, route)."""

    def __init__(self, answer: Callable[[str, int], str | Exception]) -> None:
        self.answer = answer
        self.calls = 0
        self.circuit_state: CircuitState = "closed"
        self.routes: list[tuple[str, Route | None]] = []
        self.requests: list[Mapping[str, Any]] = []

    async def sample(
        self,
        request: Mapping[str, Any],
        n: int,
        *,
        api: WireApi | None = None,
        route: Route | None = None,
    ) -> list[str]:
        self.routes.append((api.name if api is not None else "openai.chat", route))
        self.requests.append(request)
        query = query_text(request, api)
        out = []
        for _ in range(n):
            result = self.answer(query, self.calls)
            self.calls += 1
            if isinstance(result, Exception):
                raise ModelCallError(str(result), retriable=True)
            out.append(result)
        return out

    async def aclose(self) -> None:
        return None


class InMemoryStore:
    """A CalibrationStore and ReviewQueue in memory (what SqliteStore does on disk)."""

    def __init__(self) -> None:
        self.items: dict[str, ReviewItem] = {}
        self.records: dict[str, tuple[CalibrationRecord, Verdict]] = {}
        self.judgements: dict[str, Judgement] = {}

    async def save_judgement(self, judgement: Judgement) -> int:
        if judgement.item_id in self.judgements:
            return 0
        seq = len(self.judgements) + 1
        self.judgements[judgement.item_id] = replace(judgement, seq=seq)
        return seq

    async def load_judgements(self, since: float) -> list[Judgement]:
        return [j for j in self.judgements.values() if j.sampled_at >= since]

    async def submit(self, item: ReviewItem) -> None:
        self.items.setdefault(item.item_id, item)

    async def depth(self) -> int:
        return sum(1 for i in self.items if i not in self.records)

    async def save_review_item(self, item: ReviewItem) -> None:
        self.items.setdefault(item.item_id, item)

    async def get_review_item(self, item_id: str) -> ReviewItem | None:
        return self.items.get(item_id)

    async def save_record(
        self, record: CalibrationRecord, verdict: Verdict
    ) -> tuple[int, ...] | None:
        if record.item_id in self.records:
            return None
        order = (len(self.records) + 1,)
        self.records[record.item_id] = (replace(record, order=order), verdict)
        return order

    async def get_record(self, item_id: str) -> CalibrationRecord | None:
        found = self.records.get(item_id)
        return None if found is None else found[0]

    async def load_records(self) -> Sequence[CalibrationRecord]:
        return [r for r, _ in self.records.values()]

    def has_review_item(self, item_id: str) -> bool:
        return False  # single replica, like SqliteStore: recent_item_ids covers a restart

    def discard_review_item(self, item_id: str) -> None:
        return None  # the store is the queue: an item whose submit failed was not kept

    async def recent_item_ids(self, limit: int) -> Sequence[str]:
        return list(self.items)[-limit:]

    async def pending_counts(self) -> Mapping[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for item in self.pending():
            counts[(item.model, item.task)] = counts.get((item.model, item.task), 0) + 1
        return counts

    def pending(self) -> list[ReviewItem]:
        return [i for k, i in self.items.items() if k not in self.records]

    async def aclose(self) -> None:
        return None
