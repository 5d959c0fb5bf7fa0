"""The traffic consumer group's partition assignment, checked.

In a consumer group the leader computes every member's partitions and the broker hands
each member its share. When the traffic topic grows (partitions added, or the topic
recreated with more of them after a broker was rebuilt), aiokafka's leader sees it in
the metadata and rebalances; a broker that answers the new round with the previous
round's assignment (Tansu does, when the round keeps its generation number) leaves the
new partitions to nobody, for good. :class:`CheckedAssignor` is aiokafka's round-robin
assignor (same protocol name, so members of other versions agree on it) that tells,
on the leader, when the assignment received is not one it computed; the consumer then
joins again as a new member, which gets a fresh assignment. It says it leaves first
(:func:`leave_group`), so that the group does not wait a session timeout for the old
member.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import LeaveGroupRequest

__all__ = ["CheckedAssignor", "leave_group"]


class CheckedAssignor(RoundRobinPartitionAssignor):  # type: ignore[misc]
    """Round robin; ``on_stale()`` is called when this member, having computed the
    assignment as the group's leader, receives a share that is none of the computed
    ones. Used as an instance (one per consumer), in ``partition_assignment_strategy``."""

    def __init__(self, on_stale: Callable[[], None]) -> None:
        self._on_stale = on_stale
        self._computed: list[frozenset[Any]] | None = None
        self.stale = 0
        """Assignments received that the leader had not computed."""

    def assign(self, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = RoundRobinPartitionAssignor.assign(cluster, members)
        self._computed = [frozenset(a.partitions()) for a in result.values()]
        return result

    def on_assignment(self, assignment: Any) -> None:
        computed, self._computed = self._computed, None
        if computed is not None and frozenset(assignment.partitions()) not in computed:
            self.stale += 1
            self._on_stale()


async def leave_group(consumer: Any) -> None:
    """Tell the group coordinator that this (aiokafka) consumer's member leaves. aiokafka
    sends LeaveGroup only after generation 0, and Tansu numbers every round 0: without it
    the group would wait for the old member until its session expires. Best effort: a
    failure is ignored (the session then expires as it would have)."""
    coordinator = getattr(consumer, "_coordinator", None)
    member_id = getattr(coordinator, "member_id", None)
    if coordinator is None or not member_id or not hasattr(coordinator, "_send_req"):
        return
    with contextlib.suppress(KafkaError):
        await coordinator._send_req(LeaveGroupRequest(coordinator.group_id, member_id))
