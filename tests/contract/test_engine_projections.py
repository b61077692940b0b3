"""Projections are never lost: an admitted record is found by search, or search says it is stale.

On the embedded set the projection is written in the admission's own transaction; on the AWS set
it is an outbox item of that transaction, run after the commit and by the drainer. The same
behaviour holds on both: never a silent miss, and ``reindex`` rebuilds a scope's index from the
canonical store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engram_memory.engine.ports import ProjectionChange
from engram_memory.operator_plane.repair import reindex

from engram_testing import Harness, context


def found(harness: Harness, query: str) -> list[str]:
    return [p["record"]["record_id"] for p in harness.search(query)["records"]]


def search_code(harness: Harness, query: str) -> str:
    envelope = harness.call("search", {"query": query, "purpose_ref": context().purpose_ref})
    if envelope["ok"]:
        return "OK"
    assert envelope["error"]["retriable"], envelope
    code: str = envelope["error"]["code"]
    return code


def index_deferred(harness: Harness) -> bool:
    return not harness.index.maintained_by_store


@contextmanager
def index_outage(harness: Harness) -> Iterator[None]:
    """The index refuses writes (the cloud's OpenSearch): an admission still finds its
    neighbours, its upsert after the commit fails. The embedded index lives in the store and
    cannot fail on its own, so there nothing changes."""
    if index_deferred(harness):
        harness.index.writable = False
    try:
        yield
    finally:
        if index_deferred(harness):
            harness.index.writable = True


def test_a_record_admitted_while_the_index_is_down_is_never_silently_missing(
    harness: Harness,
) -> None:
    with index_outage(harness):
        record_id = harness.remember("The billing cron runs at midnight UTC.")
    if index_deferred(harness):
        assert search_code(harness, "billing cron") == "PROJECTION_STALE"
        assert not harness.index.contains(context().scope, record_id)
        assert harness.engine.drain_outbox() == 1
    assert found(harness, "billing cron") == [record_id]
    assert harness.store.outbox_pending_in(context().scope, "upsert_projection", 10) == []


def test_a_pending_upsert_only_makes_its_own_scope_stale(harness: Harness) -> None:
    other = context(workspace="workspace-other")
    theirs = harness.remember("The billing cron runs at noon.", ctx=other)
    with index_outage(harness):
        harness.remember("The billing cron runs at midnight UTC.")
    envelope = harness.call("search", {"query": "billing", "purpose_ref": other.purpose_ref}, other)
    assert [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]] == [theirs]


def test_a_replayed_admission_projects_a_record_whose_upsert_was_lost(harness: Harness) -> None:
    captured = harness.capture("The VPN gateway lives in eu-west-1.")
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-replay-0001"}
    with index_outage(harness):  # the commit lands; the upsert after it does not
        first = harness.ok("request_admission", args)
    replay = harness.ok("request_admission", args)
    assert replay["replayed"] is True
    assert replay["outcome"] == first["outcome"]
    assert found(harness, "VPN gateway") == [first["outcome"]["record_id"]]  # no drain needed


def test_forgetting_a_record_whose_upsert_is_pending_leaves_nothing_stale_or_indexed(
    harness: Harness,
) -> None:
    with index_outage(harness):
        record_id = harness.remember("The staging password rotates weekly.")
    assert harness.forget(record_id)["ok"]
    assert search_code(harness, "staging password") == "OK"
    assert found(harness, "staging password") == []
    assert not harness.index.contains(context().scope, record_id)
    assert harness.store.outbox_pending_in(context().scope, None, 10) == []


def test_an_upsert_racing_a_forget_does_not_bring_the_forgotten_record_back(
    harness: Harness,
) -> None:
    """The upsert read the record before the forget; its write lands after the forget's drop."""
    record_id = harness.remember("The old deploy key lives in the vault.")
    scope = context().scope
    row_before_forget = harness.store.record_get(scope, record_id)
    assert harness.forget(record_id)["ok"]
    projected = harness.engine.project(scope, record_id, row_before_forget, [harness.index])
    assert projected is False
    assert not harness.index.contains(scope, record_id)


def test_reindex_rebuilds_a_lost_index_from_the_canonical_store(harness: Harness) -> None:
    scope = context().scope
    kept = [
        harness.remember("The billing cron runs at midnight UTC."),
        harness.remember("The billing dashboard lives in Grafana."),
    ]
    forgotten = harness.remember("The billing password is in the vault.")
    assert harness.forget(forgotten)["ok"]
    for record_id in [*kept, forgotten]:  # what a lost (or emptied) index looks like
        harness.index.apply(scope, ProjectionChange(delete_record_id=record_id))
    assert found(harness, "billing") == []

    report = reindex(harness.engine, scope)

    assert (report.indexed, report.dropped, report.pending_upserts) == (2, 1, 0)
    assert sorted(found(harness, "billing")) == sorted(kept)
    assert not harness.index.contains(scope, forgotten)
    assert reindex(harness.engine, scope) == report  # idempotent


def test_reindex_clears_a_scope_stale_from_a_failed_upsert(harness: Harness) -> None:
    scope = context().scope
    with index_outage(harness):
        record_id = harness.remember("The billing cron runs at midnight UTC.")
    report = reindex(harness.engine, scope)
    assert report.pending_upserts == 0 and report.indexed == 1
    assert found(harness, "billing cron") == [record_id]
