"""``open_server`` opens the embedded host's data directory once: the store and the vault are
each opened one time, whether the directory is new (initializing it is that open) or not."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.local import vault
from engram_memory.adapters.local.sqlite import store
from engram_memory.embedded.data_dir import DATABASE_FILE
from engram_memory.embedded.host_file import load_host_config
from engram_memory.embedded.serve import open_server


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times the store and the vault are opened (``open_embedded`` imports them when it
    runs, so the counting subclasses are the ones it opens)."""
    counted: Counter[str] = Counter()

    class CountedStore(store.SqliteStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            counted["store"] += 1
            super().__init__(*args, **kwargs)

    class CountedVault(vault.LocalVault):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            counted["vault"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(store, "SqliteStore", CountedStore)
    monkeypatch.setattr(vault, "LocalVault", CountedVault)
    return counted


def test_a_new_data_directory_is_opened_once_and_left_whole(
    tmp_path: Path, opens: Counter[str]
) -> None:
    data = tmp_path / "new"
    server = open_server(data, port=8799)
    try:
        assert server.host.config.resource == "http://127.0.0.1:8799/mcp"
    finally:
        server.close()
    assert opens == {"store": 1, "vault": 1}
    assert (data / DATABASE_FILE).exists() and (data / "keys" / "master.key").exists()


def test_a_new_data_directory_with_a_given_configuration_is_opened_once(
    tmp_path: Path, opens: Counter[str]
) -> None:
    data = tmp_path / "given"
    open_server(tmp_path / "elsewhere").close()
    config = load_host_config(tmp_path / "elsewhere")
    opens.clear()
    server = open_server(data, config=config)
    try:
        assert server.host.config == config
    finally:
        server.close()
    assert opens == {"store": 1, "vault": 1}
    assert (data / "host.json").exists()


def test_an_initialised_data_directory_opens_on_first_use_once(
    tmp_path: Path, opens: Counter[str]
) -> None:
    data = tmp_path / "ready"
    open_server(data).close()
    opens.clear()
    server = open_server(data, port=8799)
    try:
        assert not server.engine.opened and opens == {}
        server.host  # noqa: B018
        server.host  # noqa: B018
    finally:
        server.close()
    assert opens == {"store": 1, "vault": 1}
