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
records its index finds for the candidate's text. The policy never reads a store.

``band_keys`` cuts a signature into ``BANDS`` bands of ``BAND_ROWS`` values (locality-sensitive
hashing): two texts of estimated similarity ``s`` share at least one band with probability
``1 - (1 - s**BAND_ROWS)**BANDS`` (0.99985 at 0.7, 0.988 at 0.6, 0.87 at 0.5), and unrelated
texts almost never do. An index that keeps each record's band keys (the embedded store,
issue 39) finds a candidate's near-duplicates by looking up its bands, at a cost that follows
how many records share them, not the size of the store.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import unicodedata
from collections.abc import Sequence
from typing import Final

from rensa import RMinHash

from engram_memory.engine.ports import Neighbour

__all__ = [
    "BANDS",
    "BAND_ROWS",
    "DEFAULT_MIN_TEXT_CHARS",
    "DEFAULT_NEAR_DUPLICATE_THRESHOLD",
    "NUM_PERM",
    "SHINGLE",
    "band_keys",
    "low_information",
    "normalize",
    "resembled",
]

SHINGLE: Final = 5
NUM_PERM: Final = 128
_SEED: Final = 27  # fixed: equal texts give equal signatures in every process
DEFAULT_NEAR_DUPLICATE_THRESHOLD: Final = 0.7
BANDS: Final = 32
BAND_ROWS: Final = NUM_PERM // BANDS
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


# Signatures recently made, by keyed digest of the scope's partition and the text (a key made
# per process and kept nowhere else, so the memo holds no text): an admission signs the
# candidate's text to find its neighbours (``band_keys``), to compare it with them
# (``resembled``) and to sketch the record it becomes (``band_keys`` again, in its commit); each
# is the same signature. The partition (``memo_partition``) keeps one workspace's admissions
# from making another's faster, which would tell an agent what texts another workspace holds,
# as the secret scanner's memo does. Bounded: past ``_SIGNATURE_MEMO_ENTRIES`` it starts over.
_SIGNATURE_MEMO_ENTRIES: Final = 64
_SIGNATURE_MEMO_KEY: Final = os.urandom(32)


class _Remembered:
    """A memoized signature, and its band keys once asked for (hashes, like the signature)."""

    __slots__ = ("bands", "signature")

    def __init__(self, signature: RMinHash) -> None:
        self.signature = signature
        self.bands: tuple[int, ...] | None = None


_signatures: dict[bytes, _Remembered] = {}


def memo_partition(tenant_id: str, workspace_id: str) -> str:
    """The partition of a scope's memoized answers (signatures here, secret scans in
    ``policy.secrets``): nothing one scope computed is reused for another."""
    return f"{tenant_id}\x1f{workspace_id}"


def _remembered(text: str, partition: str) -> _Remembered:
    key = hashlib.blake2b(
        f"{len(partition)}:{partition}:{text}".encode("utf-8", "surrogatepass"),
        key=_SIGNATURE_MEMO_KEY,
        digest_size=16,
    ).digest()
    remembered = _signatures.get(key)
    if remembered is None:
        remembered = _Remembered(_signed(text))
        if len(_signatures) >= _SIGNATURE_MEMO_ENTRIES:
            _signatures.clear()
        _signatures[key] = remembered
    return remembered


def _signature(text: str, partition: str) -> RMinHash:
    return _remembered(text, partition).signature


def _signed(text: str) -> RMinHash:
    normal = normalize(text)
    signature = RMinHash(num_perm=NUM_PERM, seed=_SEED)
    # Every shingle, repeats and all, in text order: a MinHash keeps the least hash per
    # permutation, which neither order nor repeats change, so this is the signature of the set
    # of shingles (sorting and de-duplicating them first was half of a signature's cost).
    signature.update([normal[i : i + SHINGLE] for i in range(max(1, len(normal) - SHINGLE + 1))])
    return signature


def resembled(
    text: str, neighbours: Sequence[Neighbour], threshold: float, *, partition: str
) -> list[tuple[str, float]]:
    """The neighbours ``text`` near-duplicates, as ``(record_id, similarity)``, most similar
    first (ties by record id); ``partition`` is the scope's (``memo_partition``)."""
    if not neighbours or not normalize(text):
        return []
    mine = _signature(text, partition)
    found = []
    for neighbour in neighbours:
        similarity = float(mine.jaccard(_signature(neighbour.text, partition)))
        if similarity >= threshold:
            found.append((neighbour.record_id, round(similarity, 3)))
    return sorted(found, key=lambda pair: (-pair[1], pair[0]))


def band_keys(text: str, *, partition: str) -> list[int]:
    """The LSH band keys of ``text``'s signature (module docstring), each a signed 64-bit
    integer naming the band's position and its ``BAND_ROWS`` values; none for a text that
    normalizes to nothing. Equal texts give equal keys in every process and every scope (a
    fixed seed); ``partition`` (``memo_partition``) only keeps the memo apart. Remembered
    with the signature: an admission asks twice (its neighbours, then the record's sketch),
    and the policy may have asked in the idle time before it (``anticipate``)."""
    remembered = _remembered(text, partition)
    if remembered.bands is None:
        remembered.bands = _bands_of(remembered.signature) if normalize(text) else ()
    return list(remembered.bands)


def _bands_of(signature: RMinHash) -> tuple[int, ...]:
    values = signature.digest()
    keys = []
    for band in range(BANDS):
        rows = values[band * BAND_ROWS : (band + 1) * BAND_ROWS]
        packed = struct.pack(f"<{BAND_ROWS + 1}I", band, *rows)
        key = hashlib.blake2b(packed, digest_size=8, person=b"engram-lsh").digest()
        keys.append(int.from_bytes(key, "little", signed=True))
    return tuple(keys)
