"""TLS for the harness's HTTPS server, and the identity provider the functions trust."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import secrets
import time
from pathlib import Path
from typing import Any, Final

from .settings import AGENTS_GROUP, APPROVER, AUDIENCE, PRINCIPAL, TENANT, TOOLS, WORKSPACE

JWKS_PATH: Final = "/.well-known/jwks.json"
AUTHORIZE_PATH: Final = "/authorize"  # never fetched: the harness plays the person signing in
TOKEN_PATH: Final = "/token"


def self_signed(work: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost (its own CA) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cloud-check")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = work / "cert.pem", work / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def _s256(verifier: str) -> str:
    """PKCE's S256 code challenge of ``verifier``."""
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Issuer:
    """Ed25519 access tokens with the contract's claims, and their JWKS."""

    def __init__(self, url: str) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.url = url
        self._key = Ed25519PrivateKey.generate()
        self.minted: list[str] = []  # every bearer or ID token handed out (the payload scan)
        self.grants: dict[str, dict[str, str]] = {}  # authorization code -> its sign-in
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        self.jwks = {
            "keys": [
                {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1", "alg": "EdDSA", "use": "sig"}
            ]
        }

    def sign_in(
        self, authorization_url: str, subject: str, *, groups: tuple[str, ...] | None = None
    ) -> tuple[str, str]:
        """``subject`` signs in at the authorization endpoint, just now: the code and the state
        the provider redirects back with (its grant kept for the token endpoint). The ID token
        lists ``groups``; by default the agent (``PRINCIPAL``) is in the agents' group, as an
        operator puts every agent user there."""
        from urllib.parse import parse_qs, urlsplit

        query = {k: v[0] for k, v in parse_qs(urlsplit(authorization_url).query).items()}
        code = secrets.token_urlsafe(24)
        if groups is None:
            groups = (AGENTS_GROUP,) if subject == PRINCIPAL else ("staff",)
        self.grants[code] = {
            **query,
            "sub": subject,
            "auth_time": str(int(time.time())),
            "groups": ",".join(groups),
        }
        return code, query.get("state", "")

    def exchange(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The token endpoint: a single-use code, its client and redirect URI, PKCE S256."""
        grant = self.grants.pop(form.get("code", ""), None)
        if (
            grant is None
            or form.get("grant_type") != "authorization_code"
            or form.get("client_id") != grant.get("client_id")
            or form.get("redirect_uri") != grant.get("redirect_uri")
            or grant.get("code_challenge_method") != "S256"
            or _s256(form.get("code_verifier", "")) != grant.get("code_challenge")
        ):
            return 400, {"error": "invalid_grant"}
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": grant["client_id"],
            "sub": grant["sub"],
            "iat": now,
            "exp": now + 300,
            "nonce": grant.get("nonce", ""),
            "auth_time": int(grant["auth_time"]),
            "groups": [g for g in grant["groups"].split(",") if g],
        }
        id_token = self._mint(claims, {"kid": "k1"})
        return 200, {"id_token": id_token, "token_type": "Bearer", "expires_in": 300}

    def token(
        self,
        tools: tuple[str, ...] = TOOLS,
        confirm: tuple[str, ...] = (),
        workspace: str = WORKSPACE,
    ) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": PRINCIPAL,
            "iat": now,
            "nbf": now,
            "exp": now + 900,
            "jti": secrets.token_urlsafe(18),
            "tenant_id": TENANT,
            "workspace_id": workspace,
            "purpose_ref": "purpose:general",
            "engram_tools": list(tools),
            "engram_confirm": list(confirm),
            "engram_approver": APPROVER,  # the template's ApproverClaim default
        }
        return self._mint(claims, {"kid": "k1", "typ": "at+jwt"})

    def _mint(self, claims: dict[str, Any], headers: dict[str, str]) -> str:
        """A signed JWT, remembered for the payload scan."""
        import jwt

        token: str = jwt.encode(claims, self._key, algorithm="EdDSA", headers=headers)
        self.minted.append(token)
        return token
