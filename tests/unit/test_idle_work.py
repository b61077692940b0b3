"""Work left for the server's idle time (``engine.idle``), and the admission it anticipates: a
captured candidate's secret scan and signature done ahead, read back by its admission, which
decides as it would have without them."""

from __future__ import annotations

import functools
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from engram_memory.embedded.composition import EmbeddedHost, open_embedded
from engram_memory.engine import idle
from engram_memory.engine.idle import IdleWork
from engram_memory.policy import secrets

from engram_testing import capture_args, context, handled


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
