"""``engram-memory approvals``: the local operator answers confirmations from a terminal.

- ``engram-memory approvals list [--data-dir DIR] [--json]``
      the questions waiting for a human, each as the approval page shows it
      (``approval_page.plain_summary``): the operation, the memory it acts on, who asks, why,
      time left.
- ``engram-memory approvals approve|decline [--data-dir DIR] [--operator NAME] APPROVAL_ID``
      answer one (the first answer wins, from here, the approval page or the agent's form). An
      approved withdraw or forget is carried out at once, as the agent's call (its one line
      says so, or why not); the agent's retry of the same call returns its result. A decline
      makes that retry fail with ``gate_failed``. The record's history names the approver
      ``operator:NAME`` (your login).

Both go through the host's approval channel (``embedded.book_channel.EmbeddedApprovals``,
the ``ApprovalChannel`` port the MCP surface asks through): ``pending`` to list, ``answer_by_id``
to answer as ``terminal``. The approvals live in the data directory (``approvals.sqlite3``):
whoever may read it may answer.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engram_memory.operator_plane.commands import (
    command_name,
    default_operator,
    fail,
    json_option,
)
from engram_memory.operator_plane.text import iso

if TYPE_CHECKING:
    from engram_memory.adapters.local.approval_book import OpenApproval
    from engram_memory.embedded.book_channel import EmbeddedApprovals
    from engram_memory.embedded.composition import EmbeddedHost


@contextmanager
def _channel(args: argparse.Namespace) -> Iterator[EmbeddedApprovals | None]:
    """The data directory's approval channel; None when nothing has asked yet. The engine (the
    memory a question shows) opens only when a question is shown. ``DataDirectoryRefused`` for
    a directory that is not an initialised data directory."""
    from engram_memory.adapters.clock import SystemClock
    from engram_memory.adapters.local.approval_book import FILE_NAME, ApprovalBook
    from engram_memory.embedded.book_channel import EmbeddedApprovals
    from engram_memory.embedded.composition import open_existing, require_initialised

    data_dir = Path(args.data_dir)
    require_initialised(data_dir)
    if not (data_dir / FILE_NAME).exists():
        yield None
        return
    hosts: list[EmbeddedHost] = []

    def kernel() -> Any:
        if not hosts:
            hosts.append(open_existing(data_dir))
        return hosts[0].engine

    channel = EmbeddedApprovals(
        lambda: ApprovalBook(data_dir), kernel, base_url="", clock=SystemClock()
    )
    try:
        yield channel
    finally:
        channel.close()
        for host in hosts:
            host.close()


def _listing(channel: EmbeddedApprovals, now_ms: int) -> list[dict[str, Any]]:
    from engram_memory.adapters.local.approval_book import shown_code
    from engram_memory.approval_page import plain_summary

    listed = []
    for row in channel.pending():
        view = channel.view_of(row)
        listed.append(
            {
                "approval_id": row.approval_id,
                "tool": row.tool,
                "target": row.target,
                "principal": row.principal,
                "agent_id": row.agent_id,
                "session_id": row.session_id,
                "reason_ref": row.reason_ref,
                "asked_at": iso(row.issued_at_ms),
                "expires_at": iso(row.expires_at_ms),
                "seconds_left": max(0, (row.expires_at_ms - now_ms) // 1000),
                "summary": plain_summary(view, now_ms),
                # what a person types on the approval page to answer there (never the agent's)
                "page_code": shown_code(row.code) if row.code else None,
            }
        )
    return listed


def cmd_list(args: argparse.Namespace) -> int:
    import time

    now_ms = int(time.time() * 1000)
    with _channel(args) as channel:
        listed = [] if channel is None else _listing(channel, now_ms)
    if args.json:
        print(json.dumps(listed, indent=2, ensure_ascii=False))
        return 0
    if not listed:
        print(f"no approval is waiting in {Path(args.data_dir)}")
        return 0
    program = command_name()
    for question in listed:
        print(f"=== {question['approval_id']}")
        print(question["summary"])
        if question["page_code"]:
            print(f"Code for the approval page: {question['page_code']}")
        print(
            f"Answer: {program} approvals approve {question['approval_id']}"
            f"   (or: approvals decline {question['approval_id']})\n"
        )
    return 0


def _not_waiting(approval_id: str, row: OpenApproval | None) -> str:
    """Why ``approval_id`` takes no answer, in one line."""
    listing = f"see `{command_name()} approvals list`"
    if row is None:
        return f"no approval {approval_id} in this data directory; {listing}"
    if row.state == "pending":
        return f"approval {approval_id} expired at {iso(row.expires_at_ms)} unanswered; {listing}"
    at = f" at {iso(row.answered_at_ms)}" if row.answered_at_ms is not None else ""
    where = f" ({row.answered_by})" if row.answered_by else ""
    return f"approval {approval_id} was already answered: {row.state}{at}{where}"


def _answer(args: argparse.Namespace, approve: bool) -> int:
    from engram_memory.approval_page.view import action_of
    from engram_memory.embedded.book_channel import outcome_line
    from engram_memory.operator_plane.auditing import operator_principal

    approver = operator_principal(args.operator)  # journaled with the transition it authorizes
    with _channel(args) as channel:
        recorded, row = (
            (False, None)
            if channel is None
            else channel.answer_by_id(args.approval_id, approve, by="terminal", approver=approver)
        )
    if not recorded or row is None:
        fail(_not_waiting(args.approval_id, row))
        return 1
    action = action_of(row.tool)[1]
    if approve:
        print(f"approved: {action} {row.target or ''} for {row.principal}. {outcome_line(row)}")
    else:
        print(f"declined: {action} {row.target or ''}. Nothing was changed.")
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
    json_option(listing)
    listing.set_defaults(func=cmd_list)
    for name, func, text in (
        ("approve", cmd_approve, "approve one (a withdraw or forget is carried out at once)"),
        ("decline", cmd_decline, "decline one (the agent's call is refused; nothing changes)"),
    ):
        answer = commands.add_parser(name, help=text)
        answer.add_argument("--data-dir", default=default_data_dir)
        answer.add_argument(
            "--operator",
            default=default_operator(),
            help="who answers, as the record's history names the approver (default: your login)",
        )
        answer.add_argument("approval_id", metavar="APPROVAL_ID", help="an id from `list`")
        answer.set_defaults(func=func)
