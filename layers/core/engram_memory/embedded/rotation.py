"""``keys rotate`` on the embedded default: a new issuer (signing) key and a new master key.

The issuer key is replaced and the old one's public key kept among the previous keys, so tokens
it signed verify until they expire (revoke them sooner with ``tokens revoke``). The master key is
replaced by re-wrapping every candidate data key under a new one: the new key is staged beside
the old (``master.key.next``), the key file is re-wrapped in one transaction that records the new
key's fingerprint, then the staged key is put in place. A rotation stopped between the two steps
is finished (or undone) the next time the data directory is opened. Run it with the server
stopped: a running server keeps the keys it loaded until it restarts.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from engram_memory.adapters.local.vault import next_master_key_path
from engram_memory.embedded.composition import KEYS_DIR, MASTER_KEY_FILE, open_existing
from engram_memory.embedded.issuer_keys import rotate_issuer_key
from engram_memory.embedded.private_files import write_private_file
from engram_memory.engine.context import Scope
from engram_memory.operator_plane.text import progress
from engram_memory.operator_plane.usecases import audited

__all__ = ["rotate_keys"]

_PAGE = 500


def rotate_keys(data_dir: Path, operator: str) -> dict[str, Any]:
    """Rotate the issuer and master keys of ``data_dir``; return what changed. Audited as
    ``admin.keys_rotate``."""
    data_dir = Path(data_dir)
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
            keys = data_dir / KEYS_DIR
            staged = next_master_key_path(keys / MASTER_KEY_FILE)
            new_master = secrets.token_bytes(32)
            write_private_file(staged, new_master, replace=True)
            rewrapped, unbound = host.vault.rewrap(new_master, bindings)
            _install(staged, keys / MASTER_KEY_FILE)
            return {
                "issuer_key": {"previous_kid": old_kid, "kid": new_kid},
                "master_key": "rotated",
                "data_keys_rewrapped": rewrapped,
                "data_keys_unbound": unbound,
                "note": "restart a running server to use the new keys; tokens signed with the"
                " previous issuer key stay valid until they expire",
            }

        return audited(
            host.engine, Scope(host.config.tenant_id, "*"), operator, "keys_rotate", None, run
        )
    finally:
        host.close()


def _install(staged: Path, master: Path) -> None:
    os.replace(staged, master)
