"""bench.lexical_threads reports a per-call time for each sharing strategy and thread count."""

from __future__ import annotations

import json

import pytest
import snowballstemmer

from bench import lexical_threads


def test_the_stemmer_sharing_benchmark_reports_both_strategies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lexical_threads.main(["--threads", "4", "--calls", "40", "--rounds", "1"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {
        "words_per_call",
        "per_thread_1_threads_us_per_call",
        "per_thread_4_threads_us_per_call",
        "locked_1_threads_us_per_call",
        "locked_4_threads_us_per_call",
    }
    assert all(value > 0 for value in report.values())


def test_both_strategies_stem_like_a_private_stemmer() -> None:
    expected = snowballstemmer.stemmer("english").stemWords(lexical_threads.WORDS)
    for factory in (lexical_threads.per_thread, lexical_threads.locked):
        assert factory()(lexical_threads.WORDS) == expected
