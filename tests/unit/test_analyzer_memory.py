"""The analyzer's stem cache is bounded in bytes, not only in entries."""

from __future__ import annotations

import gc
import tracemalloc

from engram_memory.engine import lexical

# A component's text may be 65,536 bytes of one word (CONTRACT.md §6); 60 such words are 3.6 MiB.
LONG_WORDS = 60
LONG_WORD_CHARS = 60_000


def _retained_bytes(texts: list[str]) -> int:
    """Bytes still allocated after analysing ``texts`` and dropping every result."""
    lexical.analyze("warming")  # the stemmer's tables load on first use
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            lexical.analyze(text)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


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
