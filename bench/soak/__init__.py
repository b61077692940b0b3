"""Soak benchmark: many MCP clients for minutes of mixed traffic against the real HTTP server.

    python -m bench.soak [--minutes 10] [--clients 32] [--json PATH]
        [--revision legacy|2026-07-28|both] [--tools T,...] [--trace-memory DIR]
        [--read-only-fraction 0.3] [--require-flat]

What it does:

- initialises a fresh data directory and starts ``engram-memory serve`` as a subprocess on a free
  127.0.0.1 port (the product as a user runs it);
- mints one token per client with the data directory's issuer (``withdraw`` and ``forget``
  confirmation-gated), four clients per workspace so writers contend on one journal;
- runs ``--clients`` official ``mcp`` clients over Streamable HTTP (half with the 2025-11-25
  handshake, half the stateless 2026-07-28 revision) for the duration, each looping over a mix of
  capture, request_admission, search, get and, now and then, withdraw or forget, whose
  confirmation the client's elicitation callback approves; the last ``--read-only-fraction``
  (30 %) of the run sends only search and get, so the store stops growing;
- samples the server process's open file descriptors (all, and those on ``engram.db*``), RSS and
  threads from ``/proc/<pid>`` every few seconds;
- stops by itself at the deadline (every call also has its own deadline), stops the server with
  SIGTERM (a clean stop), and prints a JSON report: throughput, calls / ok / p50 / p99 per tool,
  errors by code (the envelope's error code, ``jsonrpc:<code>`` for a JSON-RPC error, or the
  exception's type for a transport failure), the resource samples at start, middle and end, a
  per-minute series (calls, records added, RSS, fds, p50 / p99 per tool) and the flatness
  verdict of ``bench.soak.flatness`` (PASS, FAIL or INCONCLUSIVE; the exit status only with
  ``--require-flat``).

Isolating a leak: ``--revision legacy|2026-07-28`` runs every client on one protocol revision,
``--tools search,get`` narrows the mix, and ``--trace-memory DIR`` has the server write its
memory figures there at intervals (``--trace-every`` seconds; ``--trace-frames 0`` keeps only the
cheap ones: RSS, malloc's bytes in use and free, SQLite's bytes, objects by type; above 0 it also
takes tracemalloc snapshots, which slow the server a lot). ``python -m bench.soak.memory DIR``
then prints what grew (``engram_memory.embedded.memory_trace`` describes the files).

Every request goes to 127.0.0.1; the loops are bounded by the deadline.
"""
