"""The embedded operations plane from the command line (issue 12): no silent regeneration, the
operations API's commands, backup and restore, token revocation and key rotation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engram_memory.cli import main
from engram_memory.host.errors import DataDirectoryRefused
from engram_memory.mcp_surface.embedded import open_server

Capture = pytest.CaptureFixture[str]


def _one_line_error(capsys: Capture) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def toured(tmp_path: Path, capsys: Capture) -> Path:
    """A data directory holding memories (the tour's)."""
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    capsys.readouterr()
    return data


# -- no silent regeneration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["tour", "--yes"],
        ["init"],
        ["verify"],
        ["admin", "reindex"],
        ["admin", "adjudicate", "candidate_x", "accept"],
    ],
)
def test_memories_without_their_key_store_are_refused_and_nothing_is_regenerated(
    toured: Path, capsys: Capture, command: list[str]
) -> None:
    shutil.rmtree(toured / "keys")
    before = sorted(path.name for path in toured.iterdir())
    assert (
        main(
            [*command[:2], "--data-dir", str(toured), *command[2:]]
            if command[0] == "admin"
            else [command[0], "--data-dir", str(toured), *command[1:]]
        )
        == 2
    )
    line = _one_line_error(capsys)
    assert "holds memories but its key store is missing" in line
    assert "Put the original keys/ folder back" in line
    assert not (toured / "keys").exists()
    assert sorted(path.name for path in toured.iterdir()) == before


def test_the_server_refuses_memories_without_keys_before_creating_any(toured: Path) -> None:
    shutil.rmtree(toured / "keys")
    with pytest.raises(DataDirectoryRefused, match="holds memories"):
        open_server(toured, port=8765)
    assert not (toured / "keys").exists()


def test_a_lost_master_key_alone_is_refused_too(toured: Path, capsys: Capture) -> None:
    (toured / "keys" / "master.key").unlink()
    assert main(["verify", "--data-dir", str(toured)]) == 2
    assert "master.key" in _one_line_error(capsys)
    assert not (toured / "keys" / "master.key").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["verify"],
        ["admin", "reindex"],
        ["admin", "adjudicate", "candidate_x", "accept"],
        ["admin", "audit"],
        ["admin", "policy", "show"],
    ],
)
def test_the_operations_plane_never_creates_a_mistyped_data_directory(
    tmp_path: Path, capsys: Capture, command: list[str]
) -> None:
    typo = tmp_path / "dtaa"
    where = 3 if command[:2] == ["admin", "policy"] else (2 if command[0] == "admin" else 1)
    assert main([*command[:where], "--data-dir", str(typo), *command[where:]]) == 2
    line = _one_line_error(capsys)
    assert str(typo) in line and "data directory" in line
    assert not typo.exists()


def test_an_empty_data_directory_without_keys_is_initialised_as_before(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    shutil.rmtree(data / "keys")  # nothing was ever written: nothing to strand
    assert main(["init", "--data-dir", str(data)]) == 0
    assert (data / "keys" / "master.key").is_file()
