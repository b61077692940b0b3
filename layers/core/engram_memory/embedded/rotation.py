"""``keys rotate`` on the embedded default: a new issuer (signing) key and a new master key.

The issuer key is replaced and the old one's public key kept among the previous keys, so tokens
it signed verify until they expire (revoke them sooner with ``tokens revoke``). The master key is
replaced by re-wrapping every candidate data key under a new one: the new key is staged beside
the old (``master.key.next``), the key file is re-wrapped in one transaction that records the new
key's fingerprint, then the staged key is put in place. A rotation stopped between the two steps
is finished (or undone) the next time the data directory's owner opens it.

A running server keeps the master key it loaded and wraps new keys under it, so the rotation
holds the data directory's lease (``data_dir_lease``) while it runs: beside a running server it
is refused (``DataDirectoryBusy``) before anything is written, and no server starts meanwhile.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from engram_memory.adapters.local.private_files import write_private_file
from engram_memory.adapters.local.vault import next_master_key_path
from engram_memory.embedded.composition import open_existing, require_initialised
from engram_memory.embedded.data_dir import KEYS_DIR, MASTER_KEY_FILE
from engram_memory.embedded.data_dir_lease import acquire_lease
from engram_memory.embedded.issuer_keys import rotate_issuer_key
from engram_memory.engine.context import Scope
from engram_memory.operator_plane.auditing import audited
from engram_memory.operator_plane.crash_points import crash_point
from engram_memory.operator_plane.text import progress

__all__ = ["rotate_keys"]

_PAGE = 500
ROTATION = "`engram-memory admin keys rotate`"  # the lease's holder, as others' refusals name it


def rotate_keys(data_dir: Path, operator: str) -> dict[str, Any]:
    """Rotate the issuer and master keys of ``data_dir``; return what changed. Audited as
    ``admin.keys_rotate``."""
    data_dir = Path(data_dir)
    require_initialised(data_dir)  # before the lease: no lease file in a directory that is none
    with acquire_lease(data_dir, ROTATION):
        return _rotate(data_dir, operator)


def _rotate(data_dir: Path, operator: str) -> dict[str, Any]:
    host = open_existing(data_dir)
    try:

        def run(_call: Any) -> dict[str, Any]:
            bindings = {}
            for scope in host.store.scopes():
                after = ""
                while rows := host.store.candidates_list(scope, None, after, _PAGE):
                    bindings.update({row.key_ref: (scope, row.candidate_id) for row in rows})
                    after = rows[-1].candidate_id
                    progress(len(bindings), None, "candidate keys found")
            old_kid, new_kid = rotate_issuer_key(data_dir)
            crash_point("rotate.issuer_key_rotated")
            keys = data_dir / KEYS_DIR
            staged = next_master_key_path(keys / MASTER_KEY_FILE)
            new_master = secrets.token_bytes(32)
            write_private_file(staged, new_master, replace=True)
            crash_point("rotate.master_key_staged")
            rewrapped, unbound = host.vault.rewrap(new_master, bindings)
            crash_point("rotate.key_file_rewrapped")
            _install(staged, keys / MASTER_KEY_FILE)
            crash_point("rotate.master_key_installed")
            return {
                "issuer_key": {"previous_kid": old_kid, "kid": new_kid},
                "master_key": "rotated",
                "data_keys_rewrapped": rewrapped,
                "data_keys_unbound": unbound,
                "note": "tokens signed with the previous issuer key stay valid until they expire",
            }

        return audited(
            host.engine, Scope(host.config.tenant_id, "*"), operator, "keys_rotate", None, run
        )
    finally:
        host.close()


def _install(staged: Path, master: Path) -> None:
    os.replace(staged, master)
