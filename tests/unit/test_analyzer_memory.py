"""The analyzer's stem cache is bounded in bytes, not only in entries."""

from __future__ import annotations

import gc
import tracemalloc

from engram_memory.engine import lexical

# A component's text may be 65,536 bytes of one word (CONTRACT.md §6); 60 such words are 3.6 MiB.
LONG_WORDS = 60
LONG_WORD_CHARS = 60_000


def _retained_bytes(texts: list[str]) -> int:
    """Bytes the analyzer and its stemmer still hold after analysing ``texts`` and dropping
    every result (only their allocations: a thread of another test allocating meanwhile does
    not count)."""
    lexical.analyze("warming")  # the stemmer's tables load on first use
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for text in texts:
            lexical.analyze(text)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    mine = [
        tracemalloc.Filter(True, lexical.__file__),
        tracemalloc.Filter(True, "*snowballstemmer*"),
    ]
    growth = after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
    return sum(stat.size_diff for stat in growth)


def test_long_words_are_stemmed_but_not_remembered() -> None:
    words = [f"{'q' * LONG_WORD_CHARS}{n:04d}painting" for n in range(LONG_WORDS)]
    # 60 distinct 60,000-character words kept by the cache would hold 3.6 MB for as long as the
    # process lives (65,536 of them: 4 GB; measured before the bound: 9.9 MB here). Stemmed
    # without being remembered, only the last stays, in the thread's stemmer until its next word.
    assert _retained_bytes(words) < 2 * LONG_WORD_CHARS
    # ... and they are stemmed as before: the suffix goes, the word is otherwise the same.
    assert lexical.analyze(words[0]) == [words[0].removesuffix("ing")]


def test_short_words_are_remembered_up_to_the_bound() -> None:
    lexical.analyze("painting")
    hits = lexical._stem.cache_info().hits
    assert lexical.analyze("painting painted") == ["paint", "paint"]
    assert lexical._stem.cache_info().hits == hits + 1
    assert lexical._stem.cache_info().maxsize == lexical.STEM_CACHE_ENTRIES
