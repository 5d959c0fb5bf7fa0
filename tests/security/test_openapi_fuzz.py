"""Fuzz the review API and the mirror of a real ``relmon run`` from its own
``/openapi.json`` with schemathesis (valid and invalid data, derandomized so CI is
deterministic): never a 5xx, every protected route refuses a request without the token
or with a wrong one, and the process is healthy afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from adapters.review.openapi import openapi_document
from tests.security import (
    PROMPT,
    TOKEN,
    ModelThread,
    RelmonProcess,
    get,
    log_lines,
)
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = 25
"""Per operation and mode: about 400 cases, each sent with, without and with a wrong token."""


@pytest.fixture(scope="module")
def relmon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelmonProcess]:
    model = ModelThread()
    url = model.start()
    proc = RelmonProcess(tmp_path_factory.mktemp("fuzz"), url).start()
    try:
        # Some items to find, so that fuzzed ids sometimes hit one.
        for i in range(3):
            assert proc.mirror(PROMPT, f"f{i}") == 202
        auth = {"Authorization": f"Bearer {TOKEN}"}
        wait_until_sync(
            lambda: get(proc.url("review", "/api/reviews/chat:f2"), auth)[0] == 200,
            timeout_s=60,
            what="the review item chat:f2",
        )
        yield proc
    finally:
        proc.stop()
        model.stop()


@pytest.fixture(scope="module")
def api_schema(relmon: RelmonProcess) -> Any:
    return schemathesis.openapi.from_url(relmon.url("review", "/openapi.json"))


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


OPERATIONS = [
    (path, method.upper(), mode)
    for path, item in openapi_document(traffic_url="http://127.0.0.1:1")["paths"].items()
    for method in item
    if method in ("get", "post", "delete")
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if path != "/openapi.json" or mode is GenerationMode.POSITIVE  # nothing to negate
]
"""Every operation the document describes, with valid and with invalid data."""


@pytest.mark.parametrize(("path", "method", "mode"), OPERATIONS)
def test_no_5xx_and_auth_always_enforced(
    *,
    api_schema: Any,
    relmon: RelmonProcess,
    session: requests.Session,
    path: str,
    method: str,
    mode: GenerationMode,
) -> None:
    operation = api_schema[path][method]
    traffic = not path.startswith(("/api/", "/openapi.json"))  # the wire APIs' paths
    base = relmon.url("traffic" if traffic else "review", "")
    protected = bool(operation.definition.raw.get("security", [{}]))
    good = {"Authorization": f"Bearer {TOKEN}"} if protected else {}

    strategy = operation.as_strategy(generation_mode=mode)
    if "{item_id}" in path:  # also reach the handlers behind the 404 of an unknown id
        known = operation.as_strategy(generation_mode=mode, path_parameters={"item_id": "chat:f1"})
        strategy = st.one_of(strategy, known)

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        statuses.append(0)
        response = case.call(base_url=base, session=session, headers=good, timeout=30)
        assert response.status_code < 500, (response.status_code, response.text[:200])
        statuses[-1] = response.status_code
        if 200 <= response.status_code < 300 and mode is GenerationMode.POSITIVE:
            case.validate_response(response, checks=[response_schema_conformance])
        if not protected:
            return
        for bad in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Basic x"}):
            kwargs = case.as_transport_kwargs(base_url=base)
            headers = {
                k: v for k, v in (kwargs.pop("headers", None) or {}).items() if k != "Authorization"
            }
            answer = session.request(**kwargs, headers=headers | bad, timeout=30)
            assert answer.status_code == 401, (bad, answer.status_code, answer.text[:200])

    statuses: list[int] = []
    check()
    assert len(statuses) >= (1 if path == "/openapi.json" else EXAMPLES // 2)  # not vacuous


def test_healthy_afterwards(relmon: RelmonProcess) -> None:
    """Runs after the fuzzing (file order): the process is up and still scores items."""
    assert get(relmon.url("metrics", "/healthz"))[0] == 200
    assert get(relmon.url("metrics", "/readyz"))[0] == 200
    assert relmon.mirror(PROMPT, "after-fuzz") == 202
    auth = {"Authorization": f"Bearer {TOKEN}"}
    wait_until_sync(
        lambda: get(relmon.url("review", "/api/reviews/chat:after-fuzz"), auth)[0] == 200,
        what="the review item chat:after-fuzz",
    )
    lines = log_lines(relmon.stderr())
    assert not [line for line in lines if "exception" in line or line["level"] == "error"]
