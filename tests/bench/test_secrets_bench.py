"""The secret-gate benchmark's arithmetic, on tiny corpora whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.secrets.__main__ import main
from bench.secrets.evaluate import (
    BACKTRACKING_UNITS,
    Case,
    evaluate,
    load_cases,
    measure_cost,
    report,
)


def _case(number: int, label: str, kind: str = "k", form: str = "plain") -> Case:
    return Case(f"c{number}", f"text {number}", label, kind, form)


def test_rates_count_flagged_secrets_and_flagged_harmless_cases() -> None:
    cases = [
        _case(1, "secret", "aws", "plain"),
        _case(2, "secret", "aws", "spaced"),
        _case(3, "secret", "jwt", "spaced"),
        _case(4, "secret", "jwt", "plain"),
        _case(5, "harmless", "sha"),
        _case(6, "harmless", "uuid"),
        _case(7, "harmless", "uuid"),
        _case(8, "harmless", "uuid"),
    ]
    flagged = {"text 1", "text 4", "text 6"}  # two secrets found, one harmless case flagged
    outcome = evaluate(lambda text: text in flagged, cases)
    assert (outcome.secrets, outcome.detected) == (4, 2)
    assert (outcome.harmless, outcome.false_positives) == (4, 1)
    assert outcome.detection_rate == 0.5 and outcome.false_positive_rate == 0.25
    assert outcome.misses_by("kind") == {"aws": 1, "jwt": 1}
    assert outcome.misses_by("form") == {"spaced": 2}
    assert outcome.false_positives_by("kind") == {"uuid": 1}
    assert [case.id for case in outcome.missed] == ["c2", "c3"]


def test_an_empty_side_has_neutral_rates() -> None:
    outcome = evaluate(lambda text: True, [])
    assert outcome.detection_rate == 1.0 and outcome.false_positive_rate == 0.0


def test_cost_is_measured_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def flags(text: str) -> bool:
        calls.append(text)
        return True

    cost = measure_cost(flags, ["a", "b"], repeats=3)
    # The corpus texts, then the ordinary 4 KiB text five times, then each backtracking text.
    units = len(BACKTRACKING_UNITS)
    assert calls[:6] == ["a", "b"] * 3 and len(calls) == 6 + 5 + units
    assert [len(text) for text in calls[6:11]] == [4096] * 5
    assert [len(text) for text in calls[11:]] == [65536] * units
    assert cost.mean_us >= 0 and cost.median_us >= 0 and cost.ordinary_4kib_us >= 0
    assert cost.worst_64kib_unit in BACKTRACKING_UNITS


def test_the_report_names_rates_misses_and_cases() -> None:
    cases = [_case(1, "secret", "aws", "spaced"), _case(2, "harmless", "sha", "plain")]
    text = report("corpus", evaluate(lambda text: text == "text 2", cases), None, True)
    assert "detection      0/1 = 0.00%" in text
    assert "false positive 1/1 = 100.00%" in text
    assert "misses by form: spaced 1" in text
    assert "missed c1 aws/spaced" in text and "false positive c2 sha/plain" in text


def test_labels_other_than_secret_and_harmless_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    row = {"id": "x", "text": "t", "label": "maybe", "kind": "k", "form": "f"}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="label"):
        load_cases(path)


def test_the_command_runs_the_scanner_on_a_corpus_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "AKIA" + "QZ7RT4MX2PLK9WNB"
    rows = [
        {"id": "s1", "text": f"key {key}", "label": "secret", "kind": "aws", "form": "plain"},
        {"id": "s2", "text": " ".join(key), "label": "secret", "kind": "aws", "form": "spaced"},
        {"id": "h1", "text": "sha1 " + "ab" * 20, "label": "harmless", "kind": "sha1", "form": "p"},
    ]
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8"
    )
    out = tmp_path / "figures.json"
    assert main(["--data", str(tmp_path), "--repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "detection      2/2 = 100.00%" in printed and "false positive 0/1 = 0.00%" in printed
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["corpus"]["detection_rate"] == 1.0
    assert figures["corpus"]["false_positive_ids"] == []
    assert key not in printed  # only ids, kinds and forms are printed unless --show
