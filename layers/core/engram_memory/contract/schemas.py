"""JSON Schema 2020-12 of every tool's input and output envelope, generated from the models.

Optional fields are published as plain optional properties (no ``null`` branch, no ``null``
default) because ``null`` is refused; every object is closed (``additionalProperties: false``).
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from engram_memory.contract.models import INPUT_MODELS
from engram_memory.contract.outputs import OUTPUT_MODELS, FailureEnvelope

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _ContractJsonSchema(GenerateJsonSchema):
    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        if json_schema.get("default", ...) is None:
            json_schema.pop("default")
        return json_schema


def _close(node: Any) -> None:
    """Every object schema gets ``additionalProperties: false``; titles are noise for agents."""
    if isinstance(node, dict):
        node.pop("title", None)
        if node.get("type") == "object" and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for prop in value.values():
                    _close(prop)
            else:
                _close(value)
    elif isinstance(node, list):
        for item in node:
            _close(item)


def _generate(model: Any, mode: str) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema(
        schema_generator=_ContractJsonSchema, mode=mode, by_alias=True
    )
    _close(schema)
    return schema


def input_schema(tool: str) -> dict[str, Any]:
    schema = _generate(INPUT_MODELS[tool], "validation")
    return {"$schema": SCHEMA_DIALECT, **schema}


_ANNOTATIONS = frozenset({"description", "title", "examples", "default"})


def _inline(node: Any, defs: dict[str, Any], trail: tuple[str, ...] = ()) -> Any:
    """``node`` with every local ``$ref`` replaced by its definition (annotations beside the
    ``$ref`` kept): a validator then walks plain nested schemas. The official client validates
    every result against the output schema, and resolving a ``$ref`` per record field was a third
    of that cost (jsonschema's referencing resolver)."""
    if isinstance(node, list):
        return [_inline(item, defs, trail) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if name in trail or name not in defs or not set(siblings) <= _ANNOTATIONS:
            raise ValueError(f"cannot inline {node['$ref']}")  # recursive, foreign or constrained
        return {**_inline(defs[name], defs, (*trail, name)), **siblings}
    return {key: _inline(value, defs, trail) for key, value in node.items()}


def output_envelope_schema(tool: str) -> dict[str, Any]:
    """The envelope: a success carrying the tool's output value, or a failure, every definition
    inlined (``_inline``)."""
    value = _generate(OUTPUT_MODELS[tool], "serialization")
    failure = _generate(FailureEnvelope, "serialization")
    defs: dict[str, Any] = {**value.pop("$defs", {}), **failure.pop("$defs", {})}
    value.setdefault("description", "The tool's output value.")
    success = {
        "type": "object",
        "additionalProperties": False,
        "required": ["ok", "output", "auditId", "redactionClass"],
        "properties": {
            "ok": {"const": True, "description": "Always true for a success."},
            "output": {
                "type": "object",
                "additionalProperties": False,
                "required": ["schema_version", "value"],
                "properties": {
                    "schema_version": {"const": 1, "description": "Output schema version, 1."},
                    "value": value,
                },
                "description": "The versioned output.",
            },
            "auditId": {"type": "string", "description": "Audit id of this call."},
            "redactionClass": {"const": "high", "description": "Always 'high'."},
        },
    }
    return {
        "$schema": SCHEMA_DIALECT,
        "type": "object",
        "oneOf": _inline([success, failure], defs),
    }
