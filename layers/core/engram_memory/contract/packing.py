"""A compact, lossless at-rest form for the JSON documents a store keeps: journal events, ledger
outputs and record bodies (before they are sealed).

Most of such a document is SHA-256 digests in lowercase hex and the same keys and constant
strings document after document; the text itself is a few hundred bytes. ``pack`` writes each
run of exactly 64 (or 32) lowercase hex digits as a marker byte and the raw 32 (16) bytes, then
deflates the result with zlib against a preset dictionary (``zdict``) of those fixed shapes, so
even a 300-byte document finds its keys already "seen". ``unpack`` undoes both exactly: digests,
receipts and hashes are computed over the unpacked bytes, which are the bytes ``pack`` was given.

A packed value starts with ``0xFF`` (never the first byte of UTF-8 JSON) and the version of its
dictionary, so a value stored before packing is returned as it is and the dictionary can change:
a new version is added beside the old ones, which stay readable. Packing is only an encoding,
never a way to hide anything: whoever reads the store unpacks it (the byte scans of forgotten text
in the tests do, see ``unpack_all``).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Final

MAGIC: Final = 0xFF
_HEX_RUNS: Final = 1  # flag: hex runs were replaced by their bytes
# Control bytes never appear raw in JSON (RFC 8259 escapes them), so they are free as markers;
# a document that holds one anyway is deflated without the hex step (flag clear).
_HEX64: Final = b"\x01"
_HEX32: Final = b"\x02"
# Every maximal run of 32 or more, of which only those of exactly 64 or 32 are replaced: twice as
# fast as asking the engine for exactly those (a lookbehind tried at every byte).
_HEX_RUN: Final = re.compile(rb"[0-9a-f]{32,}")
_RAW_RUN: Final = re.compile(rb"\x01(.{32})|\x02(.{16})", re.DOTALL)

# Version 1: the keys and constant strings of journal events, ledger outputs (capture, admission,
# the lifecycle tools) and record bodies, most frequent last (deflate reaches the end of its
# window more cheaply). Changing it means adding version 2, never editing this one.
_DICTIONARY_V1: Final = (
    b'"kind":"context","kind":"evidence","scheme":"dia_id","type_ref":"event:utterance"'
    b'"from_state":"accepted_current","to_state":"tombstoned","operation":"forget"'
    b'"operation":"dispute""operation":"resolve""operation":"supersede""operation":"expire"'
    b'"operation":"withdraw""operation":"reject""status":"pending","status":"rejected",'
    b'"event_receipt_digest":"sha256:\x01","forget_receipt_digest":"sha256:\x01",'
    b'"replayed":true}"replayed":false}'
    b'{"authorization_receipt_digest":"sha256:\x01","citations":[{"citation_id":"citation:turn",'
    b'"content_digest":"sha256:\x01","locator":{"scheme":"dia_id","value":"D1:1"},'
    b'"source_ref":"locomo:conv-'
    b'"}],"components":[{"citation_ids":["citation:turn"],"component_id":"component:turn",'
    b'"kind":"evidence","text":"'
    b'"},{"citation_ids":["citation:turn"],"component_id":"component:context",'
    b'"kind":"context","text":"'
    b'"}],"payload_digest":"sha256:\x01","primary_component_id":"component:turn",'
    b'"primary_event":{"at":1,"citation_id":"citation:turn","type_ref":"event:utterance"},'
    b'"purpose_ref":"purpose:general","reconciliation":{"family_refs":[]},'
    b'"record_digest":"sha256:\x01","record_id":"mem_","recorded_at":"2026-01-01T00:00:00.000Z",'
    b'"recorded_cursor":"1","retention":{"derivative_rule":"make-ineligible"},'
    b'"schema_version":2,"scope_ref":"scope:\x02","trust":{"class":"asserted",'
    b'"evidence_digest":"sha256:\x01","issued_at":"2026-01-01T00:00:00.000Z",'
    b'"receipt_digest":"sha256:\x01","revocation_epoch":0,"verifier_id":"engram-host-default",'
    b'"verifier_version":"1"},"valid_time":{"t":1'
    b'{"candidate_id":"candidate_\x01","cursor":"1","payload_digest":"sha256:\x01",'
    b'"record_digest":"sha256:\x01","capture_receipt_digest":"sha256:\x01","replayed":false}'
    b'{"outcome":{"candidate_id":"candidate_\x01","cursor":"1",'
    b'"decision_receipt_digest":"sha256:\x01","record_id":"mem_","status":"accepted",'
    b'"transaction_receipt_digest":"sha256:\x01"},"replayed":false}'
    b'{"at":"2026-01-01T00:00:00.000Z","cursor":"1","digests":{"intent_hash":"sha256:\x01",'
    b'"payload_digest":"sha256:\x01","record_digest":"sha256:\x01"},"operation":"capture",'
    b'"previous_event_hash":"sha256:\x01","schema":1,"target":"candidate_\x01"}'
    b'{"at":"2026-01-01T00:00:00.000Z","cursor":"1","digests":{'
    b'"decision_receipt_digest":"sha256:\x01","intent_hash":"sha256:\x01",'
    b'"record_digest":"sha256:\x01"},"operation":"admit",'
    b'"previous_event_hash":"sha256:\x01","schema":1,"target":"candidate_\x01"}'
)
CURRENT_VERSION: Final = 1
_DICTIONARIES: Final = {1: _DICTIONARY_V1}


def _to_raw(match: re.Match[bytes]) -> bytes:
    run = match.group()
    if len(run) == 64:
        return _HEX64 + bytes.fromhex(run.decode("ascii"))
    if len(run) == 32:
        return _HEX32 + bytes.fromhex(run.decode("ascii"))
    return run


def _to_hex(match: re.Match[bytes]) -> bytes:
    raw = match.group(1) if match.group(1) is not None else match.group(2)
    return raw.hex().encode("ascii")


# Deflate's state for a 32 KiB window at memLevel 9 is ~0.4 MB, set up for every value: most of
# the cost of packing a 500-byte document. A body that, with the dictionary, fits the reach of an
# 8 KiB window (``_SMALL_REACH``: 8192 less zlib's 262-byte lookahead; a journal event, a ledger
# output, a record body) is deflated in that window at memLevel 8, for a third to a half of the
# cost. No distance can exceed the smaller window and the whole body is one block either way, so
# the matches are the same but where a hash collision of memLevel 8 could cut a long chain's walk
# differently (a contrived input): the store's documents pack to the very bytes they did
# (tests/unit/test_packing.py compares both at every size). Either output is the same format,
# which ``unpack`` inflates with the full window.
_SMALL_REACH: Final = 8192 - 262


def _deflater(body_length: int) -> zlib._Compress:
    zdict = _DICTIONARIES[CURRENT_VERSION]
    if len(zdict) + body_length <= _SMALL_REACH:
        return zlib.compressobj(9, zlib.DEFLATED, -13, 8, zdict=zdict)
    return zlib.compressobj(9, zlib.DEFLATED, -15, 9, zdict=zdict)


def pack(document: bytes) -> bytes:
    """The packed form of ``document`` (any bytes; meant for UTF-8 JSON)."""
    flags = 0
    body = document
    if _HEX64 not in document and _HEX32 not in document:
        body, flags = _HEX_RUN.sub(_to_raw, document), _HEX_RUNS
    deflate = _deflater(len(body))
    return bytes((MAGIC, CURRENT_VERSION, flags)) + deflate.compress(body) + deflate.flush()


def is_packed(value: bytes) -> bool:
    return value[:1] == b"\xff"


def unpack(value: bytes) -> bytes:
    """The document ``pack`` was given; a value that was never packed, unchanged.

    Raises ``ValueError`` for a packed value that is damaged or of an unknown version."""
    if not is_packed(value):
        return value
    if len(value) < 3 or value[1] not in _DICTIONARIES:
        raise ValueError("packed value of an unknown version")
    inflate = zlib.decompressobj(-15, zdict=_DICTIONARIES[value[1]])
    try:
        body = inflate.decompress(value[3:]) + inflate.flush()
    except zlib.error as exc:
        raise ValueError("damaged packed value") from exc
    if not inflate.eof:
        raise ValueError("truncated packed value")
    return _RAW_RUN.sub(_to_hex, body) if value[2] & _HEX_RUNS else body


def unpack_all(blob: bytes) -> Iterator[bytes]:
    """Every packed value found anywhere in ``blob`` (a database file, a page), unpacked: what a
    byte scan for plaintext must also search, since a packed value's text is deflated. Finds
    each one by trying to inflate from every magic header; garbage that happens to inflate is
    yielded too (harmless to a scan)."""
    start = 0
    while (at := blob.find(b"\xff", start)) >= 0:
        start = at + 1
        version = blob[at + 1] if at + 1 < len(blob) else None
        if version not in _DICTIONARIES or at + 2 >= len(blob) or blob[at + 2] > _HEX_RUNS:
            continue
        inflate = zlib.decompressobj(-15, zdict=_DICTIONARIES[version])
        try:
            body = inflate.decompress(blob[at + 3 : at + 3 + (1 << 20)])
        except zlib.error:
            continue
        if inflate.eof and body:
            yield _RAW_RUN.sub(_to_hex, body) if blob[at + 2] & _HEX_RUNS else body
