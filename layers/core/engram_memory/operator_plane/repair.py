"""What an operator repairs: a scope's projections rebuilt from the canonical store
(``reindex``, also the cloud drainer's and every restore's), every journal verified
(``verify_all``). Neither is audited here: the host audits the operation that runs them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope
from engram_memory.engine.kernel import Kernel
from engram_memory.engine.ports import IndexUnavailable, StoreUnavailable, VaultUnavailable
from engram_memory.engine.records import decode
from engram_memory.engine.usecases import inspection as canonical


def verify_all(engine: Kernel) -> dict[str, int]:
    """Verify every scope's journal (dense cursors, unbroken hash chain); the head cursor of
    each, by ``tenant/workspace``. Raises ``CURSOR_GAP`` or ``JOURNAL_CORRUPT``."""
    return {
        f"{scope.tenant_id}/{scope.workspace_id}": canonical.verified_head(engine, scope).cursor
        for scope in canonical.scopes(engine)
    }


_REINDEX_PAGE = 100


@dataclass(frozen=True, slots=True)
class ReindexReport:
    """What ``reindex`` did: records projected, forgotten records dropped, outbox items left."""

    indexed: int
    dropped: int
    pending_upserts: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def reindex(engine: Kernel, scope: Scope) -> ReindexReport:
    """Rebuild ``scope``'s projections (lexical, and vectors with a semantic channel) from the
    canonical store: after a lost or corrupted index, or to repair one an operator distrusts.

    Walks the scope's journal: every admitted candidate's record is projected again from its
    body in the store (an upsert, idempotent), and every record without a body (forgotten) is
    dropped, so nothing forgotten survives in the index. Then the scope's pending projection
    upserts run, which they now can. Safe beside live traffic: admissions during the walk
    project themselves, and a forget racing an upsert is caught by its re-check. Raises
    ``STORE_UNAVAILABLE`` or ``RANKING_UNAVAILABLE`` (an index that cannot be written); running
    it again after a failure is safe.
    """
    indexed = dropped = 0
    after = 0
    try:
        while True:
            events = canonical.events(engine, scope, after, _REINDEX_PAGE)
            if not events:
                break
            after = events[-1].cursor
            admitted = [
                body["target"]
                for body in (decode(event.body) for event in events)
                if body.get("operation") == "admit"
            ]
            record_ids = []
            for candidate_id in admitted:
                candidate = canonical.candidate(engine, scope, candidate_id)
                if candidate is not None:
                    record_ids.append(candidate.record_id)
            rows = canonical.records_by_id(engine, scope, record_ids)
            for record_id in record_ids:
                if engine.project(scope, record_id, rows.get(record_id), engine.surfaces):
                    indexed += 1
                else:
                    dropped += 1
        pending = engine.drain_scope(scope, "upsert_projection")
    except (StoreUnavailable, VaultUnavailable):
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    return ReindexReport(indexed=indexed, dropped=dropped, pending_upserts=pending)
