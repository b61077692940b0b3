"""The embedded canonical store: one SQLite database in WAL mode.

One transaction per mutation covers the journal, the ledger, candidate control rows, records,
the tombstone index, used approvals, the outbox and the projections, so a mutation is either
wholly there or not at all. Each scope's lexical projection is its own FTS5 table, and with a
semantic channel its vectors are a table beside it, written in the same transaction.

One concern a module:

- ``store``: the ``Store`` port (``SqliteStore``): reads and the operators' plane, composing
  the others;
- ``commit``: the atomic commit of a ``ChangeSet``, step by step (``CommitStep``);
- ``connections``: the bounded connection pool, the pragmas, the WAL scrub;
- ``schema``: the tables, the store format and the migrations between formats;
- ``rows``: how the port's rows are kept in columns (digests as bytes, packed bodies);
- ``projections``: a record's FTS5 row and vector, written and dropped together;
- ``fulltext``: the per-scope FTS5 tables and the ranked lexical query, pruned by
  ``lexical_topk``;
- ``vectors``: the per-scope vector tables, searched through ``vector_matrix`` (a scope's
  vectors as one in-memory matrix);
- ``backup``: a copy of the canonical store without its projections;
- ``indexes``: the ``LexicalIndex`` and ``VectorIndex`` ports over the store's projections.
"""
