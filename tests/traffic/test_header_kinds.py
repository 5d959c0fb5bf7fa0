"""The proxy's hot-path reading of a request head: the bounded memo that classifies header
names, the HTTP version, the chat target check and Content-Length's digits."""

from __future__ import annotations

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.traffic.intake import HeaderView
from adapters.traffic.proxy import is_chat_completions_path, is_chat_target, target_path
from adapters.traffic.request import Body, HeaderKinds, Request, decimal


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


class _Conn:
    read_paused = False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class _Head:
    """Parses one request head into a :class:`Request`, beside httptools' own reading."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.seen: list[tuple[str, str]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        req = Request(self.parser, b"/", self.headers, Body(_Conn()))
        self.seen.append((req.version, self.parser.get_http_version()))


def test_a_requests_version_is_what_httptools_reads() -> None:
    """The version is taken as "1.1" without asking httptools only when llhttp kept the
    request alive with no Connection header; every version llhttp accepts, with each
    Connection header a client sends, agrees with ``get_http_version()``."""
    connections = [b"", b"Connection: keep-alive\r\n", b"Connection: close\r\n"]
    connections += [b"connection: Keep-Alive\r\n", b"Connection: Upgrade2\r\n"]
    connections += [b"Connection:\r\n", b"Connection: x-a, keep-alive\r\n"]
    checked = 0
    for version in (b"0.9", b"1.0", b"1.1", b"2.0", b"3.0"):
        for connection in connections:
            head = _Head()
            try:
                head.parser.feed_data(b"GET / HTTP/%b\r\nHost: x\r\n%b\r\n" % (version, connection))
            except httptools.HttpParserError:
                continue  # a version llhttp refuses never reaches a Request
            assert len(head.seen) == 1
            got, expected = head.seen[0]
            assert got == expected, (version, connection)
            checked += 1
    assert checked >= 20  # 1.0 and 1.1 at least, with every Connection header


_target_bytes = st.lists(
    st.sampled_from([b"/", b"chat", b"/chat/completions", b"?", b"v1", b"=", b"%2F", b"x"]),
    max_size=8,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(target=_target_bytes)
def test_a_raw_target_is_a_chat_request_exactly_when_its_decoded_path_is(target: bytes) -> None:
    """The proxy's bytes check (with its shortcut for the usual target) agrees with the
    path check on the decoded path, queries and trailing slashes included."""
    assert is_chat_target(target) == is_chat_completions_path(target_path(target))


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(st.binary(max_size=24), st.integers(0, 10**30).map(lambda n: b"%d" % n)))
def test_decimal_reads_what_isdigit_and_int_read(value: bytes) -> None:
    """A Content-Length value: its number when it is ASCII digits (any length), else -1."""
    assert decimal(value) == (int(value) if value.isdigit() else -1)
