"""The LoCoMo benchmark on a tiny synthetic conversation whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.locomo.__main__ import main
from bench.locomo.dataset import capture_arguments, load, parse_session_time
from bench.locomo.runner import percentile, question_scores, run_benchmark
from engram_memory.adapters.embedder import semantic_extra_installed

# The head of a LoCoMo conversation file: its two speakers and when the first session was.
ANA_AND_BO = {
    "speaker_a": "Ana",
    "speaker_b": "Bo",
    "session_1_date_time": "1:56 pm on 8 May, 2023",
}


def conversation() -> dict[str, Any]:
    return {
        **ANA_AND_BO,
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a grey kitten named Pixel."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! My sister plays the cello."},
            {
                "speaker": "Ana",
                "dia_id": "D1:3",
                "text": "Look at this.",
                "img_url": ["https://example.invalid/x.jpg"],
                "blip_caption": "a photo of a lighthouse on a rocky coast",
            },
        ],
        "session_2_date_time": "10:00 am on 2 June, 2023",
        "session_2": [
            {"speaker": "Bo", "dia_id": "D2:1", "text": "We went hiking near the glacier."},
            {"speaker": "Ana", "dia_id": "D2:2", "text": "Pixel knocked over my plant."},
        ],
        "events_session_1": [],
        "qa": [
            # One evidence turn, found first: recall 1 at every depth, MRR 1.
            {
                "question": "What instrument does the sister play?",
                "answer": "cello",
                "evidence": ["D1:2"],
                "category": 4,
            },
            # Two evidence turns packed in one string (as some LoCoMo entries are), plus one
            # evidence id that names no turn (dropped); both turns mention Pixel.
            {
                "question": "What is the name of the kitten Pixel?",
                "answer": "Pixel",
                "evidence": ["D1:1; D2:2", "D9:9"],
                "category": 1,
            },
            # Found through the image caption.
            {
                "question": "Where is the lighthouse?",
                "answer": "rocky coast",
                "evidence": ["D1:3"],
                "category": 3,
            },
            # No turn shares a word with it: recall 0, MRR 0.
            {"question": "Zzyzx quux?", "answer": "none", "evidence": ["D2:1"], "category": 2},
            # Adversarial questions are excluded.
            {
                "question": "What is the cello called?",
                "adversarial_answer": "x",
                "evidence": ["D1:2"],
                "category": 5,
            },
        ],
    }


def locomo_folder(tmp_path: Path, *conversations: dict[str, Any]) -> Path:
    """A LoCoMo data folder holding ``conversations`` (conv-1.json, conv-2.json, ...)."""
    folder = tmp_path / "locomo"
    folder.mkdir()
    for number, conversation_ in enumerate(conversations, start=1):
        (folder / f"conv-{number}.json").write_text(json.dumps(conversation_))
    return folder


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return locomo_folder(tmp_path, conversation())


def test_loading_keeps_categories_one_to_four_and_splits_packed_evidence(data: Path) -> None:
    conv = load(data / "conv-1.json")
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
    assert [q.category for q in conv.questions] == [4, 1, 3, 2]
    assert conv.questions[1].evidence == ("D1:1", "D2:2")
    assert conv.dropped_evidence == 1


def test_the_capture_mapping_is_the_fixed_one(data: Path) -> None:
    conv = load(data / "conv-1.json")
    args = capture_arguments("conv-1", conv.turns[2], "purpose:x")
    payload = args["payload"]
    primary, context = payload["components"]
    assert primary["text"] == "Ana: Look at this. [image: a photo of a lighthouse on a rocky coast]"
    assert context["kind"] == "context"
    assert context["text"] == "1:56 pm on 8 May, 2023\nBo: Lovely! My sister plays the cello."
    assert payload["valid_time"] == {"t": parse_session_time("1:56 pm on 8 May, 2023")}
    assert parse_session_time("1:56 pm on 8 May, 2023") == 1_683_554_160_000
    (citation,) = payload["citations"]
    assert citation["source_ref"] == "locomo:conv-1"
    assert citation["locator"] == {"scheme": "dia_id", "value": "D1:3"}
    assert (
        capture_arguments("conv-1", conv.turns[0], "p")["payload"]["components"][1]["text"]
        == "1:56 pm on 8 May, 2023"
    )


def test_question_scores_count_evidence_in_the_top_k() -> None:
    ranked = ["D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8", "D9", "D10", "D11"]
    assert question_scores(ranked, ["D2", "D11"]) == {
        "recall@1": 0.0,
        "recall@5": 0.5,
        "recall@10": 0.5,
        "mrr": 0.5,
    }
    assert question_scores([], ["D1"])["mrr"] == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 99) == 5.0


def test_the_benchmark_computes_recall_on_a_conversation_with_known_answers(
    data: Path, tmp_path: Path
) -> None:
    from bench.locomo.dataset import load_dir

    result = run_benchmark(load_dir(data), ["lexical"], data_dir=tmp_path / "engine")
    lexical = result["profiles"]["lexical"]
    per = lexical["per_category"]
    assert per["4"]["recall@1"] == 1.0 and per["4"]["mrr"] == 1.0
    assert per["1"]["recall@5"] == 1.0  # both Pixel turns come back
    assert per["3"]["recall@1"] == 1.0  # the caption is part of the primary text
    assert per["2"] == {
        "name": "temporal",
        "questions": 1,
        "recall@1": 0.0,
        "recall@5": 0.0,
        "recall@10": 0.0,
        "mrr": 0.0,
    }
    assert lexical["questions"] == 4
    assert lexical["recall@10"] == 0.75
    assert result["throughput"]["turns"] == 5 and result["throughput"]["accepted"] == 5
    assert result["dataset"]["dropped_evidence_ids"] == 1
    assert set(result["latency_ms"]["lexical"]) == {"search_p50", "search_p99"}
    assert lexical["rank_receipt_profiles"][0].startswith("offline_lexical_v1@")


def test_the_command_line_prints_a_table_and_writes_the_json(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    assert main([str(data), "--profile", "lexical", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) >= {"profiles", "throughput", "latency_ms"}
    assert set(report["profiles"]["lexical"]) >= {
        "recall@1",
        "recall@5",
        "recall@10",
        "mrr",
        "per_category",
    }
    assert "lexical" in capsys.readouterr().out


def test_via_mcp_the_benchmark_goes_through_the_http_endpoint_and_agrees(
    data: Path, tmp_path: Path
) -> None:
    from bench.locomo.dataset import load_dir

    result = run_benchmark(load_dir(data), ["lexical"], via_mcp=True, data_dir=tmp_path / "mcp")
    assert result["via"] == "mcp-http"
    assert result["throughput"]["accepted"] == 5
    per = result["profiles"]["lexical"]["per_category"]
    assert per["4"]["recall@1"] == 1.0 and per["1"]["recall@5"] == 1.0
    assert result["profiles"]["lexical"]["recall@10"] == 0.75


@pytest.mark.skipif(
    not semantic_extra_installed(),
    reason="the semantic extra is not installed (pip install 'engram-memory[semantic]')",
)
def test_the_semantic_and_hybrid_profiles_run_on_the_local_model(
    data: Path, tmp_path: Path
) -> None:
    from bench.locomo.dataset import load_dir

    result = run_benchmark(
        load_dir(data), ["lexical", "semantic", "hybrid"], data_dir=tmp_path / "engine"
    )
    profiles = result["profiles"]
    assert [p["rank_receipt_profiles"][0].split("@")[0] for p in profiles.values()] == [
        "offline_lexical_v1",
        "semantic_v1",
        "semantic_v1",
    ]
    # semantic and hybrid are the same profile with different config digests
    assert (
        profiles["semantic"]["rank_receipt_profiles"] != profiles["hybrid"]["rank_receipt_profiles"]
    )
    # the semantic list ranks every record: the word-less question still gets 5 turns back
    assert profiles["semantic"]["per_category"]["2"]["recall@5"] == 1.0
    assert profiles["hybrid"]["per_category"]["4"]["recall@1"] == 1.0
