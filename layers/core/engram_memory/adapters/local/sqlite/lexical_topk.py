"""The best matches of an FTS5 ``OR`` query by bm25, scoring only the rows that can reach them.

FTS5 computes bm25 for every row an expression matches before ``ORDER BY score LIMIT n`` keeps
the best, and a query that shares one term (a name, a common word) with a quarter of the rows
then scores a quarter of the store (issue 26). This is MaxScore over FTS5's own scoring:

- FTS5's bm25 is a sum over the query's phrases of ``idf · f·(k1+1) / (f + k1·(1-b+b·D/avgdl))``
  (``fts5_aux.c``), so a phrase adds less than ``idf·(k1+1)`` to any row. ``idf = log((N-n+0.5) /
  (n+0.5))`` (at least 1e-6) grows with ``N`` and falls with ``n``; ``n``, the rows holding the
  term, comes from an ``fts5vocab`` table and ``max(rowid)`` bounds ``N``: each term's *bound*.
- The terms are split into the rarest, ``R``, and the rest, ``C``: a row holding no term of ``R``
  scores less than ``U_C``, the sum of ``C``'s bounds. FTS5 scores only the rows of ``R`` with the
  whole query's phrases by ``(t1 OR … OR tk) AND (r1 OR …)``: the phrases of ``R`` are counted
  twice there, so ``(r1 OR …)`` alone is scored too and subtracted; the idfs are the whole
  query's in both (FTS5 takes them from the phrase, not the expression), and the ``AND`` seeks
  the common terms' doclists to the rows of ``R`` instead of scoring their every row.
- When the depth-th best score among the rows of ``R`` (the *cut*) exceeds ``U_C``, no other row
  can reach the page: these are the best rows. Otherwise a row outside ``R`` reaches the cut only
  if it holds every term of a set of ``C`` whose bounds sum to it: the fewest such sets
  (``_covers``) join ``R`` in the driver, ``r1 OR … OR (c1 AND c2) OR …``, whose rows then hold
  every row that can reach the page (the ``AND``s cost seeks, not scores); its depth-th score is
  at least the cut, since its rows include ``R``'s. With too many sets ``R`` grows instead until
  ``U_C`` falls below the cut. Whenever the rows to score near a quarter of the matches, and on a
  small store, the plain query runs: it then costs less.

The subtraction is not FTS5's own sum: a score here is within ``_ulps`` of it (a few units in
the last place of the doubled sum; 12 at most on the bench's stores). Rows whose scores come that
close keep their order only when both queries scored them bit for bit alike, which is how FTS5
ties rows holding the query's terms equally often in rows of equal length (the bench's repeated
turns); any other near tie, and any such row just past the ``limit``-th, gives way to the plain
query. Two rows FTS5 scores apart by an ulp would have to give both sums identical bits to be
taken as tied: a coincidence of roundings not met in the tests or on the bench's stores. So the
rows and their order are the plain query's; the scores FTS5's to a few ulps.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from engram_memory.engine import lexical

# Below this many rows in the table, or matches (an upper bound: the terms' row counts summed),
# the plain query runs: python -m bench.lexical_topk found pruning slower on the 10k hot-path
# store, no better on the 30k one (p50 a little lower, p90 higher) and faster from 60k
# (docs/benchmarks.md, "Growth with the store").
PRUNE_FROM_ROWS: Final = 40_000
PRUNE_FROM_MATCHES: Final = 5_000
# The pruned queries score a row twice (and join): past this share of the matches they cost more.
_MAX_R_SHARE: Final = 0.25
# A set's rows are estimated by its rarest term's, far more than hold the whole set: this many
# times the share above.
_COVER_BUDGET: Final = 4.0
_IDF_FLOOR: Final = 1e-6  # fts5_aux.c: an idf <= 0 counts as 1e-6
_BOUND_MARGIN: Final = 1.0 + 1e-9  # FTS5's own rounding of a phrase's share and of U_C's sum
_PLAIN_TERM: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")

Ranked = list[tuple[int, float]]
_Row = tuple[int, float, float, float]  # rowid, score, the doubled sum, the driver's sum
_MOST_COVERS: Final = 64


def _quoted(term: str) -> str:
    return f'"{term}"'


def or_match(terms: Sequence[str]) -> str:
    return " OR ".join(_quoted(term) for term in terms)


def plain(conn: sqlite3.Connection, table: str, bm25_args: str, match: str, limit: int) -> Ranked:
    """The ``limit`` best rows matching ``match`` by score alone: FTS5 scores every match."""
    rows = conn.execute(
        f"SELECT rowid, -bm25({table}, {bm25_args}) AS score FROM {table} "  # noqa: S608
        f"WHERE {table} MATCH ? ORDER BY score DESC LIMIT ?",
        (match, limit),
    ).fetchall()
    return [(int(rowid), float(score)) for rowid, score in rows]


def ranked(
    conn: sqlite3.Connection,
    table: str,
    bm25_args: str,
    terms: Sequence[str],
    depth: int,
    limit: int,
) -> Ranked:
    """The ``limit`` (>= ``depth``) best rows of FTS5 table ``table`` matching any of ``terms``,
    ``(rowid, score)`` by score descending, the score ``-bm25(table, bm25_args)``: what
    ``plain`` returns, the rows tied at the ``limit``-th aside. Run inside one read transaction."""
    query = _Query(conn, table, bm25_args, terms, depth, limit)
    (top_rowid,) = conn.execute(f"SELECT max(id) FROM {table}_docsize").fetchone()  # noqa: S608
    if (top_rowid or 0) < PRUNE_FROM_ROWS:
        return query.plain()
    counts = _row_counts(conn, table, terms)
    if counts is None or sum(counts) < PRUNE_FROM_MATCHES:
        return query.plain()
    bounds = [_bound(top_rowid, n) for n in counts]
    order = sorted((i for i in range(len(terms)) if counts[i]), key=lambda i: -bounds[i])
    if not order:
        return []
    budget = _MAX_R_SHARE * sum(counts)
    size = _first_size(order, counts, depth)
    while size < len(order) and sum(counts[i] for i in order[:size]) <= budget:
        rare = [[i] for i in sorted(order[:size])]
        found = query.pruned(rare)
        if found is None:  # fewer rows than the depth
            size += 1
            continue
        rows, cut = found
        if cut > math.fsum(bounds[i] for i in order[size:]) * _BOUND_MARGIN:
            return query.checked(rows, rare)
        # Only rows holding every term of one of these sets of the rest can reach the cut.
        covers = _covers(order[size:], bounds, cut)
        held = sum(counts[i] for i in order[:size])
        if (
            covers is not None
            and held + sum(min(counts[i] for i in c) for c in covers) <= _COVER_BUDGET * budget
        ):
            # These rows include the ones above: their depth-th score is at least the cut.
            again = query.pruned(rare + covers)
            return query.plain() if again is None else query.checked(again[0], rare + covers)
        size = _size_below(order, bounds, cut, size + 1)
    return query.plain()


@dataclass(frozen=True)
class _Query:
    conn: sqlite3.Connection
    table: str
    bm25_args: str
    terms: Sequence[str]
    depth: int
    limit: int

    def plain(self) -> Ranked:
        return plain(self.conn, self.table, self.bm25_args, or_match(self.terms), self.limit)

    def pruned(self, driver: list[list[int]]) -> tuple[list[_Row], float] | None:
        """The ``limit`` best rows holding every term of one of the ``driver`` sets, and the
        *cut*: a score FTS5's depth-th of them surely reaches (the depth-th here less the
        error); None when fewer than ``depth`` rows hold one."""
        rows = _pruned(
            self.conn,
            self.table,
            self.bm25_args,
            or_match(self.terms),
            " OR ".join(f"({' AND '.join(_quoted(self.terms[i]) for i in c)})" for c in driver),
            self.limit,
        )
        if len(rows) < self.depth:
            return None
        return rows, rows[self.depth - 1][1] - _ulps(rows, _phrases(driver))

    def checked(self, rows: list[_Row], driver: list[list[int]]) -> Ranked:
        return _checked(rows, self.depth, self.limit, _phrases(driver)) or self.plain()


def _phrases(driver: list[list[int]]) -> int:
    return sum(len(c) for c in driver)


def _covers(rest: Sequence[int], bounds: Sequence[float], cut: float) -> list[list[int]] | None:
    """Sets of the terms ``rest`` (by bound, descending) such that a row whose bounds can sum to
    ``cut`` holds every term of one of them; None past ``_MOST_COVERS`` sets."""
    found: list[list[int]] = []
    tails = [math.fsum(bounds[i] for i in rest[k:]) for k in range(len(rest) + 1)]

    def walk(start: int, chosen: list[int], total: float) -> bool:
        for k in range(start, len(rest)):
            now = total + bounds[rest[k]]
            if now * _BOUND_MARGIN >= cut:
                found.append([*chosen, rest[k]])
                if len(found) > _MOST_COVERS:
                    return False
            elif (now + tails[k + 1]) * _BOUND_MARGIN >= cut and not walk(
                k + 1, [*chosen, rest[k]], now
            ):
                return False
        return True

    return found if walk(0, [], 0.0) else None


def _row_counts(conn: sqlite3.Connection, table: str, terms: Sequence[str]) -> list[int] | None:
    """Rows holding each term (``fts5vocab``), or None when a term is one FTS5's tokenizer might
    read otherwise than as itself (anything but ASCII letters and digits: then its count is
    unknown, and the plain query runs)."""
    if not all(term and _PLAIN_TERM.issuperset(term) for term in terms):
        return None
    vocab = f"{table}_terms"
    # In the connection's temp schema: derived from the FTS table, nothing to store, back up or
    # migrate, and creating it is no write to the store (a search holds only a read snapshot).
    conn.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{vocab} USING fts5vocab(main, {table}, row)"
    )
    found: dict[str, int] = dict(
        conn.execute(
            f"SELECT term, doc FROM temp.{vocab} "  # noqa: S608 - the table name is ours
            "WHERE term IN (SELECT value FROM json_each(?))",
            (json.dumps(list(terms)),),
        ).fetchall()
    )
    return [int(found.get(term, 0)) for term in terms]


def _bound(rows_at_most: int, n: int) -> float:
    """More than a phrase held by ``n`` of at most ``rows_at_most`` rows adds to a score."""
    idf = math.log((rows_at_most - n + 0.5) / (n + 0.5))
    return max(idf, _IDF_FLOOR) * (lexical.BM25_K1 + 1.0)


def _first_size(order: Sequence[int], counts: Sequence[int], rows: int) -> int:
    """The fewest rarest terms whose rows could fill ``rows`` places."""
    held = 0
    for size, i in enumerate(order, start=1):
        held += counts[i]
        if held >= rows:
            return size
    return len(order)


def _size_below(order: Sequence[int], bounds: Sequence[float], score: float, least: int) -> int:
    """The fewest rarest terms (at least ``least``) beyond which the rest's bounds sum below
    ``score``."""
    for size in range(least, len(order)):
        if math.fsum(bounds[i] for i in order[size:]) * _BOUND_MARGIN < score:
            return size
    return len(order)


def _pruned(
    conn: sqlite3.Connection, table: str, bm25_args: str, match: str, driver: str, limit: int
) -> list[_Row]:
    """The ``limit`` best rows matching ``driver``: ``(rowid, score, doubled, driver's)``."""
    rows = conn.execute(
        f"""WITH rare AS MATERIALIZED (
            SELECT rowid AS id, -bm25({table}, {bm25_args}) AS part FROM {table}
            WHERE {table} MATCH ?2
        ), doubled AS MATERIALIZED (
            SELECT rowid AS id, -bm25({table}, {bm25_args}) AS whole FROM {table}
            WHERE {table} MATCH '(' || ?1 || ') AND (' || ?2 || ')'
        )
        SELECT doubled.id, doubled.whole - rare.part AS score, doubled.whole, rare.part
        FROM doubled CROSS JOIN rare ON rare.id = doubled.id
        ORDER BY score DESC LIMIT ?3""",  # noqa: S608 - the table name is ours
        (match, driver, limit),
    ).fetchall()
    return [(int(r), float(s), float(w), float(p)) for r, s, w, p in rows]


def _ulps(rows: Sequence[_Row], doubled: int) -> float:
    """How far a score here may be from FTS5's sum: the doubled sum and the rare part each
    rounded once per phrase added twice, the difference once (with room to spare)."""
    largest = max(whole for _, _, whole, _ in rows)
    return 4.0 * (doubled + 2) * math.ulp(largest)


def _checked(rows: list[_Row], depth: int, limit: int, doubled: int) -> Ranked | None:
    """The rows by score when that is FTS5's order wherever it decides the page: None when two
    rows above or near the depth-th score within the error of each other without having scored
    alike in both queries, or when a row past the ``limit``-th might (their order is unknown)."""
    error = _ulps(rows, doubled)
    last = rows[depth - 1][1]
    if len(rows) == limit and last - error <= rows[-1][1] < last:
        return None
    for i in range(len(rows) - 1):
        (_, score, whole, part), (_, next_score, next_whole, next_part) = rows[i], rows[i + 1]
        if i >= depth and next_score < last - 2 * error:
            break
        if score - next_score <= error and (whole, part) != (next_whole, next_part):
            return None
    return [(rowid, score) for rowid, score, _, _ in rows]
