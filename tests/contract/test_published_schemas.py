"""The JSON Schemas published to agents (CONTRACT.md §1, §3, §7, §11).

The bounds table below is written from CONTRACT.md, not read from the models: loosening (or
tightening) a model changes the published schema and fails these tests. String bounds are UTF-8
bytes, published as ``x-utf8-min-bytes`` / ``x-utf8-max-bytes`` with the sound character bounds
``maxLength`` = max bytes and ``minLength`` = ceil(min bytes / 4).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pytest

from engram_memory.contract.envelope import failure, success
from engram_memory.contract.errors import ErrorCode
from engram_memory.contract.schemas import input_schema, output_envelope_schema

from engram_testing import golden_payload, object_paths

TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")
DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_SAFE = 2**53 - 1

# --------------------------------------------------------------------------------------------
# the bounds table, from CONTRACT.md
# --------------------------------------------------------------------------------------------


def text(min_bytes: int, max_bytes: int, pattern: str | None = None) -> dict[str, Any]:
    """A string of ``min_bytes..max_bytes`` UTF-8 bytes."""
    node: dict[str, Any] = {
        "type": "string",
        "minLength": math.ceil(min_bytes / 4),
        "maxLength": max_bytes,
        "x-utf8-min-bytes": min_bytes,
        "x-utf8-max-bytes": max_bytes,
    }
    if pattern is not None:
        node["pattern"] = pattern
    return node


def integer(minimum: int, maximum: int, default: int | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer", "minimum": minimum, "maximum": maximum}
    if default is not None:
        node["default"] = default
    return node


def enum(*values: str, default: str | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string", "enum": sorted(values)}
    if default is not None:
        node["default"] = default
    return node


@dataclass(frozen=True)
class Obj:
    """A closed object: exactly these required and optional properties."""

    required: dict[str, Any]
    optional: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Arr:
    items: Any
    min_items: int
    max_items: int
    unique: bool = False


# §3 common encodings
REF = text(1, 512)
IDEMPOTENCY_KEY = text(16, 256)
DIGEST = {"type": "string", "pattern": r"^sha256:[0-9a-f]{64}$"}
INSTANT = {
    "type": "string",
    "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$",
    "format": "date-time",
}
SAFE_INT = integer(-MAX_SAFE, MAX_SAFE)
# record_id: the contract gives only the pattern; 5 bytes is what the pattern implies and 512 is
# the opaque-string ceiling (implementation decision, pinned here).
RECORD_ID = text(5, 512, pattern=r"^mem_[a-z2-7]+$")
# candidate_id = "candidate_" + 64 hex (§5): exactly 74 bytes.
CANDIDATE_ID = text(74, 74, pattern=r"^candidate_[0-9a-f]{64}$")
# page_cursor: opaque, no bound in the contract; 4,096 bytes is an implementation decision.
PAGE_CURSOR = text(1, 4_096)
MAX_PACKET_BYTES = integer(4_096, 1_048_576, default=65_536)
CITATION_IDS = Arr(REF, 1, 256, unique=True)

CONTRACT_TABLE: dict[str, Obj] = {
    # §7.1
    "search": Obj(
        required={"query": text(1, 8_192), "purpose_ref": REF},
        optional={
            "limit": integer(1, 50, default=10),
            "max_packet_bytes": MAX_PACKET_BYTES,
            "capability_policy": Obj(
                required={},
                optional={
                    "minimum_channels": enum("lexical", "lexical_and_semantic", default="lexical"),
                    "network": enum("forbid", "allow", default="forbid"),
                },
            ),
            "page_cursor": PAGE_CURSOR,
        },
    ),
    # §7.2
    "get": Obj(
        required={"record_id": RECORD_ID, "purpose_ref": REF},
        optional={"max_packet_bytes": MAX_PACKET_BYTES},
    ),
    # §7.3
    "capture": Obj(
        required={
            "idempotency_key": IDEMPOTENCY_KEY,
            "payload": Obj(
                required={
                    "schema_version": {"type": "integer", "const": 2},
                    "purpose_ref": REF,
                    "valid_time": Obj(required={"t": SAFE_INT}, optional={"t_end": SAFE_INT}),
                    "components": Arr(
                        Obj(
                            required={
                                "component_id": REF,
                                "kind": enum("context", "decision", "evidence"),
                                "text": text(1, 65_536),
                                "citation_ids": CITATION_IDS,
                            }
                        ),
                        1,
                        64,
                    ),
                    "primary_component_id": REF,
                    "primary_event": Obj(
                        required={"at": SAFE_INT, "type_ref": REF, "citation_id": REF}
                    ),
                    "citations": Arr(
                        Obj(
                            required={
                                "citation_id": REF,
                                "source_ref": REF,
                                "locator": Obj(required={"scheme": REF, "value": REF}),
                                "content_digest": DIGEST,
                            },
                            optional={"observed_at": INSTANT},
                        ),
                        1,
                        256,
                    ),
                },
                optional={
                    "retention": Obj(
                        required={"derivative_rule": enum("retain", "make-ineligible")},
                        optional={"expires_at": INSTANT},
                    ),
                    "reconciliation": Obj(required={"family_refs": Arr(REF, 0, 64, unique=True)}),
                },
            ),
            "evidence": Obj(
                required={
                    "evidence_ref": REF,
                    "evidence_digest": DIGEST,
                    "citation_ids": CITATION_IDS,
                },
                # "attestation? (≤ 4,096 bytes)": an empty attestation is an omitted one.
                optional={"attestation": text(1, 4_096)},
            ),
        }
    ),
    # §7.4
    "request_admission": Obj(
        required={"candidate_id": CANDIDATE_ID, "idempotency_key": IDEMPOTENCY_KEY}
    ),
    # §7.5
    "withdraw": Obj(
        required={
            "candidate_id": CANDIDATE_ID,
            "idempotency_key": IDEMPOTENCY_KEY,
            "reason_ref": REF,
        }
    ),
    # §7.6
    "forget": Obj(
        required={"record_id": RECORD_ID, "idempotency_key": IDEMPOTENCY_KEY, "reason_ref": REF}
    ),
}

# Keywords that constrain a value: any of them present in the schema and absent from the table
# (or the reverse, or with another value) is a drift from the contract.
VALUE_KEYWORDS = frozenset(
    {
        "type", "const", "enum", "default", "format", "pattern",
        "minLength", "maxLength", "x-utf8-min-bytes", "x-utf8-max-bytes",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minItems", "maxItems", "uniqueItems", "contains", "prefixItems",
        "properties", "patternProperties", "additionalProperties", "required",
        "minProperties", "maxProperties", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
    }
)  # fmt: skip


def expected_node(spec: Any) -> dict[str, Any]:
    """The value keywords the published node must carry, per the table."""
    if isinstance(spec, Obj):
        node: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": sorted([*spec.required, *spec.optional]),
        }
        if spec.required:  # an empty "required" is omitted
            node["required"] = sorted(spec.required)
        return node
    if isinstance(spec, Arr):
        node = {"type": "array", "maxItems": spec.max_items}
        if spec.min_items:
            node["minItems"] = spec.min_items
        if spec.unique:
            node["uniqueItems"] = True
        return node
    return dict(spec)


def flatten(spec: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, spec
    if isinstance(spec, Obj):
        for name, child in {**spec.required, **spec.optional}.items():
            yield from flatten(child, (*path, name))
    elif isinstance(spec, Arr):
        yield from flatten(spec.items, (*path, "[]"))


def resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Inline a local ``$ref`` (siblings such as ``description`` are kept)."""
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        target = root["$defs"][ref.removeprefix("#/$defs/")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def published_node(root: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = resolve(root, root)
    for step in path:
        node = resolve(root, node["items"] if step == "[]" else node["properties"][step])
    return node


def value_keywords(node: dict[str, Any]) -> dict[str, Any]:
    found = {k: v for k, v in node.items() if k in VALUE_KEYWORDS}
    if "enum" in found:
        found["enum"] = sorted(found["enum"])
    if "required" in found:
        found["required"] = sorted(found["required"])
    if "properties" in found:
        found["properties"] = sorted(found["properties"])
    return found


TABLE_ROWS = [
    pytest.param(tool, path, spec, id=f"{tool}:{'.'.join(path) or '<root>'}")
    for tool, root_spec in CONTRACT_TABLE.items()
    for path, spec in flatten(root_spec)
]


@pytest.mark.parametrize(("tool", "path", "spec"), TABLE_ROWS)
def test_the_published_schema_has_exactly_the_bounds_of_the_contract(
    tool: str, path: tuple[str, ...], spec: Any
) -> None:
    node = published_node(input_schema(tool), path)
    assert value_keywords(node) == expected_node(spec)


def test_the_contract_table_covers_the_six_tools() -> None:
    assert tuple(CONTRACT_TABLE) == TOOLS


@pytest.mark.parametrize(
    ("tool", "path"),
    [
        ("search", ("query",)),
        ("search", ("purpose_ref",)),
        ("capture", ("idempotency_key",)),
        ("capture", ("payload", "components", 0, "text")),
        ("capture", ("payload", "citations", 0, "locator", "value")),
        ("capture", ("evidence", "attestation")),
        ("withdraw", ("reason_ref",)),
    ],
)
def test_the_character_bounds_never_refuse_a_text_within_the_byte_bounds(
    tool: str, path: tuple[str | int, ...]
) -> None:
    # One character is 1..4 UTF-8 bytes: the shortest valid text in characters is made of 4-byte
    # characters, the longest is ASCII. Both must pass the published schema.
    node = published_node(
        input_schema(tool), tuple("[]" if isinstance(s, int) else s for s in path)
    )
    min_bytes, max_bytes = node["x-utf8-min-bytes"], node["x-utf8-max-bytes"]
    shortest = "😀" * (min_bytes // 4) + "k" * (min_bytes % 4)
    longest = "k" * max_bytes
    check = validator(input_schema(tool))
    assert check.is_valid(with_value(tool, path, shortest))
    assert check.is_valid(with_value(tool, path, longest))
    assert not check.is_valid(with_value(tool, path, longest + "k"))


# --------------------------------------------------------------------------------------------
# structure of every input schema
# --------------------------------------------------------------------------------------------


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in the document, ``$defs`` included."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def property_maps(node: Any) -> Iterator[dict[str, Any]]:
    for schema in walk(node):
        if isinstance(schema.get("properties"), dict):
            yield schema["properties"]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_input_schema_declares_json_schema_2020_12(tool: str) -> None:
    assert input_schema(tool)["$schema"] == DIALECT


@pytest.mark.parametrize("tool", TOOLS)
def test_every_input_schema_is_a_valid_2020_12_schema(tool: str) -> None:
    jsonschema.Draft202012Validator.check_schema(input_schema(tool))


@pytest.mark.parametrize("tool", TOOLS)
def test_every_object_node_at_every_level_is_closed(tool: str) -> None:
    schema = input_schema(tool)
    objects = [
        node for node in walk(schema) if node.get("type") == "object" or "properties" in node
    ]
    assert objects
    for node in objects:
        assert node.get("additionalProperties") is False, node
        assert "patternProperties" not in node
        assert "unevaluatedProperties" not in node or node["unevaluatedProperties"] is False


@pytest.mark.parametrize("tool", TOOLS)
def test_no_property_anywhere_allows_null(tool: str) -> None:
    for node in walk(input_schema(tool)):
        kind = node.get("type")
        assert kind != "null"
        assert not (isinstance(kind, list) and "null" in kind)
        assert not ("default" in node and node["default"] is None)
        assert not ("const" in node and node["const"] is None)
        assert None not in node.get("enum", [])


@pytest.mark.parametrize("tool", TOOLS)
def test_every_property_has_a_description(tool: str) -> None:
    for properties in property_maps(input_schema(tool)):
        for name, prop in properties.items():
            assert isinstance(prop.get("description"), str), name
            assert prop["description"].strip(), name


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_schema_describes_the_tool(tool: str) -> None:
    assert input_schema(tool)["description"].strip()


@pytest.mark.parametrize("tool", TOOLS)
def test_the_published_schema_is_a_fresh_copy_each_time(tool: str) -> None:
    first = input_schema(tool)
    first["properties"].clear()
    assert input_schema(tool)["properties"]


# --------------------------------------------------------------------------------------------
# the published schema, run by a JSON Schema validator
# --------------------------------------------------------------------------------------------

KEY = "capture-key-0001"
DIGEST_A = "sha256:" + "a" * 64
RECORD_ID_VALUE = "mem_" + "a" * 52
CANDIDATE_ID_VALUE = "candidate_" + "0" * 64

VALID: dict[str, dict[str, Any]] = {
    "search": {
        "query": "correction policy",
        "purpose_ref": "purpose:case",
        "limit": 5,
        "max_packet_bytes": 4_096,
        "capability_policy": {"minimum_channels": "lexical", "network": "forbid"},
        "page_cursor": "cursor",
    },
    "get": {"record_id": RECORD_ID_VALUE, "purpose_ref": "purpose:case"},
    "capture": {
        "idempotency_key": KEY,
        "payload": golden_payload(),
        "evidence": {
            "evidence_ref": "evidence:case-7",
            "evidence_digest": DIGEST_A,
            "citation_ids": ["citation:source"],
            "attestation": "Reviewed.",
        },
    },
    "request_admission": {"candidate_id": CANDIDATE_ID_VALUE, "idempotency_key": KEY},
    "withdraw": {"candidate_id": CANDIDATE_ID_VALUE, "idempotency_key": KEY, "reason_ref": "r"},
    "forget": {"record_id": RECORD_ID_VALUE, "idempotency_key": KEY, "reason_ref": "r"},
}


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


def with_value(tool: str, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID[tool])
    node: Any = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize("tool", TOOLS)
def test_the_schema_validator_accepts_the_valid_fixture(tool: str) -> None:
    validator(input_schema(tool)).validate(VALID[tool])


@pytest.mark.parametrize(
    ("tool", "level"), [(tool, level) for tool in TOOLS for level in object_paths(VALID[tool])]
)
def test_the_schema_validator_refuses_an_extra_field_at_every_level(
    tool: str, level: tuple[str | int, ...]
) -> None:
    data = copy.deepcopy(VALID[tool])
    node: Any = data
    for step in level:
        node = node[step]
    node["confirmed"] = True
    assert not validator(input_schema(tool)).is_valid(data)


@pytest.mark.parametrize(
    ("tool", "path", "value"),
    [
        ("search", ("limit",), 51),
        ("search", ("limit",), 0),
        ("search", ("limit",), True),
        ("search", ("max_packet_bytes",), 4_095),
        ("search", ("page_cursor",), None),
        ("search", ("capability_policy", "network"), "deny"),
        ("search", ("query",), ""),
        ("get", ("record_id",), "MEM_ABC"),
        ("capture", ("idempotency_key",), "k" * 257),
        ("capture", ("idempotency_key",), "abc"),
        ("capture", ("payload", "schema_version"), 1),
        ("capture", ("payload", "valid_time", "t"), 2**53),
        ("capture", ("payload", "valid_time", "t"), "1"),
        ("capture", ("payload", "components"), []),
        ("capture", ("payload", "components", 0, "kind"), "summary"),
        ("capture", ("payload", "components", 0, "citation_ids"), ["a", "a"]),
        ("capture", ("payload", "citations", 0, "content_digest"), "sha256:" + "A" * 64),
        ("capture", ("payload", "citations", 0, "observed_at"), "2026-08-16T12:34:56Z"),
        ("capture", ("payload", "reconciliation", "family_refs"), [f"f{i:02d}" for i in range(65)]),
        ("capture", ("payload", "retention", "derivative_rule"), "keep"),
        ("capture", ("evidence", "attestation"), "x" * 4_097),
        ("request_admission", ("candidate_id",), "candidate_" + "0" * 63),
        ("withdraw", ("reason_ref",), "r" * 513),
    ],
)
def test_the_schema_validator_refuses_bound_violations(
    tool: str, path: tuple[str | int, ...], value: Any
) -> None:
    assert not validator(input_schema(tool)).is_valid(with_value(tool, path, value))


# --------------------------------------------------------------------------------------------
# output envelopes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_every_output_envelope_schema_is_a_valid_2020_12_schema(tool: str) -> None:
    schema = output_envelope_schema(tool)
    assert schema["$schema"] == DIALECT
    assert schema["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("tool", TOOLS)
def test_the_output_envelope_is_one_of_a_success_or_a_failure(tool: str) -> None:
    schema = output_envelope_schema(tool)
    ok_success, ok_failure = (resolve(schema, branch) for branch in schema["oneOf"])
    assert ok_success["properties"]["ok"]["const"] is True
    assert sorted(ok_success["required"]) == ["auditId", "ok", "output", "redactionClass"]
    assert ok_success["properties"]["redactionClass"]["const"] == "high"
    output = ok_success["properties"]["output"]
    assert output["properties"]["schema_version"]["const"] == 1
    assert sorted(output["required"]) == ["schema_version", "value"]
    assert ok_failure["properties"]["ok"]["const"] is False
    assert sorted(ok_failure["required"]) == ["auditId", "error", "ok", "redactionClass"]
    error = resolve(schema, ok_failure["properties"]["error"])
    assert sorted(error["required"]) == ["code", "message", "retriable"]
    codes = resolve(schema, error["properties"]["code"])["enum"]
    assert sorted(codes) == sorted(code.value for code in ErrorCode)


@pytest.mark.parametrize("tool", TOOLS)
def test_every_declared_object_of_the_output_envelope_is_closed(tool: str) -> None:
    schema = output_envelope_schema(tool)
    assert len(schema["oneOf"]) == 2
    for node in walk(schema):
        if "properties" in node:
            assert node.get("additionalProperties") is False, sorted(node["properties"])


@pytest.mark.parametrize("tool", TOOLS)
def test_every_output_property_has_a_description(tool: str) -> None:
    for properties in property_maps(output_envelope_schema(tool)):
        for name, prop in properties.items():
            assert isinstance(prop.get("description"), str), name


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(
    "code", [ErrorCode.INVALID_SCHEMA, ErrorCode.NOT_FOUND, ErrorCode.GATE_FAILED]
)
def test_a_failure_envelope_validates_and_its_variants_do_not(tool: str, code: ErrorCode) -> None:
    check = validator(output_envelope_schema(tool))
    envelope = failure(code, "audit-1")
    check.validate(envelope)
    assert not check.is_valid({**envelope, "ok": True})
    assert not check.is_valid({**envelope, "detail": "echo"})
    assert not check.is_valid({**envelope, "error": {**envelope["error"], "input": "echo"}})
    assert not check.is_valid({**envelope, "error": {**envelope["error"], "code": "OOPS"}})
    assert not check.is_valid({**envelope, "redactionClass": "low"})


def test_a_capture_success_envelope_validates_and_its_variants_do_not() -> None:
    check = validator(output_envelope_schema("capture"))
    value = {
        "status": "committed_pending",
        "candidate_id": CANDIDATE_ID_VALUE,
        "record_digest": DIGEST_A,
        "cursor": "1",
        "transaction_receipt_digest": DIGEST_A,
    }
    envelope = success(value, "audit-1")
    check.validate(envelope)
    assert not check.is_valid({**envelope, "extra": 1})
    assert not check.is_valid({**envelope, "output": {**envelope["output"], "schema_version": 2}})
    assert not check.is_valid({**envelope, "output": {**envelope["output"], "extra": 1}})
    assert not check.is_valid(success({**value, "extra": 1}, "audit-1"))
    assert not check.is_valid(success({**value, "status": "accepted"}, "audit-1"))
    assert not check.is_valid(success({**value, "record_digest": "sha256:AA"}, "audit-1"))
