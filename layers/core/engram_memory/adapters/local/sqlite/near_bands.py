"""The near-duplicate sketch beside each scope's FTS5 table: the LSH band keys of every record it
holds (``policy.quality.band_keys``), so the quality gate's neighbours are looked up by band, at
a cost that follows how many records share the candidate's bands, not the scope's size (issue 39;
the FTS5 query they replace scored every record sharing a term with the candidate: 50 ms at 10k
records).

One table per lexical table, ``<lexical table>_near``: ``(band, lex_rowid)``, the record named by
its FTS5 row (``records.lex_rowid``), written and deleted with that row in the same transaction
(``projections.project``), so what it finds is what the store holds. A band is a hash of a piece
of a MinHash signature of the record's text, not the text; it goes with the FTS5 row when the
record is forgotten, and is left out of backups like every projection.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections import Counter
from typing import Final

from engram_memory.engine.context import Scope
from engram_memory.policy.quality import BANDS, NUM_PERM, band_keys, memo_partition

# How many records of one band are read at most: a band shared by more (the same text captured
# over and over) still yields that many, and the cost of a lookup stays bounded whatever the
# store holds. Each near-duplicate shares ~all bands, so it is found through any of them.
BAND_READ_LIMIT: Final = 32
# The sketch's layout (the bands' shape and hash): a store whose sketches are of another (or of
# none, from before them) is re-projected when opened (``projections.staleness``).
VERSION: Final = f"lsh-{BANDS}x{NUM_PERM // BANDS}-1"
SUFFIX: Final = "_near"


def table_of(lexical_table: str) -> str:
    return lexical_table + SUFFIX


def create(conn: sqlite3.Connection, lexical_table: str) -> None:
    """The sketch table of ``lexical_table`` and its index by row, made when missing."""
    table = table_of(lexical_table)
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (band INTEGER NOT NULL, "
        "lex_rowid INTEGER NOT NULL, PRIMARY KEY (band, lex_rowid)) WITHOUT ROWID"
    )
    conn.execute(f"CREATE INDEX IF NOT EXISTS {table}_rows ON {table} (lex_rowid)")


def insert(
    conn: sqlite3.Connection, scope: Scope, lexical_table: str, lex_rowid: int, text: str
) -> None:
    conn.executemany(
        f"INSERT OR IGNORE INTO {table_of(lexical_table)} VALUES (?, ?)",  # noqa: S608 - ours
        [(band, lex_rowid) for band in band_keys(text, partition=_partition(scope))],
    )


def _partition(scope: Scope) -> str:
    return memo_partition(scope.tenant_id, scope.workspace_id)


def delete(conn: sqlite3.Connection, lexical_table: str, lex_rowid: int) -> None:
    conn.execute(
        f"DELETE FROM {table_of(lexical_table)} WHERE lex_rowid = ?",  # noqa: S608 - ours
        (lex_rowid,),
    )


@functools.lru_cache(maxsize=64)
def _bands_query(lexical_table: str, bands: int) -> str:
    """The rows of ``bands`` bands of ``lexical_table``'s sketch, each band with its limit
    (parameters: band, limit, band, limit...; a LIMIT applies to one band only inside its own
    subquery of the compound select)."""
    one = (
        f"SELECT * FROM (SELECT lex_rowid FROM {table_of(lexical_table)} "  # noqa: S608 - ours
        "WHERE band = ? LIMIT ?)"
    )
    return " UNION ALL ".join([one] * bands)


def alike(
    conn: sqlite3.Connection, scope: Scope, lexical_table: str, text: str, depth: int
) -> list[tuple[str, float]]:
    """At most ``depth`` records of ``scope`` sharing a band with ``text``, as ``(record_id,
    share of the bands in common)``, most shared first, then ``record_id``."""
    keys = band_keys(text, partition=_partition(scope))
    if not keys:
        return []
    conn.execute("BEGIN")  # the bands and the rows they name read in one snapshot
    try:
        # One statement for every band (each still read up to the limit): 32 statements, each
        # a round trip through the driver, cost more than the seeks they run.
        shared: Counter[int] = Counter(
            rowid
            for (rowid,) in conn.execute(
                _bands_query(lexical_table, len(keys)),
                [value for band in keys for value in (band, BAND_READ_LIMIT)],
            )
        )
        if not shared:
            return []  # new content: no band in common, no row to name
        ids = dict(
            conn.execute(
                f"SELECT rowid, record_id FROM {lexical_table} "  # noqa: S608 - ours
                "WHERE rowid IN (SELECT value FROM json_each(?))",
                (json.dumps(list(shared)),),
            ).fetchall()
        )
    finally:
        conn.execute("COMMIT")
    found = [(str(ids[rowid]), count / BANDS) for rowid, count in shared.items() if rowid in ids]
    found.sort(key=lambda hit: (-hit[1], hit[0]))
    return found[:depth]
