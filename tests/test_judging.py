"""The judge's prompt and reply (monitor.core.judging) and its settings (tasks[].judge)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.app.validation import validate_settings
from monitor.config import Settings
from monitor.config.judge import JudgeSettings
from monitor.core.errors import ConfigError
from monitor.core.judging import (
    DEFAULT_JUDGE_TEMPLATE,
    check_template,
    parse_judge_label,
    render_judge_prompt,
)


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("Yes", True),
        ("yes.", True),
        ("**YES**", True),
        ("Correct, Paris is the capital.", True),
        ("No", False),
        ("no, the capital is Paris", False),
        ("Incorrect.", False),
        ("Not acceptable: wrong unit", False),
        ("Not correct", False),
        ("yes/no", None),
        ("No? Yes", None),
        ("Maybe", None),
        ("", None),
        ("   ...", None),
        ("The answer is yes", None),  # the first word decides
    ],
)
def test_replies_are_read_by_their_first_word(reply: str, label: bool | None) -> None:
    assert parse_judge_label(reply) is label


def test_templates_need_both_placeholders_once() -> None:
    assert check_template(DEFAULT_JUDGE_TEMPLATE) == DEFAULT_JUDGE_TEMPLATE
    for bad in ("{query} only", "{answer} only", "{query} {answer} {answer}"):
        with pytest.raises(ConfigError, match="exactly once"):
            check_template(bad)
    prompt = render_judge_prompt("A={answer} Q={query}", "q {answer}", "a {query}")
    assert prompt == "A=a {query} Q=q {answer}"  # braces in the texts stay text


def _settings(tmp_path: Path, judge: dict[str, object], **extra: object) -> Settings:
    extra.setdefault("review", {"token": "abcdefgh"})
    return Settings(
        tasks=[{"name": "t", "endpoint": {"model": "m"}, "judge": judge}],
        state_dir=tmp_path,
        **extra,
    )


def test_judge_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="judge's model is required"):
        JudgeSettings(endpoint={})
    with pytest.raises(ValueError, match="exactly once"):
        JudgeSettings(endpoint={"model": "j"}, prompt_template="no placeholders")
    with pytest.raises(ValueError, match="either prompt_template or prompt_template_file"):
        JudgeSettings(
            endpoint={"model": "j"},
            prompt_template="{query}{answer}",
            prompt_template_file=tmp_path,
        )
    assert validate_settings(_settings(tmp_path, {"endpoint": {"model": "j"}})) == []
    template = tmp_path / "judge.txt"
    template.write_text("Q: {query}\nA: {answer}\nyes or no?", encoding="utf-8")
    judge = {"endpoint": {"model": "j"}, "prompt_template_file": str(template)}
    assert _settings(tmp_path, judge).tasks[0].judge.template().startswith("Q: ")  # type: ignore[union-attr]
    template.write_text("no placeholders", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"tasks\[0\].*judge\.prompt_template_file: .*exactly once"
    ):
        validate_settings(_settings(tmp_path, judge))
    kafka = _settings(
        tmp_path,
        {"endpoint": {"model": "j"}},
        kafka={"enabled": True, "bootstrap_servers": "127.0.0.1:9092"},
        review={"backend": "kafka", "token": "abcdefgh"},
    )
    with pytest.raises(
        ConfigError, match=r"judge: the judge-assisted level needs review\.backend: http"
    ):
        validate_settings(kafka)
