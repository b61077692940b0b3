"""A backup taken while four clients write holds everything acknowledged before it started
(issue 24), and a restore opens all of it, whatever happened to it afterwards.

Four writer threads capture through one server's engine (as four MCP clients of a running
``serve``), each admitting some of its own earlier captures as it goes; the backup (the operator's
``admin backup``, its own connections) starts once every writer has been acknowledged a few
times and runs while they keep writing. After it, every capture still pending is admitted. The
backup is restored into a fresh data directory beside a copy of the keys: every capture
acknowledged before the backup started is there, pending or admitted, and opens to its text.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from engram_memory.embedded.backup import backup
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import EmbeddedHost, open_embedded
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.ports import SealedBlob
from engram_memory.engine.records import decode

from engram_testing import capture_args, context, handled

SCOPE = Scope("local", "default")
WRITERS = 4
BEFORE = 5  # acknowledged captures per writer before the backup starts
AFTER = 5  # and after it returned


def _ctx(*_client: int) -> TrustedContext:
    """An agent's context in the embedded host's default scope."""
    return context(tenant=SCOPE.tenant_id, workspace=SCOPE.workspace_id)


class Writers:
    """Four clients capturing (and admitting every other earlier capture) until told to stop."""

    def __init__(self, host: EmbeddedHost) -> None:
        self.host = host
        self.acknowledged: dict[str, str] = {}  # candidate id -> text, in acknowledgement order
        self.counts = [0] * WRITERS
        self.lock = threading.Condition()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(w,)) for w in range(WRITERS)]

    def _run(self, writer: int) -> None:
        now_ms = int(time.time() * 1000)
        mine: list[str] = []
        i = 0
        try:
            while not self.stop.is_set():
                text = f"Writer {writer} fact {i}: the shelf label reads w{writer}x{i}q."
                args = capture_args(text, key=f"w{writer}-capture-{i:08d}", valid_from=now_ms)
                value = handled(self.host.engine, "capture", args, _ctx(writer))["output"]["value"]
                assert value["status"] == "committed_pending", value
                with self.lock:
                    self.acknowledged[value["candidate_id"]] = text
                    self.counts[writer] += 1
                    self.lock.notify_all()
                mine.append(value["candidate_id"])
                if i % 2 == 1:  # admit the capture before this one: some span the backup
                    admission = {"candidate_id": mine[-2], "idempotency_key": f"w{writer}-a-{i}"}
                    handled(self.host.engine, "request_admission", admission, _ctx(writer))
                i += 1
        except BaseException as error:  # reported by the test, not lost in the thread
            self.errors.append(error)
            with self.lock:
                self.lock.notify_all()

    def wait_for_each(self, count: int) -> None:
        with self.lock:
            self.lock.wait_for(lambda: self.errors or min(self.counts) >= count)
        assert not self.errors, self.errors

    def snapshot(self) -> dict[str, str]:
        with self.lock:
            return dict(self.acknowledged)


def _admit_the_rest(host: EmbeddedHost, candidate_ids: list[str]) -> int:
    admitted = 0
    for candidate_id in candidate_ids:
        row = host.store.candidate_get(SCOPE, candidate_id)
        if row is not None and row.state == "pending":
            admission = {"candidate_id": candidate_id, "idempotency_key": f"late-{candidate_id}"}
            handled(host.engine, "request_admission", admission, _ctx(0))
            admitted += 1
    return admitted


def _opened_text(host: EmbeddedHost, candidate_id: str) -> str:
    """The text of the capture ``candidate_id`` in a restored directory: the pending candidate's
    (it opens), or the admitted record's (its body opens)."""
    row = host.store.candidate_get(SCOPE, candidate_id)
    assert row is not None, f"{candidate_id} is missing from the backup"
    if row.state == "pending":
        content = decode(host.vault.open(SCOPE, candidate_id, SealedBlob(row.key_ref, row.sealed)))
        return str(content["record"]["components"][0]["text"])
    assert row.state == "admitted", row.state
    record = host.store.record_get(SCOPE, row.record_id)
    assert record is not None
    return str(host.engine.body(SCOPE, record)["components"][0]["text"])


def test_a_backup_taken_while_four_clients_write_holds_everything_acknowledged_before(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    server = open_embedded(data)
    writers = Writers(server)
    try:
        for thread in writers.threads:
            thread.start()
        writers.wait_for_each(BEFORE)
        before = writers.snapshot()  # acknowledged before the backup started
        backup(data, tmp_path / "engram.backup", "ops-carol")
        with writers.lock:
            after = max(writers.counts) + AFTER
        writers.wait_for_each(after)  # and they keep writing once it returned
    finally:
        writers.stop.set()
        for thread in writers.threads:
            thread.join()
    try:
        assert not writers.errors, writers.errors
        # Whatever happened afterwards: every capture still pending is admitted now.
        late = _admit_the_rest(server, list(before))
    finally:
        server.close()
    assert late > 0

    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copytree(data / "keys", restored / "keys")
    assert (
        main(["admin", "restore", str(tmp_path / "engram.backup"), "--data-dir", str(restored)])
        == 0
    )
    assert main(["verify", "--data-dir", str(restored)]) == 0
    host = open_embedded(restored)
    try:
        opened = {candidate_id: _opened_text(host, candidate_id) for candidate_id in before}
    finally:
        host.close()
    assert opened == before
    assert len(before) >= WRITERS * BEFORE
