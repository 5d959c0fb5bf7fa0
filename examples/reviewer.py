"""Review relmon's items in a terminal, through the review API (standard library only).

    export RELMON_REVIEW_TOKEN=...   # the token relmon was started with
    python examples/reviewer.py http://127.0.0.1:9109 [--reviewer NAME] [--task T]

For each waiting item it shows the question and the candidates by rank, and reads a
line: ``1 3`` (ranks 1 and 3 are acceptable: accept every acceptable one), ``0`` (none of
these; ``0 42`` also gives the correct answer 42), ``u`` (undo the last verdict, within
review.undo_s), ``s`` (skip) or ``q`` (quit). It stops when the queue is empty (204), at
``q`` or at the end of its input (answers can be piped in); ``--accept-top`` accepts rank
1 of every item without asking. Like the review page, it leases items to its session
(``GET /api/reviews/next?session=S``) and posts verdicts to
``/api/review-page/verdicts/{id}?session=S`` (held review.undo_s seconds; ``DELETE``
undoes): see docs/review.md, "The review API". To adapt it, change ``ask`` (another
input, a rule that judges some items) or ``show`` (the page shuffles the candidates and
hides their counts, against anchoring).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

TOKEN_VARIABLE = "RELMON_REVIEW_TOKEN"
Reply = tuple[int, Any]  # (HTTP status, JSON answer or None)


class Api:
    """The review API at ``base``, as one session (a lease and undo holder)."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/")
        self.session = "cli-" + secrets.token_hex(6)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, query: dict[str, Any], body: Any = None) -> Reply:
        """One request as this session; a 429 is waited out (Retry-After) and retried."""
        query = {**{k: v for k, v in query.items() if v}, "session": self.session}
        url = f"{self.base}{path}?" + urllib.parse.urlencode(query, doseq=True)
        data = None if body is None else json.dumps(body).encode()
        while True:
            request = urllib.request.Request(url, data, self.headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, raw = response.status, response.read()
            except urllib.error.HTTPError as error:
                with error:
                    status, raw, wait = error.code, error.read(), error.headers["Retry-After"]
                if status == 429:
                    print(f"busy: {json.loads(raw)['error']}; waiting {wait or 5} s", flush=True)
                    time.sleep(float(wait or 5))
                    continue
            if status == 401:
                sys.exit(f"refused: {json.loads(raw)['error']} (check ${TOKEN_VARIABLE})")
            return status, json.loads(raw) if raw else None


def _path(route: str, item_id: str) -> str:  # an item id may hold any character
    return f"/api/review-page/{route}/" + urllib.parse.quote(item_id, safe="")


def show(item: dict[str, Any]) -> None:
    print(f"\n[{item['task']}] {item['item_id']}\n  {item['query']}")
    for candidate in item["candidates"]:
        print(f"  {candidate['rank']}. {candidate['answer']}")


def ask(accept_top: bool) -> str:
    """The reviewer's line ("q" at the end of the input)."""
    if accept_top:
        return "1"
    print("acceptable ranks (e.g. 1 3), 0 [answer] for none, u undo, s skip, q quit: ", end="")
    line = sys.stdin.readline()
    print(line.strip(), flush=True)
    return line.strip() if line else "q"


def verdict_of(line: str, reviewer: str | None, candidates: int) -> dict[str, Any] | None:
    """The verdict a line gives (None: not one)."""
    words = line.split()
    if words[:1] == ["0"]:
        verdict: dict[str, Any] = {"none_of_these": True}
        if len(words) > 1:
            verdict["correct_answer"] = line.split(None, 1)[1].strip()
    elif words and all(w.isdigit() and 1 <= int(w) <= candidates for w in words):
        verdict = {"accepted_ranks": sorted({int(w) for w in words})}
    else:
        return None
    return verdict if reviewer is None else {**verdict, "reviewer": reviewer}


def review(api: Api, reviewer: str | None, task: str | None, accept_top: bool) -> int:
    """Review until the queue is empty or the reviewer stops; returns verdicts given."""
    item: dict[str, Any] | None = None
    last: str | None = None  # the item of the last verdict, while it can be undone
    given, skipped = 0, list[str]()
    while True:
        if item is None:  # 204: nothing waiting (or everything else is leased to others)
            _, item = api.call("GET", "/api/reviews/next", {"task": task, "exclude": skipped})
            if item is None:
                print("\nnothing left to review")
                return given
            show(item)
        line = ask(accept_top)
        verdict = verdict_of(line, reviewer, len(item["candidates"]))
        if line in ("q", "s"):
            api.call("POST", _path("release", item["item_id"]), {})
            if line == "q":
                return given
            skipped.append(item["item_id"])  # not this one again
            item = None
        elif line == "u" and last is not None:  # 409 once applied
            status, answer = api.call("DELETE", _path("verdicts", last), {})
            print("undone: it comes back" if status == 200 else f"not undone: {answer}")
            last, given = (None, given - 1) if status == 200 else (last, given)
            item = None  # the undone item is leased back to this session: next returns it
        elif verdict is None:
            print("nothing to undo" if line == "u" else "not understood")
        else:  # 202 held; 200 the same verdict was stored already; 409 another one counts
            status, answer = api.call("POST", _path("verdicts", item["item_id"]), {}, verdict)
            stored = status in (200, 202)
            last, given = (item["item_id"], given + 1) if stored else (last, given)
            print(f"{answer['status'] if stored else answer}: {json.dumps(verdict)}")
            item = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base_url", help="the review API, e.g. http://127.0.0.1:9109")
    parser.add_argument("--reviewer", help="your name, stored with every verdict")
    parser.add_argument("--task", help="review only this task's items")
    parser.add_argument("--accept-top", action="store_true", help="accept rank 1, never ask")
    args = parser.parse_args()
    if not (token := os.environ.get(TOKEN_VARIABLE, "").strip()):
        sys.exit(f"set {TOKEN_VARIABLE} to the review token")
    given = review(Api(args.base_url, token), args.reviewer, args.task, args.accept_top)
    print(f"{given} verdict(s) given")


if __name__ == "__main__":
    main()
