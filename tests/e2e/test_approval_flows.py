"""Approvals that outlive the request that asked for them, on the embedded HTTP server.

An approval given after the client stopped waiting (it disconnected, or its form went away) is
kept in the data directory's book: the retry with the same key commits with it (within 30 s of
the approval and 300 s of the asking) and the human is not asked again. Also: the form shows the
memory's text and asks for an explicit choice; the terminal answers the same questions.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

from engram_memory.embedded.cli import main

from e2e_support import (
    CAPTURE,
    FORGET,
    LEGACY,
    MODERN,
    REVISIONS,
    WITHDRAW,
    Agent,
    HttpService,
    Human,
    age_approval,
    approval_id_of,
    error_code,
    http_client,
    link_of,
    new_agent,
    new_key,
    new_workspace,
    now_ms,
    ok_value,
    page_answer,
    protocol_error,
    terminal_code,
    url_only_client,
)

pytestmark = pytest.mark.anyio

NOTE = "Decision: the nightly backup keeps 14 generations on the second disk."


def answer_from_terminal(service: HttpService, approval_id: str, decision: str) -> None:
    data_dir = service.server.approvals.book.path.parent
    assert main(["approvals", decision, "--data-dir", str(data_dir), approval_id]) == 0


async def answer_on_page(link: str, decision: str, code: str | None) -> int:
    return (await page_answer(link, decision, code)).status_code


async def test_a_url_only_client_holding_the_link_cannot_approve_its_own_withdraw(
    http_service: HttpService,
) -> None:
    """Issue 24: the agent gets the link (secret included) in the -32042 data, reads the page's
    CSRF token and posts ``decision=approve``; without the code only the operator's terminal
    shows, the page refuses, and after five guesses it takes no answer to that question."""
    async with new_agent(http_service, LEGACY, url_only=True) as agent:
        candidate_id = await agent.captured(NOTE)
        call = partial(agent.client.call_tool, WITHDRAW, agent.withdraw_arguments(candidate_id))
        link = await link_of(call)
        async with httpx2.AsyncClient() as http:
            shown = await http.get(link)
        assert shown.status_code == 200 and NOTE in shown.text  # the link shows the request

        assert await answer_on_page(link, "approve", None) == 403
        for guess in ("AAAA-AAAA", "2345-6789", "ZZZZ-ZZZZ", "ABCD-EFGH"):
            assert await answer_on_page(link, "approve", guess) == 403
        code = terminal_code(http_service, approval_id_of(link))
        assert await answer_on_page(link, "approve", code) == 429  # no more attempts

        assert await link_of(call) == link  # the question is still open, and nothing committed
        assert ok_value(await agent.admit(candidate_id))["outcome"]["status"] == "accepted"


async def test_an_approval_given_after_the_client_disconnected_commits_on_its_retry(
    http_service: HttpService,
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    async with url_only_client(http_service.url, token, LEGACY) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        link = await link_of(partial(client.call_tool, FORGET, arguments))
    # the client is gone; the human answers on the page a little later
    code = terminal_code(http_service, approval_id_of(link))  # the person reads their terminal
    assert await answer_on_page(link, "approve", code) == 200
    async with url_only_client(http_service.url, token, LEGACY) as client:
        forgotten = ok_value(await client.call_tool(FORGET, arguments))
        assert forgotten["receipt"]["to_state"] == "tombstoned" and forgotten["replayed"] is False
        assert ok_value(await client.call_tool(FORGET, arguments))["replayed"] is True


async def test_a_capture_approval_older_than_30_s_is_not_used_and_the_retry_asks_anew(
    http_service: HttpService,
) -> None:
    """A confirmed capture is not carried out when approved (its content never rests in the
    book): the agent's retry takes the approval within 30 s of it; after that, it asks anew."""
    _, token = http_service.tokens.fresh(confirm=["capture"])
    async with url_only_client(http_service.url, token, LEGACY) as client:
        agent = Agent(client)
        call = partial(client.call_tool, CAPTURE, agent.capture_arguments(NOTE))
        link = await link_of(call)
        row = http_service.server.approvals.book.get(approval_id_of(link))
        assert row is not None and row.call is None  # nothing of the capture is kept
        code = terminal_code(http_service, approval_id_of(link))
        assert await answer_on_page(link, "approve", code) == 200
        age_approval(http_service, approval_id_of(link), 31_000, answer_too=True)
        again = await link_of(call)  # a new question: nothing committed with a stale approval
        assert approval_id_of(again) != approval_id_of(link)


@pytest.mark.parametrize("mode", REVISIONS)
async def test_the_form_shows_the_memory_and_asks_for_an_explicit_choice(
    http_service: HttpService, mode: str
) -> None:
    workspace, token = http_service.tokens.fresh()
    asked: list[types.ElicitRequestFormParams] = []

    async def human(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    async with http_client(http_service.url, token, mode, human=Human()) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
    async with http_client(http_service.url, token, mode, human=human) as client:
        forgotten = ok_value(await Agent(client).forget(record_id))
    assert forgotten["receipt"]["to_state"] == "tombstoned"
    book = http_service.server.approvals.book
    # answered in the client: nothing is left waiting in the terminal's list
    assert [r for r in book.pending(now_ms()) if r.workspace_id == workspace] == []
    (form,) = asked
    lines = form.message.splitlines()
    assert "Forget this memory?" in lines[0]
    assert f"[decision] {NOTE} (cites citation:source)" in lines
    assert f"Target: {record_id}" in lines and "Reason: reason:obsolete" in lines
    assert "approvals approve apr_" in form.message  # the terminal answers it too
    choice = form.requested_schema["properties"]["decision"]
    assert [option["const"] for option in choice["oneOf"]] == ["approve", "decline"]
    assert form.requested_schema["required"] == ["decision"]


async def test_a_form_the_client_could_not_show_is_answered_from_the_terminal_without_asking_again(
    http_service: HttpService,
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    gone = Human("gone")
    asked = gone.asked
    async with http_client(http_service.url, token, LEGACY, human=Human()) as client:
        agent = Agent(client)
        candidate_id = await agent.captured(NOTE)
        arguments = agent.withdraw_arguments(candidate_id)
    async with http_client(http_service.url, token, LEGACY, human=gone) as client:
        await protocol_error(lambda: client.call_tool(WITHDRAW, arguments))
        (approval_id,) = set(re.findall(r"apr_[0-9a-f]{32}", asked[0]))
        answer_from_terminal(http_service, approval_id, "approve")
        withdrawn = ok_value(await client.call_tool(WITHDRAW, arguments))
        assert withdrawn["receipt"]["to_state"] == "withdrawn"
        assert len(asked) == 1  # the retry took the terminal's answer: nobody was asked twice
        assert error_code(await Agent(client).admit(candidate_id, new_key("admit"))) == "NOT_FOUND"


async def test_a_form_answered_after_the_client_gave_up_waiting_is_kept_for_its_retry(
    http_service: HttpService,
) -> None:
    """The client's request times out while its person is still on the form (the TypeScript
    SDK gives up after 60 s); the person approves anyway; the retry commits without asking."""
    token = http_service.tokens.mint(workspace=new_workspace())
    slow_person = Human(delay_s=4)  # longer than the client waits for the call
    asked = slow_person.asked
    async with http_client(http_service.url, token, LEGACY, human=Human()) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30)
    ) as http:
        impatient = Client(
            streamable_http_client(http_service.url, http_client=http),
            mode=LEGACY,
            elicitation_callback=slow_person,
            read_timeout_seconds=1.5,
        )
        async with impatient as client:
            with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's timeout, whatever its type
                await client.call_tool(FORGET, arguments)
            book = http_service.server.approvals.book
            with anyio.fail_after(20):  # the person's late answer reaches the book
                while not any(r.state == "approved" and r.target == record_id for r in _rows(book)):
                    await anyio.sleep(0.2)
    async with http_client(http_service.url, token, LEGACY, human=Human()) as client:
        forgotten = ok_value(await client.call_tool(FORGET, arguments))
        assert forgotten["receipt"]["to_state"] == "tombstoned"
    assert len(asked) == 1  # the retry took the late answer; nobody was asked twice


def _rows(book: Any) -> list[Any]:
    import contextlib
    import sqlite3

    from engram_memory.adapters.local.approval_book import COLUMNS, OpenApproval

    with contextlib.closing(sqlite3.connect(book.path)) as db:
        rows = db.execute(f"SELECT {COLUMNS} FROM approvals")
        return [OpenApproval.of_row(row) for row in rows]


async def test_a_client_that_cannot_ask_is_told_the_terminal_command_which_then_answers(
    http_service: HttpService,
) -> None:
    """-32603's data names the host's command; once a person runs it, the agent's retry
    commits."""
    async with new_agent(http_service, LEGACY, None) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        error = await protocol_error(partial(agent.client.call_tool, FORGET, arguments))
        assert error.message == "Trusted invocation context unavailable"
        approval_id = error.data["approval_id"]
        assert error.data["approve_with"] == f"engram-memory approvals approve {approval_id}"
        answer_from_terminal(http_service, approval_id, "approve")
        forgotten = ok_value(await agent.client.call_tool(FORGET, arguments))
        assert forgotten["receipt"]["to_state"] == "tombstoned"


async def test_a_host_that_requires_the_page_never_takes_the_clients_form(
    http_service: HttpService,
) -> None:
    """``approval_page_required`` (host.json): a client that could answer a form (it declares
    form and URL) gets the page's link instead; the form is never shown, and the person who
    answers on the page (with the terminal's code) is the one whose answer commits."""
    runtime = http_service.server.surface.runtime
    host = runtime.host
    runtime.host = host.model_copy(update={"approval_page_required": True})
    forms: list[Any] = []

    async def form_answerer(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        forms.append(params)
        return types.ElicitResult(action="accept", content={"decision": "approve"})

    try:
        _, token = http_service.tokens.fresh()
        async with http_client(http_service.url, token, LEGACY, human=Human()) as client:
            record_id = await Agent(client).remember(NOTE)
        async with http_client(http_service.url, token, LEGACY, human=form_answerer) as client:
            agent = Agent(client)
            call = partial(agent.forget, record_id, new_key("forget"))
            link = await link_of(call)
            assert forms == []  # the client's form was never used
            code = terminal_code(http_service, approval_id_of(link))
            assert await answer_on_page(link, "approve", code) == 200
            forgotten = ok_value(await call())
        assert forgotten["receipt"]["to_state"] == "tombstoned"
    finally:
        runtime.host = host


async def test_the_history_names_the_reason_and_the_approver_at_the_terminal_or_in_the_form(
    http_service: HttpService, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38, item 2, on the real server: a forget approved at the terminal and a withdraw
    answered in the client's form; ``admin records history`` names the agent's reason_ref and
    who approved each."""
    workspace, token = http_service.tokens.fresh()
    async with http_client(http_service.url, token, LEGACY) as client:  # it cannot ask
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        error = await protocol_error(partial(client.call_tool, FORGET, arguments))
        data_dir = http_service.server.approvals.book.path.parent
        answer = ["approvals", "approve", "--data-dir", str(data_dir), "--operator", "ops-dana"]
        assert main([*answer, error.data["approval_id"]]) == 0
        assert ok_value(await client.call_tool(FORGET, arguments))["receipt"]["operation"] == (
            "tombstone"
        )
    async with http_client(http_service.url, token, MODERN, human=Human()) as client:
        agent = Agent(client)
        candidate_id = await agent.captured("A draft the agent takes back.")
        assert ok_value(await agent.withdraw(candidate_id))["receipt"]["to_state"] == "withdrawn"
    capsys.readouterr()
    shown = ["--data-dir", str(data_dir), "--workspace", workspace, "--json"]
    steps = []
    for target in (record_id, candidate_id):
        assert main(["admin", "records", "history", target, *shown]) == 0
        steps.append(json.loads(capsys.readouterr().out)[-1])
    assert [(s["operation"], s["reason"], s["approved_by"]) for s in steps] == [
        ("tombstone", "reason:obsolete", "operator:ops-dana at the terminal"),
        ("withdraw", "reason:captured-by-mistake", "form answered by the client"),
    ]
