"""The closed input models refuse everything CONTRACT.md §1, §3 and §7 refuse, and nothing else.

Every case validates a raw dict, as ``json.loads`` would hand it over, with ``model_validate``.
"""

from __future__ import annotations

import copy
import json
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from engram_memory.contract import types
from engram_memory.contract.models import (
    INPUT_MODELS,
    RequestAdmissionInput,
    SearchInput,
)

from engram_testing import DELETE, golden_payload, with_value

MAX_SAFE = 2**53 - 1
KEY = "capture-key-0001"  # 16 bytes
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
RECORD_ID = "mem_" + "a" * 52
CANDIDATE_ID = "candidate_" + "0123456789abcdef" * 4
NON_NFC = "e\u0301"  # "e" + combining acute: NFC is "\u00e9"


def _minimal_capture() -> dict[str, Any]:
    payload = golden_payload()
    del payload["retention"], payload["reconciliation"]
    del payload["valid_time"]["t_end"], payload["citations"][0]["observed_at"]
    return {
        "idempotency_key": KEY,
        "payload": payload,
        "evidence": {
            "evidence_ref": "evidence:case-7",
            "evidence_digest": DIGEST_B,
            "citation_ids": ["citation:source"],
        },
    }


def _maximal_capture() -> dict[str, Any]:
    payload = golden_payload()
    payload["retention"] = {"derivative_rule": "retain", "expires_at": "2027-08-16T12:34:56.789Z"}
    payload["reconciliation"] = {"family_refs": ["family:a"]}
    payload["components"].append(
        {
            "component_id": "component:context",
            "kind": "context",
            "text": "Context of the correction, with accents: é, ü, 😀.",
            "citation_ids": ["citation:other", "citation:source"],
        }
    )
    payload["citations"].append(
        {
            "citation_id": "citation:other",
            "source_ref": "source:other",
            "locator": {"scheme": "url", "value": "https://example.test/doc#2"},
            "content_digest": DIGEST_B,
        }
    )
    return {
        "idempotency_key": KEY,
        "payload": payload,
        "evidence": {
            "evidence_ref": "evidence:case-7",
            "evidence_digest": DIGEST_B,
            "citation_ids": ["citation:other", "citation:source"],
            "attestation": "Reviewed by the operator.",
        },
    }


MINIMAL: dict[str, dict[str, Any]] = {
    "search": {"query": "correction policy", "purpose_ref": "purpose:case"},
    "get": {"record_id": RECORD_ID, "purpose_ref": "purpose:case"},
    "capture": _minimal_capture(),
    "request_admission": {"candidate_id": CANDIDATE_ID, "idempotency_key": KEY},
    "withdraw": {"candidate_id": CANDIDATE_ID, "idempotency_key": KEY, "reason_ref": "reason:x"},
    "forget": {"record_id": RECORD_ID, "idempotency_key": KEY, "reason_ref": "reason:x"},
}

MAXIMAL: dict[str, dict[str, Any]] = {
    "search": {
        "query": "correction policy",
        "purpose_ref": "purpose:case",
        "limit": 50,
        "max_packet_bytes": 1_048_576,
        "capability_policy": {"minimum_channels": "lexical_and_semantic", "network": "allow"},
        "page_cursor": "opaque-cursor",
    },
    "get": {"record_id": RECORD_ID, "purpose_ref": "purpose:case", "max_packet_bytes": 4_096},
    "capture": _maximal_capture(),
    "request_admission": MINIMAL["request_admission"],
    "withdraw": MINIMAL["withdraw"],
    "forget": MINIMAL["forget"],
}

MUTATING = ("capture", "request_admission", "withdraw", "forget")

Path_ = tuple[str | int, ...]
_DELETE = DELETE


def variant(tool: str, path: Path_, value: Any, *, base: str = "maximal") -> dict[str, Any]:
    """A deep copy of the tool's fixture with ``value`` at ``path`` (``_DELETE`` removes it)."""
    return with_value((MAXIMAL if base == "maximal" else MINIMAL)[tool], path, value)


def accept(tool: str, data: dict[str, Any]) -> BaseModel:
    return INPUT_MODELS[tool].model_validate(data)


def refuse(tool: str, data: dict[str, Any], *only: str) -> ValidationError:
    """Assert a refusal; with ``only``, every reported error type is one of those."""
    with pytest.raises(ValidationError) as info:
        INPUT_MODELS[tool].model_validate(data)
    if only:
        assert error_types(info.value) <= set(only), info.value.errors()
    return info.value


def error_types(error: ValidationError) -> set[str]:
    return {item["type"] for item in error.errors()}


def payload_with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(MAXIMAL["capture"])
    data["payload"].update(changes)
    return data


# --------------------------------------------------------------------------------------------
# valid inputs
# --------------------------------------------------------------------------------------------


def test_the_registry_holds_exactly_the_six_tools() -> None:
    assert list(INPUT_MODELS) == [
        "search",
        "get",
        "capture",
        "request_admission",
        "withdraw",
        "forget",
    ]
    for name, model in INPUT_MODELS.items():  # each tool's model is named after it
        assert model.__name__ == name.title().replace("_", "") + "Input"


@pytest.mark.parametrize("tool", list(INPUT_MODELS))
def test_every_model_accepts_a_valid_minimal_input(tool: str) -> None:
    accept(tool, copy.deepcopy(MINIMAL[tool]))


@pytest.mark.parametrize("tool", list(INPUT_MODELS))
def test_every_model_accepts_a_valid_maximal_input(tool: str) -> None:
    accept(tool, copy.deepcopy(MAXIMAL[tool]))


def test_search_fills_in_the_contract_defaults() -> None:
    model = SearchInput.model_validate(MINIMAL["search"])
    assert model.limit == 10
    assert model.max_packet_bytes == 65_536
    assert model.capability_policy.minimum_channels == "lexical"
    assert model.capability_policy.network == "forbid"
    assert model.page_cursor is None


def test_a_validated_input_is_frozen() -> None:
    model = SearchInput.model_validate(MINIMAL["search"])
    with pytest.raises(ValidationError):
        model.limit = 3  # type: ignore[misc]


def test_capture_accepts_the_largest_collections_the_contract_allows() -> None:
    citation_ids = [f"citation:{i:03d}" for i in range(256)]
    data = copy.deepcopy(MINIMAL["capture"])
    payload = data["payload"]
    payload["citations"] = [
        {
            "citation_id": cid,
            "source_ref": "source:s",
            "locator": {"scheme": "document", "value": cid},
            "content_digest": DIGEST_A,
        }
        for cid in citation_ids
    ]
    payload["components"] = [
        {
            "component_id": f"component:{i}",
            "kind": "evidence",
            "text": "t",
            "citation_ids": citation_ids,
        }
        for i in range(64)
    ]
    payload["primary_component_id"] = "component:0"
    payload["primary_event"]["citation_id"] = citation_ids[-1]
    payload["reconciliation"] = {"family_refs": [f"family:{i:02d}" for i in range(64)]}
    data["evidence"]["citation_ids"] = citation_ids
    accept("capture", data)


# --------------------------------------------------------------------------------------------
# closed schema: extra fields and nulls
# --------------------------------------------------------------------------------------------

EXTRA_FIELD_LEVELS: list[tuple[str, Path_]] = [
    *[(tool, ()) for tool in INPUT_MODELS],
    ("search", ("capability_policy",)),
    ("capture", ("payload",)),
    ("capture", ("payload", "valid_time")),
    ("capture", ("payload", "components", 0)),
    ("capture", ("payload", "citations", 0)),
    ("capture", ("payload", "citations", 0, "locator")),
    ("capture", ("payload", "primary_event")),
    ("capture", ("payload", "retention")),
    ("capture", ("payload", "reconciliation")),
    ("capture", ("evidence",)),
]


@pytest.mark.parametrize(("tool", "level"), EXTRA_FIELD_LEVELS)
def test_an_extra_field_is_refused_at_every_nesting_level(tool: str, level: Path_) -> None:
    data = copy.deepcopy(MAXIMAL[tool])
    node: Any = data
    for step in level:
        node = node[step]
    node["unexpected"] = "x"
    assert "extra_forbidden" in error_types(refuse(tool, data))


@pytest.mark.parametrize(
    ("tool", "field"),
    [
        ("search", "tenant_id"),
        ("search", "workspace_id"),
        ("get", "principal"),
        ("capture", "scope"),
        ("capture", "agent_id"),
        ("request_admission", "session"),
        ("withdraw", "confirmed"),
        ("forget", "confirmed"),
        ("capture", "confirmed"),
        ("request_admission", "confirmation"),
        ("forget", "auditId"),
        ("search", "deadline"),
    ],
)
def test_host_bound_facts_and_confirmations_are_never_arguments(tool: str, field: str) -> None:
    data = copy.deepcopy(MINIMAL[tool])
    data[field] = True if field.startswith("confirm") else "x"
    assert "extra_forbidden" in error_types(refuse(tool, data))


def test_the_host_injected_scope_ref_is_refused_inside_the_payload() -> None:
    data = variant("capture", ("payload", "scope_ref"), "scope:case-7")
    refuse("capture", data, "extra_forbidden")


OPTIONAL_FIELDS: list[tuple[str, Path_]] = [
    ("search", ("limit",)),
    ("search", ("max_packet_bytes",)),
    ("search", ("capability_policy",)),
    ("search", ("capability_policy", "minimum_channels")),
    ("search", ("capability_policy", "network")),
    ("search", ("page_cursor",)),
    ("get", ("max_packet_bytes",)),
    ("capture", ("payload", "valid_time", "t_end")),
    ("capture", ("payload", "citations", 0, "observed_at")),
    ("capture", ("payload", "retention")),
    ("capture", ("payload", "retention", "expires_at")),
    ("capture", ("payload", "reconciliation")),
    ("capture", ("evidence", "attestation")),
]


@pytest.mark.parametrize(("tool", "path"), OPTIONAL_FIELDS)
def test_null_is_refused_for_every_optional_field(tool: str, path: Path_) -> None:
    refuse(tool, variant(tool, path, None), "null_value")


@pytest.mark.parametrize(("tool", "path"), OPTIONAL_FIELDS)
def test_every_optional_field_may_be_omitted(tool: str, path: Path_) -> None:
    accept(tool, variant(tool, path, _DELETE))


REQUIRED_FIELDS: list[tuple[str, Path_]] = [
    ("search", ("query",)),
    ("search", ("purpose_ref",)),
    ("get", ("record_id",)),
    ("get", ("purpose_ref",)),
    ("capture", ("idempotency_key",)),
    ("capture", ("payload",)),
    ("capture", ("evidence",)),
    ("capture", ("payload", "schema_version")),
    ("capture", ("payload", "purpose_ref")),
    ("capture", ("payload", "valid_time")),
    ("capture", ("payload", "valid_time", "t")),
    ("capture", ("payload", "components")),
    ("capture", ("payload", "components", 0, "component_id")),
    ("capture", ("payload", "components", 0, "kind")),
    ("capture", ("payload", "components", 0, "text")),
    ("capture", ("payload", "components", 0, "citation_ids")),
    ("capture", ("payload", "primary_component_id")),
    ("capture", ("payload", "primary_event")),
    ("capture", ("payload", "primary_event", "at")),
    ("capture", ("payload", "primary_event", "type_ref")),
    ("capture", ("payload", "primary_event", "citation_id")),
    ("capture", ("payload", "citations")),
    ("capture", ("payload", "citations", 0, "citation_id")),
    ("capture", ("payload", "citations", 0, "source_ref")),
    ("capture", ("payload", "citations", 0, "locator")),
    ("capture", ("payload", "citations", 0, "locator", "scheme")),
    ("capture", ("payload", "citations", 0, "locator", "value")),
    ("capture", ("payload", "citations", 0, "content_digest")),
    ("capture", ("payload", "retention", "derivative_rule")),
    ("capture", ("payload", "reconciliation", "family_refs")),
    ("capture", ("evidence", "evidence_ref")),
    ("capture", ("evidence", "evidence_digest")),
    ("capture", ("evidence", "citation_ids")),
    ("request_admission", ("candidate_id",)),
    ("request_admission", ("idempotency_key",)),
    ("withdraw", ("candidate_id",)),
    ("withdraw", ("idempotency_key",)),
    ("withdraw", ("reason_ref",)),
    ("forget", ("record_id",)),
    ("forget", ("idempotency_key",)),
    ("forget", ("reason_ref",)),
]


@pytest.mark.parametrize(("tool", "path"), REQUIRED_FIELDS)
def test_every_required_field_is_refused_when_missing_or_null(tool: str, path: Path_) -> None:
    refuse(tool, variant(tool, path, _DELETE), "missing")
    refuse(tool, variant(tool, path, None), "null_value")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("payload",), []),
        (("payload",), "payload"),
        (("evidence",), [MAXIMAL["capture"]["evidence"]]),
        (("payload", "components"), {"component:decision": {}}),
        (("payload", "components", 0, "citation_ids"), "citation:source"),
        (("payload", "valid_time"), 1755350096789),
        (("payload", "citations", 0, "locator"), "document:case-7"),
        (("payload", "reconciliation", "family_refs"), "family:a"),
    ],
)
def test_a_value_of_the_wrong_container_type_is_refused(path: Path_, value: Any) -> None:
    refuse("capture", variant("capture", path, value), "model_type", "list_type")


# --------------------------------------------------------------------------------------------
# strings: UTF-8 byte bounds, NFC
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", MUTATING)
@pytest.mark.parametrize(
    ("key", "accepted"),
    [
        ("k" * 15, False),
        ("k" * 16, True),
        ("k" * 256, True),
        ("k" * 257, False),
        ("\u00e9" * 4, False),  # 4 characters, 8 bytes
        ("\u00e9" * 7 + "k", False),  # 8 characters, 15 bytes
        ("\u00e9" * 8, True),  # 16 bytes
        ("😀" * 4, True),  # 4 characters, 16 bytes
        ("\u00e9" * 128, True),  # 256 bytes
        ("\u00e9" * 129, False),  # 129 characters, 258 bytes
        ("😀" * 65, False),  # 65 characters, 260 bytes
        ("", False),
    ],
)
def test_idempotency_key_bounds_count_utf8_bytes_not_characters(
    tool: str, key: str, accepted: bool
) -> None:
    data = variant(tool, ("idempotency_key",), key)
    if accepted:
        accept(tool, data)
    else:
        assert "utf8_length" in error_types(refuse(tool, data))


@given(key=st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
@settings(max_examples=150, deadline=None)
def test_an_idempotency_key_is_accepted_exactly_when_it_is_nfc_and_16_to_256_bytes(
    key: str,
) -> None:
    data = {"candidate_id": CANDIDATE_ID, "idempotency_key": key}
    ok = unicodedata.is_normalized("NFC", key) and 16 <= len(key.encode("utf-8")) <= 256
    try:
        RequestAdmissionInput.model_validate(data)
    except ValidationError:
        assert not ok
    else:
        assert ok


REF_FIELDS: list[tuple[str, Path_]] = [
    ("search", ("purpose_ref",)),
    ("get", ("purpose_ref",)),
    ("withdraw", ("reason_ref",)),
    ("forget", ("reason_ref",)),
    ("capture", ("payload", "purpose_ref")),
    ("capture", ("payload", "primary_event", "type_ref")),
    ("capture", ("payload", "citations", 0, "source_ref")),
    ("capture", ("payload", "citations", 0, "locator", "scheme")),
    ("capture", ("payload", "citations", 0, "locator", "value")),
    ("capture", ("evidence", "evidence_ref")),
    ("capture", ("payload", "reconciliation", "family_refs", 0)),
]


@pytest.mark.parametrize(("tool", "path"), REF_FIELDS)
@pytest.mark.parametrize(
    ("ref", "accepted"),
    [
        ("", False),
        ("a", True),
        ("r" * 512, True),
        ("r" * 513, False),
        ("€" * 170, True),  # 510 bytes
        ("€" * 171, False),  # 171 characters, 513 bytes
    ],
)
def test_opaque_refs_are_1_to_512_utf8_bytes(
    tool: str, path: Path_, ref: str, accepted: bool
) -> None:
    data = variant(tool, path, ref)
    if accepted:
        accept(tool, data)
    else:
        refuse(tool, data, "utf8_length")


@pytest.mark.parametrize(
    ("tool", "path"),
    [
        *REF_FIELDS,
        ("search", ("query",)),
        ("search", ("page_cursor",)),
        ("capture", ("idempotency_key",)),
        ("capture", ("payload", "components", 0, "text")),
        ("capture", ("evidence", "attestation")),
    ],
)
def test_a_non_nfc_string_is_refused_never_normalized(tool: str, path: Path_) -> None:
    value = NON_NFC + "-sixteen-bytes!!"
    assert "not_nfc" in error_types(refuse(tool, variant(tool, path, value)))
    accept(tool, variant(tool, path, unicodedata.normalize("NFC", value)))


def test_non_nfc_ids_are_refused_even_where_they_would_cross_reference_consistently() -> None:
    data = copy.deepcopy(MINIMAL["capture"])
    cid = "citation:" + NON_NFC
    data["payload"]["citations"][0]["citation_id"] = cid
    data["payload"]["components"][0]["citation_ids"] = [cid]
    data["payload"]["primary_event"]["citation_id"] = cid
    data["evidence"]["citation_ids"] = [cid]
    assert "not_nfc" in error_types(refuse("capture", data))


@pytest.mark.parametrize(
    ("tool", "path"),
    [
        ("search", ("query",)),
        ("search", ("purpose_ref",)),
        ("capture", ("payload", "components", 0, "text")),
    ],
)
def test_a_lone_surrogate_is_refused_because_it_has_no_utf8_encoding(
    tool: str, path: Path_
) -> None:
    refuse(tool, variant(tool, path, json.loads('"bad \\ud800 surrogate"')))


@pytest.mark.parametrize(
    ("tool", "path", "max_bytes"),
    [
        ("search", ("query",), 8_192),
        ("capture", ("payload", "components", 0, "text"), 65_536),
        ("capture", ("evidence", "attestation"), 4_096),
    ],
)
def test_long_texts_are_bounded_in_utf8_bytes(tool: str, path: Path_, max_bytes: int) -> None:
    accept(tool, variant(tool, path, "q" * max_bytes))
    accept(tool, variant(tool, path, "é" * (max_bytes // 2)))
    refuse(tool, variant(tool, path, "q" * (max_bytes + 1)), "utf8_length")
    refuse(tool, variant(tool, path, "é" * (max_bytes // 2) + "q"), "utf8_length")
    refuse(tool, variant(tool, path, ""), "utf8_length")


def test_a_query_of_8193_bytes_is_refused() -> None:
    refuse("search", variant("search", ("query",), "q" * 8_193), "utf8_length")


# --------------------------------------------------------------------------------------------
# identifiers and digests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["get", "forget"])
@pytest.mark.parametrize(
    "record_id",
    [
        "mem_",
        "mem",
        "MEM_abc",
        "mem_ABC",
        "mem_abc1",  # 1 is not in the RFC 4648 base32 alphabet
        "mem_abc8",
        "mem_abc=",
        "rec_abcdef",
        " mem_abc",
        "mem_abc ",
        "mem_abc\n",
        "mem_" + "a" * 509,  # 513 bytes
        CANDIDATE_ID,
    ],
)
def test_a_malformed_record_id_is_refused(tool: str, record_id: str) -> None:
    refuse(tool, variant(tool, ("record_id",), record_id), "pattern", "utf8_length")


@pytest.mark.parametrize("tool", ["get", "forget"])
@pytest.mark.parametrize("record_id", ["mem_a", "mem_" + "abcdefghijklmnopqrstuvwxyz234567" * 2])
def test_a_well_formed_record_id_is_accepted(tool: str, record_id: str) -> None:
    accept(tool, variant(tool, ("record_id",), record_id))


@pytest.mark.parametrize("tool", ["request_admission", "withdraw"])
@pytest.mark.parametrize(
    "candidate_id",
    [
        "candidate_" + "A" * 64,
        "candidate_" + "a" * 63,
        "candidate_" + "a" * 65,
        "candidate_" + "g" * 64,
        "Candidate_" + "a" * 64,
        "cand_" + "a" * 64,
        "a" * 64,
        "sha256:" + "a" * 64,
        RECORD_ID,
        "candidate_" + "a" * 64 + "\n",
        "",
    ],
)
def test_a_malformed_candidate_id_is_refused(tool: str, candidate_id: str) -> None:
    refuse(tool, variant(tool, ("candidate_id",), candidate_id), "pattern", "utf8_length")


DIGEST_FIELDS: list[Path_] = [
    ("payload", "citations", 0, "content_digest"),
    ("evidence", "evidence_digest"),
]


@pytest.mark.parametrize("path", DIGEST_FIELDS)
@pytest.mark.parametrize(
    "digest",
    [
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "a" * 64,
        "sha512:" + "a" * 64,
        "SHA256:" + "a" * 64,
        "sha256:" + "g" * 64,
        "sha256: " + "a" * 63,
        "sha256:" + "a" * 64 + "\n",
        "",
    ],
)
def test_a_malformed_digest_is_an_invalid_digest_error(path: Path_, digest: str) -> None:
    error = refuse("capture", variant("capture", path, digest))
    assert error_types(error) == {types.INVALID_DIGEST_ERROR}
    assert error.errors()[0]["loc"] == path


@pytest.mark.parametrize("path", DIGEST_FIELDS)
@pytest.mark.parametrize("digest", [7, ["sha256:" + "a" * 64], {"sha256": "a" * 64}, True])
def test_a_digest_that_is_not_a_string_is_a_schema_error_not_a_digest_error(
    path: Path_, digest: Any
) -> None:
    kinds = error_types(refuse("capture", variant("capture", path, digest)))
    assert types.INVALID_DIGEST_ERROR not in kinds
    assert kinds == {"string_type"}


# --------------------------------------------------------------------------------------------
# instants and times
# --------------------------------------------------------------------------------------------

INSTANT_FIELDS: list[Path_] = [
    ("payload", "citations", 0, "observed_at"),
    ("payload", "retention", "expires_at"),
]


@pytest.mark.parametrize("path", INSTANT_FIELDS)
@pytest.mark.parametrize(
    "instant",
    [
        "2026-04-31T00:00:00.000Z",  # April has 30 days
        "2026-02-29T00:00:00.000Z",  # 2026 is not a leap year
        "2026-08-16T12:34:56Z",  # no milliseconds
        "2026-08-16T12:34:56.789+00:00",  # offset instead of Z
        "2026-08-16 12:34:56.789Z",  # space instead of T
        "2026-08-16T12:34:56.789z",
        "2026-08-16T12:34:56.78Z",
        "2026-08-16T12:34:56.7890Z",
        "2026-08-16T24:00:00.000Z",
        "2026-08-16T23:59:60.000Z",  # leap seconds are not canonical
        "2026-13-01T00:00:00.000Z",
        "2026-00-10T00:00:00.000Z",
        "2026-8-16T12:34:56.789Z",
        "+02026-08-16T12:34:56.789Z",
        "2026-08-16T12:34:56.789Z\n",
        "1755350096789",
    ],
)
def test_a_non_canonical_instant_is_refused(path: Path_, instant: str) -> None:
    refuse("capture", variant("capture", path, instant), "instant")


@pytest.mark.parametrize("path", INSTANT_FIELDS)
@pytest.mark.parametrize(
    "instant",
    [
        "2028-02-29T00:00:00.000Z",  # 2028 is a leap year
        "2026-08-16T12:34:56.789Z",
        "1970-01-01T00:00:00.000Z",
        "1969-12-31T23:59:59.999Z",
        "0999-12-31T23:59:59.999Z",
        "9999-12-31T23:59:59.999Z",
    ],
)
def test_a_canonical_instant_is_accepted(path: Path_, instant: str) -> None:
    accept("capture", variant("capture", path, instant))


@pytest.mark.parametrize("path", INSTANT_FIELDS)
def test_an_instant_given_as_epoch_milliseconds_is_refused(path: Path_) -> None:
    refuse("capture", variant("capture", path, 1755350096789), "string_type")


@pytest.mark.parametrize(
    ("t", "t_end", "accepted"),
    [
        (1_000, 999, False),
        (1_000, 1_000, True),
        (1_000, 1_001, True),
        (-MAX_SAFE, MAX_SAFE, True),
        (MAX_SAFE, -MAX_SAFE, False),
    ],
)
def test_valid_time_end_may_not_precede_its_start(t: int, t_end: int, accepted: bool) -> None:
    data = variant("capture", ("payload", "valid_time"), {"t": t, "t_end": t_end})
    if accepted:
        accept("capture", data)
    else:
        assert "valid_time_order" in error_types(refuse("capture", data))


SAFE_INT_FIELDS: list[Path_] = [
    ("payload", "valid_time", "t"),
    ("payload", "valid_time", "t_end"),
    ("payload", "primary_event", "at"),
]


@pytest.mark.parametrize("path", SAFE_INT_FIELDS)
@pytest.mark.parametrize(
    "value",
    [True, False, 1.0, 1755350096789.0, 0.5, 2**53, -(2**53), 2**63, "1755350096789", "1", None],
)
def test_a_time_must_be_a_safe_integer_and_not_a_boolean_float_or_string(
    path: Path_, value: Any
) -> None:
    data = variant("capture", path, value)
    if path[-1] == "t_end":  # keep t <= t_end out of the way
        data["payload"]["valid_time"]["t"] = -MAX_SAFE
    refuse("capture", data, "int_type", "greater_than_equal", "less_than_equal", "null_value")


@pytest.mark.parametrize("path", SAFE_INT_FIELDS)
@pytest.mark.parametrize("value", [MAX_SAFE, -MAX_SAFE, 0])
def test_the_extreme_safe_integers_are_accepted_as_times(path: Path_, value: int) -> None:
    data = variant("capture", path, value)
    data["payload"]["valid_time"].pop("t_end", None)
    if path[-1] == "t_end":
        data["payload"]["valid_time"] = {"t": -MAX_SAFE, "t_end": value}
    accept("capture", data)


# --------------------------------------------------------------------------------------------
# integers, enums and literals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, "2", 2.0, True, 3, None, "two"])
def test_schema_version_must_be_the_integer_2(value: Any) -> None:
    path = ("payload", "schema_version")
    refuse("capture", variant("capture", path, value), "literal_error", "int_type", "null_value")


@pytest.mark.parametrize(
    ("tool", "field", "value", "accepted"),
    [
        ("search", "limit", 0, False),
        ("search", "limit", 1, True),
        ("search", "limit", 50, True),
        ("search", "limit", 51, False),
        ("search", "limit", -1, False),
        ("search", "limit", True, False),
        ("search", "limit", 10.0, False),
        ("search", "limit", "10", False),
        ("search", "max_packet_bytes", 4_095, False),
        ("search", "max_packet_bytes", 4_096, True),
        ("search", "max_packet_bytes", 1_048_576, True),
        ("search", "max_packet_bytes", 1_048_577, False),
        ("search", "max_packet_bytes", 65_536.0, False),
        ("search", "max_packet_bytes", "65536", False),
        ("get", "max_packet_bytes", 4_095, False),
        ("get", "max_packet_bytes", 4_096, True),
        ("get", "max_packet_bytes", 1_048_576, True),
        ("get", "max_packet_bytes", 1_048_577, False),
        ("get", "max_packet_bytes", True, False),
    ],
)
def test_search_and_get_integer_options_are_strictly_bounded(
    tool: str, field: str, value: Any, accepted: bool
) -> None:
    data = variant(tool, (field,), value)
    if accepted:
        accept(tool, data)
    else:
        refuse(tool, data, "int_type", "greater_than_equal", "less_than_equal")


@pytest.mark.parametrize(
    ("tool", "path", "value"),
    [
        ("search", ("capability_policy", "minimum_channels"), "semantic"),
        ("search", ("capability_policy", "minimum_channels"), "LEXICAL"),
        ("search", ("capability_policy", "network"), "deny"),
        ("search", ("capability_policy", "network"), True),
        ("capture", ("payload", "components", 0, "kind"), "summary"),
        ("capture", ("payload", "components", 0, "kind"), "Decision"),
        ("capture", ("payload", "retention", "derivative_rule"), "make_ineligible"),
        ("capture", ("payload", "retention", "derivative_rule"), "delete"),
    ],
)
def test_a_value_outside_an_enum_is_refused(tool: str, path: Path_, value: Any) -> None:
    refuse(tool, variant(tool, path, value), "literal_error")


@pytest.mark.parametrize(
    ("tool", "path", "value"),
    [
        ("search", ("capability_policy",), {}),
        ("search", ("capability_policy",), {"minimum_channels": "lexical"}),
        ("search", ("capability_policy",), {"network": "forbid"}),
        ("capture", ("payload", "components", 0, "kind"), "context"),
        ("capture", ("payload", "components", 0, "kind"), "evidence"),
        ("capture", ("payload", "retention"), {"derivative_rule": "make-ineligible"}),
        ("capture", ("payload", "reconciliation"), {"family_refs": []}),
    ],
)
def test_every_enum_member_and_partial_option_object_is_accepted(
    tool: str, path: Path_, value: Any
) -> None:
    accept(tool, variant(tool, path, value))


# --------------------------------------------------------------------------------------------
# collections and cross-references
# --------------------------------------------------------------------------------------------


def _citation(cid: str) -> dict[str, Any]:
    return {
        "citation_id": cid,
        "source_ref": "source:s",
        "locator": {"scheme": "document", "value": "v"},
        "content_digest": DIGEST_A,
    }


def _component(cid: str) -> dict[str, Any]:
    return {
        "component_id": cid,
        "kind": "context",
        "text": "t",
        "citation_ids": ["citation:source"],
    }


MANY_IDS = ["citation:other", "citation:source", *(f"citation:x{i:03d}" for i in range(255))]


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("payload", "components"), [], "too_short"),
        (
            ("payload", "components"),
            [_component("component:decision"), *(_component(f"c{i}") for i in range(64))],
            "too_long",
        ),
        (("payload", "citations"), [], "too_short"),
        (("payload", "citations"), [_citation(cid) for cid in MANY_IDS], "too_long"),
        (("payload", "components", 0, "citation_ids"), [], "too_short"),
        (("payload", "components", 0, "citation_ids"), MANY_IDS, "too_long"),
        (("evidence", "citation_ids"), [], "too_short"),
        (("evidence", "citation_ids"), MANY_IDS, "too_long"),
    ],
)
def test_collection_sizes_are_bounded(path: Path_, value: Any, error: str) -> None:
    assert len(value) in (0, 65, 257)
    refuse("capture", variant("capture", path, value), error)


def test_duplicate_citation_ids_within_a_component_are_refused() -> None:
    path = ("payload", "components", 0, "citation_ids")
    error = refuse("capture", variant("capture", path, ["citation:source", "citation:source"]))
    assert "not_distinct" in error_types(error)


def test_duplicate_citation_ids_in_evidence_are_refused() -> None:
    path = ("evidence", "citation_ids")
    error = refuse("capture", variant("capture", path, ["citation:source", "citation:source"]))
    assert "not_distinct" in error_types(error)


def test_duplicate_component_ids_are_refused() -> None:
    data = copy.deepcopy(MAXIMAL["capture"])
    data["payload"]["components"][1]["component_id"] = "component:decision"
    assert "duplicate_id" in error_types(refuse("capture", data))


def test_duplicate_citation_ids_in_the_payload_are_refused() -> None:
    data = copy.deepcopy(MAXIMAL["capture"])
    data["payload"]["citations"][1]["citation_id"] = "citation:source"
    data["payload"]["components"][1]["citation_ids"] = ["citation:source"]
    data["evidence"]["citation_ids"] = ["citation:source"]
    assert "duplicate_id" in error_types(refuse("capture", data))


def test_a_component_citation_that_does_not_resolve_is_refused() -> None:
    path = ("payload", "components", 1, "citation_ids")
    error = refuse("capture", variant("capture", path, ["citation:missing", "citation:source"]))
    assert "unresolved_citation" in error_types(error)


def test_an_unresolved_primary_component_id_is_refused() -> None:
    error = refuse(
        "capture", variant("capture", ("payload", "primary_component_id"), "component:x")
    )
    assert "unresolved_component" in error_types(error)


def test_a_primary_event_citation_outside_the_primary_component_is_refused() -> None:
    # citation:other exists in payload.citations and in another component, not in the primary one.
    path = ("payload", "primary_event", "citation_id")
    error = refuse("capture", variant("capture", path, "citation:other"))
    assert "unresolved_citation" in error_types(error)


def test_a_primary_event_citation_that_resolves_nowhere_is_refused() -> None:
    path = ("payload", "primary_event", "citation_id")
    refuse("capture", variant("capture", path, "citation:missing"), "unresolved_citation")


def test_the_primary_event_may_cite_any_citation_of_the_primary_component() -> None:
    data = copy.deepcopy(MAXIMAL["capture"])
    data["payload"]["primary_component_id"] = "component:context"
    data["payload"]["primary_event"]["citation_id"] = "citation:other"
    accept("capture", data)


def test_an_evidence_citation_missing_from_the_payload_is_refused() -> None:
    path = ("evidence", "citation_ids")
    error = refuse("capture", variant("capture", path, ["citation:missing"]))
    assert "unresolved_citation" in error_types(error)


def test_a_payload_citation_need_not_be_cited_by_the_evidence() -> None:
    accept("capture", variant("capture", ("evidence", "citation_ids"), ["citation:other"]))


@pytest.mark.parametrize(
    "family_refs",
    [
        ["family:b", "family:a"],
        ["family:a", "family:a"],
        ["family:a", "family:b", "family:b"],
        ["b", "a", "c"],
        ["family:B", "family:A"],
        [f"family:{i:02d}" for i in range(65)],
        ["\ue000", "😀"],  # code-point order, but U+E000 sorts after the UTF-16 unit U+D83D
    ],
)
def test_family_refs_must_be_sorted_unique_and_at_most_64(family_refs: list[str]) -> None:
    path = ("payload", "reconciliation", "family_refs")
    refuse("capture", variant("capture", path, family_refs), "family_refs_order", "too_long")


@pytest.mark.parametrize(
    "family_refs",
    [
        [],
        ["family:a"],
        ["family:A", "family:a", "family:b"],
        ["a", "ab", "b"],
        ["😀", "\ue000"],  # UTF-16 code-unit order (RFC 8785 and upstream), not code points
        [f"family:{i:02d}" for i in range(64)],
    ],
)
def test_sorted_unique_family_refs_are_accepted(family_refs: list[str]) -> None:
    accept("capture", variant("capture", ("payload", "reconciliation", "family_refs"), family_refs))
