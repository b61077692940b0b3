"""What reaches the MCP SDK: one JSON-RPC object per message, in JSON the contract accepts.

Every message, on HTTP and on stdio, is screened before the SDK parses it:

- Not JSON (or ``NaN``/``Infinity``, or not UTF-8): ``-32700 Parse error``.
- Not one JSON-RPC 2.0 object (a batch, a scalar, a missing or mistyped ``jsonrpc``, ``method``
  or ``id``): ``-32600 Invalid Request``. Both messages are constant: the SDK's own answers
  carry pydantic model names, a validator URL and an echo of the request.
- JSON the contract refuses (CONTRACT.md §5: duplicate keys, ``-0``; §3: strings must be
  well-formed Unicode, so no lone surrogate): inside the ``arguments`` of a ``tools/call``, the
  call still reaches the tool and answers ``INVALID_SCHEMA`` (the arguments are replaced by a
  marker in ``_meta`` that the surface turns into that envelope); anywhere else in the
  message, ``-32600``. The SDK's parser would keep the last of duplicate keys, read ``-0`` as
  ``0`` and refuse a lone surrogate as a parse error.
- ``arguments`` that are not an object (an array, a string, a number): the same marker, so the
  call answers ``INVALID_SCHEMA`` like any other wrong type (CONTRACT.md §1), where the SDK
  would answer ``-32602`` with a message of its own (``-32602``'s is ``Unknown tool``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "INVALID_ARGUMENTS_META",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "Screened",
    "error_body",
    "screen",
]

INVALID_ARGUMENTS_META: Final = "engram-memory/invalid-arguments"
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
_MESSAGES: Final = {PARSE_ERROR: "Parse error", INVALID_REQUEST: "Invalid Request"}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE: Final = re.compile(r"\\u[dD][89a-fA-F]")


def error_body(code: int) -> dict[str, Any]:
    """The JSON-RPC error object for ``code``, with its constant message and a null id."""
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": _MESSAGES[code]}}


@dataclass(frozen=True, slots=True)
class Screened:
    """Either the message to hand on (``text``) or the error to answer (``error``)."""

    text: str | None = None
    error: dict[str, Any] | None = None


class _Refused:
    """A JSON value the contract refuses (``-0``), kept in place to be found later."""


class _RepeatedKeys(dict[str, Any]):
    """An object whose text repeated a key."""


class _Parse:
    """The hooks of one message's parse: values the contract refuses are kept in place as
    markers, and ``refused`` says whether there is any (else no value needs walking for
    them)."""

    __slots__ = ("refused",)

    def __init__(self) -> None:
        self.refused = False

    def pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        built = dict(pairs)
        if len(built) == len(pairs):
            return built
        self.refused = True
        return _RepeatedKeys(built)

    def integer(self, text: str) -> object:
        if text.startswith("-") and int(text) == 0:
            self.refused = True
            return _Refused()
        return int(text)

    def real(self, text: str) -> object:
        value = float(text)
        if value == 0 and text.startswith("-"):
            self.refused = True
            return _Refused()
        return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _refused(value: object) -> bool:
    """Does ``value`` hold anything the contract refuses (repeated keys, -0, a lone surrogate)?"""
    if isinstance(value, _Refused | _RepeatedKeys):
        return True
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_refused(key) or _refused(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_refused(item) for item in value)
    return False


def _may_hold_surrogate(text: str) -> bool:
    """Whether a string decoded from ``text`` may hold a lone surrogate: the text holds one,
    raw or escaped (a few cheap scans, where one regular expression over the whole text with
    both took half the screen's time)."""
    if "\\u" in text and _ESCAPED_SURROGATE.search(text):
        return True
    return not text.isascii() and _SURROGATE.search(text) is not None


def _nothing_refused(_value: object) -> bool:
    return False


def _is_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _is_envelope(message: dict[str, Any]) -> bool:
    """One JSON-RPC 2.0 request, notification, result or error (MCP: params is an object)."""
    if message.get("jsonrpc") != "2.0":
        return False
    if "method" in message:
        if not isinstance(message["method"], str) or (
            "id" in message and not _is_id(message["id"])
        ):
            return False
        return "params" not in message or isinstance(message["params"], dict)
    if "result" in message:
        return _is_id(message.get("id")) and isinstance(message["result"], dict)
    if "error" in message:
        error = message["error"]
        return (message.get("id") is None or _is_id(message["id"])) and isinstance(error, dict)
    return False


def screen(text: str) -> Screened:
    """Screen one message (see the module docstring)."""
    parse = _Parse()
    try:
        message = json.loads(
            text,
            object_pairs_hook=parse.pairs,
            parse_int=parse.integer,
            parse_float=parse.real,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError):
        return Screened(error=error_body(PARSE_ERROR))
    # A decoded string holds a lone surrogate only if the text holds one, raw or escaped: with
    # neither, and no marker made by the parse, no value needs walking (most messages).
    refused = _refused if parse.refused or _may_hold_surrogate(text) else _nothing_refused
    if not isinstance(message, dict) or not _is_envelope(message):
        return Screened(error=error_body(INVALID_REQUEST))
    params = message.get("params")
    if message.get("method") == "tools/call" and isinstance(params, dict) and "arguments" in params:
        arguments = params["arguments"]
        rest = {**message, "params": {k: v for k, v in params.items() if k != "arguments"}}
        if refused(rest) or isinstance(message, _RepeatedKeys) or isinstance(params, _RepeatedKeys):
            return Screened(error=error_body(INVALID_REQUEST))
        if arguments is None or (isinstance(arguments, dict) and not refused(arguments)):
            return Screened(text=text)
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            return Screened(error=error_body(INVALID_REQUEST))
        rewritten = {
            **message,
            "params": {
                **params,
                "arguments": {},
                "_meta": {**(meta or {}), INVALID_ARGUMENTS_META: True},
            },
        }
        return Screened(text=json.dumps(rewritten, ensure_ascii=False))
    if refused(message):
        return Screened(error=error_body(INVALID_REQUEST))
    return Screened(text=text)
