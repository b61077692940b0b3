"""The scope's vectors as one in-memory float32 matrix, kept with the store.

The store's vector tables are the truth; this is a cache of one table, reloaded when the table's
generation (a counter the store bumps in the same transaction as every vector write or delete)
differs from the one it was loaded at, so writes by any process are seen by the next search.

``nearest`` answers exactly what the scan of every stored vector answered (dot products of the
float32 vectors with the query, summed in float64 in index order, ties by ``record_id``): the
matrix product (float32, in C) only selects the candidates, every vector scoring within
``_FLOAT32_MARGIN`` of the ``depth``-th best, and those are scored exactly. The float32 product
of two unit vectors of a few hundred dimensions is within ~2.5e-5 of the exact one, so no vector
that belongs in the answer is left out.

The product runs on one BLAS thread (``_one_blas_thread``), like the embedder's one ONNX thread.
NumPy's OpenBLAS otherwise starts a thread per core for a product of a few thousand rows, and on
a machine whose cores are busy those threads spin waiting for each other: at 10k vectors on 2
loaded cores the product took 14 ms of CPU with two threads and 3.3 ms with one (a hybrid search
40 → 24 ms CPU p50, p99 114 → 38 ms). A server answers concurrent searches on its own threads.
"""

from __future__ import annotations

import operator
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from engram_memory.engine.ports import IndexHit

_FLOAT32_MARGIN: Final = 1e-4
_BLAS: dict[str, Any] = {}  # the process's BLAS thread-pool controller, made on first use
_BLAS_LOCK = threading.Lock()


def _one_blas_thread() -> None:
    """Limit the process's BLAS libraries to one thread (module docstring). The controller
    (which inspects the loaded libraries, milliseconds) is made once; setting the limit again on
    each search is cheap and keeps it when something else in the process changed it."""
    with _BLAS_LOCK:
        controller = _BLAS.get("controller")
        if controller is None:
            from threadpoolctl import ThreadpoolController

            controller = _BLAS["controller"] = ThreadpoolController()
        controller.limit(limits=1, user_api="blas")


@dataclass(frozen=True, slots=True)
class _Loaded:
    generation: int
    record_ids: list[str]
    matrix: Any  # numpy.ndarray (n, dimensions) of float32
    row_of: dict[str, int]  # record_id -> its row


class _LastProduct(threading.local):
    # A search asks ``nearest`` and then ``score_at`` (the hybrid floor) for one query: the
    # second reuses the first's product instead of computing it again. Per thread, one entry.
    loaded: _Loaded | None = None  # held, so identity means the same matrix
    query: bytes = b""
    product: Any = None


class VectorMatrices:
    """One cached matrix per vector table (thread-safe)."""

    def __init__(self) -> None:
        self._loaded: dict[str, _Loaded] = {}
        self._lock = threading.Lock()
        self._last = _LastProduct()

    def _product(self, loaded: _Loaded, vector: Sequence[float]) -> Any:
        """The float32 product of the matrix with ``vector`` (reused for the same query)."""
        import numpy as np

        query = np.asarray(vector, dtype=np.float32)
        last = self._last
        if last.loaded is not loaded or last.query != query.tobytes():
            _one_blas_thread()
            last.product = loaded.matrix @ query
            last.loaded, last.query = loaded, query.tobytes()
        return last.product

    def nearest(
        self,
        table: str,
        generation: int,
        load: Callable[[], list[tuple[str, bytes]]],
        vector: Sequence[float],
        depth: int,
    ) -> list[IndexHit]:
        import numpy as np  # the semantic extra's: only a semantic host has vector tables

        loaded = self._current(table, generation, load)
        count = len(loaded.record_ids)
        if count == 0 or depth <= 0:
            return []
        approximate = self._product(loaded, vector)
        if count > depth:
            kth = float(np.partition(approximate, count - depth)[count - depth])
            chosen = np.flatnonzero(approximate >= kth - _FLOAT32_MARGIN)
        else:
            chosen = np.arange(count)
        query = array("d", vector)
        hits = [
            IndexHit(
                loaded.record_ids[i],
                sum(map(operator.mul, query, loaded.matrix[i].tolist())),
            )
            for i in chosen.tolist()
        ]
        hits.sort(key=lambda hit: (-hit.score, hit.record_id))
        return hits[:depth]

    def similarities(
        self,
        table: str,
        generation: int,
        load: Callable[[], list[tuple[str, bytes]]],
        vector: Sequence[float],
        record_ids: Sequence[str],
    ) -> dict[str, float]:
        """The exact similarity of each of ``record_ids`` that has a vector (float64 dot products
        of its float32 row, as ``nearest`` scores)."""
        import numpy as np

        loaded = self._current(table, generation, load)
        rows = [(rid, loaded.row_of[rid]) for rid in record_ids if rid in loaded.row_of]
        if not rows:
            return {}
        picked = loaded.matrix[[row for _, row in rows]].astype(np.float64)
        scores = picked @ np.asarray(vector, dtype=np.float64)
        return {rid: float(score) for (rid, _), score in zip(rows, scores.tolist(), strict=True)}

    def score_at(
        self,
        table: str,
        generation: int,
        load: Callable[[], list[tuple[str, bytes]]],
        vector: Sequence[float],
        rank: int,
    ) -> float | None:
        """The exact similarity of the vector at ``rank`` (1-based) by the float32 product, or of
        the farthest when there are fewer: one partition, one exact dot product."""
        import numpy as np

        loaded = self._current(table, generation, load)
        count = len(loaded.record_ids)
        if count == 0 or rank <= 0:
            return None
        approximate = self._product(loaded, vector)
        kth = max(count - rank, 0)
        index = int(np.argpartition(approximate, kth)[kth])
        exact: float = sum(map(operator.mul, array("d", vector), loaded.matrix[index].tolist()))
        return exact

    def _current(
        self, table: str, generation: int, load: Callable[[], list[tuple[str, bytes]]]
    ) -> _Loaded:
        with self._lock:
            loaded = self._loaded.get(table)
            if loaded is not None and loaded.generation == generation:
                return loaded
        import numpy as np

        rows = load()
        record_ids = [str(record_id) for record_id, _ in rows]
        matrix = (
            np.frombuffer(b"".join(bytes(blob) for _, blob in rows), dtype="<f4")
            .reshape(len(rows), -1)
            .astype(np.float32)
            if rows
            else np.zeros((0, 0), dtype=np.float32)
        )
        fresh = _Loaded(
            generation, record_ids, matrix, {rid: i for i, rid in enumerate(record_ids)}
        )
        with self._lock:
            self._loaded[table] = fresh
        return fresh

    def clear(self) -> None:
        with self._lock:
            self._loaded.clear()
