"""The embedded host's approval book: its questions to humans and their answers, shared by the
server and the terminal (SQLite; docs/architecture.md, "Glossary of human approval").

One row per question the server asked a human: what it is bound to (principal, scope,
tool, target, operation digest), who asked (agent, session), its single-use link secret, and its
answer. The server opens a row when it first asks; the approval page and ``engram-memory
approvals approve|decline`` answer it (the first answer wins); the agent's retry of the same
call finds the answer, so an approval given after the client stopped waiting is not lost and the
human is never asked twice for one operation. A row is the ``engine.gate.Approval`` plus what the
book keeps beside it (``OpenApproval``); its windows are the gate's own (``Approval.usable_at``,
``expired``), and the engine checks them again with single use (the approval id is consumed in
the mutation's own commit).

The link shows the question; answering on the page also takes the question's one-time code,
which only the operator's terminal shows (the server's stderr, ``engram-memory approvals list``),
never the agent: an agent that can fetch the link still cannot answer its own question. The code
is 8 characters from an alphabet without look-alikes (about 40 bits), compared in constant time;
after ``MAX_CODE_ATTEMPTS`` wrong codes the page takes no answer to that question (the terminal
still does).

A withdraw or forget row also holds the agent's call (``HeldCall``: its arguments — ids, the
idempotency key, the reason_ref, never a memory's text — and the context the host bound it to,
less the bearer token), so that an approval carries it out at once, as that call
(``embedded.book_channel.EmbeddedApprovals.carry_out``); the row then records how that went
(``committed_at_ms`` or ``commit_failure``) and when the commit was first reported to the agent
(``reported_at_ms``). A capture or request_admission row holds no call: a capture's content must
never rest here, and an admission's decision matches the text against the caller's own token,
which the book does not keep either; their approval is taken by the agent's retry, as before.

The file lives in the private data directory (0600), beside the keys: whoever can read it can
already answer from the terminal, so the link secret and the code are stored as handed out.
"""

from __future__ import annotations

import hmac
import os
import secrets
import sqlite3
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, JsonValue

from engram_memory.engine.context import ALWAYS_CONFIRMED, Scope, TrustedContext, new_audit_id
from engram_memory.engine.gate import (
    APPROVAL_TTL_MS,
    AnsweredOn,
    Approval,
    ConfirmationRequest,
    approver_label,
)

FILE_NAME: Final = "approvals.sqlite3"
KEEP_ANSWERED_MS: Final = 3_600_000  # rows are pruned an hour after they expired
State = Literal["pending", "approved", "declined"]
Answerer = Literal["page", "terminal", "client", "console"]
CODE_ALPHABET: Final = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read aloud, typed
CODE_LENGTH: Final = 8
MAX_CODE_ATTEMPTS: Final = 5
CodeRefusal = Literal["wrong_code", "no_more_attempts"]
# Where each answerer answers (the client answers in its form).
_ANSWERED_ON: Final[dict[str, AnsweredOn]] = {
    "page": "page",
    "terminal": "terminal",
    "console": "console",
    "client": "form",
}


def new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def shown_code(code: str) -> str:
    """The code as the terminal shows it: ``ABCD-EFGH``."""
    return f"{code[:4]}-{code[4:]}"


def _typed(code: str) -> str:
    """A code as a person types it: any case, with or without the dash or spaces."""
    return "".join(code.split()).replace("-", "").upper()


class Bound(Protocol):
    """What an approval is bound to: a ``ConfirmationRequest`` or an ``Approval``."""

    @property
    def tool(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def operation_digest(self) -> str: ...
    @property
    def principal(self) -> str: ...
    @property
    def scope(self) -> Scope: ...


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    secret TEXT NOT NULL,
    principal TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    agent_id TEXT,
    session_id TEXT,
    tool TEXT NOT NULL,
    target TEXT,
    operation_digest TEXT NOT NULL,
    reason_ref TEXT,
    issued_at_ms INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'declined')),
    answered_at_ms INTEGER,
    answered_by TEXT,
    code TEXT NOT NULL DEFAULT '',
    code_failures INTEGER NOT NULL DEFAULT 0,
    approver TEXT,
    call TEXT,
    committed_at_ms INTEGER,
    commit_failure TEXT,
    reported_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS approvals_binding
    ON approvals (principal, tenant_id, workspace_id, tool, operation_digest);
"""
# The row is the ``Approval`` (its binding columns carry the model's own field names) and what
# the book keeps beside it; ``approved_at_ms`` and ``approved_by`` are not columns: they are
# the answer's time and who gave it (``answered_by`` where, ``approver`` who) when the answer
# was an approval.
_BOOK_COLUMNS: Final = (
    "secret",
    "agent_id",
    "session_id",
    "reason_ref",
    "state",
    "answered_at_ms",
    "answered_by",
    "code",
    "code_failures",
    "approver",
    "call",
    "committed_at_ms",
    "commit_failure",
    "reported_at_ms",
)
# Columns a book written before them lacks (its rows then have no code: the terminal answers;
# and no approver: the history says where the answer came from, not who gave it).
_ADDED_COLUMNS: Final = {
    "code": "TEXT NOT NULL DEFAULT ''",
    "code_failures": "INTEGER NOT NULL DEFAULT 0",
    "approver": "TEXT",
    "call": "TEXT",  # and no held call: the agent's retry takes the approval, as it did
    "committed_at_ms": "INTEGER",
    "commit_failure": "TEXT",
    "reported_at_ms": "INTEGER",
}
_COLUMN_NAMES: Final = (
    *(name for name in Approval.model_fields if name not in ("approved_at_ms", "approved_by")),
    *_BOOK_COLUMNS,
)
COLUMNS: Final = ", ".join(_COLUMN_NAMES)


class HeldCall(BaseModel):
    """The agent's withdraw or forget as the book holds it until a person approves it: the
    arguments as sent (ids, the idempotency key, the reason_ref: no memory's text) and what of
    the trusted context the commit needs — the purpose (part of the ledger's intent), the
    grants, and the credential's id and issue time, so that a revoked token's approval commits
    nothing. Never the bearer token, nor the call's deadline (the person answers later)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arguments: dict[str, JsonValue]
    purpose_ref: str
    grants: tuple[str, ...]
    credential_id: str | None = None
    credential_issued_at_ms: int | None = None

    @classmethod
    def of(cls, tool: str, arguments: Any, ctx: TrustedContext) -> str | None:
        """The JSON the book keeps for ``tool``'s call, or None for a call it does not carry
        out itself (capture and request_admission: see the module docstring)."""
        if tool not in ALWAYS_CONFIRMED or not isinstance(arguments, dict):
            return None
        return cls(
            arguments=arguments,
            purpose_ref=ctx.purpose_ref,
            grants=tuple(sorted(ctx.grants)),
            credential_id=ctx.credential_id,
            credential_issued_at_ms=ctx.credential_issued_at_ms,
        ).model_dump_json()

    def context(self, row: OpenApproval) -> TrustedContext:
        """The agent's context again, for the commit an approval carries out (a new audit id:
        it is a call of its own, audited as the agent's)."""
        return TrustedContext.bound(
            row.scope,
            row.principal,
            self.purpose_ref,
            audit_id=new_audit_id(),
            grants=frozenset(self.grants),
            agent_id=row.agent_id,
            session_id=row.session_id,
            credential_id=self.credential_id,
            credential_issued_at_ms=self.credential_issued_at_ms,
        )


class OpenApproval(Approval):
    """A question the book holds: the ``Approval`` (approved once answered so), its link secret,
    who asked, and its answer."""

    secret: str
    agent_id: str | None = None
    session_id: str | None = None
    reason_ref: str | None = None
    state: State = "pending"
    answered_at_ms: int | None = None
    answered_by: str | None = None
    code: str = ""  # the one-time code the page asks for (shown on the terminal only)
    code_failures: int = 0
    approver: str | None = None  # who answered, where the host knows (the operator's name)
    call: str | None = None  # the ``HeldCall`` an approval carries out (JSON), if any
    committed_at_ms: int | None = None  # when the approval's commit landed
    commit_failure: str | None = None  # the error code of an approval's commit that failed
    reported_at_ms: int | None = None  # when the agent was first told of that commit

    @classmethod
    def of_row(cls, row: Sequence[object]) -> OpenApproval:
        """The row ``SELECT {COLUMNS}`` reads."""
        fields = dict(zip(_COLUMN_NAMES, row, strict=True))
        approved_at = fields["answered_at_ms"] if fields["state"] == "approved" else None
        return cls.model_validate({**fields, "approved_at_ms": approved_at})

    def approval(self) -> Approval:
        """The approval the human gave (``usable_at`` says whether the engine would take it),
        naming who gave it and where."""
        assert self.answered_at_ms is not None
        on: AnsweredOn = _ANSWERED_ON.get(self.answered_by or "", "form")
        return self.approved(self.answered_at_ms, approver_label(on, self.approver))

    def held_call(self) -> HeldCall | None:
        return None if self.call is None else HeldCall.model_validate_json(self.call)


class ApprovalBook:
    """The open confirmations of one data directory (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = path = data_dir / FILE_NAME
        os.close(
            os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        )  # owner-only before SQLite opens it
        self._db = sqlite3.connect(path, timeout=10.0, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        known = {row[1] for row in self._db.execute("PRAGMA table_info(approvals)")}
        with self._db:
            for name, declaration in _ADDED_COLUMNS.items():
                if name not in known:
                    self._db.execute(f"ALTER TABLE approvals ADD COLUMN {name} {declaration}")
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, where: str, args: tuple[object, ...]) -> list[OpenApproval]:
        cursor = self._db.execute(f"SELECT {COLUMNS} FROM approvals WHERE {where}", args)  # noqa: S608 - fixed columns
        return [OpenApproval.of_row(row) for row in cursor.fetchall()]

    def get(self, approval_id: str) -> OpenApproval | None:
        with self._lock:
            rows = self._rows("approval_id = ?", (approval_id,))
        return rows[0] if rows else None

    def for_operation(self, request: Bound, now_ms: int) -> OpenApproval | None:
        """The newest live row bound to this very operation (pending, or answered and usable)."""
        with self._lock:
            rows = self._rows(
                "principal = ? AND tenant_id = ? AND workspace_id = ? AND tool = ?"
                " AND operation_digest = ? AND issued_at_ms >= ? ORDER BY issued_at_ms DESC",
                (
                    request.principal,
                    request.scope.tenant_id,
                    request.scope.workspace_id,
                    request.tool,
                    request.operation_digest,
                    now_ms - APPROVAL_TTL_MS,
                ),
            )
        for row in rows:
            if row.target == request.target:
                return row
        return None

    def open(
        self,
        request: ConfirmationRequest,
        *,
        agent_id: str | None,
        session_id: str | None,
        now_ms: int,
        call: str | None = None,
    ) -> OpenApproval:
        """The pending row for this operation: the one already open (with the call that asked
        first), or a new one holding ``call`` (``HeldCall.of``)."""
        existing = self.for_operation(request, now_ms)
        if existing is not None and existing.state == "pending":
            return existing
        asked = Approval.asked(request, approval_id="apr_" + uuid.uuid4().hex, issued_at_ms=now_ms)
        row = OpenApproval(
            **asked.model_dump(),
            secret=secrets.token_urlsafe(32),
            code=new_code(),
            agent_id=agent_id,
            session_id=session_id,
            reason_ref=request.reason_ref,
            call=call,
        )
        with self._lock, self._db:
            self._db.execute(
                "DELETE FROM approvals WHERE issued_at_ms < ?",
                (now_ms - APPROVAL_TTL_MS - KEEP_ANSWERED_MS,),
            )
            self._db.execute(
                f"INSERT INTO approvals ({COLUMNS})"  # noqa: S608 - fixed columns
                f" VALUES ({', '.join('?' * len(_COLUMN_NAMES))})",
                tuple(getattr(row, name) for name in _COLUMN_NAMES),
            )
        return row

    def answer(
        self,
        approval_id: str,
        approve: bool,
        *,
        now_ms: int,
        by: Answerer,
        approver: str | None = None,
    ) -> OpenApproval | None:
        """Record the first answer to a pending, unexpired row (``by``: where; ``approver``:
        who, when the answerer can say); None when there is none."""
        state: State = "approved" if approve else "declined"
        with self._lock, self._db:
            changed = self._db.execute(
                "UPDATE approvals SET state = ?, answered_at_ms = ?, answered_by = ?, approver = ?"
                " WHERE approval_id = ? AND state = 'pending' AND issued_at_ms + ? >= ?",
                (state, now_ms, by, approver, approval_id, APPROVAL_TTL_MS, now_ms),
            ).rowcount
        return self.get(approval_id) if changed == 1 else None

    def answer_with_code(
        self, approval_id: str, approve: bool, code: str, *, now_ms: int
    ) -> OpenApproval | CodeRefusal | None:
        """The page's answer: recorded (as ``answer``) only with the question's code. A wrong
        code counts against the question; after ``MAX_CODE_ATTEMPTS`` none is taken."""
        with self._lock, self._db:
            rows = self._rows("approval_id = ?", (approval_id,))
            if not rows:
                return None
            row = rows[0]
            if row.code_failures >= MAX_CODE_ATTEMPTS or not row.code:
                return "no_more_attempts"
            if not hmac.compare_digest(_typed(code).encode(), row.code.encode()):
                self._db.execute(
                    "UPDATE approvals SET code_failures = code_failures + 1 WHERE approval_id = ?",
                    (approval_id,),
                )
                return "wrong_code"
        return self.answer(approval_id, approve, now_ms=now_ms, by="page")

    def close_declined(self, approval_id: str) -> None:
        """A decline was reported to the agent: the next call for the operation asks anew."""
        with self._lock, self._db:
            self._db.execute(
                "DELETE FROM approvals WHERE approval_id = ? AND state = 'declined'",
                (approval_id,),
            )

    def forget_question(self, approval_id: str) -> None:
        """Remove a question answered elsewhere (the client's own round trip)."""
        with self._lock, self._db:
            self._db.execute("DELETE FROM approvals WHERE approval_id = ?", (approval_id,))

    def settle(self, approval_id: str, now_ms: int, failure: str | None, *, reported: bool) -> None:
        """How the commit an approval carried out went: landed at ``now_ms`` (``reported``: the
        agent had already seen it, its own retry committed first), or ``failure``'s code."""
        landed = now_ms if failure is None else None
        with self._lock, self._db:
            self._db.execute(
                "UPDATE approvals SET committed_at_ms = ?, commit_failure = ?, reported_at_ms = ?"
                " WHERE approval_id = ?",
                (landed, failure, now_ms if reported and landed else None, approval_id),
            )

    def first_report(
        self, ctx: TrustedContext, tool: str, idempotency_key: str, now_ms: int
    ) -> bool:
        """Mark the commit an approval carried out for ``ctx``'s principal's ``tool`` call under
        ``idempotency_key`` as reported to the agent; True the first time (as the cloud's
        ``ParkedApprovalBook.first_report``)."""
        with self._lock, self._db:
            rows = self._rows(
                "principal = ? AND tenant_id = ? AND workspace_id = ? AND tool = ?"
                " AND committed_at_ms IS NOT NULL AND reported_at_ms IS NULL",
                (ctx.principal, ctx.tenant_id, ctx.workspace_id, tool),
            )
            for row in rows:
                held = row.held_call()
                if held is None or held.arguments.get("idempotency_key") != idempotency_key:
                    continue
                marked: int = self._db.execute(
                    "UPDATE approvals SET reported_at_ms = ?"
                    " WHERE approval_id = ? AND reported_at_ms IS NULL",
                    (now_ms, row.approval_id),
                ).rowcount
                return marked == 1
        return False

    def pending(self, now_ms: int) -> list[OpenApproval]:
        """The questions waiting for a human, oldest first."""
        with self._lock:
            return self._rows(
                "state = 'pending' AND issued_at_ms >= ? ORDER BY issued_at_ms",
                (now_ms - APPROVAL_TTL_MS,),
            )
