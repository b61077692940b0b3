"""The audit line of a mutation rides in the store's commit (issue 39, item 3): crash drills.

A committed mutation's line is an ``audit_line`` outbox item in the same SQLite transaction as
the mutation (one sync for both); the audit log appends it without a sync of its own, syncs such
lines together, and the engine then drops their items (``engine.ports.CommittedAuditLog``). A
real engine in a child process makes capture + admission pairs and is killed (SIGKILL) at every
step of that path: before its commit, after the commit before the append, after the append
before any sync, after the sync before the items are dropped (together, in one transaction),
after they were dropped, and after all of it. A fourth drill also loses what the killed process appended unsynced (a power cut: the
file cut back to its last sync). Reopened and drained, the audit log holds exactly one line per
call that answered or committed, none for the call that did not commit, no line twice, and every
journal still verifies.

The race between a committer and a drainer in another process (the drainer appends the line of
a commit whose committer has not appended it yet) is played in one process with two hosts on one
data directory: the line is written once.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.local.audit import SETTLE_LINES, JsonlAuditLog, audit_lines
from engram_memory.embedded.composition import open_embedded
from engram_memory.operator_plane.repair import verify_all

from engram_testing import TENANT, WORKSPACE, capture_args, context, killed_child

AUDIT_FILE = "audit.log"
PAIRS = 3

_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from dataclasses import replace
    from pathlib import Path

    from engram_memory.adapters.local import audit as audit_module
    from engram_memory.adapters.local.sqlite.store import SqliteStore
    from engram_memory.embedded.composition import open_embedded
    from engram_testing import capture_args, context

    data_dir, crash, pairs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    host = open_embedded(data_dir)
    calls = 0
    armed = False

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def after_calls(original):
        def wrapped(*args, **kwargs):
            if armed:
                die()
            return original(*args, **kwargs)
        return wrapped

    store_commit = SqliteStore.commit
    follow = audit_module.JsonlAuditLog.follow
    done = SqliteStore.outbox_done_all
    if crash == "before-commit":
        SqliteStore.commit = after_calls(store_commit)
    elif crash == "before-append":
        audit_module.JsonlAuditLog.follow = after_calls(follow)
    elif crash == "after-append":
        def follow_then_die(self, item, owed):
            follow(self, item, owed)
            if armed:
                print(json.dumps({"appended": item.item_id}), flush=True)
                die()
        audit_module.JsonlAuditLog.follow = follow_then_die
    elif crash in ("mid-settle", "after-drop"):
        def done_then_die(self, items):
            lines = armed and any(item.kind == "audit_line" for item in items)
            if lines and crash == "mid-settle":
                print(json.dumps({"dying": crash}), flush=True)
                die()
            done(self, items)
            if lines:
                print(json.dumps({"dying": crash}), flush=True)
                die()
        SqliteStore.outbox_done_all = done_then_die

    def call(tool, arguments):
        ctx = context()
        print(json.dumps({"calling": ctx.audit_id, "tool": tool}), flush=True)
        envelope = host.call(tool, arguments, ctx)
        print(json.dumps({"answered": ctx.audit_id}), flush=True)
        return envelope

    facts = [
        "The backup job runs at three in the morning on weekdays.",
        "Invoices for the Lisbon office are approved by the finance lead.",
        "Our staging cluster uses spot instances to keep its bill low.",
    ]
    for n in range(pairs):
        armed = n == pairs - 1 and crash != "after-settle"
        captured = call("capture", capture_args(facts[n],
                                                key=f"audit-crash-capture-{n:08d}"))
        candidate_id = captured["output"]["value"]["candidate_id"]
        if crash in ("mid-settle", "after-drop") and armed:
            print(json.dumps({"audit_size": (data_dir / "audit.log").stat().st_size}), flush=True)
            host.engine.settle_audit(sync=True)
        call("request_admission", {"candidate_id": candidate_id,
                                   "idempotency_key": f"audit-crash-admit-{n:08d}"})
    host.engine.settle_audit(sync=True)
    die()
    """
)

STEPS = [
    "before-commit",
    "before-append",
    "after-append",
    "mid-settle",
    "after-drop",
    "after-settle",
]
SCOPE = f"{TENANT}/{WORKSPACE}"


def _crash(data_dir: Path, step: str) -> tuple[list[dict[str, Any]], int]:
    """Run the drill: the child's calls in order (``audit_id``, ``tool``, whether it answered),
    and the audit log's size when the child started (everything synced)."""
    open_embedded(data_dir).close()
    synced_size = (data_dir / AUDIT_FILE).stat().st_size
    calls: dict[str, dict[str, Any]] = {}
    dying = []
    for line in map(json.loads, killed_child(["-c", _CHILD, str(data_dir), step, str(PAIRS)])):
        if "dying" in line:
            dying.append(line["dying"])
        elif "calling" in line:
            calls[line["calling"]] = {"audit_id": line["calling"], "tool": line["tool"]}
        elif "answered" in line:
            calls[line["answered"]]["answered"] = True
    # the drills that kill while settling were killed there, not at the end
    assert dying == ([step] if step in ("mid-settle", "after-drop") else [])
    return list(calls.values()), synced_size


def _reopened(data_dir: Path) -> tuple[list[str], dict[str, int]]:
    """Reopen and drain as a restarted server does: the audit log's lines, the verified heads."""
    host = open_embedded(data_dir)
    try:
        host.engine.drain_outbox()
        assert [i for i in host.store.outbox_pending(100) if i.kind == "audit_line"] == []
        verified = verify_all(host.engine)
    finally:
        host.close()
    return [line for line in audit_lines(data_dir / AUDIT_FILE) if line.strip()], verified


def _assert_one_line_per_committed_call(
    step: str, calls: list[dict[str, Any]], lines: list[str], verified: dict[str, int]
) -> None:
    assert len(lines) == len(set(lines)), "a line written twice"
    counts = Counter(json.loads(line)["audit_id"] for line in lines)
    assert sum(counts.values()) == len(lines)
    last_committed = step != "before-commit"  # killed inside the commit, before it ran
    for call in calls[:-1]:
        assert call.get("answered") and counts[call["audit_id"]] == 1, (call, counts)
    last = calls[-1]
    assert counts[last["audit_id"]] == (1 if last_committed else 0), (step, last, counts)
    if last_committed:
        (line,) = (json.loads(x) for x in lines if last["audit_id"] in x)
        assert (line["tool"], line["code"], line["ok"]) == (last["tool"], "OK", True)
    assert set(counts) <= {call["audit_id"] for call in calls}
    # the journal: one event per committed call, the chain unbroken (verify_all raises)
    assert verified == {SCOPE: len(calls) - (0 if last_committed else 1)}


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_every_step_leaves_one_line_per_committed_call(tmp_path: Path, step: str) -> None:
    data_dir = tmp_path / "data"
    calls, _ = _crash(data_dir, step)
    lines, verified = _reopened(data_dir)
    _assert_one_line_per_committed_call(step, calls, lines, verified)


@pytest.mark.parametrize("step", ["after-append", "mid-settle"])
def test_lines_lost_with_the_unsynced_file_come_back_from_the_store_once(
    tmp_path: Path, step: str
) -> None:
    """A power cut: the lines appended without a sync are gone from the file (cut back to its
    size at the last sync); the store's outbox, synced with each commit, still holds them."""
    data_dir = tmp_path / "data"
    calls, synced_size = _crash(data_dir, step)
    audit = data_dir / AUDIT_FILE
    assert audit.stat().st_size > synced_size  # the drill's lines were appended...
    with audit.open("r+b") as handle:
        handle.truncate(synced_size)  # ...and never synced
    lines, verified = _reopened(data_dir)
    _assert_one_line_per_committed_call(step, calls, lines, verified)


@pytest.mark.parametrize("drainer_is", ["another host", "the committer itself"])
@pytest.mark.parametrize("lines_followed_before", [0, 2])
def test_a_drainer_that_recovers_a_line_first_keeps_the_committer_from_writing_it_again(
    tmp_path: Path, drainer_is: str, lines_followed_before: int
) -> None:
    """Two hosts on one data directory (a server and a CLI), or the committer's own drain
    thread: the committer's line is recovered by a drain between its commit and its append;
    written once, dropped from the outbox, and the committer's own append finds it no longer
    owed. After lines of its own the committer skips the store's lookup while the log is as it
    left it: the drain's append must make it look again."""
    data_dir = tmp_path / "data"
    committer = open_embedded(data_dir)
    drainer = open_embedded(data_dir) if drainer_is == "another host" else committer
    for n in range(lines_followed_before):
        earlier = capture_args(f"Earlier fact {n}.", key=f"audit-early-{n:012d}")
        assert committer.call("capture", earlier, context())["ok"] is True
    log = committer.audit
    assert isinstance(log, JsonlAuditLog)
    follow = log.follow
    raced: list[int] = []

    def drained_first(item: Any, owed: Any) -> None:
        raced.append(drainer.engine.drain_outbox())
        follow(item, owed)

    log.follow = drained_first  # type: ignore[method-assign]
    try:
        ctx = context()
        envelope = committer.call("capture", capture_args(key="audit-race-000000000001"), ctx)
        assert envelope["ok"] is True
        committer.engine.settle_audit(sync=True)
        drainer.engine.drain_outbox()
        assert committer.store.outbox_pending(100) == []
    finally:
        committer.close()
        drainer.close()
    # The drainer found the committed line first and wrote it, with the earlier ones still owed.
    assert raced == [1 + lines_followed_before]
    lines = [json.loads(x) for x in audit_lines(data_dir / AUDIT_FILE) if x.strip()]
    assert [line["audit_id"] for line in lines].count(ctx.audit_id) == 1


def test_committed_lines_are_synced_together(tmp_path: Path) -> None:
    """The lines of commits wait for one sync: after ``SETTLE_LINES`` of them, or with the next
    line that is synced anyway (a read's), their outbox items are dropped."""
    data_dir = tmp_path / "data"
    host = open_embedded(data_dir)
    try:
        for n in range(3):
            host.call(
                "capture", capture_args(f"Fact {n} to sync later.", key=f"sync-{n:012d}"), context()
            )
        owed = [i for i in host.store.outbox_pending(100) if i.kind == "audit_line"]
        assert len(owed) == 3 < SETTLE_LINES  # durable in the store, not yet synced in the log
        host.call("search", {"query": "fact", "purpose_ref": context().purpose_ref}, context())
        host.call("search", {"query": "fact", "purpose_ref": context().purpose_ref}, context())
        assert [i for i in host.store.outbox_pending(100) if i.kind == "audit_line"] == []
    finally:
        host.close()
