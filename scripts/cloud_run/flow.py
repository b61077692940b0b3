"""Step 2, the end-to-end flow: the adapter receives API Gateway HTTP API v2 events and drives
initialize, tools/list, capture, request_admission, search, get, withdraw (form mode, 2026-07-28,
the withdraw state machine runs) and forget (URL mode, 2025-11-25: the approval page is the built
approval function, the forget state machine runs), then search and get see the record gone; a
second forget in form mode; last, no bearer token in any payload the run produced. On the page,
the agent's own identity is refused first, then the approver its token names approves."""

from __future__ import annotations

import json
from typing import Any

from .approval import approve_the_link
from .edges import edges
from .forgeries import forgeries
from .harness import Harness
from .mcp import (
    CLASSIC,
    MODERN,
    admit,
    call,
    capture,
    confirm_in_form_mode,
    mcp,
    receipt_state,
    search_hits,
    structured,
    value,
    wait_execution,
    wait_quiet,
)
from .schedules import drain, rotate_secrets
from .settings import TOOLS, sample
from .tally import tally_between

GENERAL = "purpose:general"


def flow(h: Harness) -> None:
    handshake(h)
    record_id = remember(h)
    if record_id is None:
        return
    search_args = {**sample("search.json")["arguments"], "query": "release train Tuesday"}
    get_args = {"record_id": record_id, "purpose_ref": GENERAL}
    find_and_read(h, record_id, search_args, get_args)
    drain(h, "the admission's projection upsert")
    if not withdraw_in_form_mode(h):
        return
    if not forget_in_url_mode(h, record_id, search_args, get_args):
        return
    forget_in_form_mode(h)
    drain(h, "the forgets' projection drops")
    edges(h, search_args)
    forgeries(h)
    rotate_secrets(h)
    scan_for_tokens(h)
    check_the_services(h)


def handshake(h: Harness) -> None:
    """initialize over the execute-api host, then tools/list."""
    client = {"name": "cloud-check", "version": "1"}
    params = {"protocolVersion": CLASSIC, "capabilities": {}, "clientInfo": client}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    status, init = mcp(h, initialize, protocol=CLASSIC)
    h.report.check(
        status == 200 and init.get("result", {}).get("protocolVersion") == CLASSIC,
        f"flow: initialize over the execute-api host -> HTTP {status}",
    )
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    _, listed = mcp(h, tools_list, protocol=CLASSIC)
    names = sorted(t["name"] for t in listed.get("result", {}).get("tools", []))
    h.report.check(
        names == sorted(f"engram_memory_{t}" for t in TOOLS),
        f"flow: tools/list -> {len(names)} tools",
    )


def remember(h: Harness) -> str | None:
    """capture, then request_admission: the record's id (None when either failed)."""
    text = "The release train leaves every Tuesday at 14:00 UTC from the main branch."
    candidate_id = capture(h, text, "cloud-check-capture-0001")
    if candidate_id is None:
        return None
    h.report.check(True, f"flow: capture -> {candidate_id[:20]}…")
    admission = sample("request_admission.json")["arguments"]
    admitted = admit(h, candidate_id, "cloud-check-admit-00001", admission)
    if admitted is None:
        return None
    record_id, status = admitted
    h.report.check(status == "accepted", f"flow: request_admission -> {status}")
    return record_id


def find_and_read(
    h: Harness, record_id: str, search_args: dict[str, Any], get_args: dict[str, Any]
) -> None:
    """search finds the record (also with a date in the query), get reads it."""
    hits, said = search_hits(call(h, "search", search_args))
    h.report.check(record_id in hits, f"flow: search finds the record ({said})")
    # A date in the query: time-aware ranking parses it with dateparser, which the layer
    # must carry (the engine imports it on the first such query, not at start).
    dated = call(h, "search", {**search_args, "query": "release train on 27 May 2026"})
    hits, said = search_hits(dated)
    version = (
        (((dated.get("result") or {}).get("structuredContent") or {}).get("output") or {})
        .get("value", {})
        .get("rank_receipt", {})
        .get("profile_version")
    )
    h.report.check(
        record_id in hits and version == "2.1.0",
        f"flow: a search naming a date ranks with time-aware profile {version} ({said})",
    )
    got = call(h, "get", get_args)
    h.report.check(structured(got).get("ok") is True, "flow: get reads the record")


def withdraw_in_form_mode(h: Harness) -> bool:
    """withdraw (2026-07-28): the adapter asks, the human answers in the client, the withdraw
    state machine runs. False when the flow cannot go on."""
    text = "Draft: rotate the signing keys."
    pending_id = capture(h, text, "cloud-check-capture-02")
    if pending_id is None:
        return False
    withdraw = {
        "candidate_id": pending_id,
        "idempotency_key": "cloud-check-withdraw-01",
        "reason_ref": "reason:captured-by-mistake",
    }
    done = confirm_in_form_mode(h, "withdraw", withdraw)
    if done is None:
        return False
    state = receipt_state(done)
    h.report.check(
        structured(done).get("ok") is True and state == "withdrawn",
        f"flow: withdraw confirmed -> {state or json.dumps(done)[:300]}",
    )
    execution = wait_execution(h, "WithdrawStateMachine")
    h.report.check(
        execution["status"] == "SUCCEEDED",
        f"flow: the withdraw state machine ran on moto -> {execution['status']}",
    )
    return True


def forget_in_url_mode(
    h: Harness, record_id: str, search_args: dict[str, Any], get_args: dict[str, Any]
) -> bool:
    """forget (2025-11-25): -32042 with the approval page's URL, approved on the built page, the
    forget state machine runs; then get and search no longer see the record."""
    start = h.tally.snapshot(h.lambdas, h.work)
    forget = {
        "record_id": record_id,
        "idempotency_key": "cloud-check-forget-0001",
        "reason_ref": "reason:obsolete",
    }
    if not approve_the_link(h, call(h, "forget", forget), agent_tries_first=True):
        return False
    execution = wait_execution(h, "ForgetStateMachine")
    h.report.check(
        execution["status"] == "SUCCEEDED",
        f"flow: the forget state machine ran on moto -> {execution['status']}",
    )
    retried = call(h, "forget", forget)
    state = receipt_state(retried)
    h.report.check(
        state == "tombstoned", f"flow: forget retried -> {state or json.dumps(retried)[:300]}"
    )
    wait_quiet(h)
    url_mode = tally_between(start, h.tally.snapshot(h.lambdas, h.work), "forget")
    print(f"  tally: forget, URL mode ({CLASSIC}): {url_mode}")
    print(f"  tally: forget, URL mode: replayed = {value(retried).get('replayed')}")
    code = structured(call(h, "get", get_args)).get("error", {}).get("code")
    h.report.check(code == "NOT_FOUND", f"flow: get after forget -> {code}")
    hits, said = search_hits(call(h, "search", search_args))
    h.report.check(
        said.startswith("ok") and record_id not in hits,
        f"flow: search no longer finds the record ({said})",
    )
    return True


def forget_in_form_mode(h: Harness) -> None:
    """forget, form mode (2026-07-28): asked, approved in the client, committed."""
    text = "The staging database is rebuilt from snapshots every Sunday night."
    candidate_id = capture(h, text, "cloud-check-capture-03")
    admitted = None if candidate_id is None else admit(h, candidate_id, "cloud-check-admit-00003")
    if admitted is None:
        return
    forget = {
        "record_id": admitted[0],
        "idempotency_key": "cloud-check-forget-0002",
        "reason_ref": "reason:obsolete",
    }
    start = h.tally.snapshot(h.lambdas, h.work)
    done = confirm_in_form_mode(h, "forget", forget)
    if done is None:
        return
    state = receipt_state(done)
    h.report.check(
        structured(done).get("ok") is True and state == "tombstoned",
        f"flow: forget confirmed in form mode -> {state or json.dumps(done)[:300]}",
    )
    wait_quiet(h)
    form_mode = tally_between(start, h.tally.snapshot(h.lambdas, h.work), "forget")
    replayed = (structured(done).get("output") or {}).get("value", {}).get("replayed")
    print(f"  tally: forget, form mode ({MODERN}): {form_mode}")
    print(f"  tally: forget, form mode: replayed = {replayed}")


def scan_for_tokens(h: Harness) -> None:
    """No bearer token in any payload the run produced: invocations, execution inputs, task
    outputs, the functions' logs."""
    minted = h.issuer.minted
    secrets_seen = [*minted] + [t.rsplit(".", 1)[-1] for t in minted]
    places: dict[str, list[bytes]] = {
        "function invocation payloads": list(h.lambdas.payloads),
        "execution inputs": [i.encode() for i in h.tally.start_executions],
        "task outputs": [o.encode() for o in h.tally.task_outputs],
        "function logs": [p.read_bytes() for p in sorted(h.work.glob("*.log"))],
    }
    for place, blobs in places.items():
        hits = sum(1 for blob in blobs for t in secrets_seen if t.encode() in blob)
        h.report.check(
            hits == 0,
            f"payload scan: {len(minted)} bearer token(s) in {len(blobs)} {place}: {hits} hit(s)",
        )


def check_the_services(h: Harness) -> None:
    """The state machines ran the workflow function; OpenSearch saw only known requests."""
    steps = [step for _, step in h.lambdas.invocations]
    workflow = sum(1 for f, _ in h.lambdas.invocations if f.endswith("-workflow"))
    h.report.check(
        {"await_approval", "commit_transition", "finish_tail"} <= set(steps),
        f"flow: the state machines invoked the built workflow function ({workflow} step(s))",
    )
    unknown = h.search.unknown
    h.report.check(
        not unknown,
        f"flow: every OpenSearch request had a known shape ({len(h.search.requests)} "
        f"request(s)){'; unknown: ' + ', '.join(unknown[:3]) if unknown else ''}",
    )
