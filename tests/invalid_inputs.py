"""Invalid arguments of every kind for each of the six tools, and the check that every answer
carries its code's one constant message (CONTRACT.md §1.1, §2, §10).

``invalid_cases(purpose)`` starts from valid arguments for each tool (the token's ``purpose``)
and changes one thing at a time, at every field of every level: a wrong type, a ``null``, a
missing field, an extra field (a plain name and a secret-looking one), a bound violation (empty,
too long, negative, unsafe integer, a float), a non-NFC string, a malformed instant, a broken
cross-reference, a malformed digest, a secret-looking value where an id belongs. A variant the
closed models accept is dropped, so each case is refused by the schema: ``INVALID_DIGEST`` for a
digest field holding a string of the wrong format, ``INVALID_SCHEMA`` for the rest.

``Answers`` collects what a host answered (envelope codes and messages, JSON-RPC codes and
messages) and checks that each code came with one message only, the contract's, and that no
answer echoed the secret-looking input.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from engram_memory.contract.errors import (
    MESSAGES,
    TRUSTED_CONTEXT_UNAVAILABLE,
    UNKNOWN_TOOL,
    ErrorCode,
)
from engram_memory.contract.models import INPUT_MODELS

from engram_testing import DELETE, capture_args, with_value

KEY: Final = "invalid-input-key-0001"
RECORD_ID: Final = "mem_" + "a" * 52
CANDIDATE_ID: Final = "candidate_" + "0123456789abcdef" * 4
NON_NFC: Final = "e\u0301"  # "e" + combining acute: NFC is "\u00e9"
SECRETISH: Final = "sk-live-" + "Q" * 40  # a value no answer may echo
TOO_LONG: Final = "\u00e9" * 40_000  # 80,000 UTF-8 bytes: longer than any string field allows
UNSAFE_INTEGER: Final = 2**53
INSTANTS: Final = frozenset({"observed_at", "expires_at"})
BAD_INSTANTS: Final = (
    "2026-04-31T00:00:00.000Z",  # no such day
    "2026-08-16T12:34:56Z",  # no milliseconds
    "2026-08-16 12:34:56.789Z",
    "2026-08-16T12:34:56.789+00:00",
)
BAD_DIGESTS: Final = (
    "sha256:" + "A" * 64,  # upper case
    "sha256:" + "a" * 63,
    "md5:" + "a" * 32,
    "a" * 64,
)
# the JSON-RPC messages, one per code (CONTRACT.md §1.1)
JSONRPC_MESSAGES: Final = {-32603: TRUSTED_CONTEXT_UNAVAILABLE, -32602: UNKNOWN_TOOL}

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Case:
    """One invalid call: what changed, where, and the code it must answer."""

    tool: str
    kind: str
    where: str
    arguments: dict[str, Any]
    code: str


def valid_arguments(purpose: str) -> dict[str, dict[str, Any]]:
    """Valid arguments for each tool, every optional field present."""
    capture = capture_args(
        key=KEY,
        purpose=purpose,
        retention={"derivative_rule": "make-ineligible", "expires_at": "2027-08-16T12:34:56.789Z"},
        reconciliation={"family_refs": ["family:a", "family:b"]},
    )
    capture["payload"]["valid_time"]["t_end"] = capture["payload"]["valid_time"]["t"] + 1
    capture["payload"]["citations"][0]["observed_at"] = "2026-08-16T12:34:56.789Z"
    capture["evidence"]["attestation"] = "Reviewed by the operator."
    return {
        "search": {
            "query": "correction policy",
            "purpose_ref": purpose,
            "limit": 5,
            "max_packet_bytes": 4_096,
            "capability_policy": {"minimum_channels": "lexical", "network": "forbid"},
            "page_cursor": "opaque-cursor",
        },
        "get": {"record_id": RECORD_ID, "purpose_ref": purpose, "max_packet_bytes": 4_096},
        "capture": capture,
        "request_admission": {"candidate_id": CANDIDATE_ID, "idempotency_key": KEY},
        "withdraw": {"candidate_id": CANDIDATE_ID, "idempotency_key": KEY, "reason_ref": "r:x"},
        "forget": {"record_id": RECORD_ID, "idempotency_key": KEY, "reason_ref": "r:x"},
    }


def _paths(node: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every node below the root, with its path."""
    children = node.items() if isinstance(node, dict) else enumerate(node)
    for name, child in children:
        yield (*path, name), child
        if isinstance(child, dict | list):
            yield from _paths(child, (*path, name))


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return "x"
    return ["x"]


def _string_variants(name: str | int, value: str) -> Iterator[tuple[str, Any, str]]:
    if isinstance(name, str) and name.endswith("_digest"):
        for digest in BAD_DIGESTS:
            yield "bad digest format", digest, "INVALID_DIGEST"
        return
    yield "empty string", "", "INVALID_SCHEMA"
    yield "non-NFC string", value + NON_NFC, "INVALID_SCHEMA"
    yield "too long", TOO_LONG, "INVALID_SCHEMA"
    yield "secret-looking value", SECRETISH, "INVALID_SCHEMA"
    if name in INSTANTS:
        for instant in BAD_INSTANTS:
            yield "bad instant", instant, "INVALID_SCHEMA"


def _variants(name: str | int, value: Any) -> Iterator[tuple[str, Any, str]]:
    """(kind, replacement, code) for the node ``value`` named ``name``; ``DELETE`` removes it."""
    yield "null", None, "INVALID_SCHEMA"
    yield "wrong type", _wrong_type(value), "INVALID_SCHEMA"
    yield "missing", DELETE, "INVALID_SCHEMA"
    if isinstance(value, str):
        yield from _string_variants(name, value)
    elif isinstance(value, int) and not isinstance(value, bool):
        for bound in (-1, 0, UNSAFE_INTEGER, 10**9):
            yield "bound violation", bound, "INVALID_SCHEMA"
        yield "a float", value + 0.5, "INVALID_SCHEMA"
    elif isinstance(value, dict):
        yield "extra field", {**value, "unexpected_field": 1}, "INVALID_SCHEMA"
        yield "secret-looking extra field", {**value, SECRETISH: 1}, "INVALID_SCHEMA"
    elif isinstance(value, list):
        yield "empty list", [], "INVALID_SCHEMA"
        if value:
            yield "repeated item", [*value, value[0]], "INVALID_SCHEMA"
            yield "too many items", value * 200, "INVALID_SCHEMA"


# Broken cross-references and orders in capture's payload and evidence (path, value).
_CROSS_REFERENCES: Final[tuple[tuple[Path_, Any], ...]] = (
    (("payload", "primary_component_id"), "component:nowhere"),
    (("payload", "primary_event", "citation_id"), "citation:nowhere"),
    (("payload", "components", 0, "citation_ids"), ["citation:nowhere"]),
    (("evidence", "citation_ids"), ["citation:nowhere"]),
    (("payload", "valid_time", "t_end"), 0),
    (("payload", "reconciliation", "family_refs"), ["family:b", "family:a"]),
)


def _refused(tool: str, arguments: dict[str, Any]) -> bool:
    try:
        INPUT_MODELS[tool].model_validate(arguments)
    except ValidationError:
        return True
    return False


def _pointer(path: Path_) -> str:
    return "".join(f"/{step}" for step in path)


def one_per_kind(cases: list[Case]) -> list[Case]:
    """The first case of each (tool, kind, code): a sample that still covers every kind."""
    first: dict[tuple[str, str, str], Case] = {}
    for case in cases:
        first.setdefault((case.tool, case.kind, case.code), case)
    return list(first.values())


def invalid_cases(purpose: str) -> list[Case]:
    """Every invalid call of every tool (see the module docstring)."""
    cases: list[Case] = []
    for tool, arguments in valid_arguments(purpose).items():
        assert not _refused(tool, arguments), tool
        changes: list[tuple[str, Path_, Any, str]] = [
            (kind, path, value, code)
            for path, node in _paths(arguments)
            for kind, value, code in _variants(path[-1], node)
        ]
        changes += [("extra field", ("confirmed",), True, "INVALID_SCHEMA")]  # a model's "yes"
        changes += [
            (kind, (), value, code)  # the arguments themselves
            for kind, value, code in _variants("", arguments)
            if kind.endswith("extra field")
        ]
        if tool == "capture":
            changes += [
                ("broken cross-reference", p, v, "INVALID_SCHEMA") for p, v in _CROSS_REFERENCES
            ]
        for kind, path, value, code in changes:
            changed = with_value(arguments, path, value)
            if _refused(tool, changed):
                cases.append(Case(tool, kind, _pointer(path), changed, code))
        cases.append(Case(tool, "no arguments", "", {}, "INVALID_SCHEMA"))
    return cases


@dataclass
class Answers:
    """What a host answered to the cases: the messages seen per envelope code and per JSON-RPC
    code, and every answer's text (to look for echoes)."""

    envelope: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    jsonrpc: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    texts: list[str] = field(default_factory=list)

    def took_envelope(self, case: Case, envelope: dict[str, Any]) -> None:
        assert envelope["ok"] is False, (case, envelope)
        error = envelope["error"]
        assert set(error) == {"code", "message", "retriable"}, error  # the closed error object
        assert error["code"] == case.code, (case.tool, case.kind, case.where, error)
        self.envelope[error["code"]].add(error["message"])
        self.texts.append(json.dumps(envelope, ensure_ascii=False))

    def took_error(self, code: int, message: str, data: Any) -> None:
        self.jsonrpc[code].add(message)
        self.texts.append(json.dumps({"message": message, "data": data}, ensure_ascii=False))

    def check(self) -> None:
        """One message per code, the contract's; no echo of an input."""
        assert {code: sorted(seen) for code, seen in self.envelope.items()} == {
            code: [MESSAGES[ErrorCode(code)]] for code in self.envelope
        }
        assert {code: sorted(seen) for code, seen in self.jsonrpc.items()} == {
            code: [JSONRPC_MESSAGES[code]] for code in self.jsonrpc
        }
        for text in self.texts:
            assert SECRETISH not in text and "Q" * 10 not in text, text
            assert NON_NFC not in text and "unexpected_field" not in text, text


__all__ = ["SECRETISH", "Answers", "Case", "invalid_cases", "one_per_kind", "valid_arguments"]
