"""End-to-end support: the real MCP server driven by the official ``mcp`` client.

- ``http_service`` (one per xdist worker): ``open_server`` over a private data directory, served by
  uvicorn on a free 127.0.0.1 port in a background thread. Tests share it and keep apart by using
  a fresh workspace each (``new_workspace``).
- ``stdio_home`` (one per worker): an initialised data directory for ``engram-memory serve
  --stdio`` subprocesses; ``stdio_client_for`` launches one per client connection.
- ``Tokens`` mints real bearer tokens with the data directory's issuer, plus the forged kinds the
  refusal tests need (wrong audience, expired, badly signed, maintenance grant, foreign tenant).

Every network call goes to 127.0.0.1 and every client runs under a deadline (``CALL_DEADLINE_S``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import sqlite3
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

import anyio
import httpx2
import jwt
import mcp.types as types
import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import ClientRequestContext, ClientSession, ElicitationFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from engram_memory.adapters.local.audit import audit_lines
from engram_memory.binding.host_config import HostConfig
from engram_memory.binding.tokens import TokenIssuer, key_id
from engram_memory.contract.errors import MESSAGES, ErrorCode
from engram_memory.embedded.data_dir import AUDIT_FILE, ISSUER_KEY_FILE, key_path
from engram_memory.embedded.issuer_keys import load_or_create_issuer_key
from engram_memory.embedded.serve import EmbeddedServer, open_server
from engram_memory.engine.context import TOOLS, Scope
from engram_memory.mcp_surface.catalog import TOOL_NAMES

from engram_testing import capture_args, served

# -- protocol revisions -------------------------------------------------------------------------

LEGACY = "legacy"  # the 2025-11-25 revision, reached through initialize
MODERN = "2026-07-28"  # the stateless revision, a self-contained envelope on every request

REVISIONS = [pytest.param(LEGACY, id="2025-11-25"), pytest.param(MODERN, id="2026-07-28")]

# -- identities and limits ----------------------------------------------------------------------

PURPOSE = "purpose:e2e-memory"
ALICE = "agent-alice"
BOBBY = "agent-bobby"
ALL_GRANTS: tuple[str, ...] = tuple(TOOLS)
CALL_DEADLINE_S = 60.0
SEARCH = TOOL_NAMES["search"]
GET = TOOL_NAMES["get"]
CAPTURE = TOOL_NAMES["capture"]
ADMIT = TOOL_NAMES["request_admission"]
WITHDRAW = TOOL_NAMES["withdraw"]
FORGET = TOOL_NAMES["forget"]
TRUSTED_CONTEXT_UNAVAILABLE = -32603
UNKNOWN_TOOL = -32602
INVALID_SCHEMA_MESSAGE = MESSAGES[ErrorCode.INVALID_SCHEMA]  # the code's one message


def new_workspace() -> str:
    """A fresh workspace (always 15 characters) so tests sharing one server never meet."""
    return "ws-" + uuid.uuid4().hex[:12]


def new_key(prefix: str) -> str:
    """An idempotency key (16..256 bytes)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now_ms() -> int:
    return int(time.time() * 1000)


# -- tokens -------------------------------------------------------------------------------------


class Tokens:
    """Bearer tokens for one data directory: real ones from its issuer, and forged ones."""

    def __init__(self, data_dir: Path, config: HostConfig, issuer: TokenIssuer) -> None:
        self.config = config
        self.issuer = issuer
        self._key = load_or_create_issuer_key(key_path(data_dir, ISSUER_KEY_FILE))
        self._kid = key_id(self._key.public_key())

    def fresh(self, **claims: Any) -> tuple[str, str]:
        """A new workspace and a token for it (``claims``: as ``mint``'s)."""
        workspace = new_workspace()
        return workspace, self.mint(workspace=workspace, **claims)

    def mint(
        self,
        *,
        workspace: str,
        principal: str = ALICE,
        tools: Sequence[str] = ALL_GRANTS,
        confirm: Sequence[str] = (),
        purpose: str = PURPOSE,
        expires_in_s: int = 900,
    ) -> str:
        return self.issuer.mint(
            principal=principal,
            tenant_id=self.config.tenant_id,
            workspace_id=workspace,
            purpose_ref=purpose,
            tools=tools,
            confirm=confirm,
            expires_in_s=expires_in_s,
        )

    def _with(
        self,
        issuer: TokenIssuer,
        workspace: str,
        *,
        tenant_id: str | None = None,
        expires_in_s: int = 900,
        now: int | None = None,
    ) -> str:
        return issuer.mint(
            principal=ALICE,
            tenant_id=tenant_id or self.config.tenant_id,
            workspace_id=workspace,
            purpose_ref=PURPOSE,
            tools=ALL_GRANTS,
            expires_in_s=expires_in_s,
            now=now,
        )

    def wrong_audience(self, workspace: str) -> str:
        other = TokenIssuer(
            self._key,
            issuer=self.config.issuer,
            audience="http://127.0.0.1:8765/another-service",
            kid=self._kid,
        )
        return self._with(other, workspace)

    def expired(self, workspace: str) -> str:
        # Expired an hour ago: well beyond the verifier's 30 s leeway.
        return self._with(self.issuer, workspace, expires_in_s=60, now=int(time.time()) - 3_660)

    def badly_signed(self, workspace: str) -> str:
        impostor = TokenIssuer(
            Ed25519PrivateKey.generate(),
            issuer=self.config.issuer,
            audience=self.config.resource,
            kid=self._kid,  # claims to be the host's key; the signature says otherwise
        )
        return self._with(impostor, workspace)

    def foreign_tenant(self, workspace: str) -> str:
        return self._with(self.issuer, workspace, tenant_id="some-other-tenant")

    def maintenance(self, workspace: str) -> str:
        """Authentic and for this service, but carrying an operations-plane grant."""
        issued = int(time.time())
        claims = {
            "iss": self.config.issuer,
            "aud": self.config.resource,
            "sub": ALICE,
            "iat": issued,
            "nbf": issued,
            "exp": issued + 900,
            "tenant_id": self.config.tenant_id,
            "workspace_id": workspace,
            "purpose_ref": PURPOSE,
            "engram_tools": list(ALL_GRANTS),
            "scope": "read maintain",
        }
        return jwt.encode(
            claims, self._key, algorithm="EdDSA", headers={"kid": self._kid, "typ": "at+jwt"}
        )

    def bad(self, kind: str, workspace: str) -> str:
        forge: Callable[[str], str] = {
            "wrong-audience": self.wrong_audience,
            "expired": self.expired,
            "badly-signed": self.badly_signed,
        }[kind]
        return forge(workspace)


BAD_TOKEN_KINDS = ("wrong-audience", "expired", "badly-signed")


# -- the in-process HTTP server -----------------------------------------------------------------


@dataclass
class HttpService:
    server: EmbeddedServer
    base_url: str
    tokens: Tokens
    data_dir: Path

    def audited(self, audit_id: str) -> dict[str, Any]:
        """The audit line of the call ``audit_id`` (as ``engram-memory admin audit`` reads it)."""
        (entry,) = audit_entries(self.data_dir, {audit_id}).values()
        return entry

    def audit_of(self, audit_ids: set[str]) -> dict[str, dict[str, Any]]:
        """The audit lines of the calls ``audit_ids``, by id, in one read of the log."""
        return audit_entries(self.data_dir, audit_ids)

    @property
    def url(self) -> str:
        return self.base_url + "/mcp"

    @property
    def resource(self) -> str:
        return self.server.surface.runtime.host.resource

    def journal_cursor(self, workspace: str) -> int:
        """How many events the workspace's journal holds (read from the server's own store)."""
        scope = Scope(self.server.surface.runtime.host.tenant_id, workspace)
        return self.server.host.store.head(scope).cursor


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # the kernel picks a free port: safe for parallel workers
    return sock


@contextlib.contextmanager
def serve_http(data_dir: Path, **options: Any) -> Iterator[HttpService]:
    """``open_server(data_dir)`` behind uvicorn on a free 127.0.0.1 port, in a background thread
    (``options``: ``open_server``'s, e.g. a fake ``clock``).

    As ``engram-memory serve`` does, the resource URI (the tokens' audience, the approval
    links' origin) follows the port."""
    sock = _free_socket()
    port = sock.getsockname()[1]
    embedded = open_server(data_dir, port=port, **options)
    app = embedded.http_app(bind_host="127.0.0.1")
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=3
        )
    )
    try:
        with served(server, sock, "the in-process MCP HTTP server", stop_s=15):
            tokens = Tokens(data_dir, embedded.surface.runtime.host, embedded.issuer)
            base_url = f"http://127.0.0.1:{port}"
            yield HttpService(embedded, base_url, tokens, data_dir)
    finally:
        embedded.close()


def prepare_stdio_home(data_dir: Path, logs: Path) -> StdioHome:
    """An initialised data directory (keys, database, host.json) for stdio subprocesses."""
    embedded = open_server(data_dir)
    try:
        tokens = Tokens(data_dir, embedded.surface.runtime.host, embedded.issuer)
    finally:
        embedded.close()
    return StdioHome(data_dir=data_dir, tokens=tokens, logs=logs)


# -- the stdio server (the real console script in a subprocess) ----------------------------------


def engram_cli() -> str:
    beside = Path(sys.executable).parent / "engram-memory"
    found = str(beside) if beside.exists() else shutil.which("engram-memory")
    if found is None:
        pytest.fail("the engram-memory console script is not installed in this environment")
    return found


@dataclass
class StdioHome:
    data_dir: Path
    tokens: Tokens
    logs: Path

    def params(self, token: str | None) -> StdioServerParameters:
        env = {} if token is None else {"ENGRAM_TOKEN": token}
        return StdioServerParameters(
            command=engram_cli(),
            args=["serve", "--stdio", "--data-dir", str(self.data_dir)],
            env=env,
        )

    def stderr_log(self) -> Path:
        return self.logs / f"stderr-{uuid.uuid4().hex}.log"


# -- clients ------------------------------------------------------------------------------------


@dataclass
class Human:
    """The elicitation callback: a human who answers every confirmation the same way, after
    ``delay_s``; with ``action="gone"`` the client's form goes away instead (the callback raises)."""

    action: str = "accept"
    asked: list[str] = field(default_factory=list)
    delay_s: float = 0.0

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params.message)
        await anyio.sleep(self.delay_s)
        if self.action == "gone":
            raise RuntimeError("the client's form went away (timeout)")
        if self.action == "accept":
            return types.ElicitResult(action="accept", content={"decision": "approve"})
        return types.ElicitResult(action=self.action)


def _client_kwargs(mode: str, human: Callable[..., Any] | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"mode": mode}
    if human is not None:  # no callback: the client declares no elicitation capability
        kwargs["elicitation_callback"] = human
    return kwargs


@contextlib.asynccontextmanager
async def http_client(
    url: str,
    token: str | None,
    mode: str,
    *,
    human: Callable[..., Any] | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[Client]:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    with anyio.fail_after(CALL_DEADLINE_S):
        async with httpx2.AsyncClient(
            headers=sent, timeout=httpx2.Timeout(30, read=CALL_DEADLINE_S)
        ) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, **_client_kwargs(mode, human)) as client:
                yield client


@contextlib.asynccontextmanager
async def stdio_client_for(
    home: StdioHome,
    token: str | None,
    mode: str,
    *,
    human: Human | None = None,
    errlog: TextIO | None = None,
) -> AsyncIterator[Client]:
    with contextlib.ExitStack() as files:
        log = errlog or files.enter_context(home.stderr_log().open("w", encoding="utf-8"))
        with anyio.fail_after(CALL_DEADLINE_S):
            transport = stdio_client(home.params(token), errlog=log)
            async with Client(transport, **_client_kwargs(mode, human)) as client:
                yield client


def find_protocol_error(error: BaseException) -> MCPError | None:
    """The ``MCPError`` inside an exception (possibly wrapped in exception groups)."""
    if isinstance(error, MCPError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = find_protocol_error(inner)
            if found is not None:
                return found
    return None


async def protocol_error(attempt: Callable[[], Any]) -> MCPError:
    """Run ``attempt`` (an async callable) and return the JSON-RPC error it ends with."""
    try:
        await attempt()
    except BaseException as error:
        found = find_protocol_error(error)
        if found is None:
            raise
        return found
    raise AssertionError("expected a JSON-RPC error, the call succeeded")


# -- envelopes ----------------------------------------------------------------------------------


def envelope(result: types.CallToolResult) -> dict[str, Any]:
    """The result envelope, after checking the text content repeats ``structuredContent``."""
    structured = result.structured_content
    assert isinstance(structured, dict), result
    assert len(result.content) == 1, result.content
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert json.loads(text.text) == structured
    assert result.is_error is (not structured["ok"])
    assert structured["auditId"]
    return structured


def ok_value(result: types.CallToolResult) -> dict[str, Any]:
    env = envelope(result)
    assert env["ok"], env
    assert env["output"]["schema_version"] == 1
    value: dict[str, Any] = env["output"]["value"]
    return value


def error_code(result: types.CallToolResult) -> str:
    env = envelope(result)
    assert not env["ok"], env
    code: str = env["error"]["code"]
    return code


def audit_entries(data_dir: Path, audit_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The audit lines of the calls ``audit_ids`` in ``data_dir``'s audit log, by id (each
    call writes exactly one)."""
    found: dict[str, dict[str, Any]] = {}
    for line in audit_lines(data_dir / AUDIT_FILE):
        if line.strip() and (entry := json.loads(line))["audit_id"] in audit_ids:
            assert entry["audit_id"] not in found, entry
            found[entry["audit_id"]] = entry
    assert set(found) == audit_ids
    return found


def without_audit_id(env: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in env.items() if name != "auditId"}


# -- an agent's calls ---------------------------------------------------------------------------


def _ending(key: str, reason_ref: str) -> dict[str, str]:
    """The arguments a forget and a withdraw share: the idempotency key and the reason."""
    return {"idempotency_key": key, "reason_ref": reason_ref}


class Agent:
    """The six tools called through one client with the token's purpose."""

    def __init__(self, client: Client, purpose: str = PURPOSE) -> None:
        self.client = client
        self.purpose = purpose

    def capture_arguments(self, text: str, key: str | None = None) -> dict[str, Any]:
        arguments: dict[str, Any] = capture_args(
            text,
            key=key or new_key("capture"),
            valid_from=now_ms() - 60_000,
            purpose=self.purpose,
        )
        return arguments

    async def capture(self, text: str, key: str | None = None) -> types.CallToolResult:
        return await self.client.call_tool(CAPTURE, self.capture_arguments(text, key))

    async def admit(self, candidate_id: str, key: str | None = None) -> types.CallToolResult:
        arguments = {"candidate_id": candidate_id, "idempotency_key": key or new_key("admit")}
        return await self.client.call_tool(ADMIT, arguments)

    async def captured(self, text: str) -> str:
        value = ok_value(await self.capture(text))
        assert value["status"] == "committed_pending", value
        candidate_id: str = value["candidate_id"]
        return candidate_id

    async def remember(self, text: str) -> str:
        """Capture and admit; the record id."""
        outcome = ok_value(await self.admit(await self.captured(text)))["outcome"]
        assert outcome["status"] == "accepted", outcome
        record_id: str = outcome["record_id"]
        return record_id

    async def search(self, query: str, **options: Any) -> types.CallToolResult:
        arguments = {"query": query, "purpose_ref": self.purpose, **options}
        return await self.client.call_tool(SEARCH, arguments)

    async def found(self, query: str) -> list[str]:
        """Record ids of every page of a search."""
        ids: list[str] = []
        cursor: str | None = None
        while True:
            options: dict[str, Any] = {"limit": 50}
            if cursor is not None:
                options["page_cursor"] = cursor
            value = ok_value(await self.search(query, **options))
            ids.extend(packet["record"]["record_id"] for packet in value["records"])
            cursor = value.get("next_page_cursor")
            if cursor is None:
                return ids

    async def get(self, record_id: str) -> types.CallToolResult:
        return await self.client.call_tool(
            GET, {"record_id": record_id, "purpose_ref": self.purpose}
        )

    def forget_arguments(self, record_id: str, key: str | None = None) -> dict[str, Any]:
        return {"record_id": record_id, **_ending(key or new_key("forget"), "reason:obsolete")}

    async def forget(self, record_id: str, key: str | None = None) -> types.CallToolResult:
        return await self.client.call_tool(FORGET, self.forget_arguments(record_id, key))

    def withdraw_arguments(self, candidate_id: str, key: str | None = None) -> dict[str, Any]:
        ending = _ending(key or new_key("withdraw"), "reason:captured-by-mistake")
        return {"candidate_id": candidate_id, **ending}

    async def withdraw(self, candidate_id: str, key: str | None = None) -> types.CallToolResult:
        return await self.client.call_tool(WITHDRAW, self.withdraw_arguments(candidate_id, key))


# -- a client that declares URL-only elicitation (the approval page) ----------------------------

URL_ELICITATION_REQUIRED = -32042


class UrlOnlySession(ClientSession):
    """The SDK's session, declaring URL-mode elicitation and not form mode (the SDK declares
    both whenever it has an elicitation callback)."""

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        declared = super()._build_capabilities(version)
        return declared.model_copy(
            update={
                "elicitation": types.ElicitationCapability(url=types.UrlElicitationCapability())
            }
        )


class UrlOnlyClient(Client):
    async def _build_session(self, exit_stack: contextlib.AsyncExitStack) -> ClientSession:
        session = await super()._build_session(exit_stack)
        session.__class__ = UrlOnlySession
        return session


@contextlib.asynccontextmanager
async def url_only_client(
    url: str, token: str, mode: str, callback: ElicitationFnT | None = None
) -> AsyncIterator[Client]:
    """A client declaring URL-only elicitation; ``callback`` answers 2026-07-28 URL requests."""

    async def unanswered(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        return types.ElicitResult(action="cancel")

    with anyio.fail_after(CALL_DEADLINE_S):
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=CALL_DEADLINE_S),
        ) as http:
            transport = streamable_http_client(url, http_client=http)
            async with UrlOnlyClient(
                transport, mode=mode, elicitation_callback=callback or unanswered
            ) as client:
                declared = client.session._build_capabilities("2025-11-25")
                assert declared.elicitation is not None and declared.elicitation.form is None
                yield client


@contextlib.asynccontextmanager
async def new_agent(
    service: HttpService,
    mode: str,
    human: ElicitationFnT | None = None,
    *,
    url_only: bool = False,
    **claims: Any,
) -> AsyncIterator[Agent]:
    """An agent in a fresh workspace of the HTTP service, its token minted with ``claims``
    (``tools``, ``confirm``, ``principal``, ...); ``human`` answers its elicitations, on a client
    that declares URL-only elicitation with ``url_only``."""
    token = service.tokens.mint(workspace=new_workspace(), **claims)
    if url_only:
        opened = url_only_client(service.url, token, mode, human)
    else:
        opened = http_client(service.url, token, mode, human=human)
    async with opened as client:
        yield Agent(client, purpose=claims.get("purpose", PURPOSE))


async def link_of(attempt: Callable[[], Any]) -> str:
    """The 2025-11-25 answer to a gated call: -32042 with one URL elicitation; its link."""
    error = await protocol_error(attempt)
    assert error.code == URL_ELICITATION_REQUIRED, error
    data = error.error.data
    assert isinstance(data, dict), error
    (elicitation,) = data["elicitations"]
    assert elicitation["mode"] == "url"
    link: str = elicitation["url"]
    return link


def approval_id_of(link: str) -> str:
    return urlparse(link).path.rsplit("/", 1)[-1]


async def page_answer(link: str, decision: str, code: str | None) -> httpx2.Response:
    """What a browser does: GET the page, POST its form with the chosen button (and the code
    typed in, when the person has it); the answer's page."""
    from bs4 import BeautifulSoup, Tag

    async with httpx2.AsyncClient() as http:
        page = await http.get(link)
        hidden = BeautifulSoup(page.text, "html.parser").find("input", attrs={"name": "csrf_token"})
        assert isinstance(hidden, Tag), page.text
        form = {"csrf_token": str(hidden["value"]), "decision": decision}
        return await http.post(
            link,
            data=form if code is None else {**form, "code": code},
            headers={"Origin": link.split("/approvals")[0], "Sec-Fetch-Site": "same-origin"},
        )


def terminal_code(service: HttpService, approval_id: str) -> str:
    """The question's one-time code, as the operator's terminal shows it (the server's stderr,
    ``engram-memory approvals list``): read from the data directory's book, never the agent's."""
    row = service.server.approvals.book.get(approval_id)
    assert row is not None and row.code, approval_id
    return f"{row.code[:4]}-{row.code[4:]}"


def age_approval(
    service: HttpService, approval_id: str, ms: int, *, answer_too: bool = False
) -> None:
    """Move a question's asking (and its answer) ``ms`` into the past: the server's clock is the
    real one, so the 300 s and 30 s windows are crossed by editing the book's row."""
    answered = ", answered_at_ms = answered_at_ms - ?" if answer_too else ""
    args = (ms, ms, approval_id) if answer_too else (ms, approval_id)
    with contextlib.closing(sqlite3.connect(service.server.approvals.book.path)) as db, db:
        db.execute(
            f"UPDATE approvals SET issued_at_ms = issued_at_ms - ?{answered} WHERE approval_id = ?",
            args,
        )


# The suite's fixtures (``conftest.py`` re-exports them). Both servers are per session, so under
# xdist each worker gets its own data directories and its own free port; tests keep apart from
# each other by using a fresh workspace.


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def http_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpService]:
    with serve_http(tmp_path_factory.mktemp("engram-http")) as service:
        yield service


@pytest.fixture(scope="session")
def stdio_home(tmp_path_factory: pytest.TempPathFactory) -> StdioHome:
    return prepare_stdio_home(
        tmp_path_factory.mktemp("engram-stdio"), tmp_path_factory.mktemp("stdio-logs")
    )
