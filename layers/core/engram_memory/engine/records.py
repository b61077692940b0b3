"""Building the stored payload, the record and its digests (CONTRACT.md §5, §7.3, §12)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Final

from engram_memory.contract.canonical import (
    DIGEST_PREFIX,
    canonical_bytes,
    digest,
    digest_of_canonical,
    digest_without,
    record_id_for,
)
from engram_memory.contract.models import CaptureInput
from engram_memory.contract.packing import unpack
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope

DEFAULT_RETENTION: Final = {"derivative_rule": "make-ineligible"}
DEFAULT_RECONCILIATION: Final[dict[str, list[str]]] = {"family_refs": []}
VERIFIER_ID: Final = "engram-host-default"
VERIFIER_VERSION: Final = "1"


# A digest of the scope alone, asked for six times a capture + admission pair: made once a scope.
@functools.lru_cache(maxsize=1024)
def scope_ref(scope: Scope) -> str:
    """An opaque, stable reference to the scope (the ids themselves are never stored in a payload)."""
    value = digest("scope", {"tenant_id": scope.tenant_id, "workspace_id": scope.workspace_id})
    return "scope:" + value.removeprefix(DIGEST_PREFIX)[:32]


def stored_payload(arguments: CaptureInput, scope: Scope) -> dict[str, Any]:
    """The agent's payload plus the host-injected scope_ref and resolved defaults."""
    payload: dict[str, Any] = arguments.payload.model_dump(mode="json", exclude_none=True)
    payload["scope_ref"] = scope_ref(scope)
    payload.setdefault("retention", dict(DEFAULT_RETENTION))
    payload.setdefault("reconciliation", {"family_refs": []})
    return payload


def evidence_object(arguments: CaptureInput) -> dict[str, Any]:
    return arguments.evidence.model_dump(mode="json", exclude_none=True)


def trust_receipt(evidence: Mapping[str, Any], issued_at_ms: int) -> dict[str, Any]:
    """Trust assigned by the host's verifier; without one the class is ``asserted``."""
    trust: dict[str, Any] = {
        "class": "asserted",
        "evidence_digest": digest("evidence", dict(evidence)),
        "verifier_id": VERIFIER_ID,
        "verifier_version": VERIFIER_VERSION,
        "issued_at": format_instant(issued_at_ms),
        "revocation_epoch": 0,
    }
    trust["receipt_digest"] = digest("trust", trust)
    return trust


def build_record(
    payload: Mapping[str, Any],
    evidence: Mapping[str, Any],
    *,
    recorded_at_ms: int,
    recorded_cursor: int,
    authorization_receipt_digest: str,
) -> dict[str, Any]:
    """The full record (with ``record_id`` and ``record_digest``), fixed at capture."""
    record: dict[str, Any] = dict(payload)
    record["payload_digest"] = digest("payload", dict(payload))
    record["recorded_at"] = format_instant(recorded_at_ms)
    record["recorded_cursor"] = str(recorded_cursor)
    record["authorization_receipt_digest"] = authorization_receipt_digest
    record["trust"] = trust_receipt(evidence, recorded_at_ms)
    record_digest = digest("record", record)
    record["record_digest"] = record_digest
    record["record_id"] = record_id_for(record_digest)
    return record


def stored_body_matches(body: bytes, record_digest: str) -> bool:
    """True when a stored body is the canonical JSON of a record whose digest is ``record_digest``
    and whose id follows from it: the integrity check of every read, without re-canonicalizing.

    A stored body is ``encode(record)``: JCS sorts ``record_digest`` and ``record_id`` next to each
    other, so the bytes without that one member are exactly the canonical bytes the digest was
    computed over. Hashing them proves the body is what was digested (or a SHA-256 collision); a
    body whose digest member moved inside the JSON still decodes to the same record, or fails the
    caller's own checks. Anything else (a body stored in another form) is left to
    ``record_digest_matches``, the full re-derivation, so no valid body is refused.
    """
    member = (
        f'"record_digest":"{record_digest}","record_id":"{record_id_for(record_digest)}"'
    ).encode()
    at = body.find(member)
    if at < 0 or body.find(member, at + 1) >= 0:
        return False
    end = at + len(member)
    if body[at - 1 : at] == b",":
        rest = body[: at - 1] + body[end:]
    elif body[end : end + 1] == b",":
        rest = body[:at] + body[end + 1 :]
    else:
        rest = body[:at] + body[end:]
    return digest_of_canonical("record", rest) == record_digest


def record_digest_matches(record: Mapping[str, Any]) -> bool:
    """True when the body still hashes to its own digest and id (integrity of a stored blob)."""
    body = {k: v for k, v in record.items() if k not in ("record_id", "record_digest")}
    try:
        expected = digest("record", body)
    except ValueError:
        return False
    return record.get("record_digest") == expected and record.get("record_id") == record_id_for(
        expected
    )


def payload_of(record: Mapping[str, Any]) -> dict[str, Any]:
    excluded = {
        "payload_digest",
        "recorded_at",
        "recorded_cursor",
        "authorization_receipt_digest",
        "trust",
        "record_digest",
        "record_id",
    }
    return {k: v for k, v in record.items() if k not in excluded}


def encode(value: Any) -> bytes:
    return canonical_bytes(value)


def decode(blob: bytes) -> Any:
    """The JSON value of a stored body, packed (``contract.packing``) or not."""
    return json.loads(unpack(blob).decode("utf-8"))


def receipt(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A receipt: ``fields`` plus ``receipt_digest`` over them."""
    value = dict(fields)
    value["receipt_digest"] = digest_without(kind, value, "receipt_digest")
    return value


def record_text(record: Mapping[str, Any]) -> str:
    """A record's component texts, in order, one per line: what the quality gate compares."""
    components = record.get("components") or []
    return "\n".join(str(c.get("text", "")) for c in components if isinstance(c, Mapping))
