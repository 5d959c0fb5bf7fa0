"""The bounded memo that classifies header names on the proxy's hot path."""

from __future__ import annotations

from adapters.http.intake import HeaderView
from adapters.http.request import HeaderKinds


def test_a_name_is_classified_whatever_its_case_and_unknown_names_are_kind_0() -> None:
    kind_of = HeaderKinds({b"content-length": 1, b"connection": 4})
    for name in (b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"cOnTeNt-LeNgTh"):
        assert kind_of(name) == 1
    assert kind_of(b"Connection") == 4
    assert kind_of(b"X-Anything") == 0
    assert kind_of(b"X-Anything") == 0  # remembered, same answer


def test_the_memo_stops_growing_at_its_limit_and_still_answers_right() -> None:
    kind_of = HeaderKinds({b"te": 5}, limit=3)
    for i in range(100):  # a client minting new names cannot grow it
        assert kind_of(b"X-Name-%d" % i) == 0
    assert len(kind_of.seen) == 3
    assert kind_of(b"TE") == 5 and kind_of(b"Te") == 5  # past the limit: computed


def test_a_header_view_finds_names_of_any_case_and_the_first_value_wins() -> None:
    raw = [(b"Host", b"a"), (b"x-relmon-task", b"qa"), (b"X-Relmon-Task", b"other")]
    view = HeaderView([*raw, (b"Authorization", b"secret")])
    assert view.get("X-Relmon-Task") == "qa" and view["x-relmon-task"] == "qa"
    assert view.get("Missing", "d") == "d" and view.get("Authorizatio") is None
