"""``openai.completions``: OpenAI's legacy Completions, ``POST …/completions``
(docs/apis/openai-completions.md).

The question is one text ``prompt`` (then its ``suffix``, when it sends one); the answer
is ``choices[0].text``, streamed: the ``text`` of the chunks' choice 0 joined. The re-ask
keeps every field but ``seed`` and ``user``; ``n`` draws per call. relmon monitors one
question a call: a batch of prompts, token-id prompts and ``echo`` (whose text holds the
prompt, which no re-ask echoes) are refused with their reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from monitor.core.apis.base import AuthScheme, Route, is_text, require
from monitor.core.errors import ConfigError, InputError
from monitor.core.reask import FieldRules

__all__ = ["OpenAICompletions", "completion_prompt"]

_PROMPT_REASON: Final = "'prompt' must be a non-empty string (or a list holding one)"


def _is_tokens(value: Any) -> bool:
    """Token ids: a list of integers, or a list of such lists."""
    return isinstance(value, list) and all(
        isinstance(v, int) or (isinstance(v, list) and all(isinstance(t, int) for t in v))
        for v in value
    )


def completion_prompt(request: Mapping[str, Any]) -> str | None:
    """The one prompt of a request: the string, or the one string of a list."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def _check_prompt(request: Mapping[str, Any]) -> None:
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and _is_tokens(prompt):
        raise InputError("a token-id 'prompt' has no text to show, hash or canonicalize")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise InputError(
            f"a batch of {len(prompt)} prompts: relmon monitors one question a call "
            "(send one prompt a request)"
        )
    text = completion_prompt(request)
    require(text is not None and bool(text), _PROMPT_REASON)
    require(is_text(text), "'prompt' is not valid Unicode")


def _choice_text(choice: Any) -> Any:
    return choice.get("text") if isinstance(choice, dict) else None


class OpenAICompletions:
    """The ``openai.completions`` API (see the module)."""

    name: Final = "openai.completions"
    auth: Final[AuthScheme] = "bearer"
    max_draws_per_call: Final = 128
    rules: Final[FieldRules] = FieldRules(
        dropped=("seed", "user"),
        own=("n", "best_of", "stream", "stream_options", "echo", "logprobs"),
        forced=(),
        temperature="temperature",
        model="model",
        built=None,
    )

    def recognises(self, path: str) -> bool:
        path = path.rstrip("/")
        return path.endswith("/completions") and not path.endswith("/chat/completions")

    def check_request(self, request: Mapping[str, Any]) -> None:
        _check_prompt(request)
        suffix = request.get("suffix")
        require(suffix is None or is_text(suffix), "'suffix' must be text or null")
        require(
            request.get("echo") is not True,
            "'echo' puts the prompt in the answer, and a re-ask never echoes: "
            "the two could not be compared",
        )

    def model(self, request: Mapping[str, Any], path: str | None) -> str | None:
        model = request.get("model")
        return model if isinstance(model, str) else None

    def query(self, request: Mapping[str, Any]) -> str:
        parts = [completion_prompt(request) or ""]
        suffix = request.get("suffix")
        if isinstance(suffix, str) and suffix:
            parts.append(suffix)
        return "\n".join(parts)

    def answer(self, response: Mapping[str, Any]) -> str | None:
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices:
            return None
        text = _choice_text(choices[0])
        return text if isinstance(text, str) else None

    def stream_answer(self, events: Sequence[Mapping[str, Any]]) -> str | None:
        parts: list[str] = []
        for event in events:
            choices = event.get("choices")
            if not isinstance(choices, list):
                continue
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                if isinstance(choice.get("text"), str):
                    parts.append(choice["text"])
        return "".join(parts) if parts else None

    def not_reasked(self, request: Mapping[str, Any], allowed_tools: frozenset[str]) -> str | None:
        return None  # completions have no tools

    def route(self, request: Mapping[str, Any], path: str | None, model: str | None) -> Route:
        return Route(self.name, "/completions")

    def answers(self, response: Mapping[str, Any]) -> list[str]:
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices:
            raise InputError("body has no non-empty 'choices' list")
        texts: list[str] = []
        for choice in choices:
            text = _choice_text(choice)
            if not isinstance(text, str):
                raise InputError(f"a choice's text is a {type(text).__name__}, not a string")
            texts.append(text)
        return texts

    def with_draws(self, body: Mapping[str, Any], n: int) -> dict[str, Any]:
        if not 1 <= n <= self.max_draws_per_call:
            raise ConfigError(f"openai.completions: {n} draws in one call; 1 to 128 (n)")
        out = {k: v for k, v in body.items() if k not in ("n", "stream", "stream_options")}
        out["stream"] = False
        if n > 1:
            out["n"] = n
        return out
