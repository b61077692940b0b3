"""SIGTERM to ``serve --port`` closes the store: the SQLite write-ahead logs are checkpointed and
truncated on the way out, as on Ctrl-C (a killed server leaves them full)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_serve_day_one import (
    DEADLINE_S,
    engram,
    free_port,
    init,
    listening,
    serving,
    wait_until,
)

from engram_memory.embedded import composition
from engram_memory.embedded import serve as serve_module
from engram_memory.embedded.composition import init_data_dir
from engram_memory.embedded.serve import open_server


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


# -- a stop at any moment of start-up, in process -------------------------------------------------
# The subprocess test above stops a server that has started; its SIGTERM can land before, while
# the engine opens or the banner prints. These send it there, each time, and look at the files the
# server had open while the test still holds the server (so no garbage collection closes them).


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _sigterm_now() -> None:
    """SIGTERM to this process; the handler runs at the main thread's next bytecodes."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        pass


def _committed_probe(data: Path) -> None:
    """A committed row in each file the server holds open: it stays in the write-ahead log until
    the server's close checkpoints it."""
    for database, row in [
        (data / "engram.db", "INSERT OR REPLACE INTO store_meta VALUES ('shutdown-probe', 'x')"),
        (
            data / "keys" / "candidate-keys.db",
            "INSERT OR REPLACE INTO data_keys VALUES ('key_probe', x'00', x'00', 0)",
        ),
    ]:
        with contextlib.closing(sqlite3.connect(database)) as conn, conn:
            conn.execute(row)
        assert _wal_bytes(database) > 0


@pytest.mark.parametrize("moment", ["the engine opens", "the banner prints"])
def test_a_sigterm_during_start_up_lets_it_finish_then_closes_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigterm_restored: None, moment: str
) -> None:
    data = tmp_path / "data"
    init_data_dir(data)
    servers: list[serve_module.EmbeddedServer] = []

    def recorded(*args: Any, **kwargs: Any) -> serve_module.EmbeddedServer:
        servers.append(open_server(*args, **kwargs))
        return servers[-1]

    def stopped_during(step: Callable[..., Any]) -> Callable[..., Any]:
        def step_sent_sigterm(*args: Any, **kwargs: Any) -> Any:
            _committed_probe(data)
            _sigterm_now()
            return step(*args, **kwargs)

        return step_sent_sigterm

    monkeypatch.setattr(serve_module, "open_server", recorded)
    # this test process keeps its own allocator settings (the subprocess tests check the cap)
    monkeypatch.setattr(serve_module, "cap_malloc_arenas", lambda: False)
    if moment == "the engine opens":  # after the store and the key file are open
        monkeypatch.setattr(
            composition, "_refresh_projections", stopped_during(composition._refresh_projections)
        )
    else:
        monkeypatch.setattr(serve_module, "print_banner", stopped_during(lambda *a, **k: None))
    with pytest.raises(KeyboardInterrupt):
        serve_module.serve(data, bind_host="127.0.0.1", port=free_port(), stdio=False)
    (server,) = servers
    assert server.engine.opened, "the open ran to its end"
    host = server.engine.host
    assert host.store.open_connections() == 0
    assert _wal_bytes(data / "engram.db") == 0
    assert _wal_bytes(data / "keys" / "candidate-keys.db") == 0
    open_server(data, port=free_port()).close()  # the lease was released: another server starts


def test_the_server_closes_after_a_drain_under_way_has_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain still running as the server closes would reopen the store (it stays usable after
    ``close``) and leave the process with a connection no one closes."""
    monkeypatch.setattr(serve_module, "DRAIN_EVERY_S", 0.01)
    started, events = threading.Event(), []

    def drain_outbox() -> int:
        started.set()
        time.sleep(0.3)
        events.append("drain finished")
        return 0

    engine = SimpleNamespace(drain_outbox=drain_outbox)
    server = SimpleNamespace(  # ``serve`` closes it, after ``_serve`` returns
        engine=SimpleNamespace(opened=True),
        host=SimpleNamespace(engine=engine),
        close=lambda: events.append("closed inside _serve"),
    )

    def run() -> None:
        assert started.wait(DEADLINE_S)

    serve_module._serve(server, run)  # type: ignore[arg-type]
    events.append("serve returned")
    assert events == ["drain finished", "serve returned"]
