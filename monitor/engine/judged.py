"""Judge-assisted calibration in the engine: the judge's labels of a (model, task)'s
scored items, and the prediction-powered level they give with the human verdicts.

Every scored item of a task with ``tasks[].judge`` gets one label (the judge sees the
redacted query and the top-ranked answer, as a reviewer first does). The labels are kept
per (model, task), at most :data:`JUDGED_PER_WINDOW` times the window's size, newest
last; the estimate (:func:`monitor.core.ppi.ppi_reliability`) weighs them with the
window's drift weights, and the reviewed items (the window's own) by their inclusion
probabilities. An item the judge could not label is left out of both sides.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from monitor.core.judging import parse_judge_label, render_judge_prompt
from monitor.core.ppi import PPIEstimate, ppi_reliability
from monitor.core.window import CalibrationWindow
from monitor.engine.ports import Judgement, ModelClient

__all__ = ["JUDGED_PER_WINDOW", "JudgedItems", "ask_judge"]

JUDGED_PER_WINDOW = 10
"""Judge labels kept per (model, task): this many times ``window_size``."""


async def ask_judge(client: ModelClient, template: str, query: str, answer: str) -> bool | None:
    """The judge's label of ``answer`` to ``query``: True, False, or None (unusable
    reply). A failed call raises the client's :class:`~monitor.core.errors.ModelCallError`."""
    request = {
        "messages": [{"role": "user", "content": render_judge_prompt(template, query, answer)}]
    }
    replies = await client.sample(request, 1)
    return parse_judge_label(replies[0]) if replies else None


class JudgedItems:
    """One (model, task)'s judge labels by item id, in the order they came."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._labels: OrderedDict[str, tuple[float, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._labels)

    def add(self, judgement: Judgement) -> bool:
        """Keep a label (once per item id); False if it was there."""
        if judgement.item_id in self._labels:
            return False
        self._labels[judgement.item_id] = (judgement.sampled_at, judgement.acceptable)
        while len(self._labels) > self.max_items:
            self._labels.popitem(last=False)
        return True

    def estimate(self, window: CalibrationWindow, now: float) -> PPIEstimate | None:
        """The prediction-powered level and bound with ``window``'s verdicts, as of
        ``now`` (None without labels or with too few reviewed, labelled items)."""
        if not self._labels:
            return None
        labels = self._labels
        t = np.fromiter((v[0] for v in labels.values()), float, len(labels))
        judged = np.fromiter((v[1] for v in labels.values()), float, len(labels))
        reviewed = [e for e in window.entries() if e[0] in labels]
        t_rev = np.array([e[2] for e in reviewed], dtype=float)
        latest = max(now, float(t.max()), float(t_rev.max()) if reviewed else -np.inf)
        h = window.half_life_s

        def decay(ts: np.ndarray) -> np.ndarray:
            return np.ones_like(ts) if h is None else np.exp2(-(latest - ts) / h)

        pi = np.array([e[3] for e in reviewed], dtype=float)
        return ppi_reliability(
            judged,
            decay(t),
            np.array([e[1] <= 1.0 for e in reviewed], dtype=float),
            np.array([labels[e[0]][1] for e in reviewed], dtype=float),
            decay(t_rev) / pi if reviewed else np.zeros(0),
            delta=window.delta,
            test_weight=window.test_weight,
        )
