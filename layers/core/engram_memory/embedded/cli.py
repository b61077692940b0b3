"""``engram-memory``: the command line of the embedded default.

- ``engram-memory init [--data-dir DIR] [--resource URL]``
      create the data directory, keys and ``host.json`` (idempotent; ``--resource`` records the
      service's resource URI, the audience of every token).
- ``engram-memory token [--data-dir DIR] --principal P --workspace W --purpose REF --tools T,...
  [--confirm capture,request_admission] [--expires-in SECONDS] [--agent-id A]``
      mint a bearer token from the local issuer; prints the token and nothing else.
- ``engram-memory tour [--data-dir DIR] [--yes]``
      walk an agent's six tools end to end against the real embedded engine: capture,
      request_admission, search, get, withdraw and forget, printing each envelope. Withdraw and
      forget ask you for confirmation at the terminal (``--yes`` approves for you).
- ``engram-memory verify [--data-dir DIR] --tenant T --workspace W``
      operations plane: check a scope's journal (dense cursors, unbroken hash chain).
- ``engram-memory approvals list|approve|decline [--data-dir DIR] [APPROVAL_ID]``
      answer the confirmations agents wait for, from a terminal (``cli_approvals``).
- ``engram-memory admin audit [--data-dir DIR] [--limit N]``
      operations plane: the audit log as a table (ids, principal, tool, outcome; never content).
- ``engram-memory admin policy show|set [--data-dir DIR] [--mode auto|manual]``
      operations plane: the admission policy of ``host.json``.
- ``engram-memory admin adjudicate CANDIDATE accept|reject [--reason R]``
- ``engram-memory admin pending list|show CANDIDATE|withdraw CANDIDATE --reason R``
- ``engram-memory admin records list|show|history|dispute|resolve|supersede|expire|
  trust-invalidate|forget RECORD``
- ``engram-memory admin status``, ``admin export [--output FILE]``, ``admin backup FILE``,
  ``admin restore FILE [--new-keys]``, ``admin tokens revoke``, ``admin keys rotate``
      operations plane (``engine.operations``): every one audited under ``operator:<--operator>``;
      each takes ``--data-dir``, ``--workspace`` and ``--operator``; none creates a data
      directory but ``restore`` (its target).
- ``engram-memory admin reindex [--data-dir DIR] [--workspace W]``
      operations plane: rebuild a workspace's search index from the canonical store.
- ``engram-memory admin --stack NAME [--region R] COMMAND ...``
      the same operations against a deployed stack with your AWS credentials
      (``cloud.operator``, ``cloud.stack_backup``); ``audit`` and ``policy`` are embedded only.

Bad input exits with code 2 and one line on stderr; a failed operation exits with code 1.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from engram_memory.embedded.cli_approvals import add_approvals_parser
from engram_memory.embedded.errors import HostConfigError
from engram_memory.engine.context import TOOLS, TrustedContext, new_audit_id

if TYPE_CHECKING:  # the commands import what they use: `--help` stays light
    from engram_memory.engine.gate import ConfirmationRequest

TOUR_TENANT = "local"
TOUR_WORKSPACE = "default"
TOUR_PURPOSE = "general"
DEFAULT_DATA_DIR = ".engram"


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
    from engram_memory.binding.host_config import DEFAULT_RESOURCE
    from engram_memory.embedded.composition import AUDIT_FILE, DATABASE_FILE, init_data_dir
    from engram_memory.embedded.host_file import host_config_path
    from engram_memory.embedded.issuer_keys import issuer_key_path

    data_dir = Path(args.data_dir)
    config = init_data_dir(data_dir, resource=args.resource)
    root = data_dir.resolve()
    print(f"Engram Memory data directory ready: {root}")
    print(f"  host configuration   {host_config_path(root)}")
    follows = " (follows `serve --port`)" if config.resource == DEFAULT_RESOURCE else ""
    print(f"  resource (audience)  {config.resource}{follows}")
    print(f"  issuer, tenant       {config.issuer}, {config.tenant_id}")
    print(f"  issuer key           {issuer_key_path(root)}")
    print(f"  database             {root / DATABASE_FILE}")
    print(f"  audit log            {root / AUDIT_FILE}")
    print(f"  admission mode       {config.admission.mode}")
    print(
        "Mint a bearer token: engram-memory token --data-dir DIR --principal P --workspace W"
        " --purpose REF --tools search,get,capture,request_admission,withdraw,forget"
    )
    return 0


def cmd_tour(args: argparse.Namespace) -> int:
    from engram_memory.embedded.composition import open_embedded

    data_dir = Path(args.data_dir)
    host = open_embedded(data_dir, ask_human=(lambda _request: True) if args.yes else _ask_terminal)
    run = f"{int(time.time())}"
    now_ms = int(time.time() * 1000)
    try:
        text = f"Tour {run}: the embedded store runs SQLite in WAL mode so readers never block the writer."
        captured = _show(
            "capture (a sealed, pending candidate)",
            host.call("capture", _capture_args(text, f"tour-capture-{run}", now_ms), _context()),
        )
        candidate_id = captured["output"]["value"]["candidate_id"]
        _show(
            "search before admission (pending memories are never returned)",
            host.call(
                "search", {"query": "WAL readers writer", "purpose_ref": TOUR_PURPOSE}, _context()
            ),
        )
        admitted = _show(
            "request_admission (the host policy decides)",
            host.call(
                "request_admission",
                {"candidate_id": candidate_id, "idempotency_key": f"tour-admit-{run}"},
                _context(),
            ),
        )
        record_id = admitted["output"]["value"]["outcome"].get("record_id")
        _show(
            "search",
            host.call(
                "search",
                {"query": "WAL readers writer", "purpose_ref": TOUR_PURPOSE, "limit": 3},
                _context(),
            ),
        )
        if record_id:
            _show(
                "get",
                host.call("get", {"record_id": record_id, "purpose_ref": TOUR_PURPOSE}, _context()),
            )
        draft = _show(
            "capture a draft to withdraw",
            host.call(
                "capture",
                _capture_args(
                    f"Tour {run}: a draft that should not be kept.", f"tour-draft-{run}", now_ms
                ),
                _context(),
            ),
        )
        _show(
            "withdraw (needs your confirmation; crypto-shreds the candidate)",
            host.call(
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
                host.call(
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
                host.call("get", {"record_id": record_id, "purpose_ref": TOUR_PURPOSE}, _context()),
            )
        print(f"\nAudit log: {(data_dir / 'audit.log').resolve()}")
    finally:
        host.close()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from engram_memory.contract.errors import EngramError
    from engram_memory.embedded.composition import open_existing
    from engram_memory.engine.context import Scope
    from engram_memory.engine.journal import verify_journal

    host = open_existing(Path(args.data_dir))
    try:
        head = verify_journal(host.store, Scope(args.tenant, args.workspace))
    except EngramError as error:
        print(f"journal check failed: {error.code.value}", file=sys.stderr)
        return 1
    finally:
        host.close()
    print(f"journal ok through cursor {head.cursor}")
    return 0


class CliError(Exception):
    """Bad input: ``main`` prints the message on one line and exits with code 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are ``CliError`` (one line, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)")


def _fail(message: str) -> None:
    print(f"engram-memory: error: {_one_line(message)}", file=sys.stderr)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _data_dir(args: argparse.Namespace) -> Path:
    """The data directory of a command that needs an initialised one."""
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise CliError(
            f"no Engram Memory data directory at {data_dir};"
            f" run `engram-memory init --data-dir {data_dir}` first"
        )
    return data_dir


def _tool_list(text: str, option: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise CliError(
            f"{option}: unknown tool name(s) {', '.join(unknown)}; the grant names are"
            f" {','.join(TOOLS)}"
        )
    return names


def cmd_token(args: argparse.Namespace) -> int:
    from engram_memory.embedded.host_file import load_host_config
    from engram_memory.embedded.issuer_keys import local_issuer

    data_dir = _data_dir(args)
    config = load_host_config(data_dir).serving_on(args.host, args.port)
    tools = _tool_list(args.tools, "--tools")
    if not tools:
        raise CliError(f"--tools needs at least one of {','.join(TOOLS)}")
    confirm = _tool_list(args.confirm, "--confirm")
    outside = [name for name in confirm if name not in tools]
    if outside:
        raise CliError(f"--confirm names tools that --tools does not grant: {', '.join(outside)}")
    expires_in = config.default_token_ttl_s if args.expires_in is None else args.expires_in
    if expires_in < 1:
        raise CliError("--expires-in must be a positive number of seconds")
    try:
        token = local_issuer(data_dir, config).mint(
            principal=args.principal,
            tenant_id=config.tenant_id,
            workspace_id=args.workspace,
            purpose_ref=args.purpose,
            tools=tools,
            confirm=confirm,
            expires_in_s=expires_in,
            agent_id=args.agent_id,
        )
    except ValueError as error:
        raise CliError(str(error)) from None
    print(token)
    return 0


_AUDIT_COLUMNS: Final = (
    ("auditId", "audit_id"),
    ("time", "at"),
    ("principal", "principal"),
    ("tool", "tool"),
    ("outcome", "code"),
)
_MAX_CELL: Final = 64


def _cell(value: object) -> str:
    """A table cell: printable characters only (no terminal escapes), bounded in length."""
    text = "" if value is None else str(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _embedded_only(args: argparse.Namespace, where: str) -> None:
    if _stack(args):
        raise CliError(f"with --stack, {where}")


def cmd_admin_audit(args: argparse.Namespace) -> int:
    from engram_memory.adapters.local.audit import audit_lines
    from engram_memory.embedded.composition import AUDIT_FILE

    _embedded_only(
        args,
        "the audit is in CloudWatch Logs: the functions' log groups and the stack's"
        " OperatorAuditLogGroupName output (e.g. CloudWatch Logs Insights, message = 'audit')",
    )

    data_dir = _data_dir(args)
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    path = data_dir / AUDIT_FILE
    if not path.exists() and not any(path.parent.glob(f"{AUDIT_FILE}.*")):
        print(f"no audit entries yet ({path} does not exist)")
        return 0
    rows: list[dict[str, Any]] = []
    unreadable = 0
    for line in audit_lines(path):  # the gzip'd segments, then audit.log
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        if isinstance(entry, dict):
            rows.append(entry)
        else:
            unreadable += 1
    shown = rows[-args.limit :]
    table = [[header for header, _ in _AUDIT_COLUMNS]]
    table += [[_cell(entry.get(key)) for _, key in _AUDIT_COLUMNS] for entry in shown]
    widths = [max(len(row[i]) for row in table) for i in range(len(_AUDIT_COLUMNS))]
    for row in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    print(f"({len(shown)} of {len(rows)} entries, most recent last)")
    if unreadable:
        print(f"engram-memory: {unreadable} unreadable line(s) in {path} skipped", file=sys.stderr)
    return 0


def cmd_admin_policy_show(args: argparse.Namespace) -> int:
    _embedded_only(args, "the admission mode is the stack's AdmissionMode parameter (sam deploy)")
    from engram_memory.embedded.host_file import host_config_path, load_host_config

    data_dir = _data_dir(args)
    config = load_host_config(data_dir)
    path = host_config_path(data_dir)
    policy = config.admission_policy()
    print(f"host configuration: {path}{'' if path.exists() else ' (not written yet: defaults)'}")
    print(f"admission mode: {policy.mode}")
    print(f"policy version: {policy.version()}")
    if policy.host_rules:
        print("host rules:")
        for rule in policy.host_rules:
            print(f"  - {rule.name} ({rule.kind})")
    else:
        print("host rules: none")
    print(
        f"retention: allow_retain={str(config.retention.allow_retain).lower()},"
        f" max_expires_in_s={config.retention.max_expires_in_s}"
    )
    print(f"reconciliation consent: {str(config.reconcile_consent).lower()}")
    print(f"resource: {config.resource}")
    print(f"issuer: {config.issuer}")
    print(f"tenant: {config.tenant_id}")
    return 0


def cmd_admin_policy_set(args: argparse.Namespace) -> int:
    _embedded_only(args, "the admission mode is the stack's AdmissionMode parameter (sam deploy)")
    from engram_memory.binding.host_config import HostConfig
    from engram_memory.embedded.host_file import load_host_config, save_host_config

    data_dir = _data_dir(args)
    config = load_host_config(data_dir)
    previous = config.admission.mode
    updated = HostConfig.model_validate(
        {**config.model_dump(), "admission": {**config.admission.model_dump(), "mode": args.mode}}
    )
    path = save_host_config(data_dir, updated)
    print(f"admission mode: {updated.admission.mode} (was {previous}), saved to {path}")
    print("A running server applies it after a restart.")
    return 0


def _operate(
    args: argparse.Namespace,
    what: str,
    run: Callable[..., Any],
    show: Callable[[Any], None] | None = None,
    *,
    mutates: bool = False,
) -> int:
    """Run one operation of ``engine.operations`` on the data directory's engine as the operator
    of ``--operator`` in ``--workspace`` (or on ``--stack``'s, as the caller's AWS identity; an
    operation that ``mutates`` then has the drainer apply its projection changes); print its
    result as JSON (or hand it to ``show``). A contract failure is one line, exit code 1."""
    from engram_memory.contract.errors import EngramError
    from engram_memory.embedded.composition import open_existing
    from engram_memory.embedded.host_file import load_host_config
    from engram_memory.engine.context import Scope

    if _stack(args):
        return _on_stack(
            args,
            what,
            lambda op: run(op.engine, op.scope(args.workspace), op.operator),
            show,
            finish=mutates,
        )
    data_dir = _data_dir(args)
    config = load_host_config(data_dir)
    operator = getattr(args, "operator", None)
    if operator is not None and not operator.strip():
        raise CliError("--operator must not be empty")
    host = open_existing(data_dir, config=config)
    try:
        result = run(host.engine, Scope(config.tenant_id, args.workspace), operator)
        host.engine.drain_outbox()
    except EngramError as error:
        print(f"engram-memory: {what} failed: {error.code.value}: {error.message}", file=sys.stderr)
        return 1
    finally:
        host.close()
    if show is not None:
        show(result)
    else:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def cmd_admin_adjudicate(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import adjudicate

    return _operate(
        args,
        f"adjudication of {_cell(args.candidate)}",
        lambda engine, scope, operator: adjudicate(
            engine, scope, args.candidate, args.decision, operator, reason=args.reason
        ),
        mutates=True,
    )


def cmd_admin_reindex(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import reindex

    if _stack(args):
        from engram_memory.cloud.operator import reindex_stack

        return _on_stack(args, "reindex", lambda op: reindex_stack(op, args.workspace))

    return _operate(
        args,
        f"reindex of {_cell(args.workspace)}",
        lambda engine, scope, _operator: {
            "workspace": args.workspace,
            **reindex(engine, scope).as_dict(),
        },
    )


def cmd_admin_pending_list(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import pending_list

    return _operate(
        args,
        "pending list",
        lambda engine, scope, operator: pending_list(
            engine, scope, operator, after=args.after, limit=_limit(args)
        ),
    )


def cmd_admin_pending_show(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import pending_show

    return _operate(
        args,
        f"pending show {_cell(args.candidate)}",
        lambda engine, scope, operator: pending_show(engine, scope, args.candidate, operator),
    )


def cmd_admin_pending_withdraw(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import withdraw_candidate

    return _operate(
        args,
        f"withdraw of {_cell(args.candidate)}",
        lambda engine, scope, operator: withdraw_candidate(
            engine, scope, args.candidate, operator, args.reason
        ),
        mutates=True,
    )


def cmd_admin_records_list(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import records_list

    return _operate(
        args,
        "records list",
        lambda engine, scope, operator: records_list(
            engine, scope, operator, state=args.state, after=args.after, limit=_limit(args)
        ),
    )


def cmd_admin_records_show(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import record_show

    return _operate(
        args,
        f"records show {_cell(args.record)}",
        lambda engine, scope, operator: record_show(engine, scope, args.record, operator),
    )


def cmd_admin_records_history(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import record_history

    return _operate(
        args,
        f"records history {_cell(args.record)}",
        lambda engine, scope, operator: record_history(engine, scope, args.record, operator),
    )


def cmd_admin_records_transition(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import transition

    operation = args.records_command.replace("-", "_")
    return _operate(
        args,
        f"{args.records_command} of {_cell(args.record)}",
        lambda engine, scope, operator: transition(
            engine,
            scope,
            args.record,
            operation,
            operator,
            args.reason,
            superseded_by=getattr(args, "by", None),
        ),
        mutates=True,
    )


def cmd_admin_records_forget(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import forget_record

    return _operate(
        args,
        f"forget of {_cell(args.record)}",
        lambda engine, scope, operator: forget_record(
            engine, scope, args.record, operator, args.reason
        ),
        mutates=True,
    )


def cmd_admin_status(args: argparse.Namespace) -> int:
    from engram_memory.operator_plane.usecases import status

    return _operate(args, "status", status)


def cmd_admin_export(args: argparse.Namespace) -> int:
    from engram_memory.embedded.private_files import write_private_file
    from engram_memory.operator_plane.usecases import export_records

    def write(lines: list[dict[str, Any]]) -> None:
        text = "".join(
            json.dumps(line, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
            for line in lines
        )
        if args.output is None:
            sys.stdout.write(text)
            return
        if not write_private_file(Path(args.output), text.encode("utf-8"), replace=False):
            raise CliError(f"--output: {args.output} already exists; choose a new file")
        print(f"exported {len(lines)} record(s) to {Path(args.output).resolve()}", file=sys.stderr)

    return _operate(
        args,
        "export",
        lambda engine, scope, operator: list(export_records(engine, scope, operator)),
        show=write,
    )


def cmd_admin_backup(args: argparse.Namespace) -> int:
    from engram_memory.embedded.backup import backup

    if _stack(args):
        from engram_memory.cloud.stack_backup import backup_stack

        return _on_stack(args, "backup", lambda op: backup_stack(op, to=args.target))
    if args.target is None:
        raise CliError("name the backup FILE to write")
    return _host_operation(
        "backup", lambda: backup(_data_dir(args), Path(args.target), args.operator)
    )


def cmd_admin_restore(args: argparse.Namespace) -> int:
    from engram_memory.embedded.backup import restore

    if _stack(args):
        from engram_memory.cloud.stack_backup import restore_stack

        return _on_stack(
            args, "restore", lambda op: restore_stack(op, args.backup, new_keys=args.new_keys)
        )
    return _host_operation(
        "restore",
        lambda: restore(
            Path(args.backup), Path(args.data_dir), args.operator, new_keys=args.new_keys
        ),
    )


def _stack(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "stack", None))


def _on_stack(
    args: argparse.Namespace,
    what: str,
    run: Callable[[Any], Any],
    show: Callable[[Any], None] | None = None,
    *,
    finish: bool = False,
) -> int:
    """Run one operation against the deployed stack ``--stack`` with the caller's AWS
    credentials (``cloud.operator``), audited under ``operator:<caller ARN>``; print its
    result as JSON (or hand it to ``show``). ``finish`` asks the outbox drainer to apply the
    projection changes the operation left. A contract failure is one line and exit code 1."""
    from botocore.exceptions import BotoCoreError, ClientError

    from engram_memory.cloud.operator import StackError, open_stack
    from engram_memory.contract.errors import EngramError

    try:
        op = open_stack(args.stack, region=args.region)
    except StackError as error:
        _fail(str(error))
        return 1
    try:
        result = run(op)
        if finish:
            op.finish()
    except EngramError as error:
        return _operation_failed(what, error)
    except (BotoCoreError, ClientError) as error:  # e.g. AccessDenied for the operator's role
        code = error.response.get("Error", {}).get("Code") if isinstance(error, ClientError) else ""
        _fail(f"{what} failed: AWS answered {code or type(error).__name__}")
        return 1
    for note in op.notes:
        print(f"engram-memory: {_one_line(note)}", file=sys.stderr)
    if show is not None:
        show(result)
    else:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def _operation_failed(what: str, error: Exception) -> int:
    """One line on stderr with the contract code and the operator's detail; exit code 1."""
    code = getattr(getattr(error, "code", None), "value", "")
    detail = getattr(error, "detail", getattr(error, "message", ""))
    print(f"engram-memory: {what} failed: {code}: {_one_line(detail)}", file=sys.stderr)
    return 1


def _host_operation(what: str, run: Callable[[], dict[str, Any]]) -> int:
    """Run a host-wide operation (backup, restore, keys, tokens); print its report as JSON. A
    contract failure is one line on stderr (with the operator's detail) and exit code 1."""
    from engram_memory.contract.errors import EngramError

    try:
        report = run()
    except EngramError as error:
        return _operation_failed(what, error)
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


def cmd_admin_tokens_revoke(args: argparse.Namespace) -> int:
    from engram_memory.embedded.composition import open_existing
    from engram_memory.operator_plane.usecases import revoke_credentials

    token_id = args.token_id
    if args.token is not None:
        token_id = _token_id_of(args.token)
    if (token_id is None) == (args.principal is None):
        raise CliError("name exactly one of --token, --token-id and --principal")
    if _stack(args):
        return _on_stack(
            args,
            "revocation",
            lambda op: revoke_credentials(
                op.engine,
                op.resources.tenant_id,
                op.operator,
                token_id=token_id,
                principal=args.principal,
            ),
        )
    data_dir = _data_dir(args)

    def run() -> dict[str, Any]:
        host = open_existing(data_dir)
        try:
            return revoke_credentials(
                host.engine,
                host.config.tenant_id,
                args.operator,
                token_id=token_id,
                principal=args.principal,
            )
        finally:
            host.close()

    return _host_operation("revocation", run)


def cmd_admin_keys_rotate(args: argparse.Namespace) -> int:
    from engram_memory.embedded.rotation import rotate_keys

    if _stack(args):
        from engram_memory.cloud.operator import rotate_stack_keys

        return _on_stack(args, "key rotation", rotate_stack_keys)
    data_dir = _data_dir(args)
    return _host_operation("key rotation", lambda: rotate_keys(data_dir, args.operator))


def _token_id_of(token: str) -> str:
    """The ``jti`` of a token, read without checking it: revoking needs only the id, and an
    expired or foreign token revoked by mistake harms nothing."""
    import jwt

    try:
        claims = jwt.decode(token.strip(), options={"verify_signature": False})
    except jwt.PyJWTError:
        raise CliError("--token is not a token (a JWT)") from None
    token_id = claims.get("jti") if isinstance(claims, dict) else None
    if not isinstance(token_id, str) or not token_id:
        raise CliError("--token carries no token id (jti) to revoke; use --principal")
    return token_id


def _limit(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    return int(args.limit)


def _default_operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (e.g. some containers)
        return "operator"


def _operation(
    sub: argparse._SubParsersAction[_Parser], name: str, summary: str
) -> argparse.ArgumentParser:
    """A subcommand of the operations plane: the data directory, workspace and operator."""
    parser = sub.add_parser(name, help=summary, description=summary)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    parser.add_argument("--workspace", default=TOUR_WORKSPACE)
    parser.add_argument(
        "--operator",
        default=_default_operator(),
        help="who acts, as audited (default: your login; with --stack: your AWS caller ARN)",
    )
    return parser


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=100, help="at most N (default 100)")
    parser.add_argument("--after", default="", metavar="ID", help="start after this id")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="engram-memory", description="Governed memory for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = sub.add_parser("init", help="create the data directory and the host configuration")
    init.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    init.add_argument(
        "--resource", help="the service's resource URI, the audience of every token (CONTRACT §12)"
    )
    init.set_defaults(func=cmd_init)

    tour = sub.add_parser("tour", help="walk the six tools against the embedded engine")
    tour.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    tour.add_argument("--yes", action="store_true", help="approve confirmations without asking")
    tour.set_defaults(func=cmd_tour)

    verify = sub.add_parser("verify", help="check a scope's journal (operations plane)")
    verify.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    verify.add_argument("--tenant", default=TOUR_TENANT)
    verify.add_argument("--workspace", default=TOUR_WORKSPACE)
    verify.set_defaults(func=cmd_verify)

    token = sub.add_parser("token", help="mint a bearer token for an agent (prints only the token)")
    token.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    token.add_argument("--principal", required=True, help="the agent's principal (`sub`)")
    token.add_argument("--workspace", required=True, help="the workspace the token is bound to")
    token.add_argument("--purpose", required=True, help="the purpose_ref the agent must repeat")
    token.add_argument(
        "--tools", required=True, help=f"granted tools, comma-separated: {','.join(TOOLS)}"
    )
    token.add_argument(
        "--confirm",
        default="",
        help="tools that need a human confirmation besides withdraw and forget:"
        " capture,request_admission",
    )
    token.add_argument(
        "--expires-in", type=int, metavar="SECONDS", help="lifetime (default: host.json's)"
    )
    token.add_argument("--agent-id", help="agent identifier for the audit log (no authority)")
    token.add_argument("--host", default="127.0.0.1", help="the address `serve` binds")
    token.add_argument(
        "--port",
        type=int,
        default=8765,
        help="the port `serve` listens on: the token's audience follows it unless host.json"
        " sets a resource",
    )
    token.set_defaults(func=cmd_token)

    serve = sub.add_parser("serve", help="serve MCP on the embedded default (HTTP, or --stdio)")
    serve.add_argument("--data-dir", default=".engram")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument(
        "--stdio",
        action="store_true",
        help="serve on stdin/stdout; the token comes from ENGRAM_TOKEN",
    )
    serve.set_defaults(func=cmd_serve)
    admin = sub.add_parser("admin", help="the operations plane (never reachable by an agent)")
    admin.add_argument(
        "--stack",
        metavar="NAME",
        help="operate the deployed CloudFormation stack NAME with your AWS credentials (audited"
        " as your caller ARN) instead of a data directory",
    )
    admin.add_argument("--region", help="the stack's AWS region (default: your AWS config)")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    audit = admin_sub.add_parser("audit", help="show the audit log (ids and outcomes, no content)")
    audit.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    audit.add_argument("--limit", type=int, default=50, help="show the N most recent entries")
    audit.set_defaults(func=cmd_admin_audit)

    policy = admin_sub.add_parser("policy", help="show or change the admission policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    show = policy_sub.add_parser("show", help="show the host's admission policy and ceilings")
    show.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    show.set_defaults(func=cmd_admin_policy_show)
    set_mode = policy_sub.add_parser("set", help="change the admission mode in host.json")
    set_mode.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    set_mode.add_argument("--mode", required=True, choices=("auto", "manual"))
    set_mode.set_defaults(func=cmd_admin_policy_set)

    adjudicate = _operation(
        admin_sub, "adjudicate", "accept or reject a pending candidate (see `admin pending`)"
    )
    adjudicate.add_argument("candidate", metavar="CANDIDATE", help="the candidate id")
    adjudicate.add_argument("decision", choices=("accept", "reject"))
    adjudicate.add_argument("--reason", help="why (journaled with the decision)")
    adjudicate.set_defaults(func=cmd_admin_adjudicate)

    pending = admin_sub.add_parser("pending", help="the candidates that wait for a decision")
    pending_sub = pending.add_subparsers(dest="pending_command", required=True, metavar="COMMAND")
    listing = _operation(pending_sub, "list", "list the pending candidates (ids, no content)")
    _paging(listing)
    listing.set_defaults(func=cmd_admin_pending_list)
    show_pending = _operation(
        pending_sub, "show", "open a pending candidate: what it says (audited)"
    )
    show_pending.add_argument("candidate", metavar="CANDIDATE")
    show_pending.set_defaults(func=cmd_admin_pending_show)
    withdraw = _operation(pending_sub, "withdraw", "withdraw a pending candidate, shred its key")
    withdraw.add_argument("candidate", metavar="CANDIDATE")
    withdraw.add_argument("--reason", required=True, help="why (journaled)")
    withdraw.set_defaults(func=cmd_admin_pending_withdraw)

    records = admin_sub.add_parser("records", help="what memory holds, and its lifecycle")
    records_sub = records.add_subparsers(dest="records_command", required=True, metavar="COMMAND")
    listing = _operation(records_sub, "list", "list the records (ids, states, digests)")
    listing.add_argument(
        "--state",
        choices=(
            "accepted_current",
            "accepted_disputed",
            "historical",
            "expired",
            "trust_invalid",
            "tombstoned",
        ),
    )
    _paging(listing)
    listing.set_defaults(func=cmd_admin_records_list)
    show_record = _operation(records_sub, "show", "one record in any state, with its body")
    show_record.add_argument("record", metavar="RECORD")
    show_record.set_defaults(func=cmd_admin_records_show)
    history = _operation(records_sub, "history", "the journal events of one record")
    history.add_argument("record", metavar="RECORD")
    history.set_defaults(func=cmd_admin_records_history)
    for name, summary in (
        ("dispute", "accepted_current -> accepted_disputed (leaves search and get)"),
        ("resolve", "accepted_disputed -> accepted_current"),
        ("supersede", "-> historical (leaves search and get); --by names the successor"),
        ("expire", "-> expired (leaves search and get)"),
        ("trust-invalidate", "-> trust_invalid (leaves search and get)"),
        ("forget", "-> tombstoned from any of the five states; shreds the body"),
    ):
        step = _operation(records_sub, name, summary)
        step.add_argument("record", metavar="RECORD")
        step.add_argument("--reason", required=True, help="why (journaled)")
        if name == "supersede":
            step.add_argument("--by", metavar="RECORD", help="the current record replacing it")
        step.set_defaults(
            func=cmd_admin_records_forget if name == "forget" else cmd_admin_records_transition
        )

    state = _operation(
        admin_sub, "status", "counts by state, outbox backlog, index freshness, key store health"
    )
    state.set_defaults(func=cmd_admin_status)

    export = _operation(
        admin_sub, "export", "current records with their receipts, as JSON Lines (migration)"
    )
    export.add_argument("--output", metavar="FILE", help="write to FILE (0600) instead of stdout")
    export.set_defaults(func=cmd_admin_export)
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
    save.set_defaults(func=cmd_admin_backup)
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
    load.set_defaults(func=cmd_admin_restore)

    tokens = admin_sub.add_parser("tokens", help="bearer tokens: revoke")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="COMMAND")
    revoke = _operation(
        tokens_sub, "revoke", "revoke a token, or every current token of a principal"
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--token", help="the token itself (its id is read from it)")
    which.add_argument("--token-id", help="the token's id (its jti claim)")
    which.add_argument("--principal", help="every token of this principal issued until now")
    revoke.set_defaults(func=cmd_admin_tokens_revoke)

    keys = admin_sub.add_parser("keys", help="the key store: rotate")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    rotate = _operation(
        keys_sub,
        "rotate",
        "new issuer (signing) and master keys; data keys re-wrapped; previous tokens stay valid"
        " until they expire (stop the server first)",
    )
    rotate.set_defaults(func=cmd_admin_keys_rotate)

    rebuild = admin_sub.add_parser(
        "reindex", help="rebuild a workspace's search index from the canonical store"
    )
    rebuild.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    rebuild.add_argument("--workspace", default=TOUR_WORKSPACE)
    rebuild.set_defaults(func=cmd_admin_reindex)
    add_approvals_parser(sub, DEFAULT_DATA_DIR)
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from engram_memory.embedded.memory_trace import start_from_environment
    from engram_memory.embedded.serve import ServeError, serve

    start_from_environment()  # an opt-in leak diagnostic (ENGRAM_MEMORY_TRACE_DIR)
    try:
        serve(Path(args.data_dir), bind_host=args.host, port=args.port, stdio=args.stdio)
    except KeyboardInterrupt:
        return 0
    except ServeError as error:
        _fail(str(error))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        result: int = args.func(args)
    except (CliError, HostConfigError) as error:
        _fail(str(error))
        return 2
    except OSError as error:
        where = f": {error.filename}" if error.filename else ""
        _fail(f"{error.strerror or type(error).__name__}{where}")
        return 1
    return result


if __name__ == "__main__":
    raise SystemExit(main())
