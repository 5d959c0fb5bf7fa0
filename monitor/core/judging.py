"""The LLM judge of judge-assisted calibration: its prompt and how its reply is read.

The judge sees what a human reviewer sees first, the (redacted) query and the top-ranked
answer, and says whether that answer is acceptable. Its labels feed the
prediction-powered level (:mod:`monitor.core.ppi`); human verdicts stay the ground truth
that corrects them. No I/O here: the engine sends the prompt through a model client.
"""

from __future__ import annotations

import re

from monitor.core.errors import ConfigError

__all__ = ["DEFAULT_JUDGE_TEMPLATE", "check_template", "parse_judge_label", "render_judge_prompt"]

DEFAULT_JUDGE_TEMPLATE = """You grade answers given by an AI assistant.

Question:
{query}

Answer:
{answer}

Is this answer correct and acceptable as a reply to the question? Reply with one word: yes or no."""
"""Placeholders ``{query}`` and ``{answer}``; each must appear once."""

_YES = frozenset({"yes", "y", "acceptable", "correct", "true", "1", "pass"})
_NO = frozenset({"no", "n", "unacceptable", "incorrect", "wrong", "false", "0", "fail"})
_WORD = re.compile(r"[a-z0-9]+")


def check_template(template: str) -> str:
    """The template, if it holds ``{query}`` and ``{answer}`` once each."""
    for name in ("{query}", "{answer}"):
        if template.count(name) != 1:
            raise ConfigError(f"the judge's prompt template must hold {name} exactly once")
    return template


def render_judge_prompt(template: str, query: str, answer: str) -> str:
    """The template with the query and answer in place. Plain replacement, not
    ``str.format``: braces in a query or an answer are text, not placeholders, and the
    answer is inserted after the query so that a query holding ``{answer}`` stays as is."""
    head, _, tail = template.partition("{answer}")
    return head.replace("{query}", query) + answer + tail.replace("{query}", query)


def parse_judge_label(reply: str) -> bool | None:
    """True (acceptable), False (not), or None when the reply says neither: the first
    word decides (``Yes.``, ``**No**``, ``Incorrect: the capital is ...``); a reply whose
    first word is neither, or that says both at once (``yes/no``), is unusable."""
    words = _WORD.findall(reply.lower())
    if not words:
        return None
    first = words[0]
    if first == "not" and len(words) > 1 and words[1] in {"acceptable", "correct"}:
        return False
    if first in _YES:
        return None if len(words) > 1 and words[1] in _NO else True
    if first in _NO:
        return None if len(words) > 1 and words[1] in _YES else False
    return None
