"""``relmon certify --segment-by``: one block per segment (Mondrian), the marginal
report unchanged, thresholds checked against a small example computed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from monitor.app.cli import main
from monitor.core.certify import busiest_labels, min_calibration_items
from monitor.core.conformal import quantile_index
from monitor.core.segments import label_value

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "examples" / "arith_samples.jsonl"
LABELS = ROOT / "examples" / "arith_labels.jsonl"
# Four answers: "1" three times (rank 1), "2" once (rank 2). No ties, so no randomness.
ANSWERS = ["1", "#### 1", "The answer is 1.", "2"]
SCORE_ANSWER = {1: "1", 2: "2", 99: "9"}  # acceptable answer -> rank score (9: none, inf)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["certify", *args])
    out, err = capsys.readouterr()
    return status, out, err


def write_items(tmp_path: Path, rows: list[tuple[dict[str, Any], int]]) -> tuple[Path, Path]:
    """rows: (extra keys of the sample record, rank score 1, 2 or 99 for inf)."""
    samples, labels = tmp_path / "s.jsonl", tmp_path / "l.jsonl"
    with samples.open("w") as s, labels.open("w") as lab:
        for i, (extra, score) in enumerate(rows):
            s.write(json.dumps({"id": f"q{i}", "answers": ANSWERS, **extra}) + "\n")
            lab.write(json.dumps({"id": f"q{i}", "acceptable": [SCORE_ANSWER[score]]}) + "\n")
    return samples, labels


def hand_rows() -> list[tuple[dict[str, Any], int]]:
    """Segment a: 9 items, scores 1 x7 and 2 x2. Segment b: 3 items, all 1. One item
    without the field (segment none), score inf."""
    a = [({"meta": {"tenant": "a"}}, 1)] * 7 + [({"meta": {"tenant": "a"}}, 2)] * 2
    b = [({"meta": {"tenant": "b"}}, 1)] * 3
    return a + b + [({"meta": {}}, 99)]


def certify_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run(capsys, *args, "--format", "json")
    assert status == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_thresholds_levels_and_bounds_match_a_hand_computation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples, labels = write_items(tmp_path, hand_rows())
    doc = certify_json(
        capsys,
        *("--samples", str(samples), "--labels", str(labels), "--canonicalizer", "numeric"),
        *("--alpha", "0.1", "--alpha", "0.2", "--alpha", "0.3", "--segment-by", "meta.tenant"),
    )
    seg = {s["segment"]: s for s in doc["segments"]}
    assert [s["segment"] for s in doc["segments"]] == ["a", "b", "none"]  # busiest first
    # a: n = 9, sorted scores 1 1 1 1 1 1 1 2 2.
    # alpha 0.1: k = ceil(10 * 0.9) = 9 -> 2;  0.2: k = 8 -> 2;  0.3: k = 7 -> 1.
    a = seg["a"]
    assert (a["items"], a["n"]) == (9, 9)
    assert a["thresholds"] == {"0.1": 2, "0.2": 2, "0.3": 1}
    assert a["reliability_level"] == pytest.approx(7 / 10)
    # Clopper-Pearson: the p at which P(X >= 7 | n = 9, p) = 0.05, by the binomial.
    p_low = a["reliability_lower_bound"]
    assert stats.binom.sf(6, 9, p_low) == pytest.approx(0.05, abs=1e-9)
    assert a["too_few_reviews"] == {"0.1": False, "0.2": False, "0.3": False}
    # b: n = 3. alpha 0.1: k = ceil(4 * 0.9) = 4 > 3 -> inf, too few reviews;
    # 0.2: k = ceil(3.2) = 4 > 3 -> inf;  0.3: k = ceil(2.8) = 3 -> 1.
    b = seg["b"]
    assert b["thresholds"] == {"0.1": "inf", "0.2": "inf", "0.3": 1}
    assert b["too_few_reviews"] == {"0.1": True, "0.2": True, "0.3": False}
    assert b["min_n"] == {"0.1": 9, "0.2": 4, "0.3": 3}
    assert b["reliability_level"] == pytest.approx(3 / 4)
    # none: one item, score inf: inf everywhere, and too few reviews at each alpha.
    assert seg["none"]["thresholds"] == {"0.1": "inf", "0.2": "inf", "0.3": "inf"}
    assert seg["none"]["reliability_lower_bound"] == 0.0
    # Marginal, pooled: n = 13, sorted 1 x10, 2 x2, inf. 0.1: k = ceil(12.6) = 13 -> inf;
    # 0.2: k = ceil(11.2) = 12 -> 2;  0.3: k = ceil(9.8) = 10 -> 1.
    assert doc["n"] == 13
    assert doc["thresholds"] == {"0.1": "inf", "0.2": 2, "0.3": 1}
    assert doc["segment_by"] == "meta.tenant" and doc["segment_max"] == 20


def test_segments_past_the_max_share_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples, labels = write_items(tmp_path, hand_rows())
    doc = certify_json(
        capsys,
        *("--samples", str(samples), "--labels", str(labels), "--canonicalizer", "numeric"),
        *("--alpha", "0.3", "--segment-by", "meta.tenant", "--segment-max", "1"),
    )
    assert [(s["segment"], s["n"]) for s in doc["segments"]] == [("a", 9), ("other", 4)]
    # other: b's three 1s and none's inf: k = ceil(5 * 0.7) = 4 -> inf (not too few).
    other = doc["segments"][1]
    assert other["thresholds"] == {"0.3": "inf"}
    assert other["too_few_reviews"] == {"0.3": False}


def test_field_values_become_label_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows: list[tuple[dict[str, Any], int]] = [
        ({"plan": 3}, 1),
        ({"plan": True}, 1),
        ({"plan": ["x"]}, 1),
        ({"plan": "Acme Corp"}, 1),
        ({"plan": "other"}, 1),
        ({"plan": ""}, 1),
        ({}, 1),
    ]
    samples, labels = write_items(tmp_path, rows)
    doc = certify_json(
        capsys,
        *("--samples", str(samples), "--labels", str(labels), "--canonicalizer", "numeric"),
        *("--segment-by", "plan"),
    )
    got = {s["segment"]: s["items"] for s in doc["segments"]}
    assert got == {
        "none": 3,  # a list, the empty string, no key
        "3": 1,
        "true": 1,
        label_value("Acme Corp"): 1,
        label_value("other"): 1,
    }
    assert label_value("Acme Corp").startswith("h:")


def test_a_key_with_a_dash_is_quoted_jmespath(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples, labels = write_items(tmp_path, [({"x-tenant": "t1"}, 1)] * 2)
    base = ("--samples", str(samples), "--labels", str(labels), "--canonicalizer", "numeric")
    doc = certify_json(capsys, *base, "--segment-by", '"x-tenant"')
    assert [s["segment"] for s in doc["segments"]] == ["t1"]
    status, _, err = run(capsys, *base, "--segment-by", "x-tenant")
    assert status == 2
    assert "is not a JMESPath expression" in err


def test_the_marginal_report_is_unchanged_by_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--samples", str(SAMPLES), "--labels", str(LABELS), "--canonicalizer", "numeric")
    split = ("--test-fraction", "0.5", "--seed", "1")
    status, plain, _ = run(capsys, *base, *split)
    assert status == 0
    status, segmented, err = run(capsys, *base, *split, "--segment-by", "query")
    assert status == 0, err
    assert segmented.startswith(plain.rstrip("\n") + "\n\nsegment ")
    marginal = certify_json(capsys, *base, *split)
    doc = certify_json(capsys, *base, *split, "--segment-by", "id", "--segment-max", "5")
    segments = doc.pop("segments")
    assert doc.pop("segment_by") == "id" and doc.pop("segment_max") == 5
    assert doc == marginal
    # Each id is its own segment: 5 of one item each, the other 75 together; the
    # segments partition the marginal calibration and test parts.
    assert [s["items"] for s in segments] == [1] * 5 + [75]
    assert segments[-1]["segment"] == "other"
    assert sum(s["n"] for s in segments) == marginal["n"]
    assert sum(s["n_test"] for s in segments) == marginal["n_test"]


def test_the_table_flags_too_few_reviews(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(
        capsys,
        *("--samples", str(SAMPLES), "--labels", str(LABELS), "--canonicalizer", "numeric"),
        *("--alpha", "0.05", "--alpha", "0.5", "--segment-by", "id", "--segment-max", "2"),
    )
    assert status == 0, err
    blocks = out.split("\n\nsegment ")
    assert [b.split(" ", 1)[0] for b in blocks[1:]] == ["arith-000", "arith-001", "other"]
    assert "too few reviews to know (n < 19)" in blocks[1]
    assert "too few reviews to know" not in blocks[0] + blocks[3]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--segment-by", "a[", "is not a JMESPath expression"),
        ("--segment-max", "0", "must be a whole number from 1 to 1000"),
        ("--segment-max", "x", "must be a whole number from 1 to 1000"),
    ],
)
def test_bad_segment_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    status, _, err = run(capsys, "--samples", "s", "--labels", "l", flag, value)
    assert status == 2
    assert message in err


def test_min_calibration_items_is_the_least_n_with_k_at_most_n() -> None:
    for alpha in (0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.9):
        n = min_calibration_items(alpha)
        assert quantile_index(n, alpha) <= n
        assert all(quantile_index(m, alpha) > m for m in range(n))
    assert [min_calibration_items(a) for a in (0.01, 0.05, 0.1, 0.2)] == [99, 19, 9, 4]


def test_busiest_labels_break_ties_by_value() -> None:
    assert busiest_labels(["b", "a", "c", "c", "b", "a", "d"], 3) == ["a", "b", "c"]
    assert busiest_labels(["z"] * 3 + ["a"], 5) == ["z", "a"]


def test_a_segment_with_no_calibration_item_is_valid_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(
        capsys,
        *("--samples", str(SAMPLES), "--labels", str(LABELS), "--canonicalizer", "numeric"),
        *("--test-fraction", "0.5", "--segment-by", "id", "--segment-max", "80"),
        *("--format", "json"),
    )
    assert status == 0, err

    def strict(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    doc = json.loads(out, parse_constant=strict)
    empty = [s for s in doc["segments"] if s["n"] == 0]
    assert len(empty) == doc["n_test"] == 40
    assert all(s["thresholds"] == {k: "inf" for k in s["thresholds"]} for s in empty)
    assert all(s["mean_samples"] is None and s["too_few_reviews"]["0.3"] for s in empty)
