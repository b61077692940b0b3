"""The named steps of the operator transactions, where a crash test kills the process.

A test hook, nothing else: with ``ENGRAM_FAULT_AT=<step>`` in its environment, a process that
reaches ``crash_point(<step>)`` kills itself with SIGKILL there — nothing closed, nothing
flushed, no ``finally`` run: a power cut as near as a process can make one. Without it (always,
outside tests) a step costs one environment lookup. ``tests/integration/test_operator_crashes.py``
runs every operation of ``STEPS`` in a real subprocess, killed at each of its steps in turn, and
shows the data directory whole afterwards (the old state or the new one, never a mix).

Each step names the moment *after* what it says: ``rotate.key_file_rewrapped`` is a crash once the
key file was re-wrapped and before anything that follows.
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["FAULT_ENV", "STEPS", "crash_point"]

FAULT_ENV: Final = "ENGRAM_FAULT_AT"

STEPS: Final[dict[str, tuple[str, ...]]] = {
    "rotate": (
        "rotate.issuer_key_rotated",
        "rotate.master_key_staged",
        "rotate.key_file_rewrapped",
        "rotate.master_key_installed",
    ),
    "backup": (
        "backup.copied",
        "backup.checked",
        "backup.in_place",
    ),
    "restore": (
        "restore.copied",
        "restore.checked",
        "restore.projected",
        "restore.in_place",
    ),
    "revoke": ("revoke.written",),
}


def crash_point(step: str) -> None:
    """Die here (SIGKILL) when the environment names ``step`` (``FAULT_ENV``); else nothing."""
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
