"""Regenerate bench/data/smollm2_answers.json: real answer distributions from SmolLM2-135M.

Starts the llama.cpp server (SmolLM2-135M-Instruct, the same one tests/model/ uses) on
127.0.0.1, asks each question of its own below K = 20 times at temperature 0.7, and
writes the raw answers with the known acceptable answers. Questions are capitals
(``text`` canonicalizer) and small sums (``numeric``). The stopping experiment
(``relmon simulate stopping --real FILE``) replays these answers.

    .venv/bin/python bench/smollm2_answers.py [--out FILE] [--k 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import llama_server

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Canada", "Ottawa"),
    ("Australia", "Canberra"),
    ("Brazil", "Brasilia"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Turkey", "Ankara"),
    ("India", "New Delhi"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"),
    ("Portugal", "Lisbon"),
    ("Greece", "Athens"),
    ("Hungary", "Budapest"),
    ("Austria", "Vienna"),
    ("Switzerland", "Bern"),
    ("Morocco", "Rabat"),
    ("Vietnam", "Hanoi"),
    ("Nigeria", "Abuja"),
    ("Chile", "Santiago"),
    ("Finland", "Helsinki"),
]
SUMS = [
    ("2 + 3", "5"),
    ("4 + 4", "8"),
    ("7 + 6", "13"),
    ("9 + 8", "17"),
    ("12 + 5", "17"),
    ("15 + 9", "24"),
    ("3 * 4", "12"),
    ("6 * 7", "42"),
    ("8 * 9", "72"),
    ("10 - 4", "6"),
    ("20 - 7", "13"),
    ("14 - 9", "5"),
    ("25 + 17", "42"),
    ("31 - 12", "19"),
    ("11 * 3", "33"),
    ("9 - 6", "3"),
    ("16 + 16", "32"),
    ("5 * 5", "25"),
]
CAPITAL_SHOTS = [("Ireland", "Dublin"), ("Cuba", "Havana")]
SUM_SHOTS = [("1 + 1", "2"), ("5 + 2", "7"), ("8 - 3", "5")]


def capital_messages(country: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Answer with the name of the city only."}]
    for c, city in CAPITAL_SHOTS:
        messages += [
            {"role": "user", "content": f"What is the capital of {c}?"},
            {"role": "assistant", "content": city},
        ]
    return [*messages, {"role": "user", "content": f"What is the capital of {country}?"}]


def sum_messages(expression: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a calculator. Reply with the result."}]
    for shot, result in SUM_SHOTS:
        messages += [
            {"role": "user", "content": f"What is {shot}?"},
            {"role": "assistant", "content": f"{shot} = {result}"},
        ]
    return [*messages, {"role": "user", "content": f"What is {expression}?"}]


def ask(base_url: str, model: str, messages: list[dict[str, str]]) -> str:
    body = json.dumps(
        {"model": model, "messages": messages, "temperature": 0.7, "max_tokens": 12, "stop": ["\n"]}
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as resp:
        payload: dict[str, Any] = json.load(resp)
    return str(payload["choices"][0]["message"].get("content") or "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "data" / "smollm2_answers.json"
    )
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/relmon-smollm2-bench"))
    args = parser.parse_args()
    items: list[dict[str, Any]] = []
    started = time.monotonic()
    with llama_server(log_dir=args.log_dir, n_threads=2, seed=1234) as server:
        plan = [
            (f"capital-{c.lower()}", "text", capital_messages(c), [city]) for c, city in CAPITALS
        ] + [(f"sum-{e.replace(' ', '')}", "numeric", sum_messages(e), [r]) for e, r in SUMS]
        for item_id, canonicalizer, messages, acceptable in plan:
            answers = [ask(server.base_url, server.model, messages) for _ in range(args.k)]
            items.append(
                {
                    "id": item_id,
                    "canonicalizer": canonicalizer,
                    "query": messages[-1]["content"],
                    "answers": answers,
                    "acceptable": acceptable,
                }
            )
            print(f"{item_id}: {answers[:5]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llama.cpp, seed 1234)",
        "temperature": 0.7,
        "k": args.k,
        "items": items,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(
        f"{len(items)} items x {args.k} answers in {time.monotonic() - started:.0f} s -> {args.out}"
    )


if __name__ == "__main__":
    main()
