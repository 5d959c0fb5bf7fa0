"""Sampling by trace id: every span of a trace gets the same draw, so a trace is
monitored whole or not at all. No I/O.

The draw is :func:`monitor.core.sampler.hash_fraction` of the trace id under a fixed
namespace: uniform in [0, 1) for any ids (random or not: W3C ids are random only in
their low bytes, and some SDKs count), the same in every replica and after a restart. A
span's traffic event carries it as its ``draw`` (``TrafficEvent.draw``), compared with
its task's sampling rate as any draw is.
"""

from __future__ import annotations

from typing import Final

from monitor.core.sampler import hash_fraction

__all__ = ["TRACE_NAMESPACE", "trace_draw"]

TRACE_NAMESPACE: Final = "otlp.trace_id"


def trace_draw(trace_id: str) -> float:
    """A uniform number in [0, 1) that depends only on the trace id (hex, any case)."""
    return hash_fraction(TRACE_NAMESPACE, trace_id.lower())
