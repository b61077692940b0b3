"""The admission benchmark on a small slice of its corpus, through the real embedded engine."""

from __future__ import annotations

from bench.governance import admission


def test_the_corpus_is_labelled_with_the_benchmark_classes() -> None:
    items = admission.load()
    labels = {item.label for item in items}
    assert labels == {"seed", *admission.CLASSES}
    assert len(items) >= 250
    assert len({item.item_id for item in items}) == len(items)


def test_a_slice_reports_every_class_and_rejects_no_genuine_fact() -> None:
    result = admission.run(admission.sliced(admission.load(), 4))
    assert set(result["classes"]) == set(admission.CLASSES)
    for row in result["classes"].values():
        assert set(row) == {"items", "caught", "recall", "precision"}
        assert row["items"] == 4
    assert result["genuine_not_accepted"] == 0
    assert result["classes"]["duplicate"]["recall"] == 1.0
    assert result["classes"]["trivia"]["recall"] == 1.0
