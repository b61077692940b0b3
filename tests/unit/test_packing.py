"""The at-rest packing of journal events, ledger outputs and record bodies: lossless for any bytes,
smaller for the documents the store keeps, and never a hiding place for text."""

from __future__ import annotations

import hashlib
import json
import re
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_memory.contract.packing import (
    _DICTIONARIES,
    CURRENT_VERSION,
    is_packed,
    pack,
    unpack,
    unpack_all,
)


def _digest(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def _event(cursor: int) -> bytes:
    return json.dumps(
        {
            "at": "2026-12-04T14:58:56.792Z",
            "cursor": str(cursor),
            "digests": {
                "intent_hash": _digest(f"i{cursor}"),
                "record_digest": _digest(f"r{cursor}"),
            },
            "operation": "capture",
            "previous_event_hash": _digest(f"p{cursor}"),
            "schema": 1,
            "target": "candidate_" + hashlib.sha256(b"c").hexdigest(),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def test_a_journal_event_packs_to_under_half_and_unpacks_to_the_same_bytes() -> None:
    event = _event(7)
    packed = pack(event)
    assert is_packed(packed) and len(packed) < len(event) / 2
    assert unpack(packed) == event


@pytest.mark.parametrize(
    "document",
    [
        b"",
        b'{"a":"' + b"f" * 65 + b'"}',  # a run longer than a digest stays text
        b'{"a":"' + b"F" * 64 + b'"}',  # upper case is not a digest
        b'{"a":"' + b"0" * 64 + b"1" * 32 + b'"}',  # a 96-digit run: neither size
        b"\x01" + b"a" * 64,  # a marker byte already there: no hex step
        bytes(range(256)) * 3,
    ],
)
def test_edge_cases_round_trip(document: bytes) -> None:
    assert unpack(pack(document)) == document


@given(st.binary(max_size=400))
def test_any_bytes_round_trip(document: bytes) -> None:
    assert unpack(pack(document)) == document


def test_a_value_stored_before_packing_is_returned_as_it_is() -> None:
    assert unpack(_event(1)) == _event(1)


def test_a_damaged_or_unknown_packed_value_is_refused() -> None:
    packed = pack(_event(2))
    with pytest.raises(ValueError, match="version"):
        unpack(b"\xff\x63" + packed[2:])
    with pytest.raises(ValueError, match=r"damaged|truncated"):
        unpack(packed[:-4])


def test_a_scan_of_raw_bytes_finds_the_text_inside_packed_values() -> None:
    text = b"the heliotrope gate code is 4471"
    document = b'{"text":"' + text + b'"}'
    page = b"\x00\xff\x07" + pack(_event(3)) + b"\xff\xff" + pack(document) + b"\x00" * 9
    assert text not in page  # deflated: a plain byte scan would miss it
    assert any(text in found for found in unpack_all(page))


_EXACT_RUN = re.compile(rb"(?<![0-9a-f])(?:[0-9a-f]{64}|[0-9a-f]{32})(?![0-9a-f])")


def _full_window_pack(document: bytes) -> bytes:
    """``pack`` as it always was: the runs of exactly 64 or 32 hex digits as their bytes, then
    deflated in a 32 KiB window at memLevel 9, whatever the size."""
    flags, body = 0, document
    if b"\x01" not in document and b"\x02" not in document:
        flags = 1
        body = _EXACT_RUN.sub(
            lambda run: (
                (b"\x01" if len(run.group()) == 64 else b"\x02")
                + bytes.fromhex(run.group().decode())
            ),
            document,
        )
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zdict=_DICTIONARIES[CURRENT_VERSION])
    return bytes((0xFF, CURRENT_VERSION, flags)) + deflate.compress(body) + deflate.flush()


def _noise(size: int) -> bytes:
    """Bytes deflate finds no match in: one literal each (a block of memLevel 8 holds 16k)."""
    return b"".join(hashlib.sha256(n.to_bytes(4, "big")).digest() for n in range(size // 32))


def _record_like(words: list[str]) -> bytes:
    # The dictionary's own shapes, so the body's matches reach back into it from every size.
    text = " ".join(words)
    return json.dumps(
        {
            "components": [{"component_id": "component:turn", "kind": "evidence", "text": text}],
            "payload_digest": _digest(text),
            "record_digest": _digest(text[::-1]),
            "recorded_at": "2026-12-04T14:58:56.792Z",
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


@pytest.mark.parametrize("size", [0, 200, 1000, 1600, 2500, 4000, 5600, 5700, 5800, 9000, 20000])
def test_packing_writes_the_same_bytes_as_the_full_window_at_every_size(size: int) -> None:
    words = [f"word{n % 37}" for n in range(size // 7)]
    for document in (
        _record_like(words),
        _event(size),
        b"x" * size,
        bytes(range(256)) * (size // 256),
        _noise(size),
    ):
        assert pack(document) == _full_window_pack(document)


@given(
    st.lists(
        st.sampled_from(
            ["sha256:", "candidate_", "kind", " ", "é", "\x01", "0123456789abcdef", "A"]
        ),
        max_size=400,
    )
)
def test_packing_any_document_writes_the_full_window_s_bytes(words: list[str]) -> None:
    # Joined, the hex chunks make runs of every length: 16, 32, 48, 64, 80 ...
    for document in (_record_like(words), "".join(words).encode()):
        assert pack(document) == _full_window_pack(document)
