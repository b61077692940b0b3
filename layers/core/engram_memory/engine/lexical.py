"""The lexical channel's analyzer and ranking profile (CONTRACT.md §7.1).

The analyzer lives in the engine, not in an adapter, so every index (SQLite FTS5 embedded,
OpenSearch in the cloud) indexes the same terms and ranks the same way: indexes receive the
analyzed terms space-joined and only split them on whitespace. The profile's configuration
(analyzer, stop words, stemmer, BM25 parameters, field weights) is digested into every rank
receipt.

The analyzer (``ANALYZER_VERSION``), the same for records and queries:

1. NFKC normalization and case folding;
2. tokens: maximal runs of letters and digits (everything else separates, ``_`` included);
3. English stop words dropped (``STOP_WORDS``, 153 words: NLTK's common English list of
   pronouns, auxiliaries, articles, prepositions and question words, with the fragments ``s``,
   ``t``, ``ll``, ``didn``... that splitting contractions leaves, less ``won``, a content verb
   too);
4. each remaining token reduced by the Snowball English (Porter2) stemmer, so ``painted``,
   ``painting`` and ``paints`` all index and query as ``paint``.

These are the standard general techniques of English full-text search (Lucene's ``english``
analyzer does the same three steps); nothing in them knows any data set. Measured on the LoCoMo
benchmark (``bench/locomo``), they lift lexical recall@10 from 0.667 to 0.722.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, Final

from engram_memory.contract.canonical import digest

PROFILE: Final = "offline_lexical_v1"
PROFILE_VERSION: Final = "2.0.0"
SCORING_FORMULA_REF: Final = (
    "bm25f:k1=1.2,b=0.75;fields=primary,decision,evidence,context,citations"
)

# Field order is the index column order; weights follow the contract.
FIELD_WEIGHTS: Final[Mapping[str, float]] = {
    "primary": 3.0,
    "decision": 2.0,
    "evidence": 1.5,
    "context": 1.0,
    "citations": 0.5,
}
BM25_K1: Final = 1.2
BM25_B: Final = 0.75
ANALYZER_VERSION: Final = "casefold-nfkc-words+english-stop+snowball-english/2"
MAX_QUERY_TERMS: Final = 64

_WORD: Final = re.compile(r"[^\W_]+")

_STOP_WORDS_TEXT: Final = """
a about above after again against ain all am an and any are aren as at be because been
before being below between both but by can couldn could d did didn do does doesn doing don
down during each few for from further had hadn has hasn have haven having he her here hers
herself him himself his how i if in into is isn it its itself just ll m ma me mightn more
most mustn my myself needn no nor not now o of off on once only or other our ours ourselves
out over own re s same shan she should shouldn so some such t than that the their theirs
them themselves then there these they this those through to too under until up ve very was
wasn we were weren what when where which while who whom why will with wouldn y you your
yours yourself yourselves
"""
STOP_WORDS: Final = frozenset(_STOP_WORDS_TEXT.split())


class _PerThreadStemmer(threading.local):
    # A Snowball stemmer keeps the word being stemmed in its own attributes, so one shared by
    # the server's worker threads raises IndexError or returns another thread's stem. Each
    # thread gets its own: as cheap as a lock around a shared one (bench/lexical_threads.py)
    # and it never makes one thread's stemming wait for another's.
    stem_words: Callable[[list[str]], list[str]] | None = None


_thread_stemmer: Final = _PerThreadStemmer()


def _stemmer() -> Callable[[list[str]], list[str]]:
    stem = _thread_stemmer.stem_words
    if stem is None:
        # Imported on first use: the stemmer package loads every language's tables.
        from snowballstemmer import stemmer

        stem = _thread_stemmer.stem_words = stemmer("english").stemWords
    return stem


def tokens(text: str) -> list[str]:
    """Tokens of ``text``: NFKC, case-folded, split on anything that is not a letter or digit."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


# The stem cache's bound, in entries and in characters per word. Bounding entries alone bounds
# nothing: one word may be a whole 65,536-byte component, and 65,536 such words would hold 4 GB
# for the life of the process. Words longer than STEM_CACHE_WORD_CHARS (English words are far
# shorter; such tokens are ids, hashes or junk that rarely repeat) are stemmed every time. An
# entry then costs at most about 0.5 KiB (two strings of 32 four-byte characters and the cache's
# link), so the cache holds at most about 32 MiB; measured with tracemalloc, an entry takes 136
# bytes for a short ASCII word, 236 for 32 ASCII letters, 281 for 32 four-byte letters (a word
# the stemmer leaves alone shares its string with its stem), so about 9 to 18 MiB when full.
STEM_CACHE_ENTRIES: Final = 65_536
STEM_CACHE_WORD_CHARS: Final = 32


@functools.lru_cache(maxsize=STEM_CACHE_ENTRIES)
def _stem(token: str) -> str:
    # Stemming is a pure function of the word and the pure-Python stemmer was most of an
    # admission's analysis time; words repeat, so their stems are remembered (bounded).
    return _stemmer()([token])[0]


def _stem_word(token: str) -> str:
    if len(token) > STEM_CACHE_WORD_CHARS:
        return _stemmer()([token])[0]
    return _stem(token)


def analyze(text: str) -> list[str]:
    """Terms of ``text``: its ``tokens`` without stop words, each stemmed (module docstring)."""
    return [_stem_word(token) for token in tokens(text) if token not in STOP_WORDS]


def query_terms(query: str) -> list[str]:
    """Distinct query terms in first-seen order, at most ``MAX_QUERY_TERMS``."""
    seen: dict[str, None] = {}
    for term in analyze(query):
        seen.setdefault(term, None)
    return list(seen)[:MAX_QUERY_TERMS]


def projection_fields(record: Mapping[str, Any]) -> dict[str, str]:
    """The weighted fields of a record, as space-joined analyzed terms."""
    texts: dict[str, list[str]] = {name: [] for name in FIELD_WEIGHTS}
    primary_id = record["primary_component_id"]
    for component in record["components"]:
        field = "primary" if component["component_id"] == primary_id else component["kind"]
        texts[field].extend(analyze(component["text"]))
    for citation in record["citations"]:
        texts["citations"].extend(analyze(citation["source_ref"]))
    return {name: " ".join(terms) for name, terms in texts.items()}


def profile_config() -> dict[str, Any]:
    return {
        "profile": PROFILE,
        "profile_version": PROFILE_VERSION,
        "analyzer": ANALYZER_VERSION,
        "stop_words": digest("stop-words", sorted(STOP_WORDS)),
        "k1": str(BM25_K1),
        "b": str(BM25_B),
        "field_weights": {name: str(weight) for name, weight in FIELD_WEIGHTS.items()},
        "max_query_terms": MAX_QUERY_TERMS,
        "ties": "record_id_ascending",
    }


PROFILE_CONFIG_DIGEST: Final = digest("rank-profile", profile_config())
"""The digest of the profile without time-aware ranking; it also versions the lexical projection
(the analyzed fields), which time-aware ranking leaves as they are."""

# With time-aware ranking (engine/temporal.py) the profile is a minor version up: the same index,
# the same scores for a query without a temporal expression.
TIME_AWARE_PROFILE_VERSION: Final = "2.1.0"


@functools.cache  # constants of this build: one digest per process, not one per search
def receipt_profile(time_aware: bool) -> tuple[str, str]:
    """The rank receipt's ``profile_version`` and ``profile_config_digest``."""
    if not time_aware:
        return PROFILE_VERSION, PROFILE_CONFIG_DIGEST
    from engram_memory.engine import temporal

    config = profile_config() | {
        "profile_version": TIME_AWARE_PROFILE_VERSION,
        "temporal": temporal.profile_config(),
    }
    return TIME_AWARE_PROFILE_VERSION, digest("rank-profile", config)
