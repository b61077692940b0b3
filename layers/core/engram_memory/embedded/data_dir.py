"""The data directory's layout: the files the embedded host keeps, named in one place
(owner-only permissions; ``keys/`` is mode 0700):

- ``engram.db``                 canonical store (journal, ledger, candidates, records, FTS5)
- ``audit.log``                 one JSON line per call: ids, outcome codes, digests — no content
                                (its sealed segments and its lock: ``adapters/local/audit.py``)
- ``approvals.sqlite3``        the approval book (``adapters/local/approval_book.py``)
- ``console.sqlite3``          the console's one-time sign-in links, hashed
                                (``embedded/console/links.py``)
- ``backups/``                  the backups the console takes (``embedded/backup.py``;
                                ``admin backup`` writes wherever it is told)
- ``host.json``                 the host configuration (resource, tenant, admission, retention)
- ``issued-tokens.jsonl``      the id, principal, workspace and expiry of every token minted
- ``lease.lock``                its ``flock`` is the data directory's lease: held by the one
                                running server, or by ``admin keys rotate``/``restore`` while
                                they run (``data_dir_lease.py``); it names the holder's PID
- ``server.json``               where the HTTP server holding the lease serves (its URL, host,
                                port, PID): what ``console`` and ``token`` use without ``--port``
- ``keys/master.key``           local master key wrapping the per-candidate data keys
- ``keys/candidate-keys.db``    wrapped scope, record and candidate keys (never in a backup)
- ``keys/cursor.key``           authenticates search page cursors
- ``keys/issuer-ed25519.pem``   the local host's token issuer key (Ed25519, PKCS#8 PEM), and
  ``keys/issuer-previous.jwks.json`` the public keys of those ``keys rotate`` retired
- ``keys/request-state.key``    seals the confirmation round trip's ``requestState``
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

DATABASE_FILE: Final = "engram.db"
AUDIT_FILE: Final = "audit.log"
CONSOLE_FILE: Final = "console.sqlite3"
HOST_CONFIG_FILE: Final = "host.json"
BACKUPS_DIR: Final = "backups"
BACKUP_SUFFIX: Final = ".engram-backup.db"
# Locked by the one process that owns the directory, not written (data_dir_lease.py).
LEASE_FILE: Final = "lease.lock"
ISSUED_TOKENS_FILE: Final = "issued-tokens.jsonl"
# The serving server's address, believed only while its lease is held (data_dir_lease.py).
SERVER_FILE: Final = "server.json"

# In keys/ (0700), each file 0600: what a backup leaves out (docs/operating.md).
KEYS_DIR: Final[str] = "keys"
MASTER_KEY_FILE: Final[str] = "master.key"
CANDIDATE_KEYS_FILE: Final[str] = "candidate-keys.db"
CURSOR_KEY_FILE: Final[str] = "cursor.key"
ISSUER_KEY_FILE: Final[str] = "issuer-ed25519.pem"
PREVIOUS_ISSUER_KEYS_FILE: Final[str] = "issuer-previous.jwks.json"
REQUEST_STATE_KEY_FILE: Final[str] = "request-state.key"


def host_config_path(data_dir: Path) -> Path:
    """Where the host configuration of ``data_dir`` lives."""
    return Path(data_dir) / HOST_CONFIG_FILE


def backups_path(data_dir: Path) -> Path:
    """Where the console keeps the backups it takes of ``data_dir``."""
    return Path(data_dir) / BACKUPS_DIR


def key_path(data_dir: Path, name: str) -> Path:
    """The key file ``name`` of ``data_dir`` (one of the ``*_KEY*_FILE`` names above)."""
    return Path(data_dir) / KEYS_DIR / name
