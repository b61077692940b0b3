"""Redaction of returned records by the host's field allowlist (CONTRACT.md §7.2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from engram_memory.contract.canonical import DIGEST_PREFIX, digest

DEFAULT_ALLOWLIST: Final = (
    "/record_id",
    "/record_digest",
    "/purpose_ref",
    "/valid_time",
    "/components",
    "/primary_component_id",
    "/primary_event",
    "/citations",
    "/trust",
    "/recorded_at",
    "/retention",
)


@dataclass(frozen=True, slots=True)
class RedactionPolicy:
    allowlist: frozenset[str]
    version: str

    @classmethod
    def from_allowlist(cls, pointers: Iterable[str] = DEFAULT_ALLOWLIST) -> RedactionPolicy:
        allow = frozenset(pointers) | {"/record_id"}  # record_id is always present
        version = (
            "allowlist-1:"
            + digest("redaction-policy", sorted(allow)).removeprefix(DIGEST_PREFIX)[:16]
        )
        return cls(allowlist=allow, version=version)


def redact(
    record: Mapping[str, Any], policy: RedactionPolicy
) -> tuple[dict[str, Any], list[str], str]:
    """Return the filtered record, the sorted omitted pointers and the redaction receipt digest."""
    kept = {k: v for k, v in record.items() if "/" + k in policy.allowlist}
    redacted = sorted("/" + k for k in record if "/" + k not in policy.allowlist)
    receipt_digest = digest(
        "recall-redaction",
        {
            "record_id": record["record_id"],
            "source_record_digest": record["record_digest"],
            "policy_version": policy.version,
            "redacted_fields": redacted,
        },
    )
    return kept, redacted, receipt_digest
