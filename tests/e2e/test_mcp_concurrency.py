"""Twenty HTTP clients capture and admit at once: every acknowledged write is there afterwards,
exactly once, and the workspace's journal stays dense and unbroken."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from engram_memory.engine.context import Scope
from engram_memory.engine.journal import verify_journal

from e2e_support import (
    REVISIONS,
    Agent,
    HttpService,
    http_client,
    new_key,
    ok_value,
)

pytestmark = pytest.mark.anyio

CLIENTS = 20
NUMBERS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]


# Twenty different facts: the quality gate holds near-duplicates of a current record, and this
# test is about concurrency, not about twenty restatements of one sentence.
FACTS = [
    "the ingest queue drained on time before the nightly export",
    "billing moved its ingest queue to the Frankfurt region",
    "a schema change paused the ingest queue for four minutes",
    "Priya owns the ingest queue runbook since March",
    "the ingest queue alarms page the data on-call rotation",
    "retries on the ingest queue back off up to ninety seconds",
    "Marketing events skip the ingest queue and land in Kafka",
    "the ingest queue keeps dead letters for fourteen days",
    "a load test pushed the ingest queue to 40k messages per second",
    "the ingest queue consumer was rewritten in Go last quarter",
    "audit logs are the only payload the ingest queue encrypts twice",
    "on Sundays the ingest queue is drained by a single worker",
    "the ingest queue dashboard lives in the Grafana folder Pipelines",
    "vendor webhooks enter through the ingest queue after signature checks",
    "the staging ingest queue is wiped every Monday at six",
    "the ingest queue's poison-message rate stays under one per million",
    "Tomasz proposed sharding the ingest queue by customer tier",
    "the ingest queue ran out of disk once, in the 2024 outage",
    "legal asked that the ingest queue never hold raw card numbers",
    "the ingest queue's backlog budget is fifteen minutes at peak",
]


def note(index: int) -> str:
    return f"Concurrent observation number {NUMBERS[index]}: {FACTS[index]}."


@pytest.mark.parametrize("mode", REVISIONS)
async def test_twenty_concurrent_clients_lose_no_acknowledged_write_and_duplicate_none(
    http_service: HttpService, mode: str
) -> None:
    workspace, token = http_service.tokens.fresh()
    acknowledged: dict[int, dict[str, Any]] = {}

    async def one_client(index: int) -> None:
        async with http_client(http_service.url, token, mode) as client:
            agent = Agent(client)
            arguments = agent.capture_arguments(note(index), new_key(f"capture-{index:02d}"))
            first = ok_value(await client.call_tool("engram_memory_capture", arguments))
            # A client that retries (say, after a lost reply) must not write twice.
            retried = ok_value(await client.call_tool("engram_memory_capture", arguments))
            assert first["status"] == "committed_pending"
            assert retried["status"] == "duplicate_exact"
            assert retried["candidate_id"] == first["candidate_id"]
            outcome = ok_value(await agent.admit(first["candidate_id"]))["outcome"]
            assert outcome["status"] == "accepted", outcome
            acknowledged[index] = {
                "candidate_id": first["candidate_id"],
                "record_id": outcome["record_id"],
                "cursors": (int(first["cursor"]), int(outcome["cursor"])),
            }

    async with anyio.create_task_group() as group:
        for index in range(CLIENTS):
            group.start_soon(one_client, index)

    assert sorted(acknowledged) == list(range(CLIENTS))
    record_ids = [write["record_id"] for write in acknowledged.values()]
    assert len(set(record_ids)) == CLIENTS
    assert len({write["candidate_id"] for write in acknowledged.values()}) == CLIENTS
    cursors = sorted(c for write in acknowledged.values() for c in write["cursors"])
    assert cursors == list(range(1, 2 * CLIENTS + 1))  # one event per write, none twice

    async with http_client(http_service.url, token, mode) as client:
        reader = Agent(client)
        for index, write in acknowledged.items():
            read = ok_value(await reader.get(write["record_id"]))
            assert read["record"]["record_id"] == write["record_id"]
            assert note(index) in [c["text"] for c in read["record"]["components"]]
        found = await reader.found("concurrent observation ingest queue")
        assert sorted(found) == sorted(record_ids)  # every write found, none twice
        ranked = ok_value(await reader.search("seventeen"))["records"]
        assert [packet["record"]["record_id"] for packet in ranked] == [
            acknowledged[17]["record_id"]
        ]

    scope = Scope(http_service.server.surface.runtime.host.tenant_id, workspace)
    assert verify_journal(http_service.server.host.store, scope).cursor == 2 * CLIENTS
