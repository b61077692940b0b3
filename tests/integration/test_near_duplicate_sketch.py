"""The embedded store's near-duplicate sketch (issue 39, ``adapters/local/sqlite/near_bands.py``):
the LSH bands the quality gate's neighbours are looked up by, kept in the record's own commit.

It finds every near-duplicate the lexical neighbours (the FTS5 query it replaced) let the gate
find; it finds nothing for new content; its bands go with a forgotten record and stay out of
backups; a store from before it is sketched when opened; one band read is bounded."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from engram_memory.adapters.local.sqlite import near_bands
from engram_memory.embedded.composition import open_embedded
from engram_memory.engine import lexical
from engram_memory.engine.ports import Neighbour
from engram_memory.engine.usecases.admission import NEIGHBOUR_DEPTH
from engram_memory.policy.quality import (
    BANDS,
    DEFAULT_NEAR_DUPLICATE_THRESHOLD,
    memo_partition,
    resembled,
)

from engram_testing import (
    Harness,
    capture_args,
    context,
    embedded_harness,
    handled,
    remember_in,
)

_SERVICES = ("billing", "search", "payroll", "deploy", "audit", "mail")
_ACTIONS = (
    "retries failed card charges",
    "rotates its signing keys",
    "compacts the event log",
    "sends the weekly digest",
    "re-reads its settings",
    "snapshots the customer tables",
    "drops expired sessions",
)
_WHEN = ("three times an hour apart", "every night at two", "on the first working day")
FACTS = [
    f"The {service} service {action} {when}."
    for service, action, when in itertools.islice(
        itertools.product(_SERVICES, _ACTIONS, _WHEN), 0, None, 4
    )
]


def _variations(fact: str) -> list[str]:
    """What the quality gate exists to catch: the same fact re-cased, re-punctuated, with a
    typo, with a filler word, with a word changed."""
    words = fact.split()
    return [
        fact.upper(),
        fact.replace(" ", "  ").replace(".", "!!"),
        fact[:10] + fact[11] + fact[10] + fact[12:],
        " ".join([*words[:3], "basically", *words[3:]]),
        " ".join([*words[:-1], "today."]),
    ]


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    harness = embedded_harness(tmp_path)
    harness.without_quality_gate()  # to seed records that resemble each other
    return harness


def _flagged(text: str, ids: list[str], texts: dict[str, str]) -> set[str]:
    found = resembled(
        text,
        [Neighbour(i, texts[i]) for i in ids],
        DEFAULT_NEAR_DUPLICATE_THRESHOLD,
        partition=memo_partition("t", "w"),
    )
    return {record_id for record_id, _ in found}


def test_the_sketch_finds_every_near_duplicate_the_lexical_neighbours_found(
    harness: Harness,
) -> None:
    texts = {harness.remember(fact): fact for fact in FACTS}
    scope = context().scope
    caught = 0
    for fact in FACTS:
        for variation in _variations(fact):
            ranked = harness.index.search(scope, lexical.query_terms(variation), NEIGHBOUR_DEPTH)
            before = _flagged(variation, [hit.record_id for hit in ranked], texts)
            sketched = harness.index.near_duplicates(scope, variation, NEIGHBOUR_DEPTH)
            after = _flagged(variation, [hit.record_id for hit in sketched], texts)
            assert before <= after, (fact, variation)
            caught += bool(after)
    assert caught >= 4 * len(
        FACTS
    )  # most variations are near-duplicates (the rest: a word changed)


def test_new_content_has_no_neighbours_and_shares_no_band(harness: Harness) -> None:
    for fact in FACTS:
        harness.remember(fact)
    scope = context().scope
    new = "Invoices go out on the first working day of each month, by post."
    assert harness.index.near_duplicates(scope, new, NEIGHBOUR_DEPTH) == []
    assert harness.index.search(scope, lexical.query_terms(new), NEIGHBOUR_DEPTH)  # it would
    assert harness.index.near_duplicates(scope, "", NEIGHBOUR_DEPTH) == []


def _bands(database: Path) -> int:
    with sqlite3.connect(database) as db:
        tables = [t for (t,) in db.execute("SELECT table_name FROM lexical_tables")]
        return sum(
            db.execute(f"SELECT count(*) FROM {near_bands.table_of(t)}").fetchone()[0]
            for t in tables
        )


def test_a_forgotten_record_leaves_no_band_and_backups_hold_none(
    harness: Harness, tmp_path: Path
) -> None:
    first = harness.remember(FACTS[0])
    harness.remember(FACTS[1])
    assert _bands(tmp_path / "engram.db") == 2 * BANDS
    harness.store.backup_to(tmp_path / "backup.db")
    with sqlite3.connect(tmp_path / "backup.db") as db:
        names = [n for (n,) in db.execute("SELECT name FROM sqlite_master")]
    assert not [name for name in names if name.endswith(near_bands.SUFFIX)]
    assert harness.forget(first)["ok"]
    assert _bands(tmp_path / "engram.db") == BANDS
    found = harness.index.near_duplicates(context().scope, FACTS[0] + "!", NEIGHBOUR_DEPTH)
    assert first not in [hit.record_id for hit in found]


def test_a_store_from_before_the_sketch_is_sketched_when_opened(tmp_path: Path) -> None:
    host = open_embedded(tmp_path)
    try:
        remember_in(host.engine, FACTS[0], "sketch-key-00001")
    finally:
        host.close()
    with sqlite3.connect(tmp_path / "engram.db") as db:  # what such a store holds
        (table,) = db.execute("SELECT table_name FROM lexical_tables").fetchone()
        db.execute(f"DROP TABLE {near_bands.table_of(table)}")
        db.execute("DELETE FROM store_meta WHERE key = 'near_bands'")
    host = open_embedded(tmp_path)
    try:
        assert _bands(tmp_path / "engram.db") == BANDS
        ctx = context()
        captured = handled(
            host.engine, "capture", capture_args(FACTS[0].upper(), key="sketch-key-00002"), ctx
        )
        admitted = handled(
            host.engine,
            "request_admission",
            {
                "candidate_id": captured["output"]["value"]["candidate_id"],
                "idempotency_key": "sketch-key-00003",
            },
            ctx,
        )
        assert admitted["output"]["value"]["outcome"]["status"] == "pending_adjudication"
    finally:
        host.close()


def test_a_band_many_records_share_is_read_a_bounded_number_of_times(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(6):
        harness.remember(FACTS[0])
    scope = context().scope
    assert len(harness.index.near_duplicates(scope, FACTS[0], NEIGHBOUR_DEPTH)) == 6
    monkeypatch.setattr(near_bands, "BAND_READ_LIMIT", 2)
    assert len(harness.index.near_duplicates(scope, FACTS[0], NEIGHBOUR_DEPTH)) == 2
