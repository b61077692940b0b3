"""The key file's syncs, counted by strace (``adapters/local/key_durability.py``): a key
destruction is durable in the scrub checkpoint's two syncs (the -wal, then the database file),
not three; a seal is durable in one sync, also when its commit starts a fresh -wal (two before);
the connection is back at ``synchronous=FULL`` and automatic checkpoints afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.hotpath.writes import _MARK_START, _MARK_STOP, count_syncs

REPO = Path(__file__).resolve().parents[2]
STRACE = shutil.which("strace")

_CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from engram_memory.adapters.local.vault import LocalVault
    from engram_memory.engine.context import Scope

    keys, start, stop, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    scope = Scope("tenant-a", "workspace-1")
    vault = LocalVault(keys, b"\\x07" * 32)
    vault.record_keys.prepare(scope, "mem_1")
    blob = vault.seal(scope, "cand_1", b"secret")
    vault.seal(scope, "cand_2", b"other")

    def mark(path):
        try:
            os.readlink(path)
        except OSError:
            pass

    if step == "seal":  # a seal after a destruction: the first frames of an empty -wal
        vault.destroy(blob.key_ref)
    mark(start)
    if step == "destroy":
        vault.destroy(blob.key_ref)
    elif step == "destroy-record-key":
        vault.record_keys.destroy(scope, "mem_1")
    else:  # "seal", or "seal-again" onto the frames of the two seals above
        vault.seal(scope, "cand_3", b"third")
    mark(stop)
    wal_autocheckpoint = vault._run("t", lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone())
    assert wal_autocheckpoint == (1000,), wal_autocheckpoint
    (level,) = vault._run("t", lambda c: c.execute("PRAGMA synchronous").fetchone())
    assert level == 2, level
    vault.close()
    """
)


def _syncs(tmp_path: Path, step: str) -> dict[str, int]:
    trace = tmp_path / "strace.txt"
    assert STRACE is not None
    done = subprocess.run(  # noqa: S603 - strace on our interpreter and the script above
        [
            STRACE,
            "-f",
            "-y",
            "-qq",
            "-o",
            str(trace),
            "-e",
            "trace=fsync,fdatasync,readlink,readlinkat",
            sys.executable,
            "-c",
            _CHILD,
            str(tmp_path / "keys" / "candidate-keys.db"),
            _MARK_START,
            _MARK_STOP,
            step,
        ],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 and "ptrace" in done.stderr and os.environ.get("CI") != "true":
        pytest.skip("strace cannot trace here (ptrace not permitted)")
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(count_syncs(trace.read_text(encoding="utf-8")))


# CI installs strace (scripts/browser_deps.sh), so there a missing strace is a failure, not a skip.
pytestmark = pytest.mark.skipif(
    STRACE is None and os.environ.get("CI") != "true", reason="strace is not installed"
)


@pytest.mark.parametrize("step", ["destroy", "destroy-record-key"])
def test_a_key_destruction_costs_the_scrub_checkpoints_two_syncs(tmp_path: Path, step: str) -> None:
    assert _syncs(tmp_path, step) == {"key file": 2}


def test_a_seal_after_a_destruction_is_durable_in_one_sync_not_two(tmp_path: Path) -> None:
    # The destruction emptied the -wal: the seal's commit writes a fresh header and frames.
    assert _syncs(tmp_path, "seal") == {"key file": 1}


def test_a_seal_onto_a_written_wal_is_synced_at_its_commit(tmp_path: Path) -> None:
    assert _syncs(tmp_path, "seal-again") == {"key file": 1}
