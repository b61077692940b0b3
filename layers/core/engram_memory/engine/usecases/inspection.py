"""What an operator reads of the canonical store: candidates, records, the journal, its
verified head, the counts by state, the ledger entries of journal steps, and every scope.

The operator plane (inspection, decisions, repair) reads through these and never through the
store itself, so the engine stays the one owner of the store. Each read maps a store fault as
``Kernel.read`` does (``STORE_UNAVAILABLE``); none writes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from engram_memory.engine.context import Scope
from engram_memory.engine.journal import verify_journal
from engram_memory.engine.kernel import Kernel
from engram_memory.engine.ports import (
    CandidateRow,
    CandidateState,
    JournalEvent,
    JournalHead,
    LedgerByCursor,
    LedgerEntry,
    RecordRow,
    RecordState,
)
from engram_memory.engine.records import decode

JOURNAL_PAGE: Final = 500


def candidate(k: Kernel, scope: Scope, candidate_id: str) -> CandidateRow | None:
    """The candidate, in any state and whoever captured it."""
    return k.read(lambda: k.store.candidate_get(scope, candidate_id))


def candidates(
    k: Kernel, scope: Scope, state: CandidateState | None, after: str, limit: int
) -> list[CandidateRow]:
    """``scope``'s candidates (in ``state`` when given) after ``after``, in id order."""
    return k.read(lambda: k.store.candidates_list(scope, state, after, limit))


def record(k: Kernel, scope: Scope, record_id: str) -> RecordRow | None:
    """The record, in any state (a tombstoned one without its body)."""
    return k.read(lambda: k.store.record_get(scope, record_id))


def records(
    k: Kernel, scope: Scope, state: RecordState | None, after: str, limit: int
) -> list[RecordRow]:
    """``scope``'s records (in ``state`` when given) after ``after``, in id order."""
    return k.read(lambda: k.store.records_list(scope, state, after, limit))


def records_by_id(k: Kernel, scope: Scope, record_ids: Sequence[str]) -> dict[str, RecordRow]:
    """The rows of ``record_ids`` that exist, by id, with their bodies."""
    return k.read(lambda: k.store.records_get(scope, record_ids))


def events(k: Kernel, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]:
    """One page of ``scope``'s journal: the events after ``after_cursor``, oldest first."""
    return k.read(lambda: k.store.events(scope, after_cursor, limit))


def journal(k: Kernel, scope: Scope) -> Iterator[tuple[JournalEvent, dict[str, Any]]]:
    """Every event of ``scope``'s journal with its body decoded, oldest first, read a page at
    a time."""
    after = 0
    while page := events(k, scope, after, JOURNAL_PAGE):
        for event in page:
            yield event, decode(event.body)
        after = page[-1].cursor


def head(k: Kernel, scope: Scope) -> JournalHead:
    return k.read(lambda: k.store.head(scope))


def verified_head(k: Kernel, scope: Scope) -> JournalHead:
    """``scope``'s head once its whole journal is walked (``journal.verify_journal``):
    ``CURSOR_GAP`` or ``JOURNAL_CORRUPT`` when it does not hold together."""
    return k.read(lambda: verify_journal(k.store, scope))


def state_counts(k: Kernel, scope: Scope) -> dict[str, int]:
    """Candidates and records per state, outbox items per kind (``Store.state_counts``)."""
    return k.read(lambda: k.store.state_counts(scope))


def scopes(k: Kernel) -> list[Scope]:
    """Every scope whose journal has an event."""
    return k.read(k.store.scopes)


def ledger_at(k: Kernel, scope: Scope, cursors: Sequence[int]) -> dict[int, LedgerEntry]:
    """The ledger entries of journal ``cursors`` (who committed each step, an operator's
    reason), by cursor; none from a store that cannot find them (``ports.LedgerByCursor``)."""
    store = k.store
    if not isinstance(store, LedgerByCursor):
        return {}
    return k.read(lambda: store.ledger_at(scope, cursors))
