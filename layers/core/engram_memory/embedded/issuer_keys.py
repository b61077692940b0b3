"""The embedded host's own token issuer: its Ed25519 key in the data directory, minting with it,
the previous keys a rotation retired, and the verifier for the tokens it mints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_memory.adapters.local.private_files import write_private_file
from engram_memory.binding.host_config import HostConfig
from engram_memory.binding.tokens import JWT_TYP, TokenIssuer, TokenVerifier, key_id, public_jwks
from engram_memory.embedded.data_dir import (
    ISSUED_TOKENS_FILE,
    ISSUER_KEY_FILE,
    PREVIOUS_ISSUER_KEYS_FILE,
    key_path,
)

__all__ = [
    "load_or_create_issuer_key",
    "local_issuer",
    "local_verifier",
    "previous_issuer_keys",
    "rotate_issuer_key",
    "token_issued",
]


def load_or_create_issuer_key(path: Path) -> Ed25519PrivateKey:
    """Return the Ed25519 issuer key stored at ``path`` (PKCS#8 PEM), creating it if missing.

    A new key file is written atomically with mode 0600 (missing parent directories with 0700);
    concurrent callers all end up with the same key. Raises ``ValueError`` when the existing file
    does not hold an unencrypted Ed25519 private key.
    """
    path = Path(path)
    try:
        return _read_issuer_key(path)
    except FileNotFoundError:
        pass
    pem = Ed25519PrivateKey.generate().private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    write_private_file(path, pem, replace=False)
    return _read_issuer_key(path)


def _read_issuer_key(path: Path) -> Ed25519PrivateKey:
    data = path.read_bytes()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{path} does not hold an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


class LocalIssuer(TokenIssuer):
    """A ``TokenIssuer`` that notes the id of every token it mints in the data directory
    (``issued-tokens.jsonl``, 0600: id, principal, workspace, expiry; never the token), so that
    ``admin tokens revoke --token-id`` can tell an id it minted from a mistyped one, and the
    operator commands know the workspaces tokens were minted for."""

    def __init__(self, private_key: Ed25519PrivateKey, *, issued: Path, **names: str) -> None:
        super().__init__(private_key, **names)
        self._issued = issued

    def mint(self, **claims: Any) -> str:
        token = super().mint(**claims)
        minted = jwt.decode(token, options={"verify_signature": False})
        line = {
            "jti": minted["jti"],
            "sub": minted["sub"],
            "exp": minted["exp"],
            "workspace": minted["workspace_id"],
        }
        fd = os.open(self._issued, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as out:
            out.write(json.dumps(line, sort_keys=True) + "\n")
        return token


def _issued(data_dir: Path) -> list[dict[str, Any]] | None:
    """The lines of ``issued-tokens.jsonl`` (None without one); a torn last line is skipped."""
    try:
        lines = (Path(data_dir) / ISSUED_TOKENS_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    noted: list[dict[str, Any]] = []
    for text in lines:
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict):
            noted.append(line)
    return noted


def token_issued(data_dir: Path, token_id: str) -> bool | None:
    """Whether this data directory's issuer minted ``token_id``; None when it cannot tell (no
    token minted since ids were noted)."""
    noted = _issued(data_dir)
    if noted is None:
        return None
    return any(line.get("jti") == token_id for line in noted)


def token_workspaces(data_dir: Path) -> set[str]:
    """The workspaces of the tokens minted here (those noted with theirs)."""
    return {
        line["workspace"]
        for line in _issued(data_dir) or []
        if isinstance(line.get("workspace"), str)
    }


def local_issuer(data_dir: Path, config: HostConfig) -> TokenIssuer:
    """The embedded host's issuer: its key in ``data_dir`` (created if missing), ``kid`` = thumbprint."""
    private_key = load_or_create_issuer_key(key_path(data_dir, ISSUER_KEY_FILE))
    return LocalIssuer(
        private_key,
        issued=Path(data_dir) / ISSUED_TOKENS_FILE,
        issuer=config.issuer,
        audience=config.resource,
        kid=key_id(private_key.public_key()),
    )


def previous_issuer_keys(data_dir: Path) -> list[dict[str, Any]]:
    """The retired issuer keys' public JWKs (none when no rotation happened)."""
    path = key_path(data_dir, PREVIOUS_ISSUER_KEYS_FILE)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    keys = stored.get("keys") if isinstance(stored, dict) else None
    if not isinstance(keys, list):
        raise ValueError(f"{path} does not hold a JWKS")
    return [key for key in keys if isinstance(key, dict)]


def rotate_issuer_key(data_dir: Path) -> tuple[str, str]:
    """Replace the local issuer key with a new one, keeping the old one's public key among the
    previous keys (its tokens verify until they expire). Returns ``(old kid, new kid)``."""
    path = key_path(data_dir, ISSUER_KEY_FILE)
    old = _read_issuer_key(path)
    old_kid = key_id(old.public_key())
    retired = [k for k in previous_issuer_keys(data_dir) if k.get("kid") != old_kid]
    retired += public_jwks(old, old_kid)["keys"]
    write_private_file(
        key_path(data_dir, PREVIOUS_ISSUER_KEYS_FILE),
        json.dumps({"keys": retired}, indent=2).encode("utf-8"),
        replace=True,
    )
    new = Ed25519PrivateKey.generate()
    pem = new.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    write_private_file(path, pem, replace=True)
    return old_kid, key_id(new.public_key())


def local_verifier(data_dir: Path, config: HostConfig) -> TokenVerifier:
    """A verifier for the tokens ``local_issuer`` mints (keyed by ``kid``).

    RFC 9068: the local issuer mints access tokens with ``typ: at+jwt`` and only those are
    accepted, so no other JWT signed with the issuer key can stand in for one. (A cloud identity
    provider's verifier does not require it: Cognito and Entra ID, for example, issue access
    tokens without it; there the exact audience, our resource URI, keeps ID tokens out.)

    The issuer keys ``keys rotate`` retired are trusted too: tokens they signed are accepted
    until they expire (or are revoked)."""
    issuer = local_issuer(data_dir, config)
    current = issuer.public_jwks()["keys"]
    retired = [key for key in previous_issuer_keys(data_dir) if key.get("kid") != issuer.kid]
    return TokenVerifier.from_jwks(
        {"keys": current + retired},
        issuer=config.issuer,
        audience=config.resource,
        token_type=JWT_TYP,
    )
