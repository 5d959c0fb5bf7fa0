"""A window an item is taken out of is exactly the window of the other items: the same
snapshot (level, bound, n_eff, thresholds, served share) as a window fed only them, in
any order, whatever was added, evicted or taken out before."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.window import CalibrationWindow

ALPHAS = (0.05, 0.1, 0.2)

Item = tuple[str, float, float, float, bool | None]  # id, score, pi, t, served


def _window(max_items: int, h: float | None) -> CalibrationWindow:
    return CalibrationWindow(
        alphas=ALPHAS, max_items=max_items, half_life_s=h, min_inclusion_probability=0.1
    )


def _fresh(items: list[tuple[Item, int]], max_items: int, h: float | None) -> CalibrationWindow:
    window = _window(max_items, h)
    for (item_id, score, pi, t, served), key in reversed(items):  # another order
        window.add(item_id, score, pi, t, order=(key,), served=served)
    return window


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove"]),
        st.integers(0, 30),  # item number
        st.one_of(st.integers(1, 5).map(float), st.just(math.inf)),
        st.sampled_from([1.0, 0.5, 0.25, 0.1]),
        st.floats(0, 50_000),
        st.sampled_from([None, True, False]),
    ),
    max_size=120,
)


@settings(max_examples=300, derandomize=True)
@given(ops=operations, max_items=st.integers(1, 12), h=st.sampled_from([None, 60.0, 3600.0]))
def test_after_every_add_and_remove_the_window_is_that_of_its_items(
    ops: list[tuple[str, int, float, float, float, bool | None]],
    max_items: int,
    h: float | None,
) -> None:
    window = _window(max_items, h)
    held: dict[str, tuple[Item, int]] = {}
    key = 0
    for op, n, score, pi, t, served in ops:
        item_id = f"i{n}"
        if op == "remove":
            assert window.remove(item_id) == (item_id in held)
            held.pop(item_id, None)
        else:
            key += 1
            was = item_id in window
            window.add(item_id, score, pi, t, order=(key,), served=served)
            if not was:
                held[item_id] = ((item_id, score, pi, t, served), key)
                if len(held) > max_items:  # the window keeps the largest keys
                    oldest = min(held, key=lambda i: held[i][1])
                    del held[oldest]
        assert {e[0] for e in window.entries()} == set(held)
        now = max([t for (_, _, _, t, _), _ in held.values()], default=0.0) + 30.0
        fresh = _fresh(list(held.values()), max_items, h)
        assert window.snapshot(now) == fresh.snapshot(now)


def test_a_removed_item_can_come_back_with_its_key_and_eviction_skips_removed_ones() -> None:
    window = _window(3, None)
    for n in range(3):
        window.add(f"i{n}", 1.0, 1.0, float(n), order=(n,))
    assert window.remove("i0") and not window.remove("i0")
    window.add("i0", 2.0, 1.0, 0.0, order=(0,))  # back, with the same key
    window.add("i3", 1.0, 1.0, 3.0, order=(3,))  # evicts i0 (the least key), once
    assert sorted(e[0] for e in window.entries()) == ["i1", "i2", "i3"]
    window.add("i4", 1.0, 1.0, 4.0, order=(4,))  # then i1
    assert sorted(e[0] for e in window.entries()) == ["i2", "i3", "i4"]
    for item_id in ("i2", "i3", "i4"):
        window.remove(item_id)
    assert len(window) == 0
    assert window.snapshot(10.0) == _window(3, None).snapshot(10.0)


def test_removing_many_keeps_the_heap_small() -> None:
    rng = random.Random(7)
    window = _window(1000, 3600.0)
    for n in range(5000):
        window.add(f"i{n}", float(rng.randint(1, 3)), 1.0, float(n), order=(n,))
        if n % 2:
            window.remove(f"i{n - 1}")
    assert len(window) <= 1000
    assert len(window._heap) <= 2 * len(window) + 1
