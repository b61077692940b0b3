"""Step 3, the operator: ``engram-memory admin --stack engram-memory-dev ...`` as an operator runs
it, against the stack the harness registered in moto's CloudFormation (``Stack._cloudformation``).

The CLI is the project venv's console script (``.venv/bin/engram-memory``; ``scripts/devenv.py``
installs the package there when it is missing), run as a subprocess whose only credentials are
the operator's access key (``settings.access_key(OPERATOR)``), with ``AWS_ENDPOINT_URL`` (moto)
and ``AWS_ENDPOINT_URL_LAMBDA`` (the harness's Lambda service, where it invokes the outbox
drainer's built worker): every AWS call it makes is recorded as the operator's (``recorder``).
Each command's ``--json`` document is read for what it did, and the outside is checked where it
shows: the agent's search and get through the built adapter, the fake OpenSearch domain's
documents, the operator audit log group and the functions' log groups in moto's CloudWatch Logs.

The commands (every one of ``admin --help`` that works against a stack), in the flow's
workspace: status; pending list, show and withdraw; adjudicate accept and reject (two captures the
admission policy held as near-duplicates of a current record); records list, show, history and
every lifecycle step (dispute, resolve, supersede, expire, trust-invalidate, forget); export (both
formats); import (a ``@modelcontextprotocol/server-memory`` JSONL file and a folder of Markdown
notes: dry run, run, re-run); reindex; keys rotate; tokens revoke; backup; restore, which the
stack refuses because it holds memories (restoring into an empty stack needs a second stack:
``tests/integration/test_cloud_operator_cli.py`` does it on moto); audit and policy, which say
where the cloud keeps them. Then the smoke command (``operator_smoke``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .harness import Harness
from .mcp import CLASSIC, call, capture_arguments, mcp, search_hits, structured, value
from .operator_shell import Cli, open_cli
from .operator_smoke import operator_smoke, scan_outputs
from .settings import (
    KEY_ADMIN,
    STACK_NAME,
    TENANT,
    WORKSPACE,
)

# Near-duplicates (character shingles, see engram_memory/policy/quality.py): B and C are held
# for adjudication while A is current.
TEXT_A = "The nightly export to the data lake starts at 02:00 UTC and takes about forty minutes."
TEXT_B = (
    "The nightly export to the data lake starts at 02:00 UTC and takes about forty-five minutes."
)
TEXT_C = "the nightly export to the data lake starts at 02:00 utc, and takes about forty minutes!"
TEXT_D = "Draft: the staging cluster might move to another region next quarter."
TEXT_E = "The pager rotation hands over every Monday at 09:00 in the on-call channel."
TEXT_F = "Sealed before the rotation: the blob bucket keeps large attributes for 30 days."


# -- the agent's side, through the built adapter -----------------------------------------------


def capture(h: Harness, text: str, key: str) -> str:
    """An agent's capture of ``text``: its candidate id ('' when it failed, reported)."""
    answer = call(h, "capture", capture_arguments(text, key))
    try:
        return str(value(answer)["candidate_id"])
    except (KeyError, TypeError):
        h.report.check(False, f"operator: an agent's capture -> {json.dumps(answer)[:300]}")
        return ""


def admit(h: Harness, candidate_id: str, key: str) -> dict[str, Any]:
    """An agent's request_admission: its outcome ({} when there is none, reported)."""
    answer = call(h, "request_admission", {"candidate_id": candidate_id, "idempotency_key": key})
    try:
        outcome: dict[str, Any] = value(answer)["outcome"]
    except (KeyError, TypeError):
        h.report.check(
            False, f"operator: an agent's request_admission -> {json.dumps(answer)[:300]}"
        )
        return {}
    return outcome


def found(h: Harness, query: str) -> list[str]:
    """The record ids an agent's search finds."""
    return search_hits(call(h, "search", {"query": query, "purpose_ref": "purpose:general"}))[0]


def got(h: Harness, record_id: str) -> str:
    """An agent's get: 'ok' or the error code."""
    answer = structured(call(h, "get", {"record_id": record_id, "purpose_ref": "purpose:general"}))
    return "ok" if answer.get("ok") is True else str((answer.get("error") or {}).get("code"))


# -- the commands --------------------------------------------------------------------------------


def operator(h: Harness) -> None:
    """Every ``admin`` command against the stack (module doc), then the smoke command."""
    cli = open_cli(h)
    if cli is None or not status(h, cli):
        return
    before = pending(cli)
    held = held_for_adjudication(h)
    if held is None:
        return
    record_a, candidate_b, candidate_c = held
    record_b = pending_and_adjudication(h, cli, candidate_b, candidate_c, before)
    if record_b:
        records_and_lifecycle(h, cli, record_a, record_b)
    reindex(h, cli, import_and_export(h, cli))
    keys_and_tokens(h, cli)
    backup_and_restore(h, cli)
    said_where(h, cli)
    audit_log(h)
    function_logs(h)
    operator_smoke(h, cli)
    scan_outputs(h, cli)
    slowest = sorted(cli.took, reverse=True)[:3]
    print(
        f"  tally: operator: {len(cli.took)} admin run(s) in {sum(t for t, _ in cli.took):.1f} s;"
        f" slowest {', '.join(f'{c} {t:.1f} s' for t, c in slowest)}"
    )


def status(h: Harness, cli: Cli) -> bool:
    done = cli.workspace("status")
    doc = done.document if isinstance(done.document, dict) else {}
    scope = doc.get("scope") or {}
    health = (doc.get("key_store") or {}).get("health")
    return h.report.check(
        done.code == 0
        and scope == {"tenant_id": TENANT, "workspace_id": WORKSPACE}
        and health == "ok"
        and (doc.get("records") or {}).get("tombstoned", 0) >= 1,
        f"operator: status finds {STACK_NAME} in CloudFormation (tenant {scope.get('tenant_id')}):"
        f" the flow's records {doc.get('records')}, key store {health} {done.said()}",
    )


def held_for_adjudication(h: Harness) -> tuple[str, str, str] | None:
    """A current record (A) and two near-duplicates of it the policy holds (B, C)."""
    candidate_a = capture(h, TEXT_A, "operator-capture-a-000001")
    admitted = admit(h, candidate_a, "operator-admit-a-00000001") if candidate_a else {}
    if admitted.get("status") != "accepted":
        h.report.check(False, f"operator: an agent's record to hold near-duplicates of: {admitted}")
        return None
    held = []
    for name, text in (("b", TEXT_B), ("c", TEXT_C)):
        candidate = capture(h, text, f"operator-capture-{name}-000001")
        outcome = admit(h, candidate, f"operator-admit-{name}-00000001") if candidate else {}
        held.append((candidate, outcome.get("status")))
    statuses = [status for _, status in held]
    h.report.check(
        statuses == ["pending_adjudication"] * 2,
        f"operator: an agent's two near-duplicates of a current record are held for"
        f" adjudication ({', '.join(map(str, statuses))})",
    )
    return str(admitted["record_id"]), held[0][0], held[1][0]


def pending(cli: Cli) -> set[str]:
    listed = cli.workspace("pending", "list")
    return {str(c.get("candidate_id")) for c in listed.document or [] if isinstance(c, dict)}


def pending_and_adjudication(
    h: Harness, cli: Cli, held_b: str, held_c: str, before: set[str]
) -> str:
    """pending list/show, adjudicate accept and reject, pending withdraw: the accepted record.
    ``before``: what was pending before the two were held (the capture sample's candidate)."""
    listed = pending(cli)
    h.report.check(
        listed - before == {held_b, held_c},
        f"operator: pending list -> the 2 held candidate(s), beside {len(before)} captured"
        " before (never admitted)",
    )
    shown = cli.workspace("pending", "show", held_b)
    h.report.check(
        shown.code == 0 and TEXT_B in json.dumps((shown.document or {}).get("record")),
        f"operator: pending show opens the held candidate's text {shown.said()}",
    )
    accepted = cli.workspace("adjudicate", held_b, "accept", "--reason", "the longer run is right")
    record_b = str((accepted.document or {}).get("record_id") or "")
    h.report.check(
        accepted.code == 0
        and (accepted.document or {}).get("status") == "accepted"
        and record_b in h.search.record_ids(WORKSPACE)
        and record_b in found(h, "nightly export data lake forty five minutes"),
        f"operator: adjudicate accept -> {(accepted.document or {}).get('status')} {record_b[:16]}…,"
        f" projected by the drainer the CLI invoked, found by an agent {accepted.said()}",
    )
    rejected = cli.workspace("adjudicate", held_c, "reject", "--reason", "a duplicate of A")
    h.report.check(
        rejected.code == 0 and (rejected.document or {}).get("status") == "rejected",
        f"operator: adjudicate reject -> {(rejected.document or {}).get('status')} {rejected.said()}",
    )
    draft = capture(h, TEXT_D, "operator-capture-d-000001")
    withdrawn = cli.workspace("pending", "withdraw", draft, "--reason", "captured by mistake")
    receipt = (withdrawn.document or {}).get("receipt") or {}
    h.report.check(
        withdrawn.code == 0 and receipt.get("to_state") == "withdrawn" and pending(cli) == before,
        f"operator: pending withdraw -> {receipt.get('to_state')}; what the operator decided is no"
        f" longer pending {withdrawn.said()}",
    )
    return record_b


def step(cli: Cli, name: str, record: str, *extra: str) -> str:
    """A lifecycle step of ``record``: the state its receipt names ('' when none)."""
    done = cli.workspace("records", name, record, "--reason", f"operator {name}", *extra)
    return str(((done.document or {}).get("receipt") or {}).get("to_state") or done.said())


def records_and_lifecycle(h: Harness, cli: Cli, record_a: str, record_b: str) -> None:
    listed = cli.workspace("records", "list")
    states = {r.get("record_id"): r.get("state") for r in listed.document or []}
    h.report.check(
        listed.code == 0 and states.get(record_a) == states.get(record_b) == "accepted_current",
        f"operator: records list -> {len(states)} record(s), A and B accepted_current",
    )
    shown = cli.workspace("records", "show", record_a)
    h.report.check(
        shown.code == 0 and TEXT_A in json.dumps((shown.document or {}).get("record")),
        f"operator: records show opens the record's body ({(shown.document or {}).get('state')})",
    )
    history = cli.workspace("records", "history", record_a)
    operations = [e.get("operation") for e in history.document or [] if isinstance(e, dict)]
    h.report.check(
        history.code == 0 and operations[:2] == ["capture", "admit"],
        f"operator: records history -> {', '.join(map(str, operations))}",
    )
    lifecycle(h, cli, record_a, record_b)


def lifecycle(h: Harness, cli: Cli, record_a: str, record_b: str) -> None:
    """dispute, resolve, supersede, expire, trust-invalidate, forget: each receipt's state, and
    the projection the drainer left (search and get see only accepted_current)."""
    checks: list[tuple[str, str, str, bool]] = []

    def record(name: str, target: str, want: str, *extra: str, searchable: bool) -> None:
        state = step(cli, name, target, *extra)
        checks.append((name, want, state, (target in h.search.record_ids(WORKSPACE)) == searchable))

    record("dispute", record_a, "accepted_disputed", searchable=False)
    record("resolve", record_a, "accepted_current", searchable=True)
    record("supersede", record_a, "historical", "--by", record_b, searchable=False)
    record("expire", record_b, "expired", searchable=False)
    candidate = capture(h, TEXT_E, "operator-capture-e-000001")
    record_e = str(admit(h, candidate, "operator-admit-e-00000001").get("record_id") or "")
    record("trust-invalidate", record_e, "trust_invalid", searchable=False)
    record("forget", record_e, "tombstoned", searchable=False)
    for name, want, state, projection in checks:
        h.report.check(
            state == want and projection,
            f"operator: records {name} -> {state}; the drainer "
            + ("projected it" if want == "accepted_current" else "dropped its projection"),
        )
    seen = {got(h, record_a), got(h, record_b), got(h, record_e)}
    h.report.check(
        seen == {"NOT_FOUND"},
        f"operator: an agent's get of the historical, expired and forgotten records -> {seen}",
    )


def current(cli: Cli) -> set[str]:
    listed = cli.workspace("records", "list", "--state", "accepted_current")
    return {str(r.get("record_id")) for r in listed.document or [] if isinstance(r, dict)}


MCP_MEMORY = [  # @modelcontextprotocol/server-memory's file: one entity or relation per line
    {
        "type": "entity",
        "name": "Release train",
        "entityType": "process",
        "observations": ["Leaves every Tuesday at 14:00 UTC", "Is cut from the main branch"],
    },
    {
        "type": "entity",
        "name": "Incident review",
        "entityType": "meeting",
        "observations": ["Held on Thursdays for every paging incident of the week"],
    },
    {
        "type": "relation",
        "from": "Incident review",
        "to": "Release train",
        "relationType": "audits",
    },
]
NOTES = {
    "on-call.md": "---\ntitle: On-call handbook\ntype: note\ndate: 2026-11-02\n---\n"
    "The primary on-call answers pages within fifteen minutes.\n\n"
    "- [decision] Escalate to the secondary after two unanswered pages\n"
    "- [fact] The paging tool rings the phone and the laptop\n",
    "runbooks/restore.md": "# Restoring a table\n\nRestores go to a new table first;"
    " compare the journal heads before switching.\n\n- [procedure] Never restore over a live table\n",
}


def import_and_export(h: Harness, cli: Cli) -> set[str]:
    """Both imports, then both exports: the current records."""
    source = h.work / "memory.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in MCP_MEMORY), "utf-8")
    records = current(cli)
    records = imported(h, cli, source, "mcp-memory", len(MCP_MEMORY), "Tuesday release", records)
    notes = h.work / "notes"
    for name, text in NOTES.items():
        (notes / name).parent.mkdir(parents=True, exist_ok=True)
        (notes / name).write_text(text, "utf-8")
    records = imported(h, cli, notes, "markdown", len(NOTES), "secondary unanswered", records)
    exported = cli.workspace("export")
    lines = exported.lines if exported.code == 0 else []
    ids = {str((line.get("record") or {}).get("record_id")) for line in lines}
    h.report.check(
        exported.code == 0 and ids == records,
        f"operator: export -> {len(lines)} current record(s) with their receipts (JSON Lines)",
    )
    as_graph = cli.workspace("export", "--format", "mcp-memory")
    kinds = {line.get("type") for line in (as_graph.lines if as_graph.code == 0 else [])}
    h.report.check(
        as_graph.code == 0 and kinds <= {"entity", "relation"} and bool(kinds),
        f"operator: export --format mcp-memory -> {sorted(map(str, kinds))} lines",
    )
    return records


def imported(
    h: Harness, cli: Cli, source: Path, fmt: str, items: int, query: str, before: set[str]
) -> set[str]:
    """import --dry-run writes nothing, import admits every item, a re-run adds nothing; the
    current records after (``before``: those before)."""
    argv = [str(source), "--format", fmt, "--principal", "importer", "--purpose", "purpose:general"]
    argv.insert(0, "import")
    dry = cli.workspace(*argv, "--dry-run")
    unchanged = current(cli) == before
    done = cli.workspace(*argv)
    again = cli.workspace(*argv)
    after = current(cli)
    counts = [(d.document or {}).get(k) for d, k in ((dry, "accepted"), (done, "accepted"))]
    counts.append((again.document or {}).get("already_imported"))
    hits = found(h, query)
    h.report.check(
        dry.code == done.code == again.code == 0
        and counts == [items] * 3
        and unchanged
        and len(after - before) == items
        and bool(set(hits) - before),
        f"operator: import --format {fmt} ({items} items): dry run {counts[0]} accepted and"
        f" nothing written, run {counts[1]} accepted, re-run {counts[2]} already imported; an"
        f" agent finds them ({len(hits)} hit(s)) {done.said() or again.said()}",
    )
    return after


def reindex(h: Harness, cli: Cli, records: set[str]) -> None:
    done = cli.workspace("reindex")
    doc = done.document or {}
    h.report.check(
        done.code == 0
        and doc.get("indexed") == len(records)
        and h.search.record_ids(WORKSPACE) == records,
        f"operator: reindex -> the drainer indexed {doc.get('indexed')} record(s), exactly the"
        f" {len(records)} current ones are projected {done.said()}",
    )


def keys_and_tokens(h: Harness, cli: Cli) -> None:
    sealed = capture(h, TEXT_F, "operator-capture-f-000001")
    rotated = cli.admin("keys", "rotate", signer=KEY_ADMIN)  # the key policy's key admin only
    doc = rotated.document or {}
    opened = cli.workspace("pending", "show", sealed)
    h.report.check(
        rotated.code == 0
        and doc.get("rotated") == "on_demand"
        and doc.get("data_key") == h.stack.refs.get("EngramDataKey.Arn")
        and TEXT_F in json.dumps((opened.document or {}).get("record")),
        f"operator: keys rotate -> {doc.get('rotated')} on the stack's data key; a candidate"
        f" sealed before still opens {rotated.said()}",
    )
    cli.workspace("pending", "withdraw", sealed, "--reason", "rotation check done")
    revoke_a_token(h, cli)


def searched_with(h: Harness, token: str) -> str:
    """An agent's search with ``token``: 'ok' or the error code."""
    body = {
        "jsonrpc": "2.0",
        "id": 11,
        "method": "tools/call",
        "params": {
            "name": "engram_memory_search",
            "arguments": {"query": "release train", "purpose_ref": "purpose:general"},
        },
    }
    answer = mcp(h, body, protocol=CLASSIC, headers={"authorization": f"Bearer {token}"})[1]
    content = structured(answer)
    return "ok" if content.get("ok") is True else str((content.get("error") or {}).get("code"))


def revoke_a_token(h: Harness, cli: Cli) -> None:
    import jwt

    # Not used before the revocation: a tool function trusts a "not revoked" answer for 5 s
    # (REVOCATION_CACHE_S), which a gate without sleeps would otherwise wait out.
    token = h.issuer.token()
    token_id = str(jwt.decode(token, options={"verify_signature": False})["jti"])
    revoked = cli.admin("tokens", "revoke", "--token-id", token_id)
    doc = revoked.document or {}
    after, other = searched_with(h, token), searched_with(h, h.issuer.token())
    h.report.check(
        revoked.code == 0
        and doc.get("revoked") == "token"
        and (after, other) == ("AUTHORIZATION_REVOKED", "ok"),
        f"operator: tokens revoke --token-id -> the revoked token's search {after}, another"
        f" token's {other} {revoked.said()}",
    )


def backup_and_restore(h: Harness, cli: Cli) -> None:
    done = cli.admin("backup")
    doc = done.document or {}
    location = str(doc.get("backup") or "")
    heads = doc.get("journal_heads") or {}
    h.report.check(
        done.code == 0
        and location.startswith(f"s3://{h.stack.refs.get('EngramBlobBucket')}/")
        and doc.get("keys_included") is False
        and f"{TENANT}/{WORKSPACE}" in heads,
        f"operator: backup -> a DynamoDB export to {location[:60]}, {doc.get('records')}"
        f" record(s), no keys, journal heads {heads} {done.said()}",
    )
    if not location:
        return
    for extra in ((), ("--new-keys",)):
        refused = cli.admin("restore", location, *extra)
        h.report.check(
            refused.code == 1
            and "RESTORE_REFUSED" in refused.err
            and "already holds memories" in refused.err,
            f"operator: restore{''.join(' ' + e for e in extra)} onto the stack, which holds"
            " memories, is refused"
            f" (a restore needs an empty stack; tests/integration restores into one): "
            f"{refused.said()[:120]}",
        )


def said_where(h: Harness, cli: Cli) -> None:
    """The commands the cloud does not have say where it keeps them; a failure is one line."""
    for command in (("audit",), ("policy", "show")):
        done = cli.admin(*command)
        h.report.check(
            done.code == 2
            and "with --stack" in done.err
            and len(done.err.strip().splitlines()) == 1,
            f"operator: admin {' '.join(command)} says where the cloud keeps it (exit 2): "
            f"{done.said()[:90]}",
        )
    unknown = cli.workspace("adjudicate", "candidate_unknown", "reject")
    h.report.check(
        unknown.code == 1
        and "NOT_FOUND" in unknown.err
        and len(unknown.err.strip().splitlines()) == 1,
        f"operator: adjudicate of an unknown candidate -> exit 1, one line: {unknown.said()[:90]}",
    )


def _events(h: Harness, group: str, stream: str = "") -> list[dict[str, Any]]:
    """The group's events (one stream's when ``stream`` is given)."""
    logs = h.session.client("logs", endpoint_url=h.moto_url)
    streams = {"logStreamNames": [stream]} if stream else {}
    pages = logs.get_paginator("filter_log_events").paginate(logGroupName=group, **streams)
    return [event for page in pages for event in page.get("events", [])]


def audit_log(h: Harness) -> None:
    """One line per operation in the operator audit log group, as the caller's ARN, no content."""
    lines = [json.loads(e["message"]) for e in _events(h, h.stack.refs["OperatorAuditLogGroup"])]
    tools = {str(line.get("tool")) for line in lines}
    # an import's captures and admissions are audited as the principal it names
    principals = {
        str(line.get("principal"))
        for line in lines
        if str(line.get("tool", "")).startswith("admin.")
    }
    expected = {
        "admin.status", "admin.pending_list", "admin.pending_show", "admin.adjudicate",
        "admin.withdraw", "admin.records_list", "admin.records_show", "admin.dispute",
        "admin.resolve", "admin.forget", "admin.export", "admin.import", "admin.reindex",
        "admin.keys_rotate", "admin.revoke", "admin.restore",
    }  # fmt: skip
    text = json.dumps(lines)
    h.report.check(
        expected <= tools
        and all(p.startswith("operator:arn:aws:") for p in principals)
        and not any(t in text for t in (TEXT_A, TEXT_B, TEXT_F, "Tuesday")),
        f"operator: the audit log group holds {len(lines)} line(s) of {len(tools)} kind(s), each"
        f" admin.* one as {', '.join(sorted(principals))}, no memory text"
        + (f"; missing {sorted(expected - tools)}" if expected - tools else ""),
    )


def function_logs(h: Harness) -> None:
    """Every worker invoked so far has START, END and REPORT lines in its log stream, and its
    first REPORT carries the init duration."""
    streams = groups = reports = 0
    wrong: list[str] = []
    for worker in h.lambdas.workers.values():
        if worker.cloudwatch is None or not worker.cloudwatch.stream:
            continue
        groups += 1
        # one stream per worker (an execution environment): a restarted function has two
        events = [
            e["message"] for e in _events(h, worker.cloudwatch.group, worker.cloudwatch.stream)
        ]
        kinds = [m.split(" ", 1)[0] for m in events]
        found_reports = [m for m in events if m.startswith("REPORT ")]
        reports += len(found_reports)
        streams += 1
        if (
            kinds.count("START") != kinds.count("END")
            or kinds.count("END") != len(found_reports)
            or "Init Duration" not in found_reports[0]
            or sum("Init Duration" in m for m in found_reports) != 1
        ):
            wrong.append(worker.name)
    h.report.check(
        groups > 0 and not wrong,
        f"operator: {groups} function log group(s) hold START/END/REPORT for each of {reports}"
        f" invocation(s), Init Duration on each worker's first"
        + (f"; wrong: {', '.join(wrong)}" if wrong else ""),
    )
