"""The lexical channel's analyzer and ranking profile (CONTRACT.md §7.1).

The analyzer lives in the engine, not in an adapter, so every index (SQLite FTS5 embedded,
OpenSearch in the cloud) indexes the same terms and ranks the same way. The profile's
configuration is digested into every rank receipt.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from ..contract.canonical import digest

PROFILE: Final = "offline_lexical_v1"
PROFILE_VERSION: Final = "1.0.0"
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
ANALYZER_VERSION: Final = "casefold-nfkc-words/1"
MAX_QUERY_TERMS: Final = 64

_WORD: Final = re.compile(r"[^\W_]+")


def analyze(text: str) -> list[str]:
    """Terms of ``text``: NFKC, case-folded, split on anything that is not a letter or digit."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


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
        "k1": str(BM25_K1),
        "b": str(BM25_B),
        "field_weights": {name: str(weight) for name, weight in FIELD_WEIGHTS.items()},
        "max_query_terms": MAX_QUERY_TERMS,
        "ties": "record_id_ascending",
    }


PROFILE_CONFIG_DIGEST: Final = digest("rank-profile", profile_config())
