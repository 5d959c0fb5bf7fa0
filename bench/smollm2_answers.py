"""Record real answer distributions from SmolLM2-135M into ``bench/data/``.

Starts the llama.cpp server (SmolLM2-135M-Instruct, the same one tests/model/ uses) on
127.0.0.1, asks each question of a set K = 20 times at temperature 0.7, and writes the
raw answers with the known acceptable answers. The stopping experiments
(``relmon simulate stopping --real FILE``, ``bench/stopping_bench.py``) replay them.

Sets (``--set``):

- ``original`` (the default, ``bench/data/smollm2_answers.json``): 30 capitals (``text``
  canonicalizer) and 18 small sums (``numeric``), the 48 items the stopping rule was
  first tuned on;
- ``tune`` (``bench/data/smollm2_tune.json``) and ``heldout``
  (``bench/data/smollm2_heldout.json``): four task kinds, 20 questions of each kind per
  set: ``arith-`` (two-number sums, differences and products, ``numeric``), ``mcq-``
  (four-option multiple choice answered with a letter, ``mcq``), ``capital-`` (capitals
  of countries not in ``original``, ``text``) and ``fact-`` (other one- or two-word
  facts, ``text`` or ``numeric``). Each kind's question list is split before recording:
  even positions go to ``tune``, odd ones to ``heldout``. The stopping rule's settings
  are chosen on ``original`` and ``tune`` only; ``heldout`` is never used to choose
  anything (``bench/stopping_bench.py`` reports it separately).

Recording ``tune`` and ``heldout`` (160 questions, 3 200 answers) took about
10 minutes on 2 cores
(``tune`` 305 s, ``heldout`` 264 s, each with the server's start).

    .venv/bin/python bench/smollm2_answers.py [--set original|tune|heldout] [--out FILE] [--k 20]
"""

from __future__ import annotations

import argparse
import json
import random
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
NEW_CAPITALS = [
    ("Belgium", ["Brussels"]),
    ("Netherlands", ["Amsterdam"]),
    ("Denmark", ["Copenhagen"]),
    ("Thailand", ["Bangkok"]),
    ("South Korea", ["Seoul"]),
    ("Indonesia", ["Jakarta"]),
    ("Iran", ["Tehran"]),
    ("Iraq", ["Baghdad"]),
    ("Pakistan", ["Islamabad"]),
    ("Colombia", ["Bogota", "Bogotá"]),
    ("Venezuela", ["Caracas"]),
    ("Ukraine", ["Kyiv", "Kiev"]),
    ("Czech Republic", ["Prague"]),
    ("Romania", ["Bucharest"]),
    ("Philippines", ["Manila"]),
    ("Saudi Arabia", ["Riyadh"]),
    ("Ethiopia", ["Addis Ababa"]),
    ("New Zealand", ["Wellington"]),
    ("Bangladesh", ["Dhaka"]),
    ("Malaysia", ["Kuala Lumpur"]),
    ("Senegal", ["Dakar"]),
    ("Ghana", ["Accra"]),
    ("Cambodia", ["Phnom Penh"]),
    ("Uruguay", ["Montevideo"]),
    ("Bulgaria", ["Sofia"]),
    ("Serbia", ["Belgrade"]),
    ("Croatia", ["Zagreb"]),
    ("Iceland", ["Reykjavik", "Reykjavík"]),
    ("Jordan", ["Amman"]),
    ("Nepal", ["Kathmandu"]),
    ("Ecuador", ["Quito"]),
    ("Bolivia", ["Sucre", "La Paz"]),
    ("Tanzania", ["Dodoma"]),
    ("Algeria", ["Algiers"]),
    ("Syria", ["Damascus"]),
    ("Lebanon", ["Beirut"]),
    ("Cuba", ["Havana"]),
    ("Jamaica", ["Kingston"]),
    ("Mongolia", ["Ulaanbaatar", "Ulan Bator"]),
    ("Afghanistan", ["Kabul"]),
]
"""Capitals not in ``CAPITALS``; Cuba is also a shot of the prompt (kept: an easy item)."""
FACTS = [
    ("What is the largest planet in the solar system?", "text", ["Jupiter"]),
    ("How many legs does a spider have?", "numeric", ["8"]),
    ("What is the chemical symbol for gold?", "text", ["Au"]),
    ("Who wrote Romeo and Juliet?", "text", ["Shakespeare", "William Shakespeare"]),
    ("What is the boiling point of water in degrees Celsius?", "numeric", ["100"]),
    ("What is the largest ocean on Earth?", "text", ["Pacific", "Pacific Ocean"]),
    ("How many days are in a leap year?", "numeric", ["366"]),
    ("What gas do plants absorb from the air?", "text", ["Carbon dioxide", "CO2"]),
    ("Which planet is known as the Red Planet?", "text", ["Mars"]),
    ("How many continents are there?", "numeric", ["7"]),
    ("What is the chemical symbol for iron?", "text", ["Fe"]),
    ("Who painted the Mona Lisa?", "text", ["Leonardo da Vinci", "da Vinci", "Leonardo"]),
    ("What is the freezing point of water in degrees Fahrenheit?", "numeric", ["32"]),
    ("What is the longest river in Africa?", "text", ["Nile", "Nile River", "River Nile"]),
    ("How many sides does a hexagon have?", "numeric", ["6"]),
    ("What is the hardest natural substance?", "text", ["Diamond", "Diamonds"]),
    ("In which year did World War II end?", "numeric", ["1945"]),
    ("What is the smallest prime number?", "numeric", ["2"]),
    ("Which element has the atomic number 1?", "text", ["Hydrogen", "H"]),
    ("What is the tallest mountain in the world?", "text", ["Everest", "Mount Everest"]),
    ("How many minutes are in an hour?", "numeric", ["60"]),
    ("Which animal is the largest mammal?", "text", ["Blue whale", "whale"]),
    ("What language is spoken in Brazil?", "text", ["Portuguese"]),
    ("How many strings does a standard guitar have?", "numeric", ["6"]),
    ("What is the currency of Japan?", "text", ["Yen", "Japanese yen"]),
    ("Who developed the theory of relativity?", "text", ["Einstein", "Albert Einstein"]),
    ("What is the chemical symbol for sodium?", "text", ["Na"]),
    ("How many players are on a soccer team on the field?", "numeric", ["11"]),
    ("What is the square root of 81?", "numeric", ["9"]),
    ("Which organ pumps blood through the body?", "text", ["Heart", "The heart"]),
    ("What is the largest desert in Asia?", "text", ["Gobi", "Gobi Desert"]),
    ("How many hours are in a day?", "numeric", ["24"]),
    ("Who was the first US president?", "text", ["George Washington", "Washington"]),
    ("What is the main language of Mexico?", "text", ["Spanish"]),
    ("How many bones are in the adult human body?", "numeric", ["206"]),
    ("Which metal is liquid at room temperature?", "text", ["Mercury"]),
    ("What is the closest star to Earth?", "text", ["Sun", "The Sun"]),
    ("How many weeks are in a year?", "numeric", ["52"]),
    ("What is the second letter of the Greek alphabet?", "text", ["Beta"]),
    ("Which continent is Egypt in?", "text", ["Africa"]),
]
"""Short factual questions other than capitals, with their canonicalizer."""
MCQ = [
    ("Which planet is closest to the Sun?", ("Venus", "Mercury", "Earth", "Mars"), "B"),
    ("What is 7 x 8?", ("54", "56", "58", "64"), "B"),
    ("Which animal is a mammal?", ("Shark", "Eagle", "Dolphin", "Frog"), "C"),
    ("What color do you get by mixing blue and yellow?", ("Green", "Purple", "Orange", "Red"), "A"),
    ("Which is the largest continent?", ("Africa", "Europe", "Asia", "Oceania"), "C"),
    ("What is the freezing point of water in Celsius?", ("0", "10", "32", "100"), "A"),
    ("Who wrote Hamlet?", ("Dickens", "Tolstoy", "Austen", "Shakespeare"), "D"),
    ("Which gas do humans exhale most?", ("Oxygen", "Nitrogen", "Helium", "Argon"), "B"),
    ("How many sides does a triangle have?", ("2", "3", "4", "5"), "B"),
    ("Which country is home to the kangaroo?", ("Brazil", "India", "Australia", "Canada"), "C"),
    ("What is the capital of Italy?", ("Rome", "Milan", "Naples", "Turin"), "A"),
    ("Which instrument has 88 keys?", ("Violin", "Guitar", "Flute", "Piano"), "D"),
    ("Which is a primary color?", ("Green", "Red", "Purple", "Orange"), "B"),
    ("What do bees make?", ("Milk", "Silk", "Honey", "Wax paper"), "C"),
    ("Which planet has rings that are easy to see?", ("Saturn", "Mars", "Venus", "Mercury"), "A"),
    ("What is the largest organ of the human body?", ("Heart", "Liver", "Brain", "Skin"), "D"),
    ("Which month has 28 or 29 days?", ("January", "February", "March", "April"), "B"),
    ("What is H2O?", ("Salt", "Oxygen", "Water", "Hydrogen"), "C"),
    ("Which is the fastest land animal?", ("Cheetah", "Horse", "Lion", "Elephant"), "A"),
    ("How many legs does an insect have?", ("4", "8", "10", "6"), "D"),
    ("Which ocean lies west of Europe?", ("Indian", "Atlantic", "Pacific", "Arctic"), "B"),
    ("What is the square root of 64?", ("6", "7", "8", "9"), "C"),
    ("Which language is spoken in France?", ("French", "German", "Spanish", "Italian"), "A"),
    ("Which shape has four equal sides?", ("Circle", "Triangle", "Rectangle", "Square"), "D"),
    ("Which bird cannot fly?", ("Sparrow", "Penguin", "Eagle", "Pigeon"), "B"),
    ("What is 15 + 27?", ("40", "41", "42", "43"), "C"),
    ("Which metal is attracted by a magnet?", ("Iron", "Gold", "Copper", "Silver"), "A"),
    ("What is the boiling point of water in Celsius?", ("50", "90", "120", "100"), "D"),
    ("Which planet do we live on?", ("Mars", "Earth", "Venus", "Jupiter"), "B"),
    ("Which is the longest river in South America?", ("Nile", "Danube", "Amazon", "Thames"), "C"),
    ("Who painted the Mona Lisa?", ("Leonardo da Vinci", "Picasso", "Van Gogh", "Monet"), "A"),
    ("Which season comes after winter?", ("Summer", "Autumn", "Winter", "Spring"), "D"),
    ("What is the chemical symbol for oxygen?", ("Ox", "O", "Og", "Om"), "B"),
    ("How many days are in a week?", ("5", "6", "7", "8"), "C"),
    ("Which animal is known as the king of the jungle?", ("Lion", "Tiger", "Bear", "Wolf"), "A"),
    ("What is 100 divided by 4?", ("20", "30", "40", "25"), "D"),
    ("Which is the smallest planet?", ("Mars", "Mercury", "Venus", "Earth"), "B"),
    ("What do plants need for photosynthesis?", ("Darkness", "Salt", "Sunlight", "Sand"), "C"),
    ("Which country has the largest population?", ("India", "Peru", "Chile", "Spain"), "A"),
    ("Which is a vegetable?", ("Apple", "Banana", "Cherry", "Carrot"), "D"),
]
"""Four-option multiple choice: (question, options A-D, the right letter)."""
ARITH_SEED, ARITH_COUNT = 2026, 40
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


FACT_SHOTS = [("What is the opposite of hot?", "Cold"), ("Which animal says moo?", "Cow")]
MCQ_SHOTS = [
    ("What color is the sky on a clear day?", ("Green", "Blue", "Red", "Black"), "B"),
    ("How many wheels does a bicycle have?", ("2", "3", "4", "1"), "A"),
]


def fact_messages(question: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Answer with one or two words only."}]
    for shot, answer in FACT_SHOTS:
        messages += [
            {"role": "user", "content": shot},
            {"role": "assistant", "content": answer},
        ]
    return [*messages, {"role": "user", "content": question}]


def mcq_text(question: str, options: tuple[str, ...]) -> str:
    lines = [f"{letter}) {text}" for letter, text in zip("ABCD", options, strict=True)]
    return "\n".join([question, *lines])


def mcq_messages(question: str, options: tuple[str, ...]) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Answer with the letter of the right option."}]
    for shot, shot_options, letter in MCQ_SHOTS:
        messages += [
            {"role": "user", "content": mcq_text(shot, shot_options)},
            {"role": "assistant", "content": letter},
        ]
    return [*messages, {"role": "user", "content": mcq_text(question, options)}]


def arithmetic_questions() -> list[tuple[str, str]]:
    """ARITH_COUNT two-number sums, differences and products (seeded, none of SUMS or
    the shots): (expression, result)."""
    rng = random.Random(ARITH_SEED)
    taken = {e.replace(" ", "") for e, _ in [*SUMS, *SUM_SHOTS]}
    out: list[tuple[str, str]] = []
    while len(out) < ARITH_COUNT:
        op = rng.choice("+-*")
        if op == "+":
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            result = a + b
        elif op == "-":
            a = rng.randint(10, 60)
            b = rng.randint(2, a - 1)
            result = a - b
        else:
            a, b = rng.randint(2, 12), rng.randint(2, 12)
            result = a * b
        if f"{a}{op}{b}" not in taken:
            taken.add(f"{a}{op}{b}")
            out.append((f"{a} {op} {b}", str(result)))
    return out


Plan = list[tuple[str, str, list[dict[str, str]], list[str]]]
"""(item id, canonicalizer, messages, acceptable answers) per question."""


def original_plan() -> Plan:
    return [
        (f"capital-{c.lower()}", "text", capital_messages(c), [city]) for c, city in CAPITALS
    ] + [(f"sum-{e.replace(' ', '')}", "numeric", sum_messages(e), [r]) for e, r in SUMS]


def _slug(text: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())[:40]


def kinds_plan(part: int) -> Plan:
    """The four kinds' questions at positions ``part``, ``part + 2``, ... (0: tune,
    1: held out)."""
    arith: Plan = [
        (f"arith-{e.replace(' ', '')}", "numeric", sum_messages(e), [r])
        for e, r in arithmetic_questions()
    ]
    mcq: Plan = [
        (f"mcq-{_slug(q)}", "mcq", mcq_messages(q, options), [letter]) for q, options, letter in MCQ
    ]
    capitals: Plan = [
        (f"capital-{_slug(c)}", "text", capital_messages(c), cities) for c, cities in NEW_CAPITALS
    ]
    facts: Plan = [
        (f"fact-{_slug(q)}", canon, fact_messages(q), answers) for q, canon, answers in FACTS
    ]
    return [entry for kind in (arith, mcq, capitals, facts) for entry in kind[part::2]]


SETS = {
    "original": ("smollm2_answers.json", original_plan),
    "tune": ("smollm2_tune.json", lambda: kinds_plan(0)),
    "heldout": ("smollm2_heldout.json", lambda: kinds_plan(1)),
}


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
    parser.add_argument("--set", choices=sorted(SETS), default="original")
    parser.add_argument("--out", type=Path, help="default: bench/data/<the set's file>")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/relmon-smollm2-bench"))
    args = parser.parse_args()
    filename, make_plan = SETS[args.set]
    out = args.out or Path(__file__).parent / "data" / filename
    items: list[dict[str, Any]] = []
    started = time.monotonic()
    with llama_server(log_dir=args.log_dir, n_threads=2, seed=1234) as server:
        for item_id, canonicalizer, messages, acceptable in make_plan():
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
    elapsed = time.monotonic() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llama.cpp, seed 1234)",
        "temperature": 0.7,
        "k": args.k,
        "set": args.set,
        "seconds": round(elapsed),
        "items": items,
    }
    if args.set == "original":  # the file's format as it was recorded
        del doc["set"], doc["seconds"]
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(items)} items x {args.k} answers in {elapsed:.0f} s -> {out}")


if __name__ == "__main__":
    main()
