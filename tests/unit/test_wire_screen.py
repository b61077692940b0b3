"""``wire.screen``: what reaches the MCP SDK, message by message (HTTP and stdio alike)."""

from __future__ import annotations

import json

import pytest

from engram_memory.mcp_surface.wire_screen import INVALID_ARGUMENTS_META, screen

CALL = (
    '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x", "arguments": %s}}'
)


@pytest.mark.parametrize(
    "text",
    [
        '{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        '{"jsonrpc": "2.0", "id": "a", "result": {}}',
        '{"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "m"}}',
        CALL % '{"q": "caf\\u00e9 \\ud83d\\ude00", "n": 0, "f": 1.5}',
    ],
)
def test_a_well_formed_message_passes_unchanged(text: str) -> None:
    assert screen(text).text is text


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{", -32700),
        ('{"a": NaN}', -32700),
        ("[]", -32600),
        ('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
        ("7", -32600),
        ('{"jsonrpc": "2.0", "id": 1}', -32600),
        ('{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600),
        ('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": []}', -32600),
        ('{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "ping"}', -32600),
        ('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"a": -0}}', -32600),
        (CALL.replace('"name": "x"', '"name": "x\\udc00"') % "{}", -32600),
    ],
)
def test_a_message_that_is_not_one_well_formed_request_is_a_constant_error(
    text: str, code: int
) -> None:
    error = screen(text).error
    assert error == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": code, "message": "Parse error" if code == -32700 else "Invalid Request"},
    }


@pytest.mark.parametrize(
    "arguments",
    [
        '{"a": 1, "a": 2}',
        '{"a": {"b": [{"c": 1, "c": 1}]}}',
        '{"a": -0}',
        '{"a": -0.0}',
        '{"a": "\\ud800"}',
        '{"a": ["x", "\\uDFFF"]}',  # escapes are read whatever their case
        '{"a": "\\uDa00 and more"}',
        '{"\\udbff": 1}',  # in a key
        '{"a": "\ud800"}',  # raw, in a text that did not come from UTF-8
        '{"a": -0e5}',
        "[]",  # not an object: a wrong type, INVALID_SCHEMA like any other
        '"search"',
        "7",
        "true",
    ],
)
def test_refused_json_in_arguments_reaches_the_tool_as_a_marker(arguments: str) -> None:
    text = screen(CALL % arguments).text
    assert text is not None
    params = json.loads(text)["params"]
    assert params["arguments"] == {} and params["_meta"] == {INVALID_ARGUMENTS_META: True}
