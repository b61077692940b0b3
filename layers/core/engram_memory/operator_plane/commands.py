"""``engram-memory admin ...``: the operator plane's one command line, for both hosts.

Each command opens a seat (``operator_plane.seat``: the data directory of ``--data-dir``, or the
stack of ``--stack``), runs one operator use case (``operator_plane.inspection`` or
``decisions``) or one host-wide operation there, and prints its result as JSON. Every operation is audited under
``operator:<identity>``; nothing here is reachable through an agent's MCP endpoint.

Bad input exits with code 2 and one line on stderr; a failed operation exits with code 1.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from engram_memory.contract.errors import EngramError
from engram_memory.operator_plane import text
from engram_memory.operator_plane.seat import AuditPage, OperatorSeat, SeatFailure, UsageError

if TYPE_CHECKING:
    from engram_memory.engine.context import Scope
    from engram_memory.engine.kernel import Kernel
    from engram_memory.operator_plane.moving_in import Principals

__all__ = [
    "PROGRAM",
    "SeatOpener",
    "add_admin_parser",
    "add_full_option",
    "command_name",
    "fail",
    "json_option",
    "one_line",
]

T = TypeVar("T")
Show = Callable[[Any], None]
# Opens the seat a command names (``--data-dir`` or ``--stack``); the entry point supplies it.
SeatOpener = Callable[[argparse.Namespace], OperatorSeat]

PROGRAM: Final = "engram-memory"  # the console script (pyproject.toml [project.scripts])
DEFAULT_DATA_DIR: Final = ".engram"
DEFAULT_WORKSPACE: Final = "default"
_AUDIT_COLUMNS: Final = (
    ("auditId", "audit_id"),
    ("time", "at"),
    ("principal", "principal"),
    ("tool", "tool"),
    ("outcome", "code"),
    ("violation", "violation"),  # INVALID_SCHEMA: the field and the rule (``_violation``)
)
_PENDING_COLUMNS: Final = (
    ("candidate", "candidate_id"),
    ("captured at", "captured_at"),
    ("captured by", "principal"),
    ("waiting", "waiting"),
    ("held for", "held_for"),
    ("first line", "first_line"),
)
_RECORD_COLUMNS: Final = (
    ("record", "record_id"),
    ("state", "state"),
    ("valid from", "valid_from_at"),
    ("body", "body"),
)
_HISTORY_COLUMNS: Final = (
    ("cursor", "cursor"),
    ("at", "at"),
    ("operation", "operation"),
    ("target", "target"),
    ("by", "actor"),
    ("reason", "reason"),
    ("approved by", "approved_by"),
)
_RECORD_STATES: Final = (
    "accepted_current",
    "accepted_disputed",
    "historical",
    "expired",
    "trust_invalid",
    "tombstoned",
)
_LIFECYCLE_STEPS: Final = (
    ("dispute", "accepted_current -> accepted_disputed (leaves search and get)"),
    ("resolve", "accepted_disputed -> accepted_current"),
    ("supersede", "-> historical (leaves search and get); --by names the successor"),
    ("expire", "-> expired (leaves search and get)"),
    ("trust-invalidate", "-> trust_invalid (leaves search and get)"),
    ("forget", "-> tombstoned from any of the five states; shreds the body"),
)


def command_name(*, absolute: bool = False) -> str:
    """The command as the operator types it, for every message that names one.

    ``engram-memory`` when that name on PATH is this very program; else the path this program
    was started by (``./run`` and the README's set-up install into ``.venv``, which is not on
    PATH): relative to the working directory when under it (``.venv/bin/engram-memory``),
    absolute otherwise or with ``absolute`` (what a desktop host launches). A process not started
    as ``engram-memory`` (a test, ``python -m``) names the plain name."""
    launched = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if launched is None or launched.name != PROGRAM:
        return (shutil.which(PROGRAM) or PROGRAM) if absolute else PROGRAM
    full = Path(os.path.abspath(launched))
    on_path = shutil.which(PROGRAM)
    if not absolute and on_path is not None and Path(on_path).resolve() == full.resolve():
        return PROGRAM
    if absolute:
        return str(full)
    try:
        shown = str(full.relative_to(Path.cwd()))
    except ValueError:
        shown = str(full)
    return shlex.quote(shown if os.sep in shown else os.path.join(os.curdir, shown))


def one_line(text: str) -> str:
    return " ".join(text.split())


def fail(message: str) -> None:
    print(f"engram-memory: error: {one_line(message)}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Running a command on a seat
# --------------------------------------------------------------------------------------------


def _operation_failed(what: str, error: EngramError) -> int:
    """One line on stderr with the contract code and the operator's detail; exit code 1."""
    detail = getattr(error, "detail", error.message)
    print(f"engram-memory: {what} failed: {error.code.value}: {one_line(detail)}", file=sys.stderr)
    return 1


def _print_json(result: Any) -> None:
    print(json.dumps(result, indent=2, ensure_ascii=False))


def _shown(args: argparse.Namespace, human: Callable[[Any], None] | None = None) -> Show:
    """How a command prints its result: the JSON document with ``--json`` (the shape scripts
    read), else ``human`` (default: ``text.show``, labelled lines and aligned tables)."""
    if getattr(args, "json", False):
        return _print_json
    return human or text.show


def _on_seat(
    args: argparse.Namespace,
    what: str,
    run: Callable[[OperatorSeat], T],
    show: Callable[[T], None] | None = None,
) -> int:
    """Open the command's seat, run ``run`` there, show its result, close the seat. A contract
    failure or a host failure is one line and exit code 1."""
    try:
        seat = args.open_seat(args)
    except SeatFailure as error:
        fail(str(error))
        return 1
    shown = text.Progress(what, enabled=not getattr(args, "json", False))
    stop_watching = text.watching(shown)
    try:
        result = run(seat)
    except EngramError as error:
        return _operation_failed(what, error)
    except SeatFailure as error:
        fail(f"{what} failed: {error}")
        return 1
    finally:
        stop_watching()
        shown.close()
        seat.close()
    for note in seat.notes:
        print(f"engram-memory: {one_line(note)}", file=sys.stderr)
    (show or _shown(args))(result)
    return 0


def _use_case(
    args: argparse.Namespace,
    what: str,
    run: Callable[..., T],
    show: Callable[[T], None] | None = None,
    *,
    mutates: bool = False,
) -> int:
    """Run one operator use case ``run(engine, scope, operator)`` in ``--workspace``."""
    return _on_seat(args, what, lambda seat: seat.call(args.workspace, run, mutates=mutates), show)


def _naming(run: Callable[..., T], *named: tuple[str, str | None]) -> Callable[..., T]:
    """``run``, whose bare ``NOT_FOUND`` says which of the ``named`` (kind, id) is missing and
    why (``inspection.not_found``): the operator is told what an agent is not."""

    def explained(engine: Kernel, scope: Scope, operator: str) -> T:
        try:
            return run(engine, scope, operator)
        except EngramError as error:
            if error.code.value != "NOT_FOUND" or hasattr(error, "detail"):
                raise
            for kind, target_id in named:
                if target_id is not None:
                    why = _inspection().not_found(engine, scope, kind, target_id)
                    if why is not None:
                        raise why from None
            raise

    return explained


def _limit(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    return int(args.limit)


def _token_id_of(token: str) -> str:
    """The ``jti`` of a token, read without checking it: revoking needs only the id, and an
    expired or foreign token revoked by mistake harms nothing."""
    import jwt

    try:
        claims = jwt.decode(token.strip(), options={"verify_signature": False})
    except jwt.PyJWTError:
        raise UsageError("--token is not a token (a JWT)") from None
    token_id = claims.get("jti") if isinstance(claims, dict) else None
    if not isinstance(token_id, str) or not token_id:
        raise UsageError("--token carries no token id (jti) to revoke; use --principal")
    return token_id


# --------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------


def cmd_audit(args: argparse.Namespace) -> int:
    limit = _limit(args)
    show = (lambda page: _print_json(page.entries)) if args.json else _show_audit
    return _on_seat(args, "audit", lambda seat: seat.audit(limit), show)


def _show_audit(page: AuditPage) -> None:
    if page.empty_reason is not None:
        print(page.empty_reason)
        return
    rows = [{**entry, "violation": _violation(entry.get("violation"))} for entry in page.entries]
    for line in text.table(rows, _AUDIT_COLUMNS):
        print(line)
    print(f"({len(page.entries)} of {page.total} entries, most recent last)")
    if page.unreadable:
        print(
            f"engram-memory: {page.unreadable} unreadable line(s) in {page.source} skipped",
            file=sys.stderr,
        )


def _violation(violation: object) -> str | None:
    """An ``INVALID_SCHEMA`` line's ``violation`` in words: ``/limit: must be at most 50``
    (``(top level)`` for the arguments as a whole), and how many more there were."""
    if not isinstance(violation, dict):
        return None
    where = str(violation.get("pointer") or "(top level)")
    more = violation.get("more")
    extra = f" (+{more} more)" if isinstance(more, int) and more > 0 else ""
    return f"{where}: {violation.get('says', violation.get('rule', ''))}{extra}"


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line)


def cmd_policy_show(args: argparse.Namespace) -> int:
    return _on_seat(
        args, "policy show", lambda seat: seat.policy_lines(), _shown(args, _print_lines)
    )


def cmd_policy_set(args: argparse.Namespace) -> int:
    return _on_seat(
        args,
        "policy set",
        lambda seat: seat.set_admission_mode(args.mode),
        _shown(args, _print_lines),
    )


def _inspection() -> ModuleType:
    """The operator's reads, imported when a command runs (``--help`` stays light)."""
    from engram_memory.operator_plane import inspection

    return inspection


def _decisions() -> ModuleType:
    """The operator's decisions, imported when a command runs (``--help`` stays light)."""
    from engram_memory.operator_plane import decisions

    return decisions


def _candidate_decision(
    args: argparse.Namespace, what: str, run: Callable[[Kernel, Scope, str], Any]
) -> int:
    """An operator's decision on ``args.candidate``: a mutation, its errors naming the candidate."""
    return _use_case(
        args,
        f"{what} of {text.cell(args.candidate)}",
        _naming(run, ("candidate", args.candidate)),
        mutates=True,
    )


def cmd_adjudicate(args: argparse.Namespace) -> int:
    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        return _decisions().adjudicate(
            engine, scope, args.candidate, args.decision, operator, reason=args.reason
        )

    return _candidate_decision(args, "adjudication", run)


def cmd_reindex(args: argparse.Namespace) -> int:
    return _on_seat(
        args, f"reindex of {text.cell(args.workspace)}", lambda s: s.reindex(args.workspace)
    )


def cmd_pending_list(args: argparse.Namespace) -> int:
    limit = _limit(args)

    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        return _inspection().pending_list(engine, scope, operator, after=args.after, limit=limit)

    return _use_case(
        args,
        "pending list",
        run,
        _shown(args, text.table_of(_PENDING_COLUMNS, "no pending candidates")),
    )


def cmd_records_list(args: argparse.Namespace) -> int:
    limit = _limit(args)

    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        return _inspection().records_list(
            engine, scope, operator, state=args.state, after=args.after, limit=limit
        )

    return _use_case(
        args, "records list", run, _shown(args, text.table_of(_RECORD_COLUMNS, "no records"))
    )


# (command, use case, the argument naming its target): one id in, one document out
_SHOWS: Final = {
    "pending show": ("pending_show", "candidate"),
    "records show": ("record_show", "record"),
    "records history": ("record_history", "record"),
}


def cmd_show(args: argparse.Namespace) -> int:
    command = f"{args.admin_command} {getattr(args, f'{args.admin_command}_command')}"
    name, target = _SHOWS[command]
    target_id = getattr(args, target)

    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        return getattr(_inspection(), name)(engine, scope, target_id, operator)

    human = text.table_of(_HISTORY_COLUMNS, "no events") if name == "record_history" else None
    explained = _naming(run, (target, target_id))
    return _use_case(args, f"{command} {text.cell(target_id)}", explained, _shown(args, human))


def cmd_pending_withdraw(args: argparse.Namespace) -> int:
    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        return _decisions().withdraw_candidate(engine, scope, args.candidate, operator, args.reason)

    return _candidate_decision(args, "withdraw", run)


def cmd_records_step(args: argparse.Namespace) -> int:
    """A lifecycle step of a record (dispute … trust-invalidate), or its forgetting."""
    step = args.records_command

    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        if step == "forget":
            return _decisions().forget_record(engine, scope, args.record, operator, args.reason)
        return _decisions().transition(
            engine,
            scope,
            args.record,
            step.replace("-", "_"),
            operator,
            args.reason,
            superseded_by=getattr(args, "by", None),
        )

    explained = _naming(run, ("record", args.record), ("record", getattr(args, "by", None)))
    return _use_case(args, f"{step} of {text.cell(args.record)}", explained, mutates=True)


def cmd_status(args: argparse.Namespace) -> int:
    reports: list[dict[str, Any]] = []

    def run(engine: Kernel, scope: Scope, operator: str) -> Any:
        reports.append(_inspection().status(engine, scope, operator, full=args.full))
        return reports[-1]

    code = _use_case(args, "status", run)
    if code == 0 and reports and (line := _inspection().unreadable_line(reports[0]["key_store"])):
        fail(f"status: {line}")  # the health is not ok: exit code 1
        return 1
    return code


def cmd_export(args: argparse.Namespace) -> int:
    def run(engine: Kernel, scope: Scope, operator: str) -> list[dict[str, Any]]:
        lines = list(_inspection().export_records(engine, scope, operator))
        if args.format == "mcp-memory":
            from engram_memory.operator_plane.moving_in import mcp_memory_lines

            return mcp_memory_lines(lines)
        return lines

    return _use_case(args, "export", run, lambda lines: _write_export(args, lines))


def cmd_import(args: argparse.Namespace) -> int:
    """Read the source whole (a malformed one: one line naming the place, nothing written),
    then capture and admit each item under ``--principal`` and ``--purpose``."""
    from engram_memory.operator_plane.moving_in import import_items, read_source

    principals = _principals(args)

    def run(engine: Kernel, scope: Scope, operator: str) -> dict[str, Any]:
        now_ms = engine.clock.now_ms()
        items = read_source(args.format, Path(args.source), args.purpose, now_ms, principals)
        return import_items(
            engine,
            scope,
            operator,
            items,
            principal=args.principal,
            purpose=args.purpose,
            dry_run=args.dry_run,
        )

    what = "import dry run" if args.dry_run else "import"
    return _use_case(args, what, run, mutates=not args.dry_run)


def _principals(args: argparse.Namespace) -> Principals | None:
    """``--principal-from`` and its ``--principal-map VALUE=PRINCIPAL`` pairs, checked."""
    from engram_memory.operator_plane.moving_in import Principals

    pairs = [pair.partition("=") for pair in args.principal_map]
    if any(not value or not sep or not who.strip() for value, sep, who in pairs):
        raise UsageError("--principal-map takes VALUE=PRINCIPAL")
    if args.principal_from is None:
        if pairs:
            raise UsageError("--principal-map needs --principal-from")
        if args.principal is None:
            raise UsageError("name --principal (or, for mem0, --principal-from user_id)")
        return None
    return Principals(args.principal_from, {value: who for value, _, who in pairs})


def _write_export(args: argparse.Namespace, lines: list[dict[str, Any]]) -> None:
    text = "".join(
        json.dumps(line, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
        for line in lines
    )
    if args.output is None:
        sys.stdout.write(text)
        return
    path = Path(args.output)
    try:  # the records' text: readable by the operator alone, never over an existing file
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UsageError(f"--output: {args.output} already exists; choose a new file") from None
    with os.fdopen(fd, "wb") as out:
        out.write(text.encode("utf-8"))
        out.flush()
        os.fsync(out.fileno())
    print(f"exported {len(lines)} record(s) to {path.resolve()}", file=sys.stderr)


def cmd_backup(args: argparse.Namespace) -> int:
    return _on_seat(args, "backup", lambda seat: seat.backup(args.target))


def cmd_restore(args: argparse.Namespace) -> int:
    return _on_seat(args, "restore", lambda seat: seat.restore(args.backup, new_keys=args.new_keys))


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    token_id = args.token_id
    if args.token is not None:
        token_id = _token_id_of(args.token)
    if (token_id is None) == (args.principal is None):
        raise UsageError("name exactly one of --token, --token-id and --principal")

    def run(seat: OperatorSeat) -> Any:
        if args.token_id is not None and seat.token_issued(args.token_id) is False:
            raise SeatFailure(
                f"no token with id {text.cell(args.token_id)} was minted from this data directory;"
                " check the id, or revoke with --token TOKEN or --principal P"
            )
        return seat.call(
            args.workspace,
            lambda engine, scope, operator: _decisions().revoke_credentials(
                engine, scope.tenant_id, operator, token_id=token_id, principal=args.principal
            ),
            mutates=False,
        )

    return _on_seat(args, "revocation", run, _shown(args, _show_revocation))


def _show_revocation(result: dict[str, Any]) -> None:
    kind = result["revoked"]
    print(f"{kind}: {text.cell(result[kind])}")
    if result.get("already_revoked"):
        print(f"revoked: already revoked at {result['at']}; nothing changed")
    else:
        print(f"revoked: at {result['at']}")


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    return _on_seat(args, "key rotation", lambda seat: seat.rotate_keys())


SMOKE_TOKEN_ENV: Final = "ENGRAM_TOKEN"  # noqa: S105 - the name of a variable, not a secret


def _agent_token(args: argparse.Namespace) -> str:
    """The smoke's agent token: ``--token-file``'s content, else ``ENGRAM_TOKEN`` (never echoed)."""
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise UsageError(f"--token-file: cannot read {args.token_file}") from None
    else:
        token = os.environ.get(SMOKE_TOKEN_ENV, "").strip()
    if not token:
        raise UsageError(
            f"smoke needs an agent's bearer token for the stack: --token-file FILE or"
            f" {SMOKE_TOKEN_ENV} (all six tools granted)"
        )
    return token


def cmd_smoke(args: argparse.Namespace) -> int:
    """The six tools through the deployed API, each step printed as it happens (on stderr with
    ``--json``, whose document goes to stdout)."""
    if not getattr(args, "stack", None):
        raise UsageError("smoke runs against a deployed stack: admin --stack NAME smoke")
    token = _agent_token(args)
    stream = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    def said(document: Any) -> None:
        """Every line was said as it happened."""

    return _on_seat(
        args, "smoke", lambda seat: seat.smoke(token, args.endpoint, say), _shown(args, said)
    )


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------

# argparse names its subcommand action privately; it is the type add_subparsers returns.
Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def default_operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (e.g. some containers)
        return "operator"


def _operation(sub: Sub, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand of the operations plane: the data directory, workspace and operator."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=summary)
    _data_dir_option(parser)
    parser.add_argument("--workspace", default=DEFAULT_WORKSPACE)
    parser.add_argument(
        "--operator",
        default=default_operator(),
        help="who acts, as audited (default: your login; with --stack: your AWS caller ARN)",
    )
    return parser


def add_full_option(parser: argparse.ArgumentParser) -> None:
    """``--full`` of the health checks (``status``, ``verify``): open everything, not a sample."""
    _switch(
        parser, "--full", "open every pending candidate and record body (default: 1000 of each)"
    )


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    """Every ``admin`` command's: its data directory, and how it prints its result."""
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    json_option(parser)


def json_option(parser: argparse.ArgumentParser) -> None:
    _switch(
        parser, "--json", "print JSON for scripts (default: text for people; ISO-8601 UTC times)"
    )


def _switch(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    parser.add_argument(flag, action="store_true", help=help_text)


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, help="at most N (default 100)")
    parser.add_argument("--after", default="", metavar="ID", help="start after this id")


def _nested(sub: Sub, name: str, summary: str) -> Sub:
    parser = sub.add_parser(name, help=summary)
    nested: Sub = parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    return nested


def add_admin_parser(sub: Sub, open_seat: SeatOpener) -> None:
    """``admin ...``: every operator command, each opening its seat with ``open_seat``."""
    admin = sub.add_parser("admin", help="the operations plane (never reachable by an agent)")
    admin.add_argument(
        "--stack",
        metavar="NAME",
        help="operate the deployed CloudFormation stack NAME with your AWS credentials (audited"
        " as your caller ARN) instead of a data directory",
    )
    admin.add_argument("--region", help="the stack's AWS region (default: your AWS config)")
    admin.set_defaults(open_seat=open_seat)
    admin_sub: Sub = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    _add_inspection(admin_sub)
    _add_pending(admin_sub)
    _add_records(admin_sub)
    _add_host_operations(admin_sub)


def _add_inspection(admin_sub: Sub) -> None:
    audit = admin_sub.add_parser("audit", help="show the audit log (ids and outcomes, no content)")
    _data_dir_option(audit)
    audit.add_argument("--limit", type=int, default=50, help="show the N most recent entries")
    audit.set_defaults(func=cmd_audit)

    policy_sub = _nested(admin_sub, "policy", "show or change the admission policy")
    show = policy_sub.add_parser("show", help="show the host's admission policy and ceilings")
    _data_dir_option(show)
    show.set_defaults(func=cmd_policy_show)
    set_mode = policy_sub.add_parser("set", help="change the admission mode in host.json")
    _data_dir_option(set_mode)
    set_mode.add_argument("--mode", required=True, choices=("auto", "manual"))
    set_mode.set_defaults(func=cmd_policy_set)

    state = _operation(
        admin_sub, "status", "counts by state, outbox backlog, index freshness, key store health"
    )
    add_full_option(state)
    state.set_defaults(func=cmd_status)
    export = _operation(
        admin_sub, "export", "current records with their receipts, as JSON Lines (migration)"
    )
    export.add_argument("--output", metavar="FILE", help="write to FILE (0600) instead of stdout")
    export.add_argument(
        "--format",
        type=_format_name,
        choices=("engram", "mcp-memory"),
        default="engram",
        help="engram (records with receipts; `admin import` reads it) or mcp-memory (the JSONL"
        " file of @modelcontextprotocol/server-memory; server-memory is the same)",
    )
    export.set_defaults(func=cmd_export)
    _add_import(admin_sub)


def _format_name(text: str) -> str:
    """A file format's name as typed: ``server-memory`` (the package people know) is the
    ``mcp-memory`` format."""
    return "mcp-memory" if text == "server-memory" else text


def _add_import(admin_sub: Sub) -> None:
    move_in = _operation(
        admin_sub,
        "import",
        "capture another memory system's items and ask admission for each, as an agent would",
    )
    move_in.add_argument(
        "source", metavar="PATH", help="the file (a folder for markdown; for mem0, either)"
    )
    move_in.add_argument(
        "--format",
        required=True,
        type=_format_name,
        choices=("mcp-memory", "mem0", "markdown", "engram"),
        help="mcp-memory (server-memory's JSONL; server-memory is the same), mem0 (saved"
        " get_all() answers: a file, or a folder of pages), markdown (a folder of notes), engram"
        " (`admin export`)",
    )
    move_in.add_argument(
        "--principal",
        help="the principal the items are captured as (with --principal-from: the items that"
        " name none)",
    )
    move_in.add_argument(
        "--principal-from",
        choices=("user_id", "agent_id"),
        help="mem0: capture each memory as the principal its user_id (or agent_id) names",
    )
    move_in.add_argument(
        "--principal-map",
        action="append",
        default=[],
        metavar="VALUE=PRINCIPAL",
        help="with --principal-from: the principal a value becomes (repeatable; a value not"
        " mapped is its own principal)",
    )
    move_in.add_argument("--purpose", required=True, help="the purpose_ref they are captured under")
    _switch(move_in, "--dry-run", "report what the policy would decide; write nothing")
    move_in.set_defaults(func=cmd_import)


def _add_pending(admin_sub: Sub) -> None:
    adjudicate = _operation(
        admin_sub, "adjudicate", "accept or reject a pending candidate (see `admin pending`)"
    )
    adjudicate.add_argument("candidate", metavar="CANDIDATE", help="the candidate id")
    adjudicate.add_argument("decision", choices=("accept", "reject"))
    adjudicate.add_argument("--reason", help="why (journaled with the decision)")
    adjudicate.set_defaults(func=cmd_adjudicate)

    pending_sub = _nested(admin_sub, "pending", "the candidates that wait for a decision")
    listing = _operation(
        pending_sub,
        "list",
        "list the pending candidates: why each waits, its first line (opens them: audited)",
    )
    _paging(listing)
    listing.set_defaults(func=cmd_pending_list)
    _show_one(pending_sub, "show", "open a pending candidate: what it says (audited)", "candidate")
    withdraw = _operation(pending_sub, "withdraw", "withdraw a pending candidate, shred its key")
    withdraw.add_argument("candidate", metavar="CANDIDATE")
    withdraw.add_argument("--reason", required=True, help="why (journaled)")
    withdraw.set_defaults(func=cmd_pending_withdraw)


def _show_one(sub: Sub, name: str, summary: str, target: str) -> None:
    """A command that shows one candidate or record by id (``_SHOWS``)."""
    show = _operation(sub, name, summary)
    show.add_argument(target, metavar=target.upper())
    show.set_defaults(func=cmd_show)


def _add_records(admin_sub: Sub) -> None:
    records_sub = _nested(admin_sub, "records", "what memory holds, and its lifecycle")
    listing = _operation(records_sub, "list", "list the records (ids, states, digests)")
    listing.add_argument("--state", choices=_RECORD_STATES)
    _paging(listing)
    listing.set_defaults(func=cmd_records_list)
    _show_one(records_sub, "show", "one record in any state, with its body", "record")
    _show_one(
        records_sub,
        "history",
        "the journal events of one record (or candidate): who, why, approved by whom",
        "record",
    )
    for name, summary in _LIFECYCLE_STEPS:
        step = _operation(records_sub, name, summary)
        step.add_argument("record", metavar="RECORD")
        step.add_argument("--reason", required=True, help="why (journaled)")
        if name == "supersede":
            step.add_argument("--by", metavar="RECORD", help="the current record replacing it")
        step.set_defaults(func=cmd_records_step)


def _add_host_operations(admin_sub: Sub) -> None:
    save = _operation(
        admin_sub, "backup", "a consistent online copy of the database (no keys, no projections)"
    )
    save.add_argument(
        "target",
        metavar="FILE",
        nargs="?",
        help="the backup file to write (must not exist); with --stack an optional"
        " s3://bucket/prefix (default: the stack's blob bucket, backups/<time>)",
    )
    save.set_defaults(func=cmd_backup)
    load = _operation(
        admin_sub,
        "restore",
        "restore a backup into an empty data directory beside its own key store",
    )
    load.add_argument(
        "backup",
        metavar="FILE",
        help="a file written by `admin backup` (with --stack: its s3://bucket/prefix)",
    )
    load.add_argument(
        "--new-keys",
        action="store_true",
        help="restore onto a new key store (records only: pending candidates will not open)",
    )
    load.set_defaults(func=cmd_restore)
    _add_tokens_and_keys(admin_sub)
    rebuild = admin_sub.add_parser(
        "reindex", help="rebuild a workspace's search index from the canonical store"
    )
    _data_dir_option(rebuild)
    rebuild.add_argument("--workspace", default=DEFAULT_WORKSPACE)
    rebuild.set_defaults(func=cmd_reindex)
    _add_smoke(admin_sub)


def _add_smoke(admin_sub: Sub) -> None:
    summary = (
        "with --stack: the six tools through the deployed API with an agent's token; a person"
        " approves withdraw and forget on the approval page; the functions' REPORT lines"
    )
    smoke = admin_sub.add_parser("smoke", help=summary, description=summary)
    _data_dir_option(smoke)
    smoke.add_argument(
        "--endpoint",
        metavar="URL",
        help="the MCP endpoint to call (default: the stack's McpUrl output)",
    )
    smoke.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"the agent's bearer token (default: the {SMOKE_TOKEN_ENV} environment variable)",
    )
    smoke.set_defaults(func=cmd_smoke)


def _add_tokens_and_keys(admin_sub: Sub) -> None:
    tokens_sub = _nested(admin_sub, "tokens", "bearer tokens: revoke")
    revoke = _operation(
        tokens_sub, "revoke", "revoke a token, or every current token of a principal"
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--token", help="the token itself (its id is read from it)")
    which.add_argument("--token-id", help="the token's id (its jti claim)")
    which.add_argument("--principal", help="every token of this principal issued until now")
    revoke.set_defaults(func=cmd_tokens_revoke)
    keys_sub = _nested(admin_sub, "keys", "the key store: rotate")
    rotate = _operation(
        keys_sub,
        "rotate",
        "new issuer (signing) and master keys; data keys re-wrapped; previous tokens stay valid"
        " until they expire (refused while a server runs on the data directory: stop it first)",
    )
    rotate.set_defaults(func=cmd_keys_rotate)
