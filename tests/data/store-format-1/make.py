"""Writes this folder's data directory with the code of the tree on the path: the embedded store
as it was before store format 2 (records WITHOUT ROWID, journal and ledger as plain JSON), for
tests/integration/test_store_format.py. Made with main at 024997b:

    git archive 024997b | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/layers/core:/tmp/before/tests python tests/data/store-format-1/make.py

``expected.json`` holds what that code answered: the search hits and the records get returned.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from engram_memory.embedded.cli import main as cli_main
from engram_memory.embedded.composition import init_data_dir, open_embedded
from engram_memory.engine.context import TrustedContext, new_audit_id
from engram_memory.engine.service import Engine

from engram_testing import PURPOSE, capture_args

HERE = Path(__file__).resolve().parent
MEMORIES = (
    "The staging database is restored from the nightly snapshot at 03:00 UTC.",
    "Quarterly access reviews are signed off by the security lead.",
    "The payments service pins its TLS certificates and rotates them yearly.",
    "Forgotten: the old vault passphrase was periwinkle-quokka.",
)
QUERIES = ("staging database snapshot", "access reviews security", "TLS certificates")


def _ctx() -> TrustedContext:
    return TrustedContext(
        tenant_id="local",
        workspace_id="default",
        principal="agent-format",
        purpose_ref=PURPOSE,
        audit_id=new_audit_id(),
    )


def _call(engine: Engine, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call no human confirms: its envelope."""
    envelope = engine.handle(tool, arguments, _ctx())
    assert isinstance(envelope, dict), envelope
    return envelope


def main() -> None:
    data = HERE / "data"
    shutil.rmtree(data, ignore_errors=True)
    init_data_dir(data)
    host = open_embedded(data)
    engine = host.engine
    record_ids: list[str] = []
    for number, text in enumerate(MEMORIES):
        captured = _call(
            engine,
            "capture",
            capture_args(text, key=f"format-capture-{number:04d}", valid_from=1_700_000_000_000),
        )
        assert captured["ok"], captured
        admitted = _call(
            engine,
            "request_admission",
            {
                "candidate_id": captured["output"]["value"]["candidate_id"],
                "idempotency_key": f"format-admit-{number:04d}",
            },
        )
        record_ids.append(admitted["output"]["value"]["outcome"]["record_id"])
    host.close()
    # An operator's forget (an agent's asks a human first): the record tombstoned, its key gone.
    forget = ["admin", "records", "forget", record_ids[-1], "--reason", "fixture"]
    assert cli_main([*forget, "--data-dir", str(data)]) == 0
    host = open_embedded(data)
    engine = host.engine
    while engine.drain_outbox():
        pass
    expected = {
        "record_ids": record_ids[:-1],
        "forgotten": record_ids[-1],
        "searches": {
            query: [
                hit["record"]["record_id"]
                for hit in _call(engine, "search", {"query": query, "purpose_ref": PURPOSE})[
                    "output"
                ]["value"]["records"]
            ]
            for query in QUERIES
        },
        "gets": {
            record_id: _call(engine, "get", {"record_id": record_id, "purpose_ref": PURPOSE})[
                "output"
            ]["value"]["record"]
            for record_id in record_ids[:-1]
        },
    }
    host.close()
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
