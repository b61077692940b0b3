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
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

from engram_memory.embedded.cli_approvals import add_approvals_parser
from engram_memory.embedded.errors import HostConfigError
from engram_memory.engine.context import TOOLS, TrustedContext, new_audit_id
from engram_memory.operator_plane.commands import SeatOpener, Sub, add_admin_parser
from engram_memory.operator_plane.commands import fail as _fail
from engram_memory.operator_plane.seat import OperatorSeat, UsageError

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


class CliError(UsageError):
    """Bad input: ``main`` prints the message on one line and exits with code 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are ``CliError`` (one line, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)")


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


def build_parser(open_seat: SeatOpener) -> argparse.ArgumentParser:
    parser = _Parser(prog="engram-memory", description="Governed memory for AI agents.")
    # the subcommands are _Parser too (argparse makes them of the parent's class)
    sub = cast("Sub", parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))

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
    add_admin_parser(sub, open_seat)
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


def _no_stack(args: argparse.Namespace) -> OperatorSeat:
    from engram_memory.embedded.operator_seat import DataDirSeat

    if getattr(args, "stack", None):
        raise CliError(
            "--stack needs the cloud operator plane (run `engram-memory`, not this module)"
        )
    return DataDirSeat(Path(args.data_dir), getattr(args, "operator", None))


def main(argv: list[str] | None = None, *, open_seat: SeatOpener = _no_stack) -> int:
    """Run one command. ``open_seat`` opens the seat of an ``admin`` command: the data directory
    here; the ``engram-memory`` entry point (``engram_memory.entry``) adds ``--stack``'s."""
    parser = build_parser(open_seat)
    try:
        args = parser.parse_args(argv)
        result: int = args.func(args)
    except (UsageError, HostConfigError) as error:
        _fail(str(error))
        return 2
    except OSError as error:
        where = f": {error.filename}" if error.filename else ""
        _fail(f"{error.strerror or type(error).__name__}{where}")
        return 1
    return result


if __name__ == "__main__":
    raise SystemExit(main())
