"""``engram-memory approvals``: the local operator answers confirmations from a terminal.

- ``engram-memory approvals list [--data-dir DIR]``
      the questions waiting for a human: id, operation, target, who asks, reason, time left.
- ``engram-memory approvals approve|decline [--data-dir DIR] APPROVAL_ID``
      answer one (the first answer wins, from here, the approval page or the agent's form); the
      agent's retry of the same call then commits (within 30 s of an approval) or fails with
      ``gate_failed``.

The approvals live in the data directory (``approvals.sqlite3``): whoever may read it may answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from engram_memory.approval_page.view import action_of


def _book(args: argparse.Namespace) -> Any:
    from engram_memory.adapters.local.approvals import FILE_NAME, ApprovalBook

    data_dir = Path(args.data_dir)
    if not (data_dir / FILE_NAME).exists():
        print(f"no approvals in {data_dir} (nothing has asked yet)", file=sys.stderr)
        return None
    return ApprovalBook(data_dir)


def _now_ms() -> int:
    return int(time.time() * 1000)


def cmd_list(args: argparse.Namespace) -> int:
    book = _book(args)
    if book is None:
        return 0
    try:
        rows = book.pending(_now_ms())
    finally:
        book.close()
    if not rows:
        print("no approval is waiting")
        return 0
    now = _now_ms()
    for row in rows:
        action = action_of(row.tool)[1]
        left = max(0, (row.expires_at_ms - now) // 1000)
        print(f"{row.approval_id}  {left // 60}:{left % 60:02d} left")
        print(f"  {action}: {row.target or '(new memory)'}")
        print(
            f"  asked by {row.principal} (agent {row.agent_id or '-'}, session"
            f" {row.session_id or '-'}) in {row.tenant_id}/{row.workspace_id};"
            f" reason {row.reason_ref or '-'}"
        )
        if row.code:
            print(f"  code for the approval page: {row.code[:4]}-{row.code[4:]}")
    return 0


def _answer(args: argparse.Namespace, approve: bool) -> int:
    book = _book(args)
    if book is None:
        return 1
    try:
        answered = book.answer(args.approval_id, approve, now_ms=_now_ms(), by="terminal")
    finally:
        book.close()
    if answered is None:
        print(
            f"engram-memory: {args.approval_id} is not waiting for an answer (unknown, already"
            " answered or expired); see `engram-memory approvals list`",
            file=sys.stderr,
        )
        return 1
    action = action_of(answered.tool)[1]
    if approve:
        print(
            f"approved: {action} {answered.target or ''} for {answered.principal}. The agent's"
            " retry of the same call commits if it comes within 30 s."
        )
    else:
        print(f"declined: {action} {answered.target or ''}. Nothing was changed.")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _answer(args, approve=True)


def cmd_decline(args: argparse.Namespace) -> int:
    return _answer(args, approve=False)


def add_approvals_parser(sub: Any, default_data_dir: str) -> None:
    """``approvals list|approve|decline`` under the main parser's subcommands."""
    approvals = sub.add_parser(
        "approvals", help="answer the confirmations agents are waiting for (withdraw, forget)"
    )
    commands = approvals.add_subparsers(dest="approvals_command", required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="the approvals waiting for an answer")
    listing.add_argument("--data-dir", default=default_data_dir)
    listing.set_defaults(func=cmd_list)
    for name, func, text in (
        ("approve", cmd_approve, "approve one (the agent's retry then commits)"),
        ("decline", cmd_decline, "decline one (the agent's call fails with gate_failed)"),
    ):
        answer = commands.add_parser(name, help=text)
        answer.add_argument("--data-dir", default=default_data_dir)
        answer.add_argument("approval_id", metavar="APPROVAL_ID", help="an id from `list`")
        answer.set_defaults(func=func)
