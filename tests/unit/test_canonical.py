"""Canonical JSON (RFC 8785 over NFC data) and the domain-separated digests of CONTRACT.md §5."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import struct
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_memory.contract.canonical import (
    GENESIS_HASH,
    CanonicalizationError,
    candidate_id_for,
    canonical_array,
    canonical_bytes,
    canonical_object,
    digest,
    digest_without,
    domain_for,
    record_id_for,
)

MAX_SAFE = 2**53 - 1
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

# The upstream golden vector (rhanka/engram tests/memory-contract-schema.test.ts), embedded here and
# kept as a file in tests/fixtures/golden-payload.json (a copy of the spec's golden-payload.json).
GOLDEN_DIGEST = "sha256:df5abcbf1d1091794c1f37efcd89e5f7bd6b91afa631e29f084178d35c55e913"
GOLDEN_PAYLOAD: dict[str, Any] = {
    "schema_version": 2,
    "scope_ref": "scope:case-7",
    "purpose_ref": "purpose:case",
    "valid_time": {"t": 1755350096789, "t_end": 1755350096789},
    "components": [
        {
            "component_id": "component:decision",
            "kind": "decision",
            "text": "Applied the documented correction.",
            "citation_ids": ["citation:source"],
        }
    ],
    "primary_component_id": "component:decision",
    "primary_event": {
        "at": 1755350096789,
        "type_ref": "event:correction-applied",
        "citation_id": "citation:source",
    },
    "citations": [
        {
            "citation_id": "citation:source",
            "source_ref": "source:case",
            "locator": {"scheme": "document", "value": "case-7#correction"},
            "content_digest": "sha256:" + "a" * 64,
            "observed_at": "2026-08-16T12:34:56.789Z",
        }
    ],
    "retention": {"derivative_rule": "make-ineligible"},
    "reconciliation": {"family_refs": []},
}
# The upstream golden vector, kept in the clone (a copy of the spec's golden-payload.json).
GOLDEN_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "golden-payload.json"

RECEIPT_KINDS = (
    "search-response",
    "get-packet",
    "read-receipt",
    "rank-receipt",
    "recall-redaction",
    "admission-decision",
    "canonical-transaction",
    "operation",
    "capture-identity",
    "projection-invalidation",
)


# --------------------------------------------------------------------------------------------
# golden vector
# --------------------------------------------------------------------------------------------


def test_the_golden_payload_digest_is_reproduced_exactly() -> None:
    assert digest("payload", GOLDEN_PAYLOAD) == GOLDEN_DIGEST


def test_the_golden_payload_digest_does_not_depend_on_key_order() -> None:
    reordered = dict(reversed(list(GOLDEN_PAYLOAD.items())))
    assert digest("payload", reordered) == GOLDEN_DIGEST


def test_the_embedded_golden_vector_is_the_one_in_the_spec() -> None:
    golden = json.loads(GOLDEN_FILE.read_text(encoding="utf-8"))
    assert golden["payload"] == GOLDEN_PAYLOAD
    assert golden["expected_payload_digest"] == GOLDEN_DIGEST
    assert golden["domain"] == domain_for("payload")
    assert digest("payload", golden["payload"]) == golden["expected_payload_digest"]


def test_changing_any_golden_field_changes_the_digest() -> None:
    for key in GOLDEN_PAYLOAD:
        changed = {k: v for k, v in GOLDEN_PAYLOAD.items() if k != key}
        assert digest("payload", changed) != GOLDEN_DIGEST, key


# --------------------------------------------------------------------------------------------
# RFC 8785
# --------------------------------------------------------------------------------------------


def test_the_rfc_8785_example_serializes_as_published() -> None:
    # RFC 8785 §3.2.2 example, without the null literal (null is never data here).
    source = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [true, false]}'
    )
    expected = (
        '{"literals":[true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_bytes(json.loads(source)) == expected.encode("utf-8")


def test_keys_are_sorted_by_utf16_code_units() -> None:
    # RFC 8785 §3.2.3 example; U+FB33 is replaced by U+E000 (U+FB33 is not NFC), which still shows
    # UTF-16 ordering: the surrogate pair of U+1F600 (D83D DE00) sorts before U+E000.
    value = {
        "€": "Euro Sign",
        "\r": "Carriage Return",
        "\ue000": "Private Use",
        "1": "One",
        "😀": "Emoji: Grinning Face",
        "\u0080": "Control",
        "ö": "Latin Small Letter O With Diaeresis",
    }
    keys = [key for key, _ in json.loads(canonical_bytes(value), object_pairs_hook=list)]
    assert keys == ["\r", "1", "\u0080", "ö", "€", "😀", "\ue000"]


@pytest.mark.parametrize(
    ("ieee754_hex", "expected"),
    [
        # RFC 8785 Appendix B
        ("0000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ],
)
def test_numbers_are_formatted_as_rfc_8785_appendix_b(ieee754_hex: str, expected: str) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(ieee754_hex))
    assert canonical_bytes(number) == expected.encode("ascii")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": 1, "a": [3, {"d": True, "c": False}]}, '{"a":[3,{"c":false,"d":true}],"b":1}'),
        ([], "[]"),
        ({}, "{}"),
        ("é", '"é"'),
        ("\u2028", '"\u2028"'),
        ("\x1f", '"\\u001f"'),
        (MAX_SAFE, "9007199254740991"),
        (-MAX_SAFE, "-9007199254740991"),
        (1.0, "1"),
        (-1.5, "-1.5"),
    ],
)
def test_canonical_bytes_are_compact_sorted_utf8(value: Any, expected: str) -> None:
    assert canonical_bytes(value) == expected.encode("utf-8")


# --------------------------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "e\u0301",
        {"e\u0301": 1},
        {"ok": ["fine", "e\u0301"]},
        {"nested": {"\u212b": "angstrom sign is not NFC"}},
        "\ufb33",  # RFC 8785's own example key: a composition exclusion, not NFC
        float("nan"),
        float("inf"),
        float("-inf"),
        [1, float("nan")],
        -0.0,
        {"t": -0.0},
        2**53,
        -(2**53),
        [2**64],
        None,
        {"optional": None},
        [None],
        {1: "non-string key"},
        "lone \ud800 surrogate",
        b"bytes",
        {1, 2},
        object(),
    ],
)
def test_values_outside_the_contract_are_refused(value: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_bytes(value)


def test_a_refused_value_cannot_be_digested() -> None:
    with pytest.raises(CanonicalizationError):
        digest("payload", {"text": "e\u0301"})


def test_the_nfc_form_of_a_refused_string_is_accepted() -> None:
    assert canonical_bytes("\u00e9") == '"é"'.encode()


def test_positive_zero_is_accepted_and_written_as_0() -> None:
    assert canonical_bytes(0.0) == b"0"
    assert canonical_bytes(0) == b"0"


# --------------------------------------------------------------------------------------------
# digests and domains
# --------------------------------------------------------------------------------------------


def _manual_digest(domain: str, value: Any) -> str:
    body = domain.encode("utf-8") + b"\x00" + canonical_bytes(value)
    return "sha256:" + hashlib.sha256(body).hexdigest()


def test_payload_and_record_use_the_upstream_v2_domains() -> None:
    assert domain_for("payload") == "graphify-memory/payload/v2"
    assert domain_for("record") == "graphify-memory/record/v2"


@pytest.mark.parametrize("kind", RECEIPT_KINDS)
def test_every_receipt_kind_uses_its_v1_domain(kind: str) -> None:
    assert domain_for(kind) == f"graphify-memory/{kind}/v1"


@pytest.mark.parametrize("kind", ["payload", "record", *RECEIPT_KINDS])
def test_a_digest_is_sha256_of_domain_nul_and_canonical_json(kind: str) -> None:
    value = {"b": [1, "two"], "a": {"x": True}}
    result = digest(kind, value)
    assert DIGEST_RE.fullmatch(result)
    assert result == _manual_digest(domain_for(kind), value)


def test_the_same_value_under_different_kinds_has_different_digests() -> None:
    value = {"record_id": "mem_a", "n": 1}
    digests = [digest(kind, value) for kind in ["payload", "record", *RECEIPT_KINDS]]
    assert len(set(digests)) == len(digests)


def test_a_receipt_digest_is_computed_without_its_own_digest_field() -> None:
    receipt = {"issued_at": "2026-08-16T12:34:56.789Z", "receipt_digest": "sha256:" + "0" * 64}
    expected = digest("rank-receipt", {"issued_at": "2026-08-16T12:34:56.789Z"})
    assert digest_without("rank-receipt", receipt, "receipt_digest") == expected


def test_the_genesis_hash_is_sha256_prefix_and_64_zeros() -> None:
    assert GENESIS_HASH == "sha256:" + "0" * 64


# --------------------------------------------------------------------------------------------
# identifiers
# --------------------------------------------------------------------------------------------


def _upstream_record_id(record_digest: str) -> str:
    """A port of upstream ``recordIdFromDigest`` (rhanka/engram engram-memory/digests.ts)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    bits = buffer = 0
    encoded = ""
    for byte in bytes.fromhex(record_digest.removeprefix("sha256:")):
        buffer = ((buffer << 8) | byte) & 0xFFFFFFFF
        bits += 8
        while bits >= 5:
            encoded += alphabet[(buffer >> (bits - 5)) & 31]
            bits -= 5
    if bits > 0:
        encoded += alphabet[(buffer << (5 - bits)) & 31]
    return "mem_" + encoded


@pytest.mark.parametrize(
    "record_digest",
    [GOLDEN_DIGEST, GENESIS_HASH, "sha256:" + "f" * 64, digest("record", {"n": 1})],
)
def test_record_id_is_mem_and_unpadded_lowercase_base32_of_the_digest_bytes(
    record_digest: str,
) -> None:
    record_id = record_id_for(record_digest)
    assert re.fullmatch(r"^mem_[a-z2-7]+$", record_id)
    # 32 bytes = 256 bits = 52 base32 characters unpadded (56 only with the "====" padding).
    assert len(record_id) == 4 + 52
    raw = bytes.fromhex(record_digest.removeprefix("sha256:"))
    assert base64.b32decode(record_id.removeprefix("mem_").upper() + "====") == raw
    assert record_id == _upstream_record_id(record_digest)
    assert record_id_for(record_digest) == record_id


def test_different_record_digests_give_different_record_ids() -> None:
    assert record_id_for("sha256:" + "0" * 63 + "1") != record_id_for(GENESIS_HASH)


def test_candidate_id_is_candidate_and_the_64_hex_of_the_capture_identity_digest() -> None:
    candidate_id = candidate_id_for("tenant-1", "workspace-1", "principal-1", "capture-key-0001")
    assert re.fullmatch(r"^candidate_[0-9a-f]{64}$", candidate_id)
    identity = {
        "tenant_id": "tenant-1",
        "workspace_id": "workspace-1",
        "principal": "principal-1",
        "idempotency_key": "capture-key-0001",
    }
    expected = _manual_digest("graphify-memory/capture-identity/v1", identity)
    assert candidate_id == "candidate_" + expected.removeprefix("sha256:")
    assert candidate_id_for("tenant-1", "workspace-1", "principal-1", "capture-key-0001") == (
        candidate_id
    )


def test_candidate_id_differs_by_tenant_workspace_principal_and_key() -> None:
    base = ("tenant-1", "workspace-1", "principal-1", "capture-key-0001")
    ids = {candidate_id_for(*base)}
    for position in range(4):
        changed = list(base)
        changed[position] += "x"
        ids.add(candidate_id_for(*changed))
    assert len(ids) == 5


def test_candidate_id_does_not_confuse_fields_whose_values_are_swapped() -> None:
    same = "same-value-16byte"
    permutations = {
        candidate_id_for(*values) for values in itertools.permutations((same, "b", "c", "d"))
    }
    assert len(permutations) == 24


# --------------------------------------------------------------------------------------------
# property: dict insertion order never matters
# --------------------------------------------------------------------------------------------

NFC_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12).map(
    lambda s: unicodedata.normalize("NFC", s)
)
SAFE_INTS = st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE)
JSON_LIKE = st.recursive(
    st.booleans() | SAFE_INTS | NFC_TEXT,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(NFC_TEXT, children, max_size=5)
    ),
    max_leaves=30,
)


def _reorder(value: Any, rng: Any) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _reorder(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_reorder(item, rng) for item in value]
    return value


@given(value=JSON_LIKE, rng=st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_canonical_bytes_do_not_depend_on_dict_insertion_order(value: Any, rng: Any) -> None:
    encoded = canonical_bytes(value)
    assert canonical_bytes(_reorder(value, rng)) == encoded
    assert json.loads(encoded) == value


# --------------------------------------------------------------------------------------------
# property: the fast path writes exactly what rfc8785 writes
# --------------------------------------------------------------------------------------------

# Text of any code point (astral, control, U+2028, combining), keys ASCII or not, and floats of
# every magnitude: values the fast path takes and values it must hand to rfc8785.
ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda x: not (x == 0.0 and str(x).startswith("-"))
)
WIDE_JSON = st.recursive(
    st.booleans() | SAFE_INTS | FLOATS | NFC_TEXT | ANY_TEXT,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(NFC_TEXT | ANY_TEXT | st.from_regex(r"[a-z_]{1,8}"), children, max_size=5)
    ),
    max_leaves=30,
)


def _rfc8785_with_contract_checks(value: Any) -> bytes | None:
    """What the checked path alone answers: rfc8785's bytes, or None for a refused value."""
    import rfc8785

    from engram_memory.contract import canonical

    try:
        canonical._check(value, "")
        return rfc8785.dumps(value)
    except (CanonicalizationError, rfc8785.CanonicalizationError, ValueError, TypeError):
        return None


def _assert_same_as_rfc8785(value: Any) -> None:
    expected = _rfc8785_with_contract_checks(value)
    if expected is None:
        with pytest.raises(CanonicalizationError):
            canonical_bytes(value)
    else:
        assert canonical_bytes(value) == expected


@given(value=WIDE_JSON)
@settings(max_examples=500, deadline=None)
def test_canonical_bytes_are_exactly_rfc8785_on_every_value(value: Any) -> None:
    _assert_same_as_rfc8785(value)


@pytest.mark.parametrize(
    "value",
    [
        {"score": 3.0},  # integral: ECMAScript writes 3, Python 3.0
        {"score": 1e-05},  # below 1e-4: Python switches to an exponent earlier
        {"score": 1.5e16},
        {"é": 1, "e": 2},  # a non-ASCII key
        {"\U0001f600": 1, "\uffff": 2},  # UTF-16 order differs from code point order
        {"a": "e\u0301"},  # not NFC: refused
        {"a": None},
    ],
)
def test_values_the_fast_path_declines_still_match_rfc8785(value: Any) -> None:
    _assert_same_as_rfc8785(value)


@given(value=st.dictionaries(st.from_regex(r"[ -~]{0,8}", fullmatch=True), JSON_LIKE, max_size=6))
@settings(max_examples=200, deadline=None)
def test_an_object_composed_from_its_members_bytes_is_its_canonical_bytes(value: Any) -> None:
    members = {key: canonical_bytes(item) for key, item in value.items()}
    assert canonical_object(members) == canonical_bytes(value)
    items = list(value.values())
    assert canonical_array([canonical_bytes(item) for item in items]) == canonical_bytes(items)


def test_an_object_composed_from_members_refuses_non_ascii_keys() -> None:
    # JCS orders keys by UTF-16 code units: composition only takes the keys it can sort alike.
    with pytest.raises(CanonicalizationError):
        canonical_object({"é": b"1"})
