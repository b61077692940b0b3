"""The ``LexicalIndex`` and ``VectorIndex`` ports over the store's own projection tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    IndexHit,
    IndexUnavailable,
    ProjectionChange,
    StoreUnavailable,
)

T = TypeVar("T")


class _StoreSurface:
    """A projection surface inside the store: applied in the store's own commit."""

    name: str
    maintained_by_store: Final = True

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def _asked(self, ask: Callable[[], T]) -> T:
        """The store's answer; the store being unavailable is this index being unavailable."""
        try:
            return ask()
        except StoreUnavailable as exc:
            raise IndexUnavailable(f"{self.name} index unavailable") from exc

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        self._asked(lambda: self._store.lexical_apply(scope, change))


class SqliteLexicalIndex(_StoreSurface):
    """The ``LexicalIndex`` port over the store's per-scope FTS5 tables."""

    name: Final = "lexical"
    scoring_formula_ref: Final = lexical.SCORING_FORMULA_REF  # FTS5 bm25() with column weights

    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        return self._asked(lambda: self._store.lexical_search(scope, terms, depth))

    def near_duplicates(self, scope: Scope, text: str, depth: int) -> list[IndexHit]:
        """``NearDuplicateIndex``: the records sharing LSH bands with ``text`` (``near_bands``)."""
        return self._asked(lambda: self._store.near_duplicates(scope, text, depth))

    def contains(self, scope: Scope, record_id: str) -> bool:
        return self._store.lexical_contains(scope, record_id)


class SqliteVectorIndex(_StoreSurface):
    """The ``VectorIndex`` port over the store's per-scope vector tables (exact cosine scan)."""

    name: Final = "semantic"
    scoring_formula_ref: Final = "cosine:exact-scan,float32"
    vector_formula_ref: Final = scoring_formula_ref

    def nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        return self._asked(lambda: self._store.vector_nearest(scope, vector, depth))

    def score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        return self._asked(lambda: self._store.vector_score_at(scope, vector, rank))

    def similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        return self._asked(lambda: self._store.vector_similarities(scope, vector, record_ids))

    def contains(self, scope: Scope, record_id: str) -> bool:
        return self._store.vector_contains(scope, record_id)

    def has_vector(self, scope: Scope, record_id: str) -> bool:
        return self._store.vector_contains(scope, record_id)
