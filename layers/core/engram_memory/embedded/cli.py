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
- ``engram-memory verify [--data-dir DIR] --tenant T --workspace W [--full]``
      operations plane: check a scope's journal (dense cursors, unbroken hash chain) and that
      its pending candidates and record bodies open (a sample, or all with ``--full``).
- ``engram-memory console [--data-dir DIR] [--operator NAME] [--host H] [--port P]``
      print a one-time sign-in link to the operator console of the server serving the data
      directory (``embedded.console``); the session it opens acts as NAME (default: your login).
- ``engram-memory approvals list|approve|decline [--data-dir DIR] [APPROVAL_ID]``
      answer the confirmations agents wait for, from a terminal (``cli_approvals``).
- ``engram-memory admin ...``
      the operations plane, one front end for both hosts (``operator_plane.commands``): on this
      data directory's seat (``embedded.operator_seat``), or with ``--stack NAME`` on a deployed
      stack's when run as ``engram-memory`` (``engram_memory.entry``). ``admin --help`` lists them.

Bad input exits with code 2 and one line on stderr; a failed operation exits with code 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from engram_memory.embedded.cli_approvals import add_approvals_parser
from engram_memory.embedded.errors import HostConfigError
from engram_memory.embedded.tour import TOUR_TENANT, TOUR_WORKSPACE
from engram_memory.operator_plane.commands import (
    SeatOpener,
    Sub,
    add_admin_parser,
    add_full_option,
    command_name,
)
from engram_memory.operator_plane.commands import fail as _fail
from engram_memory.operator_plane.seat import OperatorSeat, UsageError

if TYPE_CHECKING:  # the commands import what they use: `--help` stays light
    pass

DEFAULT_DATA_DIR = ".engram"


def cmd_tour(args: argparse.Namespace) -> int:
    from engram_memory.embedded.tour import run_tour

    return run_tour(Path(args.data_dir), approve_all=args.yes)


def cmd_init(args: argparse.Namespace) -> int:
    from engram_memory.binding.host_config import DEFAULT_RESOURCE
    from engram_memory.embedded.composition import init_data_dir
    from engram_memory.embedded.data_dir import (
        AUDIT_FILE,
        DATABASE_FILE,
        ISSUER_KEY_FILE,
        host_config_path,
        key_path,
    )

    data_dir = Path(args.data_dir)
    config = init_data_dir(data_dir, resource=args.resource)
    root = data_dir.resolve()
    print(f"Engram Memory data directory ready: {root}")
    print(f"  host configuration   {host_config_path(root)}")
    follows = " (follows `serve --port`)" if config.resource == DEFAULT_RESOURCE else ""
    print(f"  resource (audience)  {config.resource}{follows}")
    print(f"  issuer, tenant       {config.issuer}, {config.tenant_id}")
    print(f"  issuer key           {key_path(root, ISSUER_KEY_FILE)}")
    print(f"  database             {root / DATABASE_FILE}")
    print(f"  audit log            {root / AUDIT_FILE}")
    print(f"  admission mode       {config.admission.mode}")
    print(
        f"Mint a bearer token: {command_name()} token --data-dir DIR --principal P --workspace W"
        " --purpose REF --tools search,get,capture,request_admission,withdraw,forget"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from engram_memory.contract.errors import EngramError
    from engram_memory.embedded.composition import open_existing
    from engram_memory.engine.context import Scope
    from engram_memory.engine.journal import verify_journal
    from engram_memory.operator_plane.auditing import audited
    from engram_memory.operator_plane.commands import default_operator
    from engram_memory.operator_plane.inspection import readability, unreadable_line

    host = open_existing(Path(args.data_dir))
    scope = Scope(args.tenant, args.workspace)
    try:
        head = verify_journal(host.store, scope)
        health = audited(
            host.engine,
            scope,
            default_operator(),
            "verify",
            None,
            lambda call: readability(host.engine, call, full=args.full),
        )
    except EngramError as error:
        print(f"journal check failed: {error.code.value}", file=sys.stderr)
        return 1
    finally:
        host.close()
    print(f"journal ok through cursor {head.cursor}")
    line = unreadable_line(health)
    if line is not None:
        _fail(f"verify: {line}")
        return 1
    print(
        f"bodies ok: {health['pending_checked']} pending candidate(s) and"
        f" {health['records_checked']} record(s) opened ({health['checked']})"
    )
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
            f" run `{command_name()} init --data-dir {data_dir}` first"
        )
    return data_dir


def _tool_list(text: str, option: str) -> list[str]:
    from engram_memory.engine.context import TOOLS  # the contract's models: not for --help

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise CliError(
            f"{option}: unknown tool name(s) {', '.join(unknown)}; the grant names are"
            f" {','.join(TOOLS)}"
        )
    return names


def _served_on(args: argparse.Namespace, data_dir: Path, what: str) -> tuple[str, int]:
    """The address ``what`` is for: ``--host``/``--port`` when given, else the running server's
    (``server.json``, believed while it holds the lease), else the default, said on stderr."""
    from engram_memory.binding.host_config import DEFAULT_PORT
    from engram_memory.embedded.data_dir_lease import serving_address

    host = args.host or "127.0.0.1"
    if args.port is not None:
        return host, int(args.port)
    running = serving_address(data_dir)
    if running is not None and args.host in (None, running.get("host")):
        return str(running.get("host") or host), int(running["port"])
    if running is None:
        said = f"no server is serving {data_dir} over HTTP now"
        hint = f"start `{command_name()} serve`, or pass --port"
    else:  # a server runs, on another host than --host names
        said = (
            f"the server of {data_dir} listens on {running.get('host')}:{running['port']},"
            f" not on --host {host}"
        )
        hint = "drop --host for the running server's address, or pass --port"
    print(
        f"engram-memory: {said}; {what} is for {host}:{DEFAULT_PORT}, the default ({hint})",
        file=sys.stderr,
    )
    return host, DEFAULT_PORT


def cmd_token(args: argparse.Namespace) -> int:
    from engram_memory.embedded.host_file import load_host_config
    from engram_memory.embedded.issuer_keys import local_issuer

    data_dir = _data_dir(args)
    stored = load_host_config(data_dir)
    tools = _tool_list(args.tools, "--tools")
    if not tools:
        raise CliError("--tools needs at least one tool (search,get,capture,...)")
    confirm = _tool_list(args.confirm, "--confirm")
    outside = [name for name in confirm if name not in tools]
    if outside:
        raise CliError(f"--confirm names tools that --tools does not grant: {', '.join(outside)}")
    if args.expires_in is not None and args.expires_in < 1:
        raise CliError("--expires-in must be a positive number of seconds")
    config = stored.serving_on(*_served_on(args, data_dir, "the token"))
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


def cmd_console(args: argparse.Namespace) -> int:
    import time

    from engram_memory.embedded.composition import require_initialised
    from engram_memory.embedded.console.app import sign_in_link
    from engram_memory.embedded.console.links import LINK_TTL_MS
    from engram_memory.embedded.host_file import load_host_config
    from engram_memory.embedded.serve import page_origin

    data_dir = _data_dir(args)
    require_initialised(data_dir)
    operator = args.operator.strip()
    if not operator:
        raise CliError("--operator must not be empty")
    served = _served_on(args, data_dir, "the link")
    resource = load_host_config(data_dir).serving_on(*served).resource
    link = sign_in_link(data_dir, page_origin(resource), operator, int(time.time() * 1000))
    print(link)
    print(
        f"Open it within {LINK_TTL_MS // 60_000} min, once, in a browser on this machine while"
        f" `{command_name()} serve` runs; the session acts as {operator!r}.",
        file=sys.stderr,
    )
    return 0


def _add_console_parser(sub: Sub) -> None:
    from engram_memory.operator_plane.commands import default_operator

    console = sub.add_parser(
        "console", help="print a one-time sign-in link to the operator console (`serve`'s)"
    )
    console.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    console.add_argument(
        "--operator", default=default_operator(), help="who acts, as audited (default: your login)"
    )
    console.add_argument(
        "--host", help="the address `serve` binds (default: the running server's, or 127.0.0.1)"
    )
    console.add_argument(
        "--port", type=int, help="the port `serve` listens on (default: the running server's)"
    )
    console.set_defaults(func=cmd_console)


def _add_token_parser(sub: Sub) -> None:
    token = sub.add_parser("token", help="mint a bearer token for an agent (prints only the token)")
    token.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    token.add_argument("--principal", required=True, help="the agent's principal (`sub`)")
    token.add_argument("--workspace", required=True, help="the workspace the token is bound to")
    token.add_argument("--purpose", required=True, help="the purpose_ref the agent must repeat")
    token.add_argument(
        "--tools",
        required=True,
        help="granted tools, comma-separated grant names (search,get,capture,request_admission,"
        "withdraw,forget: the MCP tool names without engram_memory_)",
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
    token.add_argument(
        "--host", help="the address `serve` binds (default: the running server's, or 127.0.0.1)"
    )
    token.add_argument(
        "--port",
        type=int,
        help="the port `serve` listens on (default: the running server's, or 8765): the token's"
        " audience follows it unless host.json sets a resource",
    )
    token.set_defaults(func=cmd_token)


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

    verify = sub.add_parser(
        "verify", help="check a scope's journal and that its memories open (operations plane)"
    )
    verify.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    verify.add_argument("--tenant", default=TOUR_TENANT)
    verify.add_argument("--workspace", default=TOUR_WORKSPACE)
    add_full_option(verify)
    verify.set_defaults(func=cmd_verify)

    _add_token_parser(sub)
    _add_console_parser(sub)

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


def data_dir_seat(args: argparse.Namespace) -> OperatorSeat:
    """The seat of an ``admin`` command on this host: its ``--data-dir``."""
    from engram_memory.embedded.operator_seat import DataDirSeat

    if getattr(args, "stack", None):
        raise CliError(
            "--stack needs the cloud operator plane (run `engram-memory`, not this module)"
        )
    return DataDirSeat(Path(args.data_dir), getattr(args, "operator", None))


# Options whose value is an id a program chose and may begin with "-" (a token id is URL-safe
# base64): argparse reads "--token-id -x" as a missing value, so the pair is joined first.
_ID_OPTIONS = ("--token-id",)


def _values_joined(argv: list[str]) -> list[str]:
    joined: list[str] = []
    pending: str | None = None
    for arg in argv:
        if pending is not None:
            joined.append(f"{pending}={arg}")
            pending = None
        elif arg in _ID_OPTIONS:
            pending = arg
        else:
            joined.append(arg)
    if pending is not None:
        joined.append(pending)
    return joined


def main(argv: list[str] | None = None, *, open_seat: SeatOpener = data_dir_seat) -> int:
    """Run one command. ``open_seat`` opens the seat of an ``admin`` command: the data directory
    here; the ``engram-memory`` entry point (``engram_memory.entry``) adds ``--stack``'s."""
    parser = build_parser(open_seat)
    try:
        args = parser.parse_args(_values_joined(sys.argv[1:] if argv is None else argv))
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
