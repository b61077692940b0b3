"""Every read checks a stored record body against its digest: from the stored bytes when they are
the canonical form (one hash), else by re-deriving the digest from the decoded record."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from engram_memory.engine.records import decode, record_digest_matches, stored_body_matches

from engram_testing import embedded_harness


def _stored(tmp_path: Path, record_id: str) -> tuple[bytes, str]:
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        body, record_digest = conn.execute(
            "SELECT body, record_digest FROM records WHERE record_id = ?", (record_id,)
        ).fetchone()
    return bytes(body), str(record_digest)


def test_a_stored_body_hashes_to_its_digest_without_being_re_canonicalized(
    tmp_path: Path,
) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The backup window is 02:00 UTC.")
    body, record_digest = _stored(tmp_path, record_id)
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
    body, record_digest = _stored(tmp_path, record_id)
    spaced = json.dumps(json.loads(body), indent=2).encode()
    assert not stored_body_matches(spaced, record_digest)
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        conn.execute("UPDATE records SET body = ? WHERE record_id = ?", (spaced, record_id))
    value = harness.get(record_id)["output"]["value"]
    assert value["record"]["record_id"] == record_id
    harness.close()


def test_a_digest_member_moved_into_a_nested_object_is_journal_corrupt(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The backup window is 02:00 UTC.")
    body, _ = _stored(tmp_path, record_id)
    record = json.loads(body)
    moved = {k: v for k, v in record.items() if k not in ("record_digest", "record_id")}
    moved["retention"] = {
        **moved["retention"],
        "record_digest": record["record_digest"],
        "record_id": record["record_id"],
    }
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        conn.execute(
            "UPDATE records SET body = ? WHERE record_id = ?",
            (json.dumps(moved, separators=(",", ":"), sort_keys=True).encode(), record_id),
        )
    assert harness.get(record_id)["error"]["code"] == "JOURNAL_CORRUPT"
    harness.close()
