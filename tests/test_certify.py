"""``relmon certify`` end to end: files in, report out, and clear errors."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from monitor.app.cli import main
from monitor.core.canon import get_canonicalizer
from monitor.core.conformal import conformal_threshold

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "examples" / "arith_samples.jsonl"
LABELS = ROOT / "examples" / "arith_labels.jsonl"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["certify", *args])
    out, err = capsys.readouterr()
    return status, out, err


def certify_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    status, out, err = run(
        capsys,
        "--samples",
        str(SAMPLES),
        "--labels",
        str(LABELS),
        "--canonicalizer",
        "numeric",
        "--format",
        "json",
        *extra,
    )
    assert status == 0, err
    doc: dict[str, object] = json.loads(out)
    return doc


def independent_rank_bounds() -> list[tuple[float, float]]:
    """Per item, the best and worst rank the acceptable class can get under any tie order."""
    canon = get_canonicalizer("numeric")
    labels = {
        json.loads(line)["id"]: json.loads(line)["acceptable"]
        for line in LABELS.read_text().splitlines()
    }
    out = []
    for line in SAMPLES.read_text().splitlines():
        item = json.loads(line)
        counts = Counter(canon.canonicalize(a) for a in item["answers"])
        good = {canon.canonicalize(a) for a in labels[item["id"]]} - {"<INVALID>"}
        best = [c for c in good if c in counts]
        if not best:
            out.append((math.inf, math.inf))
            continue
        top = max(counts[c] for c in best)
        above = sum(1 for v in counts.values() if v > top)
        tied = sum(1 for v in counts.values() if v == top) - sum(
            1 for c in best if counts[c] == top
        )
        out.append((above + 1.0, above + 1.0 + tied))
    return out


def test_json_report_matches_independent_computation(capsys: pytest.CaptureFixture[str]) -> None:
    doc = certify_json(capsys)
    bounds = independent_rank_bounds()
    n = len(bounds)
    assert doc["n"] == n == 80
    lo = sum(1 for b, w in bounds if w <= 1) / (n + 1)
    hi = sum(1 for b, w in bounds if b <= 1) / (n + 1)
    assert lo <= doc["reliability_level"] <= hi
    assert 0 <= doc["reliability_lower_bound"] <= doc["reliability_level"]
    thresholds = doc["thresholds"]
    assert isinstance(thresholds, dict)
    assert list(thresholds) == ["0.01", "0.05", "0.1", "0.15", "0.2", "0.25", "0.3"]
    for key, m in thresholds.items():
        best = conformal_threshold([b for b, _ in bounds], float(key))
        worst = conformal_threshold([w for _, w in bounds], float(key))
        value = math.inf if m == "inf" else m
        assert isinstance(m, int) or m == "inf"
        assert best <= value <= worst
    assert doc["canonicalizer"] == "numeric"


def test_split_reports_coverage_and_set_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    doc = certify_json(
        capsys, "--test-fraction", "0.5", "--seed", "3", "--alpha", "0.1", "--alpha", "0.3"
    )
    assert doc["n"] == 40 and doc["n_test"] == 40
    for key in ("coverage", "set_size_mean", "conditional_coverage"):
        table = doc[key]
        assert isinstance(table, dict) and set(table) == {"0.1", "0.3"}
    cov, cond = doc["coverage"], doc["conditional_coverage"]
    assert isinstance(cov, dict) and isinstance(cond, dict)
    for a in ("0.1", "0.3"):
        assert 0 <= cov[a] <= cond[a] <= 1
    assert cov["0.1"] >= cov["0.3"]
    assert 0 <= doc["mode_accuracy"] <= 1


def test_result_does_not_depend_on_line_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = SAMPLES.read_text().splitlines()
    random.Random(5).shuffle(lines)
    shuffled = tmp_path / "s.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    a = certify_json(capsys)
    status, out, _ = run(
        capsys,
        "--samples",
        str(shuffled),
        "--labels",
        str(LABELS),
        "--canonicalizer",
        "numeric",
        "--format",
        "json",
    )
    assert status == 0 and json.loads(out) == a


def test_table_format(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "--samples",
        str(SAMPLES),
        "--labels",
        str(LABELS),
        "--canonicalizer",
        "numeric",
        "--test-fraction",
        "0.25",
    )
    assert status == 0
    assert "reliability level" in out and "coverage" in out


def test_every_score_runs(capsys: pytest.CaptureFixture[str]) -> None:
    for score in ("cumprob", "lac", "aps"):
        doc = certify_json(capsys, "--score", score, "--test-fraction", "0.5")
        assert doc["score"] == score
        cov = doc["coverage"]
        assert isinstance(cov, dict) and all(0 <= v <= 1 for v in cov.values())


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("samples", "labels", "expected"),
    [
        (
            ['{"id": "a", "answers": ["1"]}', "{not json"],
            [{"id": "a", "acceptable": ["1"]}],
            "s.jsonl:2: invalid JSON",
        ),
        (
            [{"id": "a", "answers": ["1"]}, {"id": "b", "answers": ["2"]}],
            [{"id": "a", "acceptable": ["1"]}],
            "no label for id 'b' (",
        ),
        ([], [{"id": "a", "acceptable": ["1"]}], "calibration set is empty"),
        ([{"id": "a", "answers": "1"}], [], "s.jsonl:1: 'answers' must be a list of strings"),
        (
            [{"id": "a", "answers": ["1"]}, {"id": "a", "answers": ["2"]}],
            [],
            "s.jsonl:2: duplicate id 'a'",
        ),
        ([{"answers": ["1"]}], [], "s.jsonl:1: 'id' must be"),
        (
            [{"id": "a", "answers": ["1"]}],
            [{"id": "a", "acceptable": ["no number here"]}],
            "l.jsonl:1: no acceptable answer of id 'a' parses",
        ),
        (["[1, 2]"], [], "s.jsonl:1: expected a JSON object"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    samples: list[object],
    labels: list[object],
    expected: str,
) -> None:
    s = write(tmp_path / "s.jsonl", samples)
    lab = write(tmp_path / "l.jsonl", labels)
    status, out, err = run(
        capsys, "--samples", str(s), "--labels", str(lab), "--canonicalizer", "numeric"
    )
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("relmon: error: ")
    assert expected in err


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"--alpha": "1.5"}, "alpha must be in (0, 1)"),
        ({"--canonicalizer": "nope"}, "canonicalizer 'nope': unknown name"),
        ({"--test-fraction": "0.999"}, "leaves"),
        ({"--samples": "/does/not/exist"}, "cannot open"),
    ],
)
def test_bad_arguments(
    capsys: pytest.CaptureFixture[str], override: dict[str, str], expected: str
) -> None:
    args = {
        "--samples": str(SAMPLES),
        "--labels": str(LABELS),
        "--canonicalizer": "numeric",
        **override,
    }
    status, out, err = run(capsys, *[x for kv in args.items() for x in kv])
    assert status == 2 and out == ""
    assert expected in err and err.count("\n") == 1 and err.startswith("relmon: error: ")


@pytest.mark.integration  # runs a relmon process
def test_module_entry_point_runs_as_a_process() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor",
            "certify",
            "--samples",
            str(SAMPLES),
            "--labels",
            str(LABELS),
            "--canonicalizer",
            "numeric",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["n"] == 80
    bad = subprocess.run(
        [sys.executable, "-m", "monitor", "certify", "--samples", "/nope", "--labels", str(LABELS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
