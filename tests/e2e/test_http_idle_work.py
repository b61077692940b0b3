"""The embedded HTTP server runs the idle work (``engine.idle``) once each answer has left, as the
stdio server does: through uvicorn and the official client, a capture's admission finds its
candidate already scanned, and decides as it would have."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engram_memory.engine import idle
from engram_memory.policy import secrets

from e2e_support import REVISIONS, HttpService, new_agent, ok_value

pytestmark = pytest.mark.anyio

IDLE_RUN_DEADLINE_S = 30.0


class Watched:
    """Every text the secret scanner scanned for real, and a signal each time the idle queue
    ran a piece of work (both on the server's own threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.scanned: list[str] = []
        self.ran = threading.Event()
        scan, offer = secrets.SecretScanner._scan_first, idle.IdleWork.offer
        watched = self

        def counted(scanner: secrets.SecretScanner, text: str) -> str:
            watched.scanned.append(text)
            return scan(scanner, text)

        def offered(work: idle.IdleWork, piece: Any) -> None:
            def then_signal() -> None:
                try:
                    piece()
                finally:
                    watched.ran.set()

            offer(work, then_signal)

        monkeypatch.setattr(secrets.SecretScanner, "_scan_first", counted)
        monkeypatch.setattr(idle.IdleWork, "offer", offered)


@pytest.mark.parametrize("mode", REVISIONS)
@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("The staging database moved to the second rack, port 5433.", "accepted"),
        ("Deploy with AKIAZ7QW3XH2N5LK4TPV and the usual role.", "rejected"),
    ],
)
async def test_the_admission_after_an_http_capture_reads_back_the_idle_scan(
    http_service: HttpService, monkeypatch: pytest.MonkeyPatch, mode: str, text: str, status: str
) -> None:
    watched = Watched(monkeypatch)
    async with new_agent(http_service, mode) as agent:
        candidate_id = await agent.captured(text)
        # The work runs once the answer's last byte is sent, i.e. around the time the client
        # reads it: wait for it (an event, not a duration) before the admission is sent.
        assert watched.ran.wait(IDLE_RUN_DEADLINE_S), "the HTTP server ran no idle work"
        assert text in watched.scanned  # scanned ahead...

        watched.scanned.clear()
        outcome = ok_value(await agent.admit(candidate_id))["outcome"]

    assert watched.scanned == []  # ...and not again by the admission
    assert outcome["status"] == status
