"""The flow's other paths, each a case a deployed stack meets: a person declining (in the
client's form and on the page), a withdraw approved on the page, an admission the policy
rejects, a capture and an admission the token makes ask for a person, an admission while
OpenSearch is down (it waits) and while it refuses writes (the outbox and its drainer), and
memories above DynamoDB's item limit (S3
bodies, a shredded body whose delete S3 refused). They make the recording cover what the
stack's roles are granted: a grant no case exercises fails the IAM step
(``probes.unused_grants``)."""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

from .approval import approve_on_the_page, approve_the_link, page_link
from .harness import Harness
from .mcp import (
    DECLINE,
    admit,
    call,
    capture,
    capture_arguments,
    confirm_in_form_mode,
    receipt_state,
    running_executions,
    search_hits,
    structured,
    value,
    wait_execution,
    wait_quiet,
)
from .schedules import drain

GENERAL = "purpose:general"
# Ten components of ~60 KiB of varied words: the record body, packed (deflate) before it is
# sealed, stays above the store's 256 KiB inline limit, so S3 holds both bodies.
LARGE_COMPONENTS = 10
LARGE_COMPONENT_BYTES = 60_000
AWS_KEY = "AKIA" + "QZ7RT4MX2PLK9WNB"  # an access key id's shape: the policy rejects it


def edges(h: Harness, search_args: dict[str, Any]) -> None:
    declined(h)
    withdraw_on_the_page(h)
    rejected(h)
    confirmed_writes(h)
    admitted = admit_while_search_is_down(h, search_args)
    if admitted is not None:
        forget_while_search_is_down(h, admitted[0], search_args)
    forget_while_keys_stay(h)
    large_memory(h, search_args)
    large_memory_drained(h)
    withdraw_large_candidate(h)


def _code(answer: Any) -> str | None:
    code = (structured(answer or {}).get("error") or {}).get("code")
    return None if code is None else str(code)


def _still_waiting(h: Harness, timeout_s: float = 15.0) -> set[str]:
    """The runs still waiting for an answer once a declined form has had time to end its own
    (the function's SendTaskFailure; moto moves the run on in its own thread)."""
    until = time.monotonic() + timeout_s
    while True:
        waiting = running_executions(h) - h.abandoned
        if not waiting or time.monotonic() > until:
            return waiting
        time.sleep(0.2)


def declined(h: Harness) -> None:
    """A person declines: a withdraw and a forget in the client's form (2026-07-28), a forget
    on the page (2025-11-25); none commits, and a page-declined execution ends."""
    pending_id = capture(h, "Draft: move the standup to Thursdays.", "cloud-check-capture-05")
    if pending_id is not None:
        withdraw = {
            "candidate_id": pending_id,
            "idempotency_key": "cloud-check-withdraw-02",
            "reason_ref": "reason:captured-by-mistake",
        }
        done = confirm_in_form_mode(h, "withdraw", withdraw, DECLINE)
        waiting = _still_waiting(h)
        h.abandoned |= waiting
        h.report.check(
            _code(done) == "gate_failed" and not waiting,
            f"flow: a withdraw declined in the form -> {_code(done)}, its run ended"
            f" ({len(waiting)} left waiting)",
        )
    for mode, key in (("form", "0004"), ("page", "0003")):
        text = {
            "form": "The release checklist lives beside the runbooks.",
            "page": "Quarterly budget reviews need the finance lead's sign-off.",
        }[mode]
        candidate_id = capture(h, text, f"cloud-check-capture-decline-{mode}")
        admitted = (
            None if candidate_id is None else admit(h, candidate_id, f"cloud-check-admit-d{key}")
        )
        if admitted is None:
            return
        forget = {
            "record_id": admitted[0],
            "idempotency_key": f"cloud-check-forget-{key}",
            "reason_ref": "reason:obsolete",
        }
        if mode == "form":
            done = confirm_in_form_mode(h, "forget", forget, DECLINE)
            waiting = _still_waiting(h)
            h.abandoned |= waiting
            h.report.check(
                not waiting,
                f"flow: a forget declined in the form ended its run ({len(waiting)} left waiting)",
            )
        else:
            approval_id = page_link(h, call(h, "forget", forget))
            if approval_id is None:
                return
            approve_on_the_page(h, approval_id, "decline")
            wait_execution(h, "ForgetStateMachine")
            done = call(h, "forget", forget)
        h.report.check(
            _code(done) == "gate_failed",
            f"flow: a forget declined ({mode}) -> {_code(done)}",
        )


def withdraw_on_the_page(h: Harness) -> None:
    """A withdraw at 2025-11-25: the page shows the candidate (its digest, never its sealed
    text) and the person approves there; the retry commits."""
    pending_id = capture(h, "Draft: archive the Q3 planning notes.", "cloud-check-capture-07")
    if pending_id is None:
        return
    withdraw = {
        "candidate_id": pending_id,
        "idempotency_key": "cloud-check-withdraw-03",
        "reason_ref": "reason:captured-by-mistake",
    }
    if not approve_the_link(h, call(h, "withdraw", withdraw), "withdraw"):
        return
    wait_execution(h, "WithdrawStateMachine")
    state = receipt_state(call(h, "withdraw", withdraw))
    h.report.check(state == "withdrawn", f"flow: a withdraw approved on the page -> {state}")


def rejected(h: Harness) -> None:
    """A capture holding an access key id: sealed, then rejected by the policy (its key
    shredded), and never echoed."""
    candidate_id = capture(h, f"The deploy key is {AWS_KEY} for now.", "cloud-check-capture-08")
    outcome = None if candidate_id is None else admit(h, candidate_id, "cloud-check-admit-00008")
    status = outcome[1] if outcome else None
    h.report.check(status == "rejected", f"flow: a capture holding a key is rejected -> {status}")


def confirmed_writes(h: Harness) -> None:
    """A token that lists capture and request_admission in ``engram_confirm``: both ask for a
    person in the client's form, and commit once approved. The admission runs in a new
    container, which opens the scope's record key made by an earlier one."""
    h.restart("RequestAdmissionFunction")
    confirm = ("capture", "request_admission")
    text = "Incident reviews are published within five working days."
    done = confirm_in_form_mode(
        h, "capture", capture_arguments(text, "cloud-check-capture-09"), confirm=confirm
    )
    try:
        candidate_id = str(value(done)["candidate_id"])
    except (KeyError, TypeError):
        h.report.check(False, f"flow: a confirmed capture -> {json.dumps(done)[:300]}")
        return
    admission = {"candidate_id": candidate_id, "idempotency_key": "cloud-check-admit-00009"}
    admitted = confirm_in_form_mode(h, "request_admission", admission, confirm=confirm)
    status = (value(admitted) or {}).get("outcome", {}).get("status") if admitted else None
    h.report.check(
        status == "accepted", f"flow: a capture and an admission confirmed in the form -> {status}"
    )


def admit_while_search_is_down(
    h: Harness, search_args: dict[str, Any], arguments: dict[str, Any] | None = None
) -> tuple[str, str] | None:
    """An admission while the OpenSearch domain answers 503 waits: ``RANKING_UNAVAILABLE``
    (retriable, nothing written), the near-duplicate gate never decides without the index. The
    same call while the domain refuses writes only: the record is committed with its projection
    upsert left in the outbox; the drainer's next run applies it and clears it."""
    text = "The on-call handbook moved to the wiki's operations space in November."
    if arguments is None:
        candidate_id = capture(h, text, "cloud-check-capture-04")
    else:
        candidate_id = _captured(h, call(h, "capture", arguments))
    if candidate_id is None:
        return None
    key = f"admit-while-down-{candidate_id[-12:]}"
    h.search.unavailable = True
    try:
        waited = call(
            h, "request_admission", {"candidate_id": candidate_id, "idempotency_key": key}
        )
    finally:
        h.search.unavailable = False
    h.report.check(
        _code(waited) == "RANKING_UNAVAILABLE",
        f"flow: an admission while OpenSearch is down waits ({_code(waited)}, nothing written)",
    )
    h.search.refusing_writes = True
    try:
        admitted = admit(h, candidate_id, key)
    finally:
        h.search.refusing_writes = False
    if admitted is None:
        return None
    pending = drain(h, "an upsert left while the domain was down")
    query = (
        " ".join(str(arguments["payload"]["components"][0]["text"]).split()[:4])
        if arguments
        else "on-call handbook wiki"
    )
    found = call(h, "search", {**search_args, "query": query, "max_packet_bytes": 1_048_576})
    hits, said = search_hits(found)
    h.report.check(
        admitted[1] == "accepted" and admitted[0] in hits,
        f"flow: admitted while OpenSearch refused writes ({admitted[1]}), searchable after the "
        f"drainer's run ({said}; drainer: {json.dumps(pending)[:120]})",
    )
    return admitted


def forget_while_search_is_down(h: Harness, record_id: str, search_args: dict[str, Any]) -> None:
    """A forget whose execution's projection drop meets OpenSearch down: the drop stays in the
    outbox, and the drainer's next run applies it."""
    forget = {
        "record_id": record_id,
        "idempotency_key": "cloud-check-forget-while-down",
        "reason_ref": "reason:obsolete",
    }
    h.search.unavailable = True
    try:
        done = confirm_in_form_mode(h, "forget", forget)
        wait_quiet(h)
    finally:
        h.search.unavailable = False
    drained = drain(h, "a drop left while the domain was down")
    query = {**search_args, "query": "on-call handbook wiki"}
    hits, said = search_hits(call(h, "search", query))
    h.report.check(
        done is not None and receipt_state(done) == "tombstoned" and record_id not in hits,
        f"flow: forgotten while OpenSearch was down, gone from search after the drainer's run "
        f"({said}; drainer: {json.dumps(drained)[:120]})",
    )


def forget_while_keys_stay(h: Harness) -> None:
    """A forget whose key destruction meets a key table that refuses deletes (throttled) for
    everyone but the drainer: the execution's tail retries, the drainer's next run destroys the
    record's key from the outbox, and the tail then finds nothing left."""
    text = "The incident bridge number changes every quarter."
    candidate_id = capture(h, text, "cloud-check-capture-10")
    admitted = None if candidate_id is None else admit(h, candidate_id, "cloud-check-admit-00010")
    if admitted is None:
        return
    forget = {
        "record_id": admitted[0],
        "idempotency_key": "cloud-check-forget-keys-stay",
        "reason_ref": "reason:obsolete",
    }
    with key_deletes_refused(h) as refused:
        done = confirm_in_form_mode(h, "forget", forget)
        until = time.monotonic() + 30
        while not refused and time.monotonic() < until:
            time.sleep(0.1)
        keys_before = key_items(h)
        drained = drain(h, "a key destruction the execution could not finish")
        keys_after = key_items(h)
    wait_quiet(h)
    h.report.check(
        done is not None
        and receipt_state(done) == "tombstoned"
        and bool(refused)
        and keys_after < keys_before,
        f"flow: forgotten while the key table refused deletes ({len(refused)} refused); the "
        f"drainer destroyed the key ({keys_before} -> {keys_after} key items; drainer: "
        f"{json.dumps(drained)[:100]})",
    )


@contextlib.contextmanager
def key_deletes_refused(h: Harness) -> Iterator[list[str]]:
    """The key table answers DeleteItem with throttling to every principal but the drainer
    (moto runs in this process; the recorder knows whose request it is answering). Yields the
    principals refused so far."""
    from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException
    from moto.dynamodb.models import DynamoDBBackend

    key_table = str(h.stack.refs["EngramKeyTable"])
    refused: list[str] = []
    delete = DynamoDBBackend.delete_item

    def throttled(backend: Any, table_name: str, *args: Any, **kwargs: Any) -> Any:
        principal = getattr(h.recorder.current, "principal", None)
        if table_name == key_table and principal != "OutboxDrainerFunction":
            refused.append(str(principal))
            raise DynamodbException(
                ERROR_TYPE_PREFIX + "ProvisionedThroughputExceededException",
                "cloud-check: the key table refuses deletes for now",
            )
        return delete(backend, table_name, *args, **kwargs)

    with patch.object(DynamoDBBackend, "delete_item", throttled):
        yield refused


def key_items(h: Harness) -> int:
    """How many items the key table holds (the harness's own view)."""
    dynamodb = h.session.client("dynamodb", endpoint_url=h.moto_url)
    return int(
        dynamodb.scan(TableName=str(h.stack.refs["EngramKeyTable"]), Select="COUNT")["Count"]
    )


def varied_words(seed: int, size: int) -> str:
    """Pronounceable made-up words (deterministic): text that deflate cannot shrink much and
    that no secret detector mistakes for a key."""
    rng = random.Random(seed)  # noqa: S311 - test text, not a secret
    words: list[str] = []
    length = 0
    while length < size:
        syllables = rng.randint(2, 4)
        word = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(syllables))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def large_arguments(key: str, seed: int = 0, components: int = LARGE_COMPONENTS) -> dict[str, Any]:
    """A capture of ``components`` x ~60 KiB of text citing one source."""
    arguments = capture_arguments("placeholder", key)
    payload = arguments["payload"]
    template = payload["components"][0]
    parts = [
        {
            **template,
            "component_id": f"component:part-{index}",
            "text": varied_words(seed + index, LARGE_COMPONENT_BYTES),
        }
        for index in range(components)
    ]
    payload["components"] = parts
    payload["primary_component_id"] = parts[0]["component_id"]
    joined = "".join(c["text"] for c in parts)
    digest = capture_arguments(joined, key)["payload"]["citations"][0]["content_digest"]
    payload["citations"][0]["content_digest"] = digest
    return arguments


def _captured(h: Harness, captured: Any) -> str | None:
    try:
        return str(value(captured)["candidate_id"])
    except (KeyError, TypeError):
        h.report.check(False, f"flow: a large capture -> {json.dumps(captured)[:300]}")
        return None


def large_memory(h: Harness, search_args: dict[str, Any]) -> None:
    """A memory above DynamoDB's item limit: its sealed candidate and its record body go to the
    blob bucket; search and get read the body back; the page shows it to the person who
    approves its forget; forget shreds it (a BLOB_GC marker) while S3 refuses deletes, so the
    drainer's next run deletes the object and the marker."""
    arguments = large_arguments("cloud-check-capture-large")
    candidate_id = _captured(h, call(h, "capture", arguments))
    admitted = None if candidate_id is None else admit(h, candidate_id, "cloud-check-admit-large")
    if admitted is None or not h.report.check(
        admitted[1] == "accepted", f"flow: a ~600 KiB memory admitted -> {admitted and admitted[1]}"
    ):
        return
    record_id = admitted[0]
    blobs = blob_keys(h)
    words = " ".join(arguments["payload"]["components"][0]["text"].split()[:4])
    big = {"max_packet_bytes": 1_048_576}
    hits, said = search_hits(call(h, "search", {**search_args, "query": words, **big}))
    got = call(h, "get", {"record_id": record_id, "purpose_ref": GENERAL, **big})
    h.report.check(
        structured(got).get("ok") is True and record_id in hits and len(blobs) >= 2,
        f"flow: search ({said}) and get read a record whose body is in S3 ({len(blobs)} blob(s))"
        + ("" if structured(got).get("ok") else f": {json.dumps(got)[:300]}"),
    )
    drain(h, "the large record's projection upsert")
    forget = {
        "record_id": record_id,
        "idempotency_key": "cloud-check-forget-large",
        "reason_ref": "reason:obsolete",
    }
    with s3_deletes_failing():
        if not approve_the_link(h, call(h, "forget", forget)):
            return
        wait_execution(h, "ForgetStateMachine")
        wait_quiet(h)
    kept = blob_keys(h)
    drain(h, "the large record's drop and its shredded blob, which S3 refused to delete")
    left = blob_keys(h)
    h.report.check(
        receipt_state(call(h, "forget", forget)) == "tombstoned" and len(left) < len(kept),
        f"flow: forget shreds a body held in S3 ({len(blobs)} blob(s) before; {len(kept)} while "
        f"S3 refused deletes; {len(left)} after the drainer's run)",
    )


def large_memory_drained(h: Harness) -> None:
    """A large memory admitted while OpenSearch refuses writes (the drainer reads its body from
    S3 to project it), then forgotten in the form with S3 answering (the workflow deletes the
    object and its marker itself)."""
    arguments = large_arguments("cloud-check-capture-large-3", seed=200)
    search_args = {"query": "", "purpose_ref": GENERAL, "limit": 5}
    admitted = admit_while_search_is_down(h, search_args, arguments)
    if admitted is None:
        return
    before = blob_keys(h)
    forget = {
        "record_id": admitted[0],
        "idempotency_key": "cloud-check-forget-large-3",
        "reason_ref": "reason:obsolete",
    }
    done = confirm_in_form_mode(h, "forget", forget)
    wait_quiet(h)
    left = blob_keys(h)
    h.report.check(
        done is not None and receipt_state(done) == "tombstoned" and len(left) < len(before),
        f"flow: a large record forgotten in the form, its body deleted at once ({len(before)} "
        f"blob(s) before, {len(left)} after)",
    )


def withdraw_large_candidate(h: Harness) -> None:
    """A candidate above the item limit withdrawn in the form."""
    candidate_id = _captured(
        h,
        call(h, "capture", large_arguments("cloud-check-capture-large-2", seed=100, components=5)),
    )
    if candidate_id is None:
        return
    withdraw = {
        "candidate_id": candidate_id,
        "idempotency_key": "cloud-check-withdraw-large",
        "reason_ref": "reason:captured-by-mistake",
    }
    done = confirm_in_form_mode(h, "withdraw", withdraw)
    wait_quiet(h)
    h.report.check(
        done is not None and receipt_state(done) == "withdrawn",
        f"flow: a large candidate withdrawn -> {done and receipt_state(done)}",
    )


@contextlib.contextmanager
def s3_deletes_failing() -> Iterator[None]:
    """S3 answers every DeleteObject with an error (moto runs in this process)."""
    from moto.s3.exceptions import S3ClientError
    from moto.s3.models import S3Backend

    def refuse(*_: Any, **__: Any) -> Any:
        raise S3ClientError("ServiceUnavailable", "cloud-check: S3 refuses deletes for now")

    with patch.object(S3Backend, "delete_object", refuse):
        yield


def blob_keys(h: Harness) -> list[str]:
    """The objects in the blob bucket (the harness's own view, not a recorded call)."""
    s3 = h.session.client("s3", endpoint_url=h.moto_url)
    listed = s3.list_objects_v2(Bucket=str(h.stack.refs["EngramBlobBucket"]))
    return [str(o["Key"]) for o in listed.get("Contents", [])]
