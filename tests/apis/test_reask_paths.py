"""Re-asks go where the task says (monitor.core.apis.paths, each API's route): a target a
client shaped to go elsewhere is never re-asked, and every re-ask's URL, as the model
client's transport writes it on the wire, is the task's base URL + the API's own path.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapters.model.transport import ModelTransport
from monitor.core.apis.base import WireApi
from monitor.core.apis.paths import normalised_path, unsafe_path
from monitor.core.apis.registry import API_NAMES, get_api, path_refused
from monitor.core.errors import InputError

UNSAFE = [
    "/v1beta/models/../../admin/secret/models/gm:generateContent",
    "http://host/v1beta/models/gm:generateContent",
    "https://other.example/v1/chat/completions",
    "other.example:443",
    "*",
    "",
    "v1/chat/completions",
    "//other.example/v1/chat/completions",
    "/v1//chat/completions",
    "/agent/..",
    "/agent/%2e%2e/admin",
    "/agent/%2E%2E/admin",
    "/agent/.%2e/admin",
    "/agent/%2e./admin",
    "/agent/%252e%252e/admin",
    "/agent/..;jsessionid=1/admin",
    "/agent/%2e%2e;x/admin",
    "/agent%2f..%2fadmin",
    "/agent%5c..%5cadmin",
    "/agent\\..\\admin",
    "/agent/%0d%0aHost:x",
    "/agent/\x00",
    "/agent/caf\udce9",  # bytes that are not UTF-8, as the proxy decodes them
]
SAFE = [
    ("/agent/ask", "/agent/ask"),
    ("/agent/./ask", "/agent/ask"),
    ("/agent/%2e/ask", "/agent/ask"),
    ("/agent/ask/.", "/agent/ask/"),
    ("/agent/...", "/agent/..."),
    ("/agent/a..b", "/agent/a..b"),
    ("/agent/caf%C3%A9", "/agent/caf%C3%A9"),
    ("/v1/chat/completions", "/v1/chat/completions"),
]


@pytest.mark.parametrize("path", UNSAFE)
def test_a_target_shaped_to_go_elsewhere_is_unsafe(path: str) -> None:
    assert unsafe_path(path)


@pytest.mark.parametrize(("path", "plain"), SAFE)
def test_a_plain_path_is_safe_and_loses_only_its_dot_segments(path: str, plain: str) -> None:
    assert not unsafe_path(path)
    assert normalised_path(path) == plain


def test_no_path_is_not_unsafe() -> None:
    assert not unsafe_path(None)


GENERIC = get_api("generic", {"query_path": "q", "answer_path": "a", "path_prefix": "/agent/"})
APIS: list[WireApi] = [get_api(name) for name in API_NAMES if name != "generic"] + [GENERIC]


def test_a_generic_path_must_stay_under_the_task_prefix() -> None:
    assert GENERIC.route({}, "/agent/./ask", None).path == "/agent/ask"
    assert GENERIC.route({}, None, None).path == "/agent/"  # no production path: the prefix
    for outside in ("/admin/ask", "/agent", "/./admin", "/agent/../admin"):
        assert path_refused(GENERIC, outside), outside
        with pytest.raises(InputError):
            GENERIC.route({}, outside, None)
    assert not path_refused(GENERIC, "/agent/ask")


def test_gemini_keeps_only_the_version_and_vertex_names_of_the_production_path() -> None:
    api = get_api("gemini.generate_content")
    own = {
        "/gateway/v1beta/models/g-1:generateContent": "/v1beta/models/g-1:generateContent",
        "/v1/models/g-1:streamGenerateContent": "/v1/models/g-1:generateContent",
        "/admin/secret/models/g-1:generateContent": "/v1beta/models/g-1:generateContent",
        "/v1/projects/p-1/locations/us-central1/publishers/google/models/g-1:generateContent": (
            "/v1/projects/p-1/locations/us-central1/publishers/google/models/g-1:generateContent"
        ),
        "/v1/projects/p%2f1/locations/l/publishers/google/models/g-1:generateContent": (
            "/v1beta/models/g-1:generateContent"
        ),
    }
    for production, route in own.items():
        assert api.route({}, production, None).path == route, production
    for bad_model in ("/v1beta/models/..:generateContent", "/v1beta/models/%2e%2e:generateContent"):
        with pytest.raises(InputError, match="one path segment"):
            api.route({}, bad_model, None)


# --- the property -----------------------------------------------------------------------

_SEGMENTS = st.sampled_from(
    [
        "v1",
        "v1beta",
        "models",
        "tunedModels",
        "agent",
        "ask",
        "admin",
        "chat",
        "completions",
        "responses",
        "messages",
        "gemini-2.0-flash:generateContent",
        "gemini-2.0-flash:streamGenerateContent",
        "projects",
        "p",
        "locations",
        "l",
        "publishers",
        "google",
        "",
        ".",
        "..",
        "%2e",
        "%2e%2e",
        "%2E.",
        ".%2e",
        "%252e%252e",
        "..;x",
        "%2f",
        "a%2F..",
        "%5c",
        "\\",
        "http:",
        "other.example:80",
        "%00",
        "caf\udce9",
    ]
)
PATHS = st.one_of(
    st.none(),
    st.builds(lambda parts: "/" + "/".join(parts), st.lists(_SEGMENTS, max_size=10)),
    st.builds("/".join, st.lists(_SEGMENTS, min_size=1, max_size=10)),
    st.builds(
        lambda scheme, parts: scheme + "/".join(parts),
        st.sampled_from(["http://other.example/", "https://h:1/", "//other.example/"]),
        st.lists(_SEGMENTS, max_size=8),
    ),
    st.text(max_size=40),
)
BASES = st.sampled_from(
    ["http://model.internal:8000/v1", "https://api.example.com", "http://10.0.0.5/base/"]
)
_GEMINI_OWN = re.compile(
    r"/v[0-9]+[a-z0-9]*/(?:projects/[A-Za-z0-9][A-Za-z0-9_-]*/locations/[A-Za-z0-9][A-Za-z0-9_-]*/"
    r"publishers/google/)?(?:models|tunedModels)/[A-Za-z0-9][A-Za-z0-9._@-]*:generateContent"
)
_FIXED = {
    "openai.chat": "/chat/completions",
    "openai.responses": "/responses",
    "anthropic.messages": "/v1/messages",
    "openai.completions": "/completions",
}


def _own_path(api: WireApi, path: str) -> bool:
    """Whether ``path`` (under the base URL) is the API's own path."""
    if api.name in _FIXED:
        return path == _FIXED[api.name]
    if api.name == "gemini.generate_content":
        return _GEMINI_OWN.fullmatch(path) is not None
    return path.startswith("/agent/") and not unsafe_path(path) and normalised_path(path) == path


def _on_the_wire(base: str, path: str, auth: str) -> tuple[str, str]:
    """The request target and ``Host`` the model client's transport writes for a call to
    ``path`` under ``base``."""
    transport = ModelTransport(
        base, api_key="task-key", timeout_s=1, max_connections=1, max_bytes=1
    )
    head = transport._head_for(path, auth).decode("ascii")
    request_line, host_line = head.split("\r\n")[:2]
    return request_line.split(" ")[1], host_line.removeprefix("Host: ")


@settings(max_examples=400, deadline=None)
@given(path=PATHS, base=BASES, api=st.sampled_from(APIS), model=st.sampled_from([None, "m-1"]))
@example(
    path="/v1beta/models/../../admin/secret/models/gm:generateContent",
    base="https://api.example.com",
    api=get_api("gemini.generate_content"),
    model=None,
)
@example(path="/agent/../admin", base="http://10.0.0.5/base/", api=GENERIC, model=None)
@example(
    path="/gateway/v1beta/models/gm:generateContent",
    base="http://10.0.0.5/base/",
    api=get_api("gemini.generate_content"),
    model=None,
)
def test_every_reask_goes_to_the_base_url_and_the_apis_own_path_or_nowhere(
    path: str | None, base: str, api: WireApi, model: str | None
) -> None:
    if path_refused(api, path):  # not re-asked (relmon_not_reasked_total{unsafe_path})
        return
    try:
        route = api.route({}, path, model)
    except InputError:  # no model a path can hold: rejected, not re-asked
        return
    assert _own_path(api, route.path), (path, route.path)
    target, host = _on_the_wire(base, route.path, api.auth)
    base_path = base.split("/", 3)[3] if base.count("/") >= 3 else ""
    expected_prefix = ("/" + base_path).rstrip("/")
    assert host == base.split("/")[2]
    assert unquote(target) == expected_prefix + route.path
    assert not unsafe_path(target)
    assert ".." not in [unquote(unquote(s)).split(";")[0] for s in target.split("/")]
