"""The wire (issue 14): what a search or get result costs the official client, and its bytes.

One fresh data directory; ``--records`` memories (LoCoMo turns, bench/hotpath's corpus) written
through ``Engine.handle``; then ``--searches`` searches (LoCoMo questions, limit 10) and as many
gets. Each result is turned into what the client holds (the envelope as the server sends it,
parsed back from its JSON text) and validated as the ``mcp`` client's ``validate_tool_result``
does: the tool's published ``outputSchema`` compiled once (``validator_for`` with an empty
``Registry``), then ``best_match(iter_errors(structuredContent))`` per result. That validation is
timed in CPU (``time.thread_time``), which load does not enter.

The bytes: the compact JSON-RPC response carrying a 10-record search (CONTRACT.md §2: the
envelope as ``structuredContent`` and again as the JSON text of a ``TextContent``), the memory
text it carries, and where the rest goes: the text copy, the envelope's frame, the search value's
receipts, and each packet's fields summed over the page (§7.1 packets, §7.2's default
allowlist, §5 digests).

Run the same script against another tree for a before/after comparison (the tree's package comes
first on the path)::

    python -m bench.wire --records 300
    PYTHONPATH=/tmp/before/layers/core python -m bench.wire --records 300

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.hotpath.corpus import Corpus
from bench.in_process import DEFAULT_LOCOMO, bench_context, envelope, remember_all, seeding_policy
from bench.locomo.calls import PURPOSE


def client_validator(
    name: str, schema: dict[str, Any]
) -> Callable[[Any], Coroutine[Any, Any, None]]:
    """The ``mcp`` client's own check of one result (``ClientSession.validate_tool_result``,
    which raises ``RuntimeError`` for a result that fails the schema), on a session that has
    listed the tool: its ``outputSchema`` cached, compiled on first use, as in a session."""
    import mcp.types as types
    from mcp.client.session import ClientSession

    session = object.__new__(ClientSession)  # no streams: only the listing's caches are used
    session._tool_output_schemas = {name: schema}
    session._tool_output_validators = {}

    async def check(result: types.CallToolResult) -> None:
        await session.validate_tool_result(name, result)

    return check


def published_output_schemas() -> dict[str, dict[str, Any]]:
    """Each tool's ``outputSchema`` as a client receives it in ``tools/list`` (JSON)."""
    from engram_memory.mcp_surface.catalog import build_tools

    return {
        grant: json.loads(json.dumps(tool.output_schema)) for grant, tool in build_tools().items()
    }


def on_the_wire(envelope: dict[str, Any]) -> tuple[Any, int]:
    """The ``CallToolResult`` the client builds from the server's compact JSON-RPC response
    carrying ``envelope``, and that response's bytes."""
    import mcp.types as types

    from engram_memory.mcp_surface.server import envelope_result

    message = {
        "jsonrpc": "2.0",
        "id": 0,
        "result": envelope_result(envelope).model_dump(
            mode="json", by_alias=True, exclude_unset=True
        ),
    }
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    received = types.CallToolResult.model_validate(json.loads(text)["result"])
    return received, len(text.encode())


def validation_cpu_ms(
    check: Callable[[Any], Coroutine[Any, Any, None]], results: list[Any], repeat: int
) -> dict[str, float]:
    """Median and p90 CPU milliseconds of one client-side validation, over every result (one
    event loop for all; a first validation, which compiles the schema, is left out)."""
    import anyio

    timings: list[float] = []

    async def validate_all() -> None:
        await check(results[0])
        for result in results:
            for _ in range(repeat):
                began = time.thread_time()
                await check(result)
                timings.append((time.thread_time() - began) * 1000)

    anyio.run(validate_all)
    timings.sort()
    return {
        "median_ms": round(statistics.median(timings), 3),
        "p90_ms": round(timings[int(len(timings) * 0.9)], 3),
        "validations": len(timings),
    }


def _member_bytes(key: str, value: Any) -> int:
    """Bytes of ``"key":value`` in compact JSON (without the separating comma)."""
    return len(json.dumps({key: value}, separators=(",", ":"), ensure_ascii=False).encode()) - 2


def _text_bytes(record: dict[str, Any]) -> int:
    return sum(len(c.get("text", "").encode()) for c in record.get("components") or ())


def breakdown(envelope: dict[str, Any]) -> dict[str, Any]:
    """Where the bytes of one search response go, summed over its packets."""
    from engram_memory.contract.envelope import envelope_text

    _, response = on_the_wire(envelope)
    value = envelope["output"]["value"]
    packets = value["records"]
    text = sum(_text_bytes(packet["record"]) for packet in packets)
    parts: Counter[str] = Counter()
    for packet in packets:
        record = packet["record"]
        for key, item in record.items():
            if key == "components":
                text_of = _text_bytes(record)
                parts["record.components (memory text)"] += text_of
                parts["record.components (ids, kind, citation_ids, JSON)"] += (
                    _member_bytes(key, item) - text_of
                )
            else:
                parts[f"record.{key}"] += _member_bytes(key, item)
        for key, item in packet.items():
            if key != "record":
                parts[f"packet.{key}"] += _member_bytes(key, item)
    for key, item in value.items():
        if key != "records":
            parts[f"value.{key}"] += _member_bytes(key, item)
    envelope_bytes = _json_bytes(envelope)
    value_bytes = _json_bytes(value)
    parts["JSON punctuation of the value (braces, commas, the record/records keys)"] = (
        value_bytes - sum(parts.values())
    )
    parts["envelope frame (ok, output, schema_version, auditId, redactionClass)"] = (
        envelope_bytes - value_bytes
    )
    # §2: the text content is the envelope's own JSON text, escaped into a JSON string.
    text_copy = len(json.dumps(envelope_text(envelope), ensure_ascii=False).encode())
    return {
        "records": len(packets),
        "text_bytes": text,
        "response_bytes": response,
        "times_text": round(response / text, 1) if text else None,
        "structured_content_bytes": envelope_bytes,
        "structured_content_times_text": round(envelope_bytes / text, 1) if text else None,
        "text_copy_bytes": text_copy,
        "jsonrpc_frame_bytes": response - envelope_bytes - text_copy,
        "envelope_parts": dict(parts.most_common()),
    }


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _answers(
    corpus: Corpus, records: int, searches: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """On a fresh embedded store of ``records``: the search envelopes that hold a full page of
    10 records, and ``searches`` get envelopes."""
    from engram_memory.embedded.composition import init_data_dir, open_embedded

    with tempfile.TemporaryDirectory(prefix="engram-wire-bench-") as tmp:
        data = Path(tmp) / "data"
        init_data_dir(data)
        host = open_embedded(data, policy=seeding_policy())
        try:
            engine = host.engine
            record_ids = remember_all(engine, corpus.memories(0, records), "wire")
            full_pages: list[dict[str, Any]] = []
            for index in range(searches):
                query = {"query": corpus.query(index), "purpose_ref": PURPOSE, "limit": 10}
                found = envelope(engine.handle("search", query, bench_context()))
                assert found["ok"], found
                if len(found["output"]["value"]["records"]) == 10:
                    full_pages.append(found)
            gets = []
            for i in range(searches):
                record_id = record_ids[(i * 7919) % len(record_ids)]
                arguments = {"record_id": record_id, "purpose_ref": PURPOSE}
                gets.append(envelope(engine.handle("get", arguments, bench_context())))
        finally:
            host.close()
    return full_pages, gets


def run(corpus: Corpus, records: int, searches: int, repeat: int) -> dict[str, Any]:
    import engram_memory
    from engram_memory.mcp_surface.catalog import TOOL_NAMES

    schemas = published_output_schemas()
    full_pages, gets = _answers(corpus, records, searches)
    if not full_pages:
        raise SystemExit("no search returned 10 records: seed more --records")
    search_results = [on_the_wire(page)[0] for page in full_pages]
    get_results = [on_the_wire(got)[0] for got in gets]
    sizes = [breakdown(page) for page in full_pages]
    median_page = sorted(sizes, key=lambda size: size["response_bytes"])[len(sizes) // 2]
    return {
        "package": str(Path(engram_memory.__file__).parent),
        "records": records,
        "client_validation_cpu": {
            "search_10_records": validation_cpu_ms(
                client_validator(TOOL_NAMES["search"], schemas["search"]), search_results, repeat
            ),
            "get": validation_cpu_ms(
                client_validator(TOOL_NAMES["get"], schemas["get"]), get_results, repeat
            ),
        },
        "output_schema_bytes": {
            grant: len(json.dumps(schema, separators=(",", ":")).encode())
            for grant, schema in schemas.items()
        },
        "search_pages_of_10": len(full_pages),
        "response_bytes_median": median_page["response_bytes"],
        "times_text_median": median_page["times_text"],
        "median_page": median_page,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5, help="validations per result")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    args = parser.parse_args(argv)
    if min(args.records, args.searches, args.repeat) < 1:
        parser.error("--records, --searches and --repeat must be at least 1")
    report = run(Corpus.load(args.locomo), args.records, args.searches, args.repeat)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
