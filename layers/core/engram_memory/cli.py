"""``engram-memory``: the command line of the embedded default.

- ``engram-memory init [--data-dir DIR]``   create the data directory (idempotent)
- ``engram-memory tour [--data-dir DIR] [--yes]``
      walk an agent's six tools end to end against the real embedded engine: capture,
      request_admission, search, get, withdraw and forget, printing each envelope. Withdraw and
      forget ask you for confirmation at the terminal (``--yes`` approves for you).
- ``engram-memory verify [--data-dir DIR] --tenant T --workspace W``
      operations plane: check a scope's journal (dense cursors, unbroken hash chain).

The MCP server (``engram-memory serve``) is the next layer; it drives this same engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from .bootstrap import open_embedded, prepare_data_dir
from .contract.errors import EngramError
from .engine.context import TrustedContext
from .engine.journal import verify_journal
from .engine.ports import ConfirmationRequest
from .engine.service import new_audit_id

TOUR_TENANT = "local"
TOUR_WORKSPACE = "default"
TOUR_PURPOSE = "general"


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ask_terminal(request: ConfirmationRequest) -> bool:
    print("\n--- confirmation needed ---------------------------------", file=sys.stderr)
    print(request.summary, file=sys.stderr)
    try:
        answer = input("Approve? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def _context() -> TrustedContext:
    return TrustedContext(
        tenant_id=TOUR_TENANT,
        workspace_id=TOUR_WORKSPACE,
        principal="tour-agent",
        purpose_ref=TOUR_PURPOSE,
        audit_id=new_audit_id(),
    )


def _show(title: str, envelope: dict[str, Any]) -> dict[str, Any]:
    print(f"\n=== {title}")
    print(json.dumps(envelope, indent=2, ensure_ascii=False))
    return envelope


def _capture_args(text: str, key: str, now_ms: int) -> dict[str, Any]:
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": TOUR_PURPOSE,
            "valid_time": {"t": now_ms - 60_000},
            "components": [
                {"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}
            ],
            "primary_component_id": "c1",
            "primary_event": {
                "at": now_ms - 60_000,
                "type_ref": "event:decided",
                "citation_id": "s1",
            },
            "citations": [
                {
                    "citation_id": "s1",
                    "source_ref": "source:engram-tour",
                    "locator": {"scheme": "document", "value": "tour#1"},
                    "content_digest": _sha(text),
                }
            ],
        },
        "evidence": {
            "evidence_ref": "evidence:tour",
            "evidence_digest": _sha(text),
            "citation_ids": ["s1"],
        },
    }


def cmd_init(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    prepare_data_dir(data_dir)
    host = open_embedded(data_dir)
    host.close()
    print(f"Engram Memory data directory ready: {data_dir.resolve()}")
    return 0


def cmd_tour(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    host = open_embedded(data_dir, ask_human=(lambda _request: True) if args.yes else _ask_terminal)
    engine = host.engine
    run = f"{int(time.time())}"
    now_ms = int(time.time() * 1000)
    try:
        text = f"Tour {run}: the embedded store runs SQLite in WAL mode so readers never block the writer."
        captured = _show(
            "capture (a sealed, pending candidate)",
            engine.handle(
                "capture", _capture_args(text, f"tour-capture-{run}", now_ms), _context()
            ),
        )
        candidate_id = captured["output"]["value"]["candidate_id"]
        _show(
            "search before admission (pending memories are never returned)",
            engine.handle(
                "search", {"query": "WAL readers writer", "purpose_ref": TOUR_PURPOSE}, _context()
            ),
        )
        admitted = _show(
            "request_admission (the host policy decides)",
            engine.handle(
                "request_admission",
                {"candidate_id": candidate_id, "idempotency_key": f"tour-admit-{run}"},
                _context(),
            ),
        )
        record_id = admitted["output"]["value"]["outcome"].get("record_id")
        _show(
            "search",
            engine.handle(
                "search",
                {"query": "WAL readers writer", "purpose_ref": TOUR_PURPOSE, "limit": 3},
                _context(),
            ),
        )
        if record_id:
            _show(
                "get",
                engine.handle(
                    "get", {"record_id": record_id, "purpose_ref": TOUR_PURPOSE}, _context()
                ),
            )
        draft = _show(
            "capture a draft to withdraw",
            engine.handle(
                "capture",
                _capture_args(
                    f"Tour {run}: a draft that should not be kept.", f"tour-draft-{run}", now_ms
                ),
                _context(),
            ),
        )
        _show(
            "withdraw (needs your confirmation; crypto-shreds the candidate)",
            engine.handle(
                "withdraw",
                {
                    "candidate_id": draft["output"]["value"]["candidate_id"],
                    "idempotency_key": f"tour-withdraw-{run}",
                    "reason_ref": "reason:tour-draft",
                },
                _context(),
            ),
        )
        if record_id:
            _show(
                "forget (needs your confirmation; the record becomes permanently ineligible)",
                engine.handle(
                    "forget",
                    {
                        "record_id": record_id,
                        "idempotency_key": f"tour-forget-{run}",
                        "reason_ref": "reason:tour",
                    },
                    _context(),
                ),
            )
            _show(
                "get after forget",
                engine.handle(
                    "get", {"record_id": record_id, "purpose_ref": TOUR_PURPOSE}, _context()
                ),
            )
        print(f"\nAudit log: {(data_dir / 'audit.log').resolve()}")
    finally:
        host.close()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .engine.context import Scope

    host = open_embedded(Path(args.data_dir))
    try:
        head = verify_journal(host.store, Scope(args.tenant, args.workspace))
    except EngramError as error:
        print(f"journal check failed: {error.code.value}", file=sys.stderr)
        return 1
    finally:
        host.close()
    print(f"journal ok through cursor {head.cursor}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="engram-memory", description="Governed memory for AI agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="create the data directory")
    init.add_argument("--data-dir", default=".engram")
    init.set_defaults(func=cmd_init)
    tour = sub.add_parser("tour", help="walk the six tools against the embedded engine")
    tour.add_argument("--data-dir", default=".engram")
    tour.add_argument("--yes", action="store_true", help="approve confirmations without asking")
    tour.set_defaults(func=cmd_tour)
    verify = sub.add_parser("verify", help="check a scope's journal (operations plane)")
    verify.add_argument("--data-dir", default=".engram")
    verify.add_argument("--tenant", default=TOUR_TENANT)
    verify.add_argument("--workspace", default=TOUR_WORKSPACE)
    verify.set_defaults(func=cmd_verify)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
