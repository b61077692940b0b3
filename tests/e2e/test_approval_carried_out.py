"""Issue 38, item 5: an approval a person gives carries the agent's forget (or withdraw) out at
once, as the agent's call; the agent's retry with the same key finds that commit whenever it
comes, here 31 s after the approval on the server's clock (a fake one, moved on: nothing
sleeps), and nobody is asked again. A decline still refuses; a revoked token's approval commits
nothing, and the approver is told so in one line.

The server is the embedded HTTP server in this process; the agent is the official ``mcp``
client declaring no elicitation (it cannot ask: -32603 names the question); the person runs the
real ``engram-memory approvals`` command in a subprocess, or answers on the approval page; the
record's state is read with ``engram-memory admin records show``.
"""

from __future__ import annotations

# ruff: noqa: S603 - the subprocess is this environment's own engram-memory
import json
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx2
import pytest
from bs4 import BeautifulSoup

from engram_memory.approval_page import CARRIED_OUT

from e2e_support import (
    FORGET,
    LEGACY,
    WITHDRAW,
    Agent,
    HttpService,
    approval_id_of,
    engram_cli,
    error_code,
    http_client,
    link_of,
    ok_value,
    page_answer,
    protocol_error,
    serve_http,
    terminal_code,
    url_only_client,
)
from engram_testing import FakeClock

pytestmark = pytest.mark.anyio

NOTE = "Decision: the build cache is purged every Sunday at 02:00."
PAST_THE_WINDOW_MS = 31_000  # the gate's execution window is 30 s


@pytest.fixture(scope="module")
def clock() -> FakeClock:
    return FakeClock(int(time.time() * 1000))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, clock: FakeClock) -> Iterator[HttpService]:
    with serve_http(tmp_path_factory.mktemp("carried-out"), clock=clock) as served:
        yield served


def engram(service: HttpService, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command line on the server's data directory, as an operator runs it."""
    return subprocess.run(
        [engram_cli(), *args, "--data-dir", str(service.data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def record_state(service: HttpService, workspace: str, record_id: str) -> str:
    shown = engram(
        service, "admin", "records", "show", record_id, "--workspace", workspace, "--json"
    )
    assert shown.returncode == 0, shown.stderr
    state: str = json.loads(shown.stdout)["state"]
    return state


async def to_forget(client: Any) -> tuple[str, dict[str, Any]]:
    """A record the agent remembered, and its forget's arguments."""
    record_id = await Agent(client).remember(NOTE)
    return record_id, Agent(client).forget_arguments(record_id)


async def asked(client: Any, arguments: dict[str, Any], tool: str = FORGET) -> str:
    """The agent's gated call, answered -32603 (its client cannot ask): the question's id."""
    error = await protocol_error(partial(client.call_tool, tool, arguments))
    assert error.code == -32603 and error.data["reason"] == "no_elicitation", error
    approval_id: str = error.data["approval_id"]
    return approval_id


async def test_a_forget_approved_at_the_terminal_is_done_at_once_and_a_retry_31_s_later_gets_it(
    service: HttpService, clock: FakeClock
) -> None:
    workspace, token = service.tokens.fresh()
    async with http_client(service.url, token, LEGACY) as client:  # declares no elicitation
        record_id, arguments = await to_forget(client)
        approval_id = await asked(client, arguments)

        approved = engram(service, "approvals", "approve", approval_id, "--operator", "ops-kim")
        assert approved.returncode == 0, approved.stderr
        assert "It was carried out" in approved.stdout  # one line says what the approval did
        assert record_state(service, workspace, record_id) == "tombstoned"  # before any retry
        assert error_code(await Agent(client).get(record_id)) == "NOT_FOUND"

        clock.advance(PAST_THE_WINDOW_MS)  # past the 30 s in which a retry had to come
        forgotten = ok_value(await client.call_tool(FORGET, arguments))
        assert forgotten["receipt"]["to_state"] == "tombstoned"
        assert forgotten["replayed"] is False  # the agent sees the commit for the first time
        assert ok_value(await client.call_tool(FORGET, arguments))["replayed"] is True
    assert service.server.approvals.pending() == []  # nobody was asked again
    history = engram(
        service, "admin", "records", "history", record_id, "--workspace", workspace, "--json"
    )
    assert json.loads(history.stdout)[-1]["approved_by"] == "operator:ops-kim at the terminal"


async def test_a_decline_at_the_terminal_changes_nothing_and_the_retry_gets_gate_failed(
    service: HttpService,
) -> None:
    workspace, token = service.tokens.fresh()
    async with http_client(service.url, token, LEGACY) as client:
        record_id, arguments = await to_forget(client)
        approval_id = await asked(client, arguments)
        declined = engram(service, "approvals", "decline", approval_id)
        assert declined.returncode == 0 and "Nothing was changed" in declined.stdout
        assert record_state(service, workspace, record_id) == "accepted_current"
        assert error_code(await client.call_tool(FORGET, arguments)) == "gate_failed"


async def test_a_revoked_tokens_approval_commits_nothing_and_the_approver_is_told(
    service: HttpService,
) -> None:
    principal = "agent-revoked-while-asking"
    workspace, token = service.tokens.fresh(principal=principal)
    async with http_client(service.url, token, LEGACY) as client:
        agent = Agent(client)
        candidate_id = await agent.captured(NOTE)
        approval_id = await asked(client, agent.withdraw_arguments(candidate_id), WITHDRAW)
    revoked = engram(service, "admin", "tokens", "revoke", "--principal", principal)
    assert revoked.returncode == 0, revoked.stderr

    approved = engram(service, "approvals", "approve", approval_id)
    assert approved.returncode == 0, approved.stderr
    assert "could not be carried out now (the agent's token was revoked)" in approved.stdout
    assert "nothing was changed" in approved.stdout
    row = service.server.approvals.book.get(approval_id)
    assert row is not None and row.committed_at_ms is None
    assert row.commit_failure == "AUTHORIZATION_REVOKED"
    pending = engram(service, "admin", "pending", "list", "--workspace", workspace, "--json")
    assert candidate_id in pending.stdout  # still pending: nothing was withdrawn


async def test_an_approval_on_the_page_is_done_at_once_and_the_page_says_so(
    service: HttpService, clock: FakeClock
) -> None:
    workspace, token = service.tokens.fresh()
    async with url_only_client(service.url, token, LEGACY) as client:
        record_id, arguments = await to_forget(client)
        link = await link_of(partial(client.call_tool, FORGET, arguments))
        code = terminal_code(service, approval_id_of(link))
        page = await page_answer(link, "approve", code)
        assert page.status_code == 200 and "It was carried out" in page.text
        assert record_state(service, workspace, record_id) == "tombstoned"
        clock.advance(PAST_THE_WINDOW_MS)
        forgotten = ok_value(await client.call_tool(FORGET, arguments))
        assert forgotten["replayed"] is False and forgotten["receipt"]["to_state"] == "tombstoned"


async def test_the_agent_and_the_approver_read_the_same_words(service: HttpService) -> None:
    """The link's message (the agent's) and the page before the answer (the approver's) both
    say that an approval carries the change out and the retry returns its result."""
    _, token = service.tokens.fresh()
    async with url_only_client(service.url, token, LEGACY) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        error = await protocol_error(
            partial(client.call_tool, FORGET, agent.forget_arguments(record_id))
        )
    (elicitation,) = error.error.data["elicitations"]
    assert CARRIED_OUT in elicitation["message"]
    assert "within 30 s" not in elicitation["message"]
    async with httpx2.AsyncClient() as http:
        page = await http.get(elicitation["url"])
    shown = " ".join(BeautifulSoup(page.text, "html.parser").get_text().split())
    assert page.status_code == 200 and CARRIED_OUT in shown
