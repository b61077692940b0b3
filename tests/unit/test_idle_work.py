"""Work left for the server's idle time (``engine.idle``), and the admission it anticipates: a
captured candidate's secret scan and signature done ahead, read back by its admission, which
decides as it would have without them; the plaintext the capture sealed, held for the admission
(``ExpectedAdmissions``) in place of opening the message again, never for another message or
past its key; the accepted record's body and projection made ahead."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from store_rows import candidate as candidate_row

from engram_memory.embedded.composition import EmbeddedHost, open_embedded
from engram_memory.engine import idle
from engram_memory.engine.context import Scope
from engram_memory.engine.idle import ExpectedAdmissions, IdleWork
from engram_memory.engine.ports import CandidateRow, SealedBlob
from engram_memory.policy import secrets

from engram_testing import PURPOSE, capture_args, context, handled


def test_nothing_is_kept_before_a_host_accepts_to_run_it() -> None:
    work = IdleWork()
    ran: list[int] = []
    work.offer(lambda: ran.append(1))
    work.accept()
    work.run()
    assert ran == []  # offered before anyone promised to run it: dropped, not kept


def test_accepted_work_runs_oldest_first_and_the_oldest_make_room() -> None:
    work = IdleWork()
    work.accept()
    ran: list[int] = []
    for n in range(idle.LIMIT + 2):
        work.offer(functools.partial(ran.append, n))
    work.run()
    assert ran == list(range(2, idle.LIMIT + 2))
    work.run()
    assert ran == list(range(2, idle.LIMIT + 2))  # each runs once


def test_a_failing_piece_is_dropped_and_the_rest_still_run() -> None:
    work = IdleWork()
    work.accept()
    ran: list[str] = []

    def fails() -> None:
        raise RuntimeError("boom")

    work.offer(fails)
    work.offer(lambda: ran.append("after"))
    work.run()
    assert ran == ["after"]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[EmbeddedHost]:
    opened = open_embedded(tmp_path / "data")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the secret scanner scanned for real (not read back from its memo)."""
    scanned: list[str] = []
    scan = secrets.SecretScanner._scan_first

    def counted(self: secrets.SecretScanner, text: str) -> str:
        scanned.append(text)
        return scan(self, text)

    monkeypatch.setattr(secrets.SecretScanner, "_scan_first", counted)
    return scanned


def _capture(host: EmbeddedHost, text: str, key: str) -> str:
    envelope = handled(host.engine, "capture", capture_args(text, key=key), context())
    candidate_id: str = envelope["output"]["value"]["candidate_id"]
    return candidate_id


def _admit(host: EmbeddedHost, candidate_id: str, key: str) -> dict[str, Any]:
    arguments = {"candidate_id": candidate_id, "idempotency_key": key}
    envelope = handled(host.engine, "request_admission", arguments, context())
    outcome: dict[str, Any] = envelope["output"]["value"]["outcome"]
    return outcome


def test_a_capture_leaves_nothing_behind_on_a_host_that_runs_no_idle_work(
    host: EmbeddedHost,
) -> None:
    _capture(host, "The retro moved to Thursday afternoons.", "idle-none-0000000001")
    assert not host.engine.idle.accepted  # in process, the cloud: no candidate's content is kept


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("The retro moved to Thursday afternoons, room Ada.", "accepted"),
        ("Deploy with AKIAZ7QW3XH2N5LK4TPV and the usual role.", "rejected"),
    ],
)
def test_the_admission_reads_back_what_the_idle_time_scanned_and_decides_the_same(
    host: EmbeddedHost, scans: list[str], text: str, status: str
) -> None:
    host.engine.accept_idle_work()
    candidate_id = _capture(host, text, "idle-capture-000000001")
    scans.clear()
    host.engine.run_idle_work()  # the wait between the capture's answer and the admission
    assert text in scans  # scanned ahead...

    scans.clear()
    outcome = _admit(host, candidate_id, "idle-admission-0000001")

    assert scans == []  # ...and not again
    assert outcome["status"] == status


def test_without_idle_time_the_same_admission_scans_and_decides_alike(
    host: EmbeddedHost, scans: list[str]
) -> None:
    text = "Deploy with AKIAZ7QW3XH2N5LK4TPV and the usual role."
    candidate_id = _capture(host, text, "idle-capture-000000002")
    outcome = _admit(host, candidate_id, "idle-admission-0000002")
    assert text in scans
    assert outcome["status"] == "rejected"


@pytest.mark.parametrize("accepted_first", [True, False])
def test_the_stdio_server_s_engine_on_demand_accepts_before_or_after_it_opens(
    tmp_path: Path, accepted_first: bool
) -> None:
    from engram_memory.embedded.serve import EngineOnDemand

    on_demand = EngineOnDemand(lambda: open_embedded(tmp_path / "data"))
    if accepted_first:
        on_demand.accept_idle_work()  # serve_stdio, before any call opened the engine
        assert not on_demand.opened
    try:
        engine = on_demand.host.engine
        if not accepted_first:
            on_demand.accept_idle_work()
        assert engine.idle.accepted
        on_demand.run_idle_work()
    finally:
        on_demand.close()


def test_the_http_gate_runs_the_idle_work_after_the_answer_s_last_byte_only() -> None:
    from engram_memory.mcp_surface.transports import _then

    happened: list[str] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        happened.append(f"{message['type']}:{message.get('more_body', False)}")

    async def answer() -> None:
        sending = _then(send, lambda: happened.append("idle work"))
        await sending({"type": "http.response.start", "status": 200, "headers": []})
        await sending({"type": "http.response.body", "body": b"event: message", "more_body": True})
        assert "idle work" not in happened  # a streamed answer is not whole yet
        await sending({"type": "http.response.body", "body": b""})

    anyio.run(answer)
    assert happened == [
        "http.response.start:False",
        "http.response.body:True",
        "http.response.body:False",
        "idle work",
    ]


# -- what a capture hands to the admission (``ExpectedAdmissions``) ---------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _expected(clock: _Clock | None = None) -> ExpectedAdmissions:
    work = IdleWork()
    work.accept()
    return ExpectedAdmissions(work, clock or _Clock())


def _row(candidate_id: str, key_ref: str, sealed: bytes) -> CandidateRow:
    return replace(candidate_row(candidate_id, sealed=sealed), key_ref=key_ref)


SCOPE = Scope("tenant", "workspace")


def test_only_the_message_the_store_holds_is_taken_and_only_once() -> None:
    expected = _expected()
    expected.hold(SCOPE, "cand_a", "key_a", b"message", b"plaintext")

    assert expected.take(SCOPE, _row("cand_a", "key_b", b"message")) is None  # resealed since
    expected.hold(SCOPE, "cand_a", "key_a", b"message", b"plaintext")
    assert expected.take(SCOPE, _row("cand_a", "key_a", b"altered")) is None  # not this message
    assert expected.take(SCOPE, _row("cand_a", "key_a", b"message")) is None  # dropped by a miss

    expected.hold(SCOPE, "cand_a", "key_a", b"message", b"plaintext")
    assert expected.take(Scope("tenant", "other"), _row("cand_a", "key_a", b"message")) is None
    taken = expected.take(SCOPE, _row("cand_a", "key_a", b"message"))
    assert taken is not None and taken.plaintext == b"plaintext"
    assert "plaintext" not in repr(taken) and "message" not in repr(taken)  # never in a log
    assert expected.take(SCOPE, _row("cand_a", "key_a", b"message")) is None  # once


def test_nothing_is_held_for_a_host_that_runs_no_idle_work() -> None:
    expected = ExpectedAdmissions(IdleWork(), _Clock())
    expected.hold(SCOPE, "cand_a", "key_a", b"message", b"plaintext")
    assert expected.take(SCOPE, _row("cand_a", "key_a", b"message")) is None


def test_the_newest_candidates_are_held_for_a_while_and_never_past_their_key() -> None:
    clock = _Clock()
    expected = _expected(clock)
    for n in range(idle.LIMIT + 1):
        expected.hold(SCOPE, f"cand_{n}", f"key_{n}", b"m", b"p")
    assert expected.take(SCOPE, _row("cand_0", "key_0", b"m")) is None  # made room
    assert expected.take(SCOPE, _row("cand_1", "key_1", b"m")) is not None

    expected.drop_key("key_2")
    assert expected.take(SCOPE, _row("cand_2", "key_2", b"m")) is None

    clock.now += idle.HOLD_S + 0.001
    assert expected.take(SCOPE, _row("cand_3", "key_3", b"m")) is None  # expired
    expected.expire()  # what the host runs after each answer
    assert len(expected) == 0  # the last one too, untouched since


def test_what_the_idle_work_prepared_goes_only_to_a_candidate_still_held() -> None:
    expected = _expected()
    expected.prepared(SCOPE, "cand_a", None, b"body")  # nothing held: nothing kept
    expected.hold(SCOPE, "cand_a", "key_a", b"m", b"p")
    expected.prepared(SCOPE, "cand_a", None, b"body")
    taken = expected.take(SCOPE, _row("cand_a", "key_a", b"m"))
    assert taken is not None and taken.sealed_body == b"body"


@pytest.fixture
def opened_messages(host: EmbeddedHost, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The candidates whose sealed message the vault opened."""
    opened: list[str] = []
    vault = host.engine.vault
    open_message = vault.open

    def counted(scope: Scope, candidate_id: str, blob: SealedBlob) -> bytes:
        opened.append(candidate_id)
        return open_message(scope, candidate_id, blob)

    monkeypatch.setattr(vault, "open", counted)
    return opened


def _noted(made: list[str], name: str, make: Any, *args: Any) -> Any:
    made.append(name)
    return make(*args)


def _record_text(host: EmbeddedHost, record_id: str) -> str:
    envelope = handled(
        host.engine, "get", {"record_id": record_id, "purpose_ref": PURPOSE}, context()
    )
    record = envelope["output"]["value"]["record"]
    return str(record["components"][0]["text"])


@pytest.mark.parametrize("idle_time", [True, False])
def test_the_admission_admits_the_plaintext_its_capture_held_without_opening_the_message(
    host: EmbeddedHost,
    opened_messages: list[str],
    idle_time: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "The retro moved to Thursday afternoons, room Ada."
    host.engine.accept_idle_work()
    candidate_id = _capture(host, text, "held-capture-00000001")
    if idle_time:
        host.engine.run_idle_work()  # also seals the body and builds the projection ahead
    made: list[str] = []
    for name in ("seal_record", "projection_doc"):
        made_here = getattr(host.engine, name)
        monkeypatch.setattr(host.engine, name, functools.partial(_noted, made, name, made_here))

    outcome = _admit(host, candidate_id, "held-admission-0000001")

    assert outcome["status"] == "accepted"
    assert opened_messages == []
    assert made == ([] if idle_time else ["projection_doc", "seal_record"])
    assert _record_text(host, outcome["record_id"]) == text  # the body opens under its key
    found = handled(
        host.engine, "search", {"query": "retro Thursday", "purpose_ref": PURPOSE}, context()
    )
    hits = found["output"]["value"]["records"]
    assert [hit["record"]["record_id"] for hit in hits] == [outcome["record_id"]]


def _held_capture(host: EmbeddedHost, key: str) -> CandidateRow:
    """A candidate captured on a host that runs idle work (its plaintext held)."""
    host.engine.accept_idle_work()
    candidate_id = _capture(host, "The retro moved to Thursday afternoons.", key)
    candidate = host.engine.store.candidate_get(context().scope, candidate_id)
    assert candidate is not None
    return candidate


def test_a_destroyed_key_is_blob_missing_though_the_plaintext_was_held(host: EmbeddedHost) -> None:
    candidate = _held_capture(host, "held-capture-00000002")
    candidate_id = candidate.candidate_id
    host.engine.vault.destroy(candidate.key_ref)  # e.g. another process shredded it

    arguments = {"candidate_id": candidate_id, "idempotency_key": "held-admission-0000002"}
    envelope = handled(host.engine, "request_admission", arguments, context())

    assert envelope["error"]["code"] == "BLOB_MISSING"


def test_a_message_altered_in_the_store_is_opened_and_refused_not_replaced_by_the_held_one(
    host: EmbeddedHost, tmp_path: Path, opened_messages: list[str]
) -> None:
    candidate_id = _held_capture(host, "held-capture-00000003").candidate_id
    other_id = _capture(host, "Standups are at nine sharp.", "held-capture-00000004")
    db = sqlite3.connect(tmp_path / "data" / "engram.db")
    with db:
        db.execute(
            "UPDATE candidates SET sealed = (SELECT sealed FROM candidates WHERE candidate_id = ?)"
            " WHERE candidate_id = ?",
            (other_id, candidate_id),
        )
    db.close()

    arguments = {"candidate_id": candidate_id, "idempotency_key": "held-admission-0000003"}
    envelope = handled(host.engine, "request_admission", arguments, context())

    assert envelope["error"]["code"] == "JOURNAL_CORRUPT"
    assert opened_messages == [candidate_id]


def test_destroying_a_candidate_s_key_drops_what_its_capture_held(host: EmbeddedHost) -> None:
    candidate = _held_capture(host, "held-capture-00000005")
    host.engine.run_outbox(
        [host.engine.destroy_candidate_key(context().scope, candidate.key_ref, 0)]
    )
    assert host.engine.expected.take(context().scope, candidate) is None
