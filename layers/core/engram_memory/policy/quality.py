"""The quality gate of the built-in admission policy: low-information captures and
near-duplicates of current records in the same scope (issue 27).

Near-duplicates are found with shingled MinHash (``rensa``: a maintained Rust implementation with
no dependencies; ``datasketch`` would bring numpy and scipy into the Lambda layer and 0.4 s of
imports into every start): each text is normalized (NFKC, case folded, every run of non-letters
and non-digits one space), cut into character shingles of ``SHINGLE`` characters, and its MinHash signature compared with each neighbour's; the estimated
Jaccard similarity at or above the host's threshold makes the candidate a near-duplicate of that
record. Character shingles see through re-casing, punctuation, spacing, a typo or a filler word;
they do not see a restatement in other words (that needs the semantic channel).

The neighbours come from the engine (``AdmissionRequest.neighbours``): the scope's current
records its lexical index ranks highest for the candidate's text. The policy never reads a store.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Final

from rensa import RMinHash

from engram_memory.engine.ports import Neighbour

__all__ = [
    "DEFAULT_MIN_TEXT_CHARS",
    "DEFAULT_NEAR_DUPLICATE_THRESHOLD",
    "NUM_PERM",
    "SHINGLE",
    "low_information",
    "normalize",
    "resembled",
]

SHINGLE: Final = 5
NUM_PERM: Final = 128
_SEED: Final = 27  # fixed: equal texts give equal signatures in every process
DEFAULT_NEAR_DUPLICATE_THRESHOLD: Final = 0.7
# Below this many letters and digits a capture carries nothing worth recalling ("ok", "thx!").
DEFAULT_MIN_TEXT_CHARS: Final = 12

_NON_WORD: Final = re.compile(r"[\W_]+")


def normalize(text: str) -> str:
    """NFKC, case folded, every run of non-letters and non-digits one space, trimmed."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def low_information(text: str, min_chars: int) -> bool:
    """Whether ``text`` is empty after normalization or has fewer than ``min_chars`` letters and
    digits (``min_chars`` 0 turns the length rule off; empty text is always low information)."""
    content = normalize(text).replace(" ", "")
    return not content or len(content) < min_chars


def _signature(text: str) -> RMinHash:
    normal = normalize(text)
    signature = RMinHash(num_perm=NUM_PERM, seed=_SEED)
    # Every shingle, repeats and all, in text order: a MinHash keeps the least hash per
    # permutation, which neither order nor repeats change, so this is the signature of the set
    # of shingles (sorting and de-duplicating them first was half of a signature's cost).
    signature.update([normal[i : i + SHINGLE] for i in range(max(1, len(normal) - SHINGLE + 1))])
    return signature


def resembled(
    text: str, neighbours: Sequence[Neighbour], threshold: float
) -> list[tuple[str, float]]:
    """The neighbours ``text`` near-duplicates, as ``(record_id, similarity)``, most similar
    first (ties by record id)."""
    if not neighbours or not normalize(text):
        return []
    mine = _signature(text)
    found = []
    for neighbour in neighbours:
        similarity = float(mine.jaccard(_signature(neighbour.text)))
        if similarity >= threshold:
            found.append((neighbour.record_id, round(similarity, 3)))
    return sorted(found, key=lambda pair: (-pair[1], pair[0]))
