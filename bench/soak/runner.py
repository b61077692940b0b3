"""The soak run: server subprocess, clients, resource sampling and the report (see the package)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from engram_memory.embedded.data_dir import DATABASE_FILE
from engram_memory.mcp_surface.catalog import TOOL_NAMES

from .. import harness
from ..locomo.runner import percentile
from .flatness import judge

PURPOSE = "purpose:soak"
CLIENTS_PER_WORKSPACE = 4
CALL_DEADLINE_S = 60.0
REVISIONS = ("legacy", "2026-07-28")
# The traffic mix: relative weights. A tool that needs something the client does not have yet
# (admission without a pending candidate, get or forget without a record) falls back to capture
# or search.
MIX: dict[str, int] = {
    "search": 35,
    "capture": 25,
    "request_admission": 15,
    "get": 15,
    "withdraw": 5,
    "forget": 5,
}
# The read-only phase's tools: nothing in them writes, so the store stops growing and what RSS
# still gains there is a leak (bench/soak/flatness.py).
READ_ONLY_TOOLS = ("search", "get")
READ_ONLY_FRACTION = 0.3
MINUTE_S = 60.0
WORDS = [
    "deploy",
    "staging",
    "flag",
    "release",
    "train",
    "database",
    "writer",
    "reader",
    "index",
    "token",
    "purpose",
    "workspace",
    "backup",
    "key",
    "vault",
    "journal",
    "ledger",
    "cursor",
    "search",
    "ranking",
    "field",
    "weight",
    "record",
    "candidate",
    "admission",
    "policy",
    "audit",
    "retention",
    "window",
    "schema",
    "migration",
    "replica",
    "latency",
    "budget",
    "cache",
]


# -- the server process -------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    data_dir: Path

    def sample(self, elapsed_s: float) -> dict[str, Any]:
        """Open descriptors (all, and on ``engram.db*``), RSS and threads of the server now."""
        pid = self.process.pid
        fds = 0
        database_fds = 0
        database = str((self.data_dir / DATABASE_FILE).resolve())
        for fd in os.listdir(f"/proc/{pid}/fd"):
            fds += 1
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(database):
                    database_fds += 1
        status = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":" in line
        )
        return {
            "t_s": round(elapsed_s, 1),
            "fds": fds,
            "database_fds": database_fds,
            "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "threads": int(status["Threads"]),
        }


@contextlib.contextmanager
def running_server(
    data_dir: Path, log_dir: Path, *, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """``engram-memory serve`` as its own process (``bench.harness``), sampled as it runs."""
    with harness.running_server(data_dir, log_dir, env=env) as started:
        yield Server(url=started.url, process=started.process, data_dir=data_dir)


# -- one client's traffic -----------------------------------------------------------------------


@dataclass
class Tally:
    """Every call's tool, outcome and latency, shared by the clients (one event loop); the
    running counts of tool calls and of records added (accepted admissions), and each minute's
    latencies per tool (``minute`` is the call's end, in whole minutes since the start)."""

    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    by_minute_ms: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    calls: int = 0
    records: int = 0

    def add(self, tool: str, outcome: str, took_ms: float, minute: int = 0) -> None:
        self.latencies_ms.setdefault(tool, []).append(took_ms)
        by_outcome = self.outcomes.setdefault(tool, {})
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
        if tool != "session":
            self.calls += 1
            self.by_minute_ms.setdefault(minute, {}).setdefault(tool, []).append(took_ms)


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(text: str, key: str) -> dict[str, Any]:
    at = int(time.time() * 1000) - 60_000
    citation = {
        "citation_id": "citation:soak",
        "source_ref": "source:soak",
        "locator": {"scheme": "document", "value": key},
        "content_digest": _sha(text),
    }
    component = {
        "component_id": "component:note",
        "kind": "decision",
        "text": text,
        "citation_ids": ["citation:soak"],
    }
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": PURPOSE,
            "valid_time": {"t": at},
            "components": [component],
            "primary_component_id": "component:note",
            "primary_event": {"at": at, "type_ref": "event:noted", "citation_id": "citation:soak"},
            "citations": [citation],
        },
        "evidence": {
            "evidence_ref": "evidence:soak",
            "evidence_digest": _sha("evidence:" + text),
            "citation_ids": ["citation:soak"],
        },
    }


async def approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """The client's human: approves every withdraw and forget confirmation."""
    return types.ElicitResult(action="accept", content={"decision": "approve"})


@dataclass
class Agent:
    """One client's state: what it may admit, read, withdraw or forget next."""

    number: int
    rng: random.Random
    mix: dict[str, int] = field(default_factory=lambda: dict(MIX))
    pending: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    calls: int = 0
    # From this moment (``time.monotonic()``) on, only the read-only tools of ``mix``.
    read_only_at: float = float("inf")

    def current_mix(self) -> dict[str, int]:
        if time.monotonic() < self.read_only_at:
            return self.mix
        reads = {tool: weight for tool, weight in self.mix.items() if tool in READ_ONLY_TOOLS}
        return reads or {"search": MIX["search"]}

    def key(self, prefix: str) -> str:
        self.calls += 1
        return f"soak-{prefix}-{self.number:03d}-{self.calls:09d}-{self.rng.getrandbits(32):08x}"

    def next_call(self) -> tuple[str, dict[str, Any]]:
        mix = self.current_mix()
        tool = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        if tool in ("request_admission", "withdraw") and not self.pending:
            tool = "capture"
        if tool in ("get", "forget") and not self.records:
            tool = "search"
        if tool == "capture":
            text = " ".join(self.rng.choices(WORDS, k=12)) + f" (note {self.key('text')})"
            return tool, capture_arguments(text, self.key("capture"))
        if tool == "search":
            query = " ".join(self.rng.choices(WORDS, k=3))
            return tool, {"query": query, "purpose_ref": PURPOSE, "limit": 10}
        if tool == "get":
            return tool, {"record_id": self.rng.choice(self.records), "purpose_ref": PURPOSE}
        if tool == "request_admission":
            return tool, {"candidate_id": self.pending.pop(), "idempotency_key": self.key("admit")}
        reason = "reason:soak"
        if tool == "withdraw":
            candidate_id = self.pending.pop()
            key = self.key("withdraw")
            return tool, {
                "candidate_id": candidate_id,
                "idempotency_key": key,
                "reason_ref": reason,
            }
        record_id = self.records.pop(self.rng.randrange(len(self.records)))
        key = self.key("forget")
        return tool, {"record_id": record_id, "idempotency_key": key, "reason_ref": reason}

    def learn(self, tool: str, value: dict[str, Any]) -> bool:
        """Remember what the call made; True when it added a record."""
        if tool == "capture" and value.get("status") == "committed_pending":
            self.pending.append(value["candidate_id"])
        elif tool == "request_admission" and value["outcome"].get("status") == "accepted":
            self.records.append(value["outcome"]["record_id"])
            del self.records[:-200]
            return True
        return False


def outcome_of(result: types.CallToolResult) -> tuple[str, dict[str, Any] | None]:
    envelope = result.structured_content
    if not isinstance(envelope, dict):
        return "no_envelope", None
    if envelope.get("ok"):
        return "OK", envelope["output"]["value"]
    return str(envelope.get("error", {}).get("code", "no_code")), None


def _protocol_error(error: BaseException) -> MCPError | None:
    if isinstance(error, MCPError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _protocol_error(inner)
            if found is not None:
                return found
    return None


async def client_loop(
    url: str, token: str, mode: str, agent: Agent, began: float, deadline: float, tally: Tally
) -> None:
    """Call tools until ``deadline``; reconnect when a session breaks (counted as an error)."""
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        try:
            async with (
                httpx2.AsyncClient(
                    headers=headers, timeout=httpx2.Timeout(30, read=CALL_DEADLINE_S)
                ) as http,
                Client(
                    streamable_http_client(url, http_client=http),
                    mode=mode,
                    elicitation_callback=approve,
                ) as client,
            ):
                while time.monotonic() < deadline:
                    await _one_call(client, agent, began, tally)
        except Exception as error:
            tally.add("session", _error_name(error), 0.0)
            await anyio.sleep(1.0)


async def _one_call(client: Client, agent: Agent, began: float, tally: Tally) -> None:
    tool, arguments = agent.next_call()
    started = time.perf_counter()
    value: dict[str, Any] | None = None
    try:
        with anyio.fail_after(CALL_DEADLINE_S):
            result = await client.call_tool(TOOL_NAMES[tool], arguments)
        outcome, value = outcome_of(result)
    except Exception as error:
        protocol = _protocol_error(error)
        if protocol is None:
            raise
        outcome = f"jsonrpc:{protocol.code}"
    minute = int((time.monotonic() - began) // MINUTE_S)
    tally.add(tool, outcome, (time.perf_counter() - started) * 1000, minute)
    if value is not None and agent.learn(tool, value):
        tally.records += 1


def _error_name(error: BaseException) -> str:
    protocol = _protocol_error(error)
    if protocol is not None:
        return f"jsonrpc:{protocol.code}"
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _error_name(error.exceptions[0])
    return type(error).__name__


# -- the run ------------------------------------------------------------------------------------


async def _sampler(
    server: Server,
    began: float,
    deadline: float,
    every_s: float,
    tally: Tally,
    samples: list[dict[str, Any]],
) -> None:
    while True:
        now = time.monotonic()
        sample = server.sample(now - began)
        sample.update(calls=tally.calls, records=tally.records)
        samples.append(sample)
        if now >= deadline:
            return
        await anyio.sleep(min(every_s, max(0.0, deadline - now)))


@dataclass(frozen=True)
class Traffic:
    """What the clients send: the protocol revisions (client ``number`` uses
    ``revisions[number % len(revisions)]``) and the tool mix's weights."""

    revisions: tuple[str, ...] = REVISIONS
    mix: dict[str, int] = field(default_factory=lambda: dict(MIX))
    # The last part of the run (a fraction of its duration) sends only search and get.
    read_only_fraction: float = READ_ONLY_FRACTION


async def drive(
    server: Server, tokens: Sequence[str], seconds: float, seed: int, traffic: Traffic
) -> tuple[Tally, list[dict[str, Any]], float]:
    tally = Tally()
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    deadline = began + seconds
    read_only_at = deadline - seconds * traffic.read_only_fraction
    every_s = max(1.0, seconds / 60)
    async with anyio.create_task_group() as group:
        group.start_soon(_sampler, server, began, deadline, every_s, tally, samples)
        for number, token in enumerate(tokens):
            rng = random.Random(seed * 1000 + number)
            agent = Agent(number, rng, mix=dict(traffic.mix), read_only_at=read_only_at)
            mode = traffic.revisions[number % len(traffic.revisions)]
            group.start_soon(client_loop, server.url, token, mode, agent, began, deadline, tally)
    return tally, samples, time.monotonic() - began


def run_soak(
    *,
    seconds: float,
    clients: int,
    seed: int = 13,
    data_dir: Path | None = None,
    traffic: Traffic | None = None,
    server_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the soak and return its report (``report`` describes the fields). ``traffic`` narrows
    the revisions or tools (to isolate one); ``server_env`` goes to the server's environment."""
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="engram-soak-")))
        data = data_dir or scratch / "data"
        server = stack.enter_context(running_server(data, scratch, env=server_env))
        tokens = [
            harness.mint_token(
                data,
                principal=f"agent-soak-{number:03d}",
                workspace=f"ws-soak-{number // CLIENTS_PER_WORKSPACE:03d}",
                purpose=PURPOSE,
                confirm=("withdraw", "forget"),
                expires_in_s=int(seconds) + 3600,
            )
            for number in range(clients)
        ]
        traffic = traffic or Traffic()
        tally, samples, elapsed = anyio.run(drive, server, tokens, seconds, seed, traffic)
    read_only_from_s: float | None = seconds * (1 - traffic.read_only_fraction)
    if traffic.read_only_fraction <= 0:
        read_only_from_s = None
    return report(tally, samples, elapsed, clients, read_only_from_s=read_only_from_s)


def _phase(minute: int, read_only_from_s: float | None) -> str:
    if read_only_from_s is None or (minute + 1) * MINUTE_S <= read_only_from_s:
        return "mixed"
    return "read-only" if minute * MINUTE_S >= read_only_from_s else "both"


def per_minute(
    tally: Tally, samples: Sequence[dict[str, Any]], read_only_from_s: float | None
) -> list[dict[str, Any]]:
    """One row per minute (and one for the last part minute): the last sample of the minute
    (running calls and records, RSS, fds), the calls answered in it and each tool's p50 / p99."""
    rows: list[dict[str, Any]] = []
    last_minute = int(samples[-1]["t_s"] // MINUTE_S) if samples else -1
    for minute in range(last_minute + 1):
        inside = [s for s in samples if s["t_s"] < (minute + 1) * MINUTE_S]
        if not inside:
            continue
        sample = inside[-1]
        latencies = tally.by_minute_ms.get(minute, {})
        rows.append(
            {
                "minute": minute + 1,
                "t_s": sample["t_s"],
                "phase": _phase(minute, read_only_from_s),
                "calls": sample["calls"],
                "calls_in_minute": sum(len(values) for values in latencies.values()),
                "records": sample["records"],
                "rss_mb": sample["rss_mb"],
                "fds": sample["fds"],
                "tools": {
                    tool: {
                        "calls": len(values),
                        "p50_ms": round(percentile(values, 50), 1),
                        "p99_ms": round(percentile(values, 99), 1),
                    }
                    for tool, values in sorted(latencies.items())
                },
            }
        )
    return rows


def report(
    tally: Tally,
    samples: Sequence[dict[str, Any]],
    elapsed_s: float,
    clients: int,
    *,
    read_only_from_s: float | None = None,
) -> dict[str, Any]:
    """Throughput, per-tool calls / ok / p50 / p99, errors by code, resources at start/middle/end,
    the per-minute series and the flatness verdict (``bench.soak.flatness``).

    ``session`` counts broken client sessions (reconnected); it is not a tool and has no latency.
    ``read_only_from_s``: when the read-only phase began (None: the run had none).
    """
    tools: dict[str, Any] = {}
    errors: dict[str, int] = {}
    for tool in sorted(tally.outcomes):
        outcomes = tally.outcomes[tool]
        latencies = tally.latencies_ms.get(tool, [])
        calls = sum(outcomes.values())
        for outcome, count in outcomes.items():
            if outcome != "OK":
                errors[outcome] = errors.get(outcome, 0) + count
        if tool == "session":
            continue
        tools[tool] = {
            "calls": calls,
            "ok": outcomes.get("OK", 0),
            "p50_ms": round(percentile(latencies, 50), 1),
            "p99_ms": round(percentile(latencies, 99), 1),
        }
    calls = sum(entry["calls"] for entry in tools.values())
    middle = min(samples, key=lambda s: abs(s["t_s"] - elapsed_s / 2)) if samples else None
    return {
        "clients": clients,
        "duration_s": round(elapsed_s, 1),
        "calls": calls,
        "ok": sum(entry["ok"] for entry in tools.values()),
        "throughput_per_s": round(calls / elapsed_s, 2) if elapsed_s > 0 else 0.0,
        "tools": tools,
        "errors_by_code": dict(sorted(errors.items())),
        "read_only_from_s": None if read_only_from_s is None else round(read_only_from_s, 1),
        "series": per_minute(tally, samples, read_only_from_s),
        "flatness": judge(samples, elapsed_s, read_only_from_s),
        "server": {
            "start": samples[0] if samples else None,
            "middle": middle,
            "end": samples[-1] if samples else None,
            "samples": list(samples),
        },
    }


def table(result: dict[str, Any]) -> str:
    """A short human-readable summary of a report."""
    lines = [
        f"{result['clients']} clients, {result['duration_s']} s: {result['calls']} calls "
        f"({result['ok']} ok), {result['throughput_per_s']} calls/s",
        f"{'tool':<18}{'calls':>8}{'ok':>8}{'p50 ms':>10}{'p99 ms':>10}",
    ]
    for tool, entry in result["tools"].items():
        lines.append(
            f"{tool:<18}{entry['calls']:>8}{entry['ok']:>8}"
            f"{entry['p50_ms']:>10}{entry['p99_ms']:>10}"
        )
    lines.append("errors by code: " + (json.dumps(result["errors_by_code"]) or "{}"))
    for moment in ("start", "middle", "end"):
        sample = result["server"][moment]
        if sample is not None:
            lines.append(
                f"server at {moment:<6} (t={sample['t_s']} s): {sample['fds']} fds "
                f"({sample['database_fds']} on engram.db*), RSS {sample['rss_mb']} MB, "
                f"{sample['threads']} threads"
            )
    read_only = result["read_only_from_s"]
    lines.append(
        "read-only phase (search and get only): "
        + ("none" if read_only is None else f"from t={read_only} s to the end")
    )
    lines.append(
        f"{'minute':>6} {'phase':<10}{'calls':>8}{'in min':>8}{'records':>9}{'RSS MB':>8}{'fds':>5}"
    )
    for row in result["series"]:
        lines.append(
            f"{row['minute']:>6} {row['phase']:<10}{row['calls']:>8}{row['calls_in_minute']:>8}"
            f"{row['records']:>9}{row['rss_mb']:>8}{row['fds']:>5}"
        )
    flatness = result["flatness"]
    lines.append(f"flatness (warm-up ended at t={flatness['warmup_end_s']} s):")
    lines.extend("  " + line for line in flatness["lines"])
    return "\n".join(lines)
