"""Every read checks a stored record body against its digest: from the opened bytes when they are
the canonical form (one hash), else by re-deriving the digest from the decoded record. (Bodies
are sealed under their record's key: these tests open and re-seal them with that key.)"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from engram_memory.contract.canonical import digest
from engram_memory.contract.packing import unpack
from engram_memory.engine import records
from engram_memory.engine.context import Scope
from engram_memory.engine.records import decode, record_digest_matches, stored_body_matches

from engram_testing import Harness, context, embedded_harness


def _stored(harness: Harness, tmp_path: Path, record_id: str) -> tuple[bytes, str]:
    """The record's body as stored, opened and unpacked, and its digest."""
    row = harness.store.record_get(context().scope, record_id)  # digests are bytes in the file
    assert row is not None and row.body is not None
    opened = harness.record_keys.open_many(context().scope, {record_id: row.body})
    return unpack(opened[record_id]), row.record_digest  # the engine packs before sealing


def _store(harness: Harness, tmp_path: Path, record_id: str, plaintext: bytes) -> None:
    """Replace the record's body with ``plaintext``, sealed under the record's own key."""
    sealed = harness.record_keys.seal(context().scope, record_id, plaintext)
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        conn.execute("UPDATE records SET body = ? WHERE record_id = ?", (sealed, record_id))


def test_a_stored_body_hashes_to_its_digest_without_being_re_canonicalized(
    tmp_path: Path,
) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The backup window is 02:00 UTC.")
    body, record_digest = _stored(harness, tmp_path, record_id)
    assert stored_body_matches(body, record_digest)
    assert record_digest_matches(decode(body))
    # Any change to the bytes, to the digest, or a second copy of the digest member fails.
    assert not stored_body_matches(body.replace(b"02:00", b"03:00"), record_digest)
    assert not stored_body_matches(body, record_digest[:-1] + "0")
    member_at = body.index(b'"record_digest"')
    assert not stored_body_matches(body[:member_at] + body[member_at:] * 2, record_digest)
    harness.close()


def test_a_body_stored_in_another_json_form_is_still_read(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The on-call rota lives in the ops calendar.")
    body, record_digest = _stored(harness, tmp_path, record_id)
    spaced = json.dumps(json.loads(body), indent=2).encode()
    assert not stored_body_matches(spaced, record_digest)
    _store(harness, tmp_path, record_id, spaced)
    value = harness.get(record_id)["output"]["value"]
    assert value["record"]["record_id"] == record_id
    harness.close()


def test_a_digest_member_moved_into_a_nested_object_is_journal_corrupt(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The backup window is 02:00 UTC.")
    body, _ = _stored(harness, tmp_path, record_id)
    record = json.loads(body)
    moved = {k: v for k, v in record.items() if k not in ("record_digest", "record_id")}
    moved["retention"] = {
        **moved["retention"],
        "record_digest": record["record_digest"],
        "record_id": record["record_id"],
    }
    _store(
        harness,
        tmp_path,
        record_id,
        json.dumps(moved, separators=(",", ":"), sort_keys=True).encode(),
    )
    assert harness.get(record_id)["error"]["code"] == "JOURNAL_CORRUPT"
    harness.close()


def test_a_scope_s_reference_is_digested_once_and_stays_the_digest_of_its_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scope = Scope("tenant-scope-ref-0001", "ws-scope-ref-0001")
    expected = (
        "scope:"
        + digest(
            "scope", {"tenant_id": scope.tenant_id, "workspace_id": scope.workspace_id}
        ).removeprefix("sha256:")[:32]
    )
    digested: list[str] = []

    def counted(kind: str, value: object) -> str:
        digested.append(kind)
        return digest(kind, value)

    monkeypatch.setattr(records, "digest", counted)
    assert records.scope_ref(scope) == expected
    assert records.scope_ref(Scope(scope.tenant_id, scope.workspace_id)) == expected
    assert digested == ["scope"]  # the second ask, for an equal scope, is answered from memory
    assert records.scope_ref(Scope(scope.tenant_id, "ws-scope-ref-0002")) != expected
    assert digested == ["scope", "scope"]
