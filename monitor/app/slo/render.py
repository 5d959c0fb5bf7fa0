"""Rules as data, and their YAML text (written by hand so that the files read well and
are byte-stable: comments kept, every expression a literal block, descriptions folded)."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field

__all__ = ["Group", "Rule", "render_file"]

_WIDTH = 92
_NBSP = "\x00"
_PLAIN = re.compile(r"^[a-z][a-z0-9_-]*$")


def _scalar(value: str) -> str:
    """A label value or annotation: plain when it is a simple word, else double-quoted."""
    return value if _PLAIN.match(value) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Rule:
    """A recording rule (``record``) or an alert (``alert``)."""

    name: str
    expr: str
    alert: bool = False
    comment: str = ""
    for_: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Rule, ...]
    comment: str = ""


def _comment(text: str, indent: str) -> list[str]:
    out = []
    for paragraph in text.strip().split("\n"):
        width = _WIDTH - len(indent) - 2
        lines = textwrap.wrap(paragraph, width, break_on_hyphens=False) or [""]
        out += [f"{indent}# {line}".rstrip() for line in lines]
    return out


def _block(key: str, text: str, indent: str) -> list[str]:
    body = textwrap.dedent(text).strip("\n")
    return [f"{indent}{key}: |"] + [
        f"{indent}  {line}".rstrip() if line.strip() else "" for line in body.splitlines()
    ]


def _glue(match: re.Match[str]) -> str:
    return match.group(0).replace(" ", _NBSP)


def _folded(key: str, text: str, indent: str) -> list[str]:
    # A template action ({{ $value | humanizePercentage }}) is kept on one line.
    words = re.sub(r"\{\{.*?\}\}", _glue, " ".join(text.split()))
    lines = textwrap.wrap(
        words,
        _WIDTH - len(indent) - 2,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [f"{indent}{key}: >-"] + [f"{indent}  {line.replace(_NBSP, ' ')}" for line in lines]


def _rule(rule: Rule) -> list[str]:
    ind = "        "
    out = _comment(rule.comment, "      ") if rule.comment else []
    out.append(f"      - {'alert' if rule.alert else 'record'}: {rule.name}")
    out += _block("expr", rule.expr, ind)
    if rule.for_ is not None:
        out.append(f"{ind}for: {rule.for_}")
    if rule.labels:
        out.append(f"{ind}labels:")
        out += [f"{ind}  {k}: {_scalar(v)}" for k, v in rule.labels.items()]
    if rule.annotations:
        out.append(f"{ind}annotations:")
        for key, value in rule.annotations.items():
            if key == "description":
                out += _folded(key, value, ind + "  ")
            else:
                out.append(f"{ind}  {key}: {_scalar(value)}")
    return out


def render_file(header: str, groups: list[Group]) -> str:
    """The text of one rule file."""
    out = _comment(header, "")
    out.append("groups:")
    for group in groups:
        out += _comment(group.comment, "  ") if group.comment else []
        out.append(f"  - name: {group.name}")
        out.append("    rules:")
        for rule in group.rules:
            out += _rule(rule)
    return "\n".join(out) + "\n"
