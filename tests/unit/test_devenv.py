"""scripts/devenv.py: ./run installs the package alone, ./test adds its extras to the same .venv,
and the stamp knows what was installed (no real pip here: the commands are recorded)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from scripts import devenv


@pytest.fixture
def installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(devenv, "VENV", venv)
    monkeypatch.setattr(devenv, "STAMP", venv / ".installed")
    commands: list[list[str]] = []

    def run(args: list[str], **_: Any) -> None:
        commands.append(args)

    monkeypatch.setattr(subprocess, "run", run)  # the module devenv runs pip with
    return commands


def _targets(commands: list[list[str]]) -> list[str]:
    return [command[-1] for command in commands if "-e" in command]


def test_run_installs_the_package_without_extras(installs: list[list[str]]) -> None:
    devenv.ensure_venv()
    assert _targets(installs) == [str(devenv.ROOT)]
    devenv.ensure_venv()  # nothing more to install
    assert len(_targets(installs)) == 1


def test_test_adds_its_extras_once_and_run_then_installs_nothing(
    installs: list[list[str]],
) -> None:
    devenv.ensure_venv()
    devenv.ensure_venv(devenv.TEST_EXTRAS)
    assert _targets(installs) == [str(devenv.ROOT), f"{devenv.ROOT}[dev,semantic]"]
    devenv.ensure_venv()
    devenv.ensure_venv(devenv.TEST_EXTRAS)
    assert len(_targets(installs)) == 2
    assert devenv.STAMP.read_text().splitlines()[1] == "dev,semantic"


def test_a_changed_pyproject_installs_afresh_only_what_is_asked(
    installs: list[list[str]],
) -> None:
    devenv.ensure_venv(devenv.TEST_EXTRAS)
    devenv.STAMP.write_text("an-older-fingerprint\ndev,semantic")
    devenv.ensure_venv()
    assert _targets(installs)[-1] == str(devenv.ROOT)  # the old extras are not carried over
