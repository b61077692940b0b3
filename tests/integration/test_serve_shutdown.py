"""SIGTERM to ``serve --port`` closes the store: the SQLite write-ahead logs are checkpointed and
truncated on the way out, as on Ctrl-C (a killed server leaves them full)."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

from test_serve_day_one import (
    DEADLINE_S,
    engram,
    free_port,
    init,
    listening,
    serving,
    wait_until,
)


def _wal_bytes(database: Path) -> int:
    wal = database.with_name(database.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_sigterm_closes_the_store_and_the_key_file(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    init(data)
    store, keys = data / "engram.db", data / "keys" / "candidate-keys.db"
    argv = [engram(), "serve", "--data-dir", str(data), "--port", str(port)]
    with serving(argv, port) as process:
        # The port listens before the engine opens: wait for its connections (their -shm files).
        for database in (store, keys):
            shm = database.with_name(database.name + "-shm")
            wait_until(shm.exists, f"the server opened {database.name}")
        # A committed write in each file while the server holds them open: it stays in the
        # write-ahead log (the server's connections keep it from being checkpointed on our
        # close), so a server that dies without closing its files leaves the logs full.
        for database, row in [
            (store, "INSERT INTO store_meta VALUES ('shutdown-probe', 'x')"),
            (keys, "INSERT INTO data_keys VALUES ('key_probe', x'00', x'00', 0)"),
        ]:
            with sqlite3.connect(database) as conn:
                conn.execute(row)
            conn.close()
            assert _wal_bytes(database) > 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0
        wait_until(lambda: not listening(port), "the port is free again")
    assert _wal_bytes(store) == 0
    assert _wal_bytes(keys) == 0
