"""``relmon check-config`` on the wire API settings (monitor/app/api_checks.py): a base URL
that does not fit its ``endpoint.api``, a ``generic`` task not declared safe to repeat or
without its path and answer, ``supports_n`` where the API draws one answer a call; and
the settings that are right pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monitor.app.cli import main

HEAD = """review: {token: tok-0123456789abcdef}
traffic: {mode: "off"}
query_hash_key: "0123456789abcdef0123456789abcdef"
tasks:
"""


@pytest.fixture(autouse=True)
def _no_relmon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("RELMON_"):
            monkeypatch.delenv(key)


def _check(tmp_path: Path, tasks: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "relmon.yaml"
    path.write_text(HEAD + tasks)
    code = main(["check-config", "--config", str(path)])
    return code, capsys.readouterr().err


WRONG = [
    (
        "  - name: claude\n    endpoint: {api: anthropic.messages, model: c,"
        " base_url: 'https://api.anthropic.com/v1'}\n",
        ["tasks[0] (claude).endpoint.base_url", "without its version segment"],
    ),
    (
        "  - name: gem\n    endpoint: {api: gemini.generate_content, model: g,"
        " base_url: 'https://generativelanguage.googleapis.com/v1beta'}\n",
        ["tasks[0] (gem).endpoint.base_url", "without a version or model segment"],
    ),
    (
        "  - name: x\n    endpoint: {api: openai.chat, model: m,"
        " base_url: 'https://api.anthropic.com'}\n",
        ["tasks[0] (x).endpoint.base_url", "speaks anthropic.messages, not openai.chat"],
    ),
    (
        "  - name: r\n    endpoint: {api: openai.responses, model: m, supports_n: true}\n",
        ["tasks[0] (r).endpoint.supports_n", "draws one answer a call"],
    ),
    (
        "  - name: agent\n    match: {path_prefix: /agent/}\n    answer_path: answer\n"
        "    endpoint: {api: generic}\n",
        ["tasks[0] (agent).endpoint.repeatable", "may act", "repeatable: true"],
    ),
    (
        "  - name: agent\n    answer_path: answer\n"
        "    endpoint: {api: generic, repeatable: true}\n",
        ["tasks[0] (agent).match.path_prefix", "required for endpoint.api: generic"],
    ),
    (
        "  - name: agent\n    match: {path_prefix: /agent/}\n    answer_path: 'answer['\n"
        "    endpoint: {api: generic, repeatable: true}\n",
        ["tasks[0] (agent).answer_path", "JMESPath"],
    ),
    (
        "  - name: t\n    match: {api: openai.responses}\n"
        "    endpoint: {api: openai.chat, model: m}\n",
        ["tasks[0] (t).match.api", "cannot be re-asked in endpoint.api openai.chat"],
    ),
    (
        "  - name: t\n    query_path: q\n    endpoint: {model: m}\n",
        ["tasks[0] (t).query_path", "only for endpoint.api: generic"],
    ),
]


@pytest.mark.parametrize(("tasks", "expected"), WRONG)
def test_check_config_names_the_wire_api_setting_that_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tasks: str, expected: list[str]
) -> None:
    code, err = _check(tmp_path, tasks, capsys)
    assert code == 2, err
    line = next((x for x in err.splitlines() if expected[0] in x), None)
    assert line is not None, err
    for part in expected[1:]:
        assert part in line, (part, line)
    assert "Traceback" not in err


def test_unknown_api_names_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = "  - name: t\n    endpoint: {api: cohere.chat, model: m}\n"
    code, err = _check(tmp_path, tasks, capsys)
    assert code == 2
    assert "unknown api 'cohere.chat'" in err and "anthropic.messages" in err


def test_every_api_with_its_sdks_base_url_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = """  - name: chat
    endpoint: {api: openai.chat, model: m, base_url: 'https://api.openai.com/v1'}
  - name: responses
    match: {api: openai.responses}
    endpoint: {api: openai.responses, model: m, base_url: 'http://vllm:8000/v1'}
    reask: {server_tools: [file_search]}
  - name: claude
    endpoint: {api: anthropic.messages, model: c, base_url: 'https://api.anthropic.com'}
  - name: gemini
    endpoint:
      api: gemini.generate_content
      model: g
      base_url: 'https://generativelanguage.googleapis.com'
      supports_n: true
  - name: completions
    endpoint: {api: openai.completions, model: m, supports_n: true}
  - name: agent
    match: {path_prefix: /agent/}
    query_path: question
    answer_path: result.text
    endpoint: {api: generic, repeatable: true, base_url: 'http://agent:8080'}
"""
    code, err = _check(tmp_path, tasks, capsys)
    assert code == 0, err
