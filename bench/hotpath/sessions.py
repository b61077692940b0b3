"""One measured session against one server: start + connect, then pings, searches, gets, writes.

Three servers, each a separate process driven by the official ``mcp`` client (initialize
handshake, revision 2025-11-25, on every one so the call paths compare):

- ``engram-stdio``: ``engram-memory serve --stdio`` launched by the client, token in ENGRAM_TOKEN;
- ``engram-http``: ``engram-memory serve --port P`` (Streamable HTTP on 127.0.0.1), bearer token;
- ``server-memory``: ``node .../server-memory/dist/index.js`` launched by the client;
- ``floor-stdio`` and ``floor-http``: the bare SDK server of ``bench.hotpath.floor`` answering our
  tools with our payloads, on each transport, driven by the same client code as ours;
- ``engine``: no server and no client, ``Engine.handle`` in process on the same plan
  (``bench.hotpath.inprocess.engine_session``): the engine's own share of each call.

Each session starts on a fresh copy of the seeded store, so every repetition sees the same data.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from bench import harness
from bench.harness import engram_cli
from bench.locomo.calls import PRINCIPAL, PURPOSE

from .corpus import SEARCH_LIMIT, Memory
from .floor import PAYLOADS
from .stores import DATA, PEER_FILE, WORKSPACE, SeededStore

ENGRAM_STDIO = "engram-stdio"
ENGRAM_HTTP = "engram-http"
# The stdio server with host.json's search.time_aware false: the ranking before time-aware
# search (engine/temporal.py), measured beside it to read what the feature costs.
ENGRAM_STDIO_NOTIME = "engram-stdio-notime"
# The stdio server with the host's default admission policy, its quality gate on (the seeded
# stores and the other servers run with it off: the corpus repeats its turns on purpose), so
# the write pair's cost with the gate comparing each candidate to its neighbours is read beside.
ENGRAM_STDIO_GATE = "engram-stdio-gate"
PEER = "server-memory"
FLOOR_STDIO = "floor-stdio"
FLOOR_HTTP = "floor-http"
ENGINE = "engine"
# The floor that each of our servers is split against (``runner.split``).
FLOOR_OF = {
    ENGRAM_STDIO: FLOOR_STDIO,
    ENGRAM_STDIO_NOTIME: FLOOR_STDIO,
    ENGRAM_STDIO_GATE: FLOOR_STDIO,
    ENGRAM_HTTP: FLOOR_HTTP,
}
WARM_UP_CALLS = 2  # per tool, not timed: the first calls of a process pay its lazy imports
START_DEADLINE_S = 120.0
CALL_DEADLINE_S = 120.0
PEER_PACKAGE = Path(__file__).parent / "node_modules/@modelcontextprotocol/server-memory"
REPO = Path(__file__).resolve().parents[2]  # the floor server runs as ``python -m`` from here


@dataclass(frozen=True)
class Plan:
    """What one session does (identical for every server)."""

    pings: int
    queries: Sequence[str]
    gets: Sequence[Memory]  # seeded memories to read back
    writes: Sequence[Memory]  # new memories to write
    ten: Sequence[Memory]  # 10 seeded memories: server-memory's 10-memory response (open_nodes)
    run_id: str  # makes the writes' idempotency keys unique
    floor_payloads: Path | None = None  # what the floor servers answer (``floor.write_payloads``)
    # New memories written before the timed writes, not timed: the first write of a process pays
    # its lazy imports (ours: the Encryption SDK at the first sealed candidate, ~0.4 s of CPU).
    warm_writes: Sequence[Memory] = ()


@dataclass
class Session:
    """The raw figures of one session (milliseconds unless named otherwise)."""

    server: str
    start_connect_s: float = 0.0
    ping_ms: list[float] = field(default_factory=list)
    search_ms: list[float] = field(default_factory=list)
    search_results: list[int] = field(default_factory=list)
    get_ms: list[float] = field(default_factory=list)
    write_pair_ms: list[float] = field(default_factory=list)
    first_write_ms: list[float] = field(default_factory=list)  # capture / create_entities alone
    envelope: dict[str, int] = field(default_factory=dict)
    rank_profiles: set[str] = field(default_factory=set)  # what our searches' receipts say ran
    # CPU of the server's process per call, mean over each timed phase ("search", "get",
    # "pair"), and all of it until it answered tools/list ("start"): on a shared machine the
    # wall clock also measures the neighbours, CPU much less.
    cpu_ms: dict[str, float] = field(default_factory=dict)


class ProcessCpu:
    """CPU time (user + system, every thread, from ``/proc/<pid>/stat``) of a process: the
    server this process started (its only child), or None where there is no ``/proc``. The
    kernel counts in clock ticks (10 ms at 100 Hz): a phase's mean is exact to ticks / calls."""

    _TICK_MS = 1000 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10.0

    def __init__(self, pid: int) -> None:
        self._stat = Path(f"/proc/{pid}/stat")

    @classmethod
    def of_child(cls) -> ProcessCpu | None:
        me = os.getpid()
        found = set()
        for children in Path(f"/proc/{me}/task").glob("*/children"):
            found |= {int(pid) for pid in children.read_text().split()}
        return cls(found.pop()) if len(found) == 1 else None

    def ms(self) -> float:
        return sum(self.user_system_ms())

    def user_system_ms(self) -> tuple[float, float]:
        """User and system CPU, apart."""
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) * self._TICK_MS, int(fields[12]) * self._TICK_MS  # utime, stime


def cpu_per_call(cpu: ProcessCpu | None, since: float, calls: int) -> float:
    """Mean CPU per call of a phase that began at ``since`` (``ProcessCpu.ms``); 0 unknown."""
    return round((cpu.ms() - since) / calls, 3) if cpu is not None and calls else 0.0


def mint_token(data_dir: Path, port: int | None = None) -> str:
    """The bench agent's token from the data directory's own issuer (``bench.harness``)."""
    return harness.mint_token(
        data_dir, principal=PRINCIPAL, workspace=WORKSPACE, purpose=PURPOSE, port=port
    )


def response_bytes(result: CallToolResult) -> int:
    """Bytes of the JSON-RPC response that carried ``result`` (compact JSON, as both servers send)."""
    message = {
        "jsonrpc": "2.0",
        "id": 0,
        "result": result.model_dump(mode="json", by_alias=True, exclude_unset=True),
    }
    return len(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode())


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


# -- the servers --------------------------------------------------------------------------------


class Server:
    """How to reach one server and how its tools map to the benchmark's operations."""

    name: str

    def __init__(self) -> None:
        self.rank_profiles: set[str] = set()  # the profiles our searches' rank receipts name

    def prepare(self, workdir: Path) -> None:
        """What the client side does before the start + connect clock runs (tokens, paths)."""

    def connect(
        self, workdir: Path, store: SeededStore
    ) -> contextlib.AbstractAsyncContextManager[Client]:
        raise NotImplementedError

    async def write(self, client: Client, memory: Memory, run_id: str) -> float:
        """Write one memory (two calls); returns the first call's milliseconds."""
        raise NotImplementedError

    async def search(self, client: Client, query: str) -> tuple[CallToolResult, int]:
        """One search; the result and how many memories it returned."""
        raise NotImplementedError

    async def get(self, client: Client, memory: Memory, record_id: str) -> CallToolResult:
        raise NotImplementedError

    async def ten_records(
        self, client: Client, search: CallToolResult | None, memories: Sequence[Memory]
    ) -> tuple[CallToolResult, int] | None:
        """A response carrying 10 memories and the memory text bytes it carries.

        ``search`` is the first measured search that returned 10 records, if any; None when
        there is no such response.
        """
        raise NotImplementedError


def _ok_value(result: CallToolResult, what: str) -> dict[str, Any]:
    envelope = result.structured_content
    if not isinstance(envelope, dict) or not envelope.get("ok"):
        code = envelope.get("error", {}).get("code") if isinstance(envelope, dict) else None
        raise RuntimeError(f"{what} failed: {code or result.content}")
    found: dict[str, Any] = envelope["output"]["value"]
    return found


def record_text_bytes(record: dict[str, Any]) -> int:
    return sum(len(c.get("text", "").encode()) for c in record.get("components") or ())


class Engram(Server):
    # Whether an admission must accept: with the quality gate on, a memory whose turn the store
    # already holds (the corpus cycles its turns) is held for a person, as it would be.
    only_accepted = True

    def prepare(self, workdir: Path) -> None:
        self.command = engram_cli()
        self.token = mint_token(workdir / DATA)

    async def write(self, client: Client, memory: Memory, run_id: str) -> float:
        from engram_memory.mcp_surface.catalog import TOOL_NAMES

        started = time.perf_counter()
        captured = _ok_value(
            await client.call_tool(TOOL_NAMES["capture"], memory.capture_arguments(run_id)),
            "capture",
        )
        first = _ms_since(started)
        admission = memory.admission_arguments(captured["candidate_id"], run_id)
        admitted = _ok_value(
            await client.call_tool(TOOL_NAMES["request_admission"], admission), "admission"
        )
        if self.only_accepted and admitted["outcome"]["status"] != "accepted":
            raise RuntimeError(f"admission: {admitted['outcome']['status']}")
        return first

    async def search(self, client: Client, query: str) -> tuple[CallToolResult, int]:
        from engram_memory.mcp_surface.catalog import TOOL_NAMES

        arguments = {"query": query, "purpose_ref": PURPOSE, "limit": SEARCH_LIMIT}
        result = await client.call_tool(TOOL_NAMES["search"], arguments)
        found = _ok_value(result, "search")
        receipt = found["rank_receipt"]
        self.rank_profiles.add(f"{receipt['profile']}@{receipt['profile_version']}")
        return result, len(found["records"])

    async def get(self, client: Client, memory: Memory, record_id: str) -> CallToolResult:
        from engram_memory.mcp_surface.catalog import TOOL_NAMES

        arguments = {"record_id": record_id, "purpose_ref": PURPOSE}
        result = await client.call_tool(TOOL_NAMES["get"], arguments)
        _ok_value(result, "get")
        return result

    async def ten_records(
        self, client: Client, search: CallToolResult | None, memories: Sequence[Memory]
    ) -> tuple[CallToolResult, int] | None:
        if search is None:
            return None
        packets = _ok_value(search, "search")["records"]
        return search, sum(record_text_bytes(p["record"]) for p in packets)


class EngramStdio(Engram):
    name = ENGRAM_STDIO

    @contextlib.asynccontextmanager
    async def connect(self, workdir: Path, store: SeededStore) -> AsyncIterator[Client]:
        params = StdioServerParameters(
            command=self.command,
            args=["serve", "--stdio", "--data-dir", str(workdir / DATA)],
            env={"ENGRAM_TOKEN": self.token},
        )
        async with harness.stdio_session(params, workdir / "stderr.log") as client:
            yield client


def _edit_host_json(workdir: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    host_json = workdir / DATA / "host.json"
    config = json.loads(host_json.read_text(encoding="utf-8"))
    edit(config)
    host_json.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


class EngramStdioUntimed(EngramStdio):
    name = ENGRAM_STDIO_NOTIME

    def prepare(self, workdir: Path) -> None:
        super().prepare(workdir)
        _edit_host_json(
            workdir, lambda config: config.setdefault("search", {}).update(time_aware=False)
        )


class EngramStdioGated(EngramStdio):
    name = ENGRAM_STDIO_GATE
    only_accepted = False

    def prepare(self, workdir: Path) -> None:
        super().prepare(workdir)
        _edit_host_json(workdir, lambda config: config.pop("admission", None))


class EngramHttp(Engram):
    name = ENGRAM_HTTP

    def prepare(self, workdir: Path) -> None:
        self.command = engram_cli()
        self.port = harness.free_port()
        self.token = mint_token(workdir / DATA, self.port)

    def connect(
        self, workdir: Path, store: SeededStore
    ) -> contextlib.AbstractAsyncContextManager[Client]:
        return engram_over_http(self.command, workdir / DATA, self.port, self.token, workdir)


def engram_over_http(
    cli: str, data_dir: Path, port: int, token: str, workdir: Path
) -> contextlib.AbstractAsyncContextManager[Client]:
    """``cli serve --port`` on ``data_dir`` (its log in ``workdir``), connected with the official
    client over Streamable HTTP, sending ``token``."""
    command = [cli, "serve", "--port", str(port), "--data-dir", str(data_dir)]
    return _http_client(command, port, workdir, {"Authorization": f"Bearer {token}"})


class FloorStdio(Engram):
    """The floor on stdio: the same client calls as ours, answered by the bare SDK server."""

    name = FLOOR_STDIO

    def prepare(self, workdir: Path) -> None:
        self.argv = [sys.executable, "-m", "bench.hotpath.floor", "--payloads"]
        self.argv.append(str(workdir / PAYLOADS))

    @contextlib.asynccontextmanager
    async def connect(self, workdir: Path, store: SeededStore) -> AsyncIterator[Client]:
        params = StdioServerParameters(
            command=self.argv[0], args=[*self.argv[1:], "--stdio"], cwd=REPO
        )
        async with harness.stdio_session(params, workdir / "stderr.log") as client:
            yield client


class FloorHttp(FloorStdio):
    name = FLOOR_HTTP

    @contextlib.asynccontextmanager
    async def connect(self, workdir: Path, store: SeededStore) -> AsyncIterator[Client]:
        port = harness.free_port()
        async with _http_client([*self.argv, "--port", str(port)], port, workdir, {}) as client:
            yield client


@contextlib.asynccontextmanager
async def _http_client(
    command: list[str], port: int, workdir: Path, headers: dict[str, str]
) -> AsyncIterator[Client]:
    """Start ``command`` (a server on 127.0.0.1:``port``, its output in server.log), wait for
    its port, and connect the official client over Streamable HTTP with ``headers``."""
    with (workdir / "server.log").open("w", encoding="utf-8") as log:
        process = subprocess.Popen(  # noqa: S603 - our console script or our own bench module
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            await _wait_for_port(port, process)
            async with (
                httpx2.AsyncClient(
                    headers=headers, timeout=httpx2.Timeout(CALL_DEADLINE_S)
                ) as http,
                Client(
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http),
                    mode="legacy",
                ) as client,
            ):
                yield client
        finally:
            _stop(process)


class ServerMemory(Server):
    name = PEER

    def prepare(self, workdir: Path) -> None:
        self.node = shutil.which("node") or "node"

    @contextlib.asynccontextmanager
    async def connect(self, workdir: Path, store: SeededStore) -> AsyncIterator[Client]:
        params = StdioServerParameters(
            command=self.node,
            args=[str(PEER_PACKAGE / "dist" / "index.js")],
            env={"MEMORY_FILE_PATH": str(workdir / PEER_FILE)},
        )
        async with harness.stdio_session(params, workdir / "stderr.log") as client:
            yield client

    async def write(self, client: Client, memory: Memory, run_id: str) -> float:
        started = time.perf_counter()
        _check(await client.call_tool("create_entities", {"entities": [memory.peer_entity()]}))
        first = _ms_since(started)
        observations = {"observations": [memory.peer_observation()]}
        _check(await client.call_tool("add_observations", observations))
        return first

    async def search(self, client: Client, query: str) -> tuple[CallToolResult, int]:
        result = _check(await client.call_tool("search_nodes", {"query": query}))
        return result, len((result.structured_content or {}).get("entities", []))

    async def get(self, client: Client, memory: Memory, record_id: str) -> CallToolResult:
        result = _check(await client.call_tool("open_nodes", {"names": [memory.key]}))
        if len((result.structured_content or {}).get("entities", [])) != 1:
            raise RuntimeError(f"open_nodes did not find {memory.key}")
        return result

    async def ten_records(
        self, client: Client, search: CallToolResult | None, memories: Sequence[Memory]
    ) -> tuple[CallToolResult, int]:
        # Its search matches a whole query as one substring: LoCoMo questions find nothing, so
        # its 10-memory response is open_nodes of 10 names.
        names = [m.key for m in memories[:SEARCH_LIMIT]]
        result = _check(await client.call_tool("open_nodes", {"names": names}))
        entities = (result.structured_content or {}).get("entities", [])
        if len(entities) != SEARCH_LIMIT:
            raise RuntimeError(f"open_nodes returned {len(entities)} entities")
        return result, sum(len(o.encode()) for e in entities for o in e["observations"])


def _check(result: CallToolResult) -> CallToolResult:
    if result.is_error:
        raise RuntimeError(f"server-memory call failed: {result.content}")
    return result


async def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the HTTP server exited with {process.returncode} before serving")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start in time") from None
            await anyio.sleep(0.01)
            continue
        await stream.aclose()
        return


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the server closes its store cleanly on it), then kill if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


SERVERS: dict[str, Callable[[], Server]] = {
    ENGRAM_STDIO: EngramStdio,
    ENGRAM_STDIO_NOTIME: EngramStdioUntimed,
    ENGRAM_STDIO_GATE: EngramStdioGated,
    ENGRAM_HTTP: EngramHttp,
    FLOOR_STDIO: FloorStdio,
    FLOOR_HTTP: FloorHttp,
    PEER: ServerMemory,
}


# -- one session --------------------------------------------------------------------------------


def prepare_workdir(workdir: Path, store: SeededStore, server: str, plan: Plan) -> None:
    """A fresh copy of the seeded store for one session (the floor's: its payloads)."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    if server == PEER:
        shutil.copy2(store.peer_file, workdir / PEER_FILE)
    elif server in (FLOOR_STDIO, FLOOR_HTTP):
        if plan.floor_payloads is None:
            raise RuntimeError("the floor servers need the plan's floor_payloads")
        shutil.copy2(plan.floor_payloads, workdir / PAYLOADS)
    else:
        shutil.copytree(store.data_dir, workdir / DATA)
        os.chmod(workdir / DATA, 0o700)


def run_session(server_name: str, workdir: Path, store: SeededStore, plan: Plan) -> Session:
    prepare_workdir(workdir, store, server_name, plan)
    if server_name == ENGINE:
        return _engine_child(workdir, store, plan)
    return anyio.run(_measure, SERVERS[server_name](), workdir, store, plan)


def _engine_child(workdir: Path, store: SeededStore, plan: Plan) -> Session:
    """The engine's session (``inprocess.engine_session``) in a fresh process of its own, as
    each server is: not in this one, whose heap (the corpus, the client) its collections would
    walk."""
    task = workdir / "engine-session.pickle"
    task.write_bytes(pickle.dumps((store, plan)))
    done = subprocess.run(  # noqa: S603 - this interpreter on the bench's own module
        [sys.executable, "-m", "bench.hotpath.inprocess", "--session", str(task)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the engine session failed:\n{done.stderr[-4000:]}")
    fields = json.loads(done.stdout.strip().splitlines()[-1])
    return Session(**fields | {"rank_profiles": set(fields["rank_profiles"])})


async def _measure(server: Server, workdir: Path, store: SeededStore, plan: Plan) -> Session:
    session = Session(server.name)
    server.prepare(workdir)
    started = time.perf_counter()
    with anyio.fail_after(START_DEADLINE_S + CALL_DEADLINE_S * 10):
        async with server.connect(workdir, store) as client:
            await client.list_tools()
            session.start_connect_s = time.perf_counter() - started
            cpu = ProcessCpu.of_child()
            session.cpu_ms["start"] = cpu.ms() if cpu is not None else 0.0  # all it did so far
            for _ in range(plan.pings):
                begun = time.perf_counter()
                await client.send_ping()
                session.ping_ms.append(_ms_since(begun))
            ten = await _reads(server, client, store, plan, session, cpu)
            carried = await server.ten_records(client, ten, plan.ten)
            if carried is not None:
                carrier, text = carried
                session.envelope = {"response_bytes": response_bytes(carrier), "text_bytes": text}
            for memory in plan.warm_writes:
                await server.write(client, memory, plan.run_id)
            since = cpu.ms() if cpu is not None else 0.0
            for memory in plan.writes:
                begun = time.perf_counter()
                session.first_write_ms.append(await server.write(client, memory, plan.run_id))
                session.write_pair_ms.append(_ms_since(begun))
            session.cpu_ms["pair"] = cpu_per_call(cpu, since, len(plan.writes))
    return session


async def _reads(
    server: Server,
    client: Client,
    store: SeededStore,
    plan: Plan,
    session: Session,
    cpu: ProcessCpu | None,
) -> CallToolResult | None:
    """The warm-up calls, then the timed searches and gets; the first search that returned
    ``SEARCH_LIMIT`` records (the 10-record response), if any."""
    ids = store.record_ids
    for query in plan.queries[:WARM_UP_CALLS]:
        await server.search(client, query)
    for memory in plan.gets[:WARM_UP_CALLS]:
        await server.get(client, memory, ids[memory.index])
    ten: CallToolResult | None = None
    since = cpu.ms() if cpu is not None else 0.0
    for query in plan.queries:
        begun = time.perf_counter()
        result, count = await server.search(client, query)
        session.search_ms.append(_ms_since(begun))
        session.search_results.append(count)
        if ten is None and count == SEARCH_LIMIT:
            ten = result
    session.cpu_ms["search"] = cpu_per_call(cpu, since, len(plan.queries))
    session.rank_profiles = server.rank_profiles
    since = cpu.ms() if cpu is not None else 0.0
    for memory in plan.gets:
        begun = time.perf_counter()
        await server.get(client, memory, ids[memory.index])
        session.get_ms.append(_ms_since(begun))
    session.cpu_ms["get"] = cpu_per_call(cpu, since, len(plan.gets))
    return ten
