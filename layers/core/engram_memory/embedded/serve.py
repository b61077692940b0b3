"""The embedded MCP server: the runtime wired from a data directory, and ``serve``."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlparse

import anyio

from engram_memory.adapters.clock import SystemClock
from engram_memory.adapters.lazy import Lazy
from engram_memory.adapters.local.approval_book import ApprovalBook
from engram_memory.adapters.local.private_files import write_private_file
from engram_memory.binding.host_config import DEFAULT_PORT, HostConfig
from engram_memory.binding.tokens import InvalidToken, TokenIssuer, context_from_claims
from engram_memory.binding.verified_tokens import cached
from engram_memory.contract.errors import ErrorCode, TrustedContextUnavailable
from engram_memory.embedded.allocator import (
    RELEASE_EVERY_S,
    cap_malloc_arenas,
    release_free_memory,
)
from engram_memory.embedded.book_channel import EmbeddedApprovals, LinkDesk, approval_routes
from engram_memory.embedded.console.app import Console, console_routes, sign_in_link
from engram_memory.embedded.data_dir import (
    ISSUER_KEY_FILE,
    REQUEST_STATE_KEY_FILE,
    host_config_path,
    key_path,
)
from engram_memory.embedded.data_dir_lease import DataDirectoryBusy, DataDirLease, acquire_lease
from engram_memory.embedded.host_file import LiveAdmissionPolicy, load_host_config
from engram_memory.embedded.issuer_keys import local_issuer, local_verifier
from engram_memory.engine.context import TOOLS, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationNeeded
from engram_memory.mcp_surface.catalog import instructions_for
from engram_memory.mcp_surface.request_state import RequestStateSealer
from engram_memory.mcp_surface.server import EngramMcp, SurfaceRuntime
from engram_memory.mcp_surface.transports import MCP_PATH, McpGate, http_app, serve_stdio
from engram_memory.operator_plane.commands import command_name, default_operator

if TYPE_CHECKING:  # the engine (and the encryption SDK under it) loads when first needed
    from engram_memory.embedded.composition import EmbeddedHost

DEFAULT_PRINCIPAL = "default-agent"
DEFAULT_WORKSPACE = "default"
DEFAULT_PURPOSE = "general"
STDIO_TOKEN_ENV = "ENGRAM_TOKEN"  # noqa: S105 - the name of a variable, not a secret
REQUEST_STATE_KEY_BYTES = 32
DRAIN_EVERY_S = 5.0  # how often the drainer looks at the outbox


class EngineOnDemand:
    """The embedded engine (SQLite store, vault, admission policy), opened on first use: a stdio
    host answers ``initialize`` and ``tools/list`` without loading it. It is the surface's
    ``SurfaceEngine``."""

    def __init__(self, opener: Callable[[], EmbeddedHost]) -> None:
        self._opener = opener
        self._host = Lazy(self._open)
        self._idle_accepted = False

    def _open(self) -> EmbeddedHost:
        host = self._opener()
        if self._idle_accepted:  # the transport accepted before the first call opened the engine
            host.engine.accept_idle_work()
        return host

    @property
    def host(self) -> EmbeddedHost:
        return self._host.get()

    def accept_idle_work(self) -> None:
        self._idle_accepted = True
        if self._host.made:
            self._host.get().engine.accept_idle_work()

    def run_idle_work(self) -> None:
        if self._host.made:
            self._host.get().engine.run_idle_work()

    @property
    def opened(self) -> bool:
        return self._host.made

    def close(self) -> None:
        self._host.close()

    def handle(
        self, tool: str, arguments: Any, ctx: TrustedContext, approval: Approval | None = None
    ) -> dict[str, Any] | ConfirmationNeeded:
        with STOP_SIGNALS.held():
            return self.host.engine.handle(tool, arguments, ctx, approval)

    def refuse(
        self, tool: str, ctx: TrustedContext | None, audit_id: str, code: ErrorCode | str
    ) -> dict[str, Any]:
        with STOP_SIGNALS.held():
            return self.host.engine.refuse(tool, ctx, audit_id, code)

    def decline(
        self, tool: str, ctx: TrustedContext, approval: Approval, arguments: Any = None
    ) -> dict[str, Any]:
        with STOP_SIGNALS.held():
            return self.host.engine.decline(tool, ctx, approval)  # the book holds the question


@dataclass
class EmbeddedServer:
    surface: EngramMcp
    issuer: TokenIssuer
    engine: EngineOnDemand
    approvals: EmbeddedApprovals
    desk: LinkDesk  # the approval page's
    console: Console
    lease: DataDirLease | None = None  # the data directory's, held until ``close``

    @property
    def host(self) -> EmbeddedHost:
        """The opened embedded host (opening it now if needed)."""
        return self.engine.host

    def http_app(self, *, bind_host: str) -> McpGate:
        """The ASGI app: ``/mcp``, its metadata, the approval page and the operator console, on
        one loopback address."""
        return http_app(
            self.surface,
            bind_host=bind_host,
            routes=lambda hosts: [
                *approval_routes(self.desk, hosts),
                *console_routes(self.console, hosts),
            ],
        )

    def close(self) -> None:
        try:
            self.engine.close()
            self.approvals.close()
            self.console.close()
        finally:
            if self.lease is not None:
                self.lease.release()


def _request_state_key(path: Path) -> bytes:
    """The 32-byte request-state key, created (0600) on first use; concurrent starts agree."""
    write_private_file(path, secrets.token_bytes(REQUEST_STATE_KEY_BYTES), replace=False)
    key = path.read_bytes()
    if len(key) != REQUEST_STATE_KEY_BYTES:
        raise ValueError(f"{path} does not hold a {REQUEST_STATE_KEY_BYTES}-byte key")
    return key


def _initialised(data_dir: Path) -> bool:
    return host_config_path(data_dir).exists() and key_path(data_dir, ISSUER_KEY_FILE).exists()


def open_server(
    data_dir: Path,
    *,
    stdio_token: str | None = None,
    port: int | None = None,
    bind_host: str = "127.0.0.1",
    config: HostConfig | None = None,
    **engine_options: Any,
) -> EmbeddedServer:
    """Wire the MCP surface over the embedded engine in ``data_dir`` (initializing it if needed).

    ``port``: the port served on; the resource URI (the tokens' audience) follows it unless
    ``host.json`` sets one explicitly. ``config``: the host configuration to use instead of
    ``host.json``. ``engine_options`` go to ``open_embedded`` (e.g. ``embedder``,
    ``semantic_mode``; ``clock``, which the approval book keeps time by too). The engine opens
    on first use (``EmbeddedServer.host``), or here when the data directory is new:
    initializing it is that one open.

    The server holds the data directory's lease (``data_dir_lease``) until it is closed; raises
    ``DataDirectoryBusy`` when another server or a key rotation holds it.
    """
    new, stored = _prepared(data_dir, config)
    lease = acquire_lease(data_dir)
    try:
        return _wired(
            data_dir,
            lease,
            new=new,
            served=stored.serving_on(bind_host, port) if port is not None else stored,
            from_file=config is None,
            stdio_token=stdio_token,
            engine_options=engine_options,
        )
    except BaseException:
        lease.release()
        raise


def _wired(
    data_dir: Path,
    lease: DataDirLease,
    *,
    new: bool,
    served: HostConfig,
    from_file: bool,
    stdio_token: str | None,
    engine_options: dict[str, Any],
) -> EmbeddedServer:
    """``open_server``'s server over the data directory whose lease it holds."""

    def open_engine() -> EmbeddedHost:
        from engram_memory.embedded.composition import open_embedded

        options = engine_options
        if from_file and "policy" not in options:  # `admin policy set` applies at the next call
            live = LiveAdmissionPolicy(data_dir, served.admission_policy())
            options = {**options, "policy": live}
        return open_embedded(data_dir, config=served, **options)

    engine = EngineOnDemand(open_engine)
    if new:
        engine.host  # noqa: B018 - a new data directory is whole (database, keys) once this returns
    state_key = _request_state_key(key_path(data_dir, REQUEST_STATE_KEY_FILE))
    # one clock for the engine and the approval book (a test's fake one, given to open_server)
    clock = engine_options.get("clock") or SystemClock()
    page = None if stdio_token is not None else page_origin(served.resource)  # stdio: no page
    approvals = EmbeddedApprovals(
        lambda: ApprovalBook(data_dir), lambda: engine.host.engine, base_url=page, clock=clock
    )
    runtime = SurfaceRuntime(
        engine=engine,
        verifier=cached(local_verifier(data_dir, served)),  # verified once per token
        host=served,
        sealer=RequestStateSealer(state_key),
        clock=clock,
        stdio_token=stdio_token,
        approvals=approvals,
        revoked=lambda ctx: engine.host.engine.credential_revoked(ctx),
    )
    binding = stdio_binding(runtime) if stdio_token else None
    purpose = binding.purpose_ref if isinstance(binding, TrustedContext) else None
    return EmbeddedServer(
        surface=EngramMcp(runtime, instructions=instructions_for(purpose)),
        issuer=local_issuer(data_dir, served),
        engine=engine,
        approvals=approvals,
        desk=LinkDesk(approvals, csrf_key=_csrf_key(state_key)),
        console=Console(
            data_dir,
            opened=lambda: engine.host,
            approvals=approvals,
            csrf_key=_csrf_key(state_key, b"console"),
            remote=served.console_remote,
        ),
        lease=lease,
    )


def _csrf_key(state_key: bytes, page: bytes = b"approval") -> bytes:
    """A page's CSRF key (the approval page's, the console's), derived from the request-state
    key."""
    return hashlib.sha256(b"engram-memory/" + page + b"-csrf/v1" + state_key).digest()


def _prepared(data_dir: Path, config: HostConfig | None) -> tuple[bool, HostConfig]:
    """Whether ``data_dir`` is new (initialized now), and the host configuration: ``config``,
    or the data directory's ``host.json``."""
    from engram_memory.embedded.composition import (
        check_key_store,
        init_host_files,
        prepare_data_dir,
    )

    check_key_store(data_dir)  # memories without their keys: refused before anything is made
    if not _initialised(data_dir):
        written = init_host_files(data_dir)
        return True, config or written
    prepare_data_dir(data_dir)  # a read-only data directory is one line now, not later
    return False, config or load_host_config(data_dir)


def page_origin(resource: str) -> str:
    """The origin of the approval page and the console: the MCP resource's scheme and
    authority (loopback)."""
    parsed = urlparse(resource)
    return f"{parsed.scheme}://{parsed.netloc}"


def stdio_binding(runtime: SurfaceRuntime) -> TrustedContext | str:
    """The context the stdio token binds, or what is wrong with it (one line for stderr)."""
    token = runtime.stdio_token
    mint = (
        f"mint one with `{command_name()} token --data-dir DIR --principal P --workspace W"
        " --purpose REF --tools search,get,...`"
    )
    refused = "no tools are listed and every call is refused (-32603)"
    if not token:
        return f"{STDIO_TOKEN_ENV} is not set: {refused}; {mint}."
    try:
        claims = runtime.verifier.verify(token)
        return context_from_claims(claims, audit_id="aud_start", host=runtime.host)
    except InvalidToken as error:
        return f"{STDIO_TOKEN_ENV} is refused ({error}): {refused}; {mint}."
    except TrustedContextUnavailable:
        return (
            f"{STDIO_TOKEN_ENV} binds no usable context on this host (its tenant, claims or a"
            f" maintenance grant): {refused}; {mint}."
        )


def default_token(server: EmbeddedServer) -> str:
    config = server.surface.runtime.host
    return server.issuer.mint(
        principal=DEFAULT_PRINCIPAL,
        tenant_id=config.tenant_id,
        workspace_id=DEFAULT_WORKSPACE,
        purpose_ref=DEFAULT_PURPOSE,
        tools=TOOLS,
        expires_in_s=config.default_token_ttl_s,
    )


INSPECTOR = "npx @modelcontextprotocol/inspector@2.12.0"  # needs Node >= 22


def client_configuration(url: str, token: str, data_dir: Path, port: int) -> dict[str, Any]:
    """Ready-to-paste configurations for a desktop MCP host (HTTP or stdio) and the Inspector."""
    stdio_args = ["serve", "--stdio", "--data-dir", str(data_dir.resolve())]
    if port != DEFAULT_PORT:  # the token's audience follows the port: so must the stdio server's
        stdio_args += ["--port", str(port)]
    return {
        "mcpServers": {
            "engram-memory": {
                "type": "http",
                "url": url,
                "headers": {"Authorization": f"Bearer {token}"},
            },
            "engram-memory-stdio": {
                "command": command_name(absolute=True),
                "args": stdio_args,
                "env": {STDIO_TOKEN_ENV: token},
            },
        }
    }


def describe_lifetime(seconds: int) -> str:
    """A token lifetime for people: ``24 h``, ``90 min``, ``45 s``, ``2 d 3 h``."""
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else ""]
    parts += [f"{minutes} min" if minutes else "", f"{secs} s" if secs else ""]
    return " ".join(part for part in parts if part) or "0 s"


def print_banner(
    out: TextIO,
    *,
    url: str,
    token: str,
    data_dir: Path,
    port: int,
    token_ttl_s: int | None = None,
    console_link: str | None = None,
) -> None:
    config = client_configuration(url, token, data_dir, port)
    print("Engram Memory is serving MCP at " + url, file=out)
    print(f"Data directory: {data_dir.resolve()}", file=out)
    print(
        "\nPaste into your MCP client configuration (token for principal "
        f"'{DEFAULT_PRINCIPAL}', workspace '{DEFAULT_WORKSPACE}', purpose '{DEFAULT_PURPOSE}', all six tools):\n",
        file=out,
    )
    print(json.dumps(config, indent=2), file=out)
    if token_ttl_s is not None:
        print(
            f"\nThe token expires in {describe_lifetime(token_ttl_s)} (default_token_ttl_s in"
            f" {host_config_path(data_dir)}); revoke it sooner with"
            f" `{command_name()} admin tokens revoke --token <token>`.",
            file=out,
        )
    print(
        f"\nMCP Inspector (Node >= 22): {INSPECTOR}, transport 'Streamable HTTP', URL "
        f"{url}, header 'Authorization: Bearer <the token above>'.",
        file=out,
    )
    if console_link is not None:
        print(
            f"\nOperator console (one-time sign-in link, 5 min; `{command_name()} console` prints"
            f" a new one for this server while it runs): {console_link}",
            file=out,
        )
    print(
        f"\nMint tokens for other agents with `{command_name()} token --help` (while this server"
        " runs, they are for its address: no --port needed). Ctrl-C stops.",
        file=out,
        flush=True,
    )


class ServeError(Exception):
    """The server cannot start; the message is one line for a person."""


def _drain_loop(server: EmbeddedServer, stop: threading.Event) -> None:
    """Completes queued key destructions and projection drops without further calls, and
    returns to the system what closed sessions freed."""
    released = time.monotonic()
    while not stop.wait(DRAIN_EVERY_S):
        if server.engine.opened:
            server.host.engine.drain_outbox()
        if time.monotonic() - released >= RELEASE_EVERY_S:  # e.g. closed idle sessions
            release_free_memory()
            released = time.monotonic()


def _listening_socket(bind_host: str, port: int) -> socket.socket:
    """The bound socket to serve on, before anything is printed: a port in use is one line."""
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind_host, port))
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {bind_host} is already in use (another engram-memory?);"
                f" choose another with --port, e.g. --port {port + 1}"
            ) from None
        raise ServeError(f"cannot listen on {bind_host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class StopSignals:
    """SIGTERM stops the server like Ctrl-C (the store is closed on the way out): as a
    ``KeyboardInterrupt`` in the main thread, which Python raises wherever that thread is.

    Never inside an engine call or start-up, though: the stdio server runs its calls on the
    main thread (``EngramMcp.engine_on_loop``), and a stop that arrives during one (or while
    ``serve`` opens the server) is held until it returns, then raised. The call ends as it
    would have, its commit and its audit line together, rather than as a crash the next start
    has to recover from (the HTTP server's calls run in worker threads, which a signal never
    interrupts)."""

    def __init__(self) -> None:
        self._calls = 0  # engine calls running on the main thread now
        self._held = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._arrived)

    def _arrived(self, _signum: int, _frame: object) -> None:
        if self._calls:
            self._held = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A stop arriving while the block runs on the main thread is raised when it ends."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._calls += 1
        try:
            yield
        finally:
            self._calls -= 1
            if self._held and not self._calls:
                self._held = False
                raise KeyboardInterrupt


STOP_SIGNALS = StopSignals()


def serve(data_dir: Path, *, bind_host: str, port: int, stdio: bool) -> None:
    """Serve MCP over stdio or HTTP until stopped (Ctrl-C, SIGTERM, or stdin closed on stdio).

    Raises ``ServeError`` (one line) when another process holds the data directory's lease, or
    the port is taken or cannot be bound."""
    cap_malloc_arenas()  # before any worker thread exists: see host.allocator
    STOP_SIGNALS.install()
    server: EmbeddedServer | None = None
    try:
        # A stop during start-up waits for it to finish: an open cut short would leave the
        # files it had opened unclosed (their write-ahead logs full), out of ``close``'s reach.
        with STOP_SIGNALS.held():
            server, run = (_started_stdio if stdio else _started_http)(data_dir, bind_host, port)
        _serve(server, run)
    finally:
        if server is not None:
            server.close()


def _started_stdio(
    data_dir: Path, bind_host: str, port: int
) -> tuple[EmbeddedServer, Callable[[], None]]:
    stdio_token = os.environ.get(STDIO_TOKEN_ENV)
    server = _leased(
        lambda: open_server(data_dir, stdio_token=stdio_token, port=port, bind_host=bind_host)
    )
    binding = stdio_binding(server.surface.runtime)
    if isinstance(binding, str):
        print(f"engram-memory: {binding}", file=sys.stderr, flush=True)
    return server, lambda: anyio.run(serve_stdio, server.surface)


def _started_http(
    data_dir: Path, bind_host: str, port: int
) -> tuple[EmbeddedServer, Callable[[], None]]:
    """The server with its engine open, listening, its banner printed."""
    # The lease first: a second server on this data directory is told who holds it, whatever
    # port it asked for.
    server = _leased(lambda: open_server(data_dir, port=port, bind_host=bind_host))
    try:
        sock = _listening_socket(bind_host, port)
    except BaseException:
        server.close()
        raise
    try:
        server.host  # noqa: B018 - open the engine now: a broken data directory fails before the banner
        _announce(server, data_dir, bind_host, port)
    except BaseException:
        sock.close()
        server.close()
        raise
    return server, lambda: _run_uvicorn(server, bind_host, sock)


def _announce(server: EmbeddedServer, data_dir: Path, bind_host: str, port: int) -> None:
    url = f"http://{bind_host}:{port}{MCP_PATH}"
    if server.lease is not None:  # `console` and `token` find this server without --port
        server.lease.announce({"url": url, "host": bind_host, "port": port})
    resource = server.surface.runtime.host.resource
    print_banner(
        sys.stdout,
        url=url,
        token=default_token(server),
        data_dir=data_dir,
        port=port,
        token_ttl_s=server.surface.runtime.host.default_token_ttl_s,
        console_link=sign_in_link(
            data_dir, page_origin(resource), default_operator(), server.approvals.clock.now_ms()
        ),
    )
    if resource != url:
        print(
            f"\nNote: host.json sets the service's resource URI (the tokens' audience) to"
            f" {resource}; clients are told to use it.",
            file=sys.stderr,
            flush=True,
        )


def _leased(opened: Callable[[], EmbeddedServer]) -> EmbeddedServer:
    """``opened()``, or one line when another process holds the data directory."""
    try:
        return opened()
    except DataDirectoryBusy as busy:
        raise ServeError(
            f"{busy}: one server per data directory. Use that server (its URL is in its banner),"
            " or stop it and start again"
        ) from None


def _run_uvicorn(server: EmbeddedServer, bind_host: str, sock: socket.socket) -> None:
    import uvicorn

    from engram_memory.embedded.http_server import uvicorn_config

    surface = server.surface

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # Wake the calls waiting on a human's answer as shutdown begins: they answer
            # CANCELLED while their connections drain, instead of holding the server until
            # the graceful period ends (the app's lifespan wakes them then, at the latest).
            surface.stop_waiting()
            await super().shutdown(sockets)

    app = server.http_app(bind_host=bind_host)
    try:
        Server(uvicorn_config(app)).run(sockets=[sock])
    finally:
        sock.close()


def _serve(server: EmbeddedServer, run: Callable[[], None]) -> None:
    """``run()`` beside the drainer, which has stopped when this returns: a drain still running
    as the server closes would reopen the store (it stays usable) and exit with it unclosed."""
    stop = threading.Event()
    drainer = threading.Thread(target=_drain_loop, args=(server, stop), daemon=True)
    drainer.start()
    try:
        run()
    finally:
        stop.set()
        drainer.join()
