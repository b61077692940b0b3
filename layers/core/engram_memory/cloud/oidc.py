"""An external identity provider's signing keys, from its OIDC discovery document.

The cloud stack verifies agent tokens issued by the tenant's identity provider (Okta, Entra ID,
Keycloak, ...). Its keys are not configured: ``IssuerKeys`` reads the issuer's discovery document
(OpenID Connect Discovery 1.0 §4: ``<issuer>/.well-known/openid-configuration``, a trailing
``/`` of the issuer removed first), checks that it names exactly the configured ``issuer``
(§4.3: a document for another issuer is refused) and takes its ``jwks_uri``. The JWKS itself is
PyJWT's ``PyJWKClient``: fetched over verified HTTPS (no redirects), cached for ``ttl_s``
(default 300 s), and refetched **once** when a token names a ``kid`` the cached set lacks (a key
the issuer rotated in) — at most once per ``refetch_cooldown_s`` (default 30 s, counted from the
last successful fetch), so a flood of tokens with made-up ``kid`` values cannot turn into a flood
of requests to the identity provider; during the cooldown an unknown ``kid`` is just unknown.

An identity provider that cannot be reached is not asked again for ``refetch_cooldown_s`` either
(PyJWKClient's cooldown only follows successes): meanwhile, and whenever the cache expired but
the provider fails, the last JWKS fetched still verifies tokens (a key does not stop being the
issuer's because the issuer is briefly down). Before any JWKS was fetched, lookups raise
``IssuerKeysUnavailable``; ``prefetch`` at a cold start turns a wrong issuer into a
configuration error there, not a 401 later.

Issuer shapes as the providers publish them (the tests serve each from loopback):

- Okta: ``https://<org>.okta.com/oauth2/default`` → ``jwks_uri`` ``…/oauth2/default/v1/keys``;
- Entra ID (v2 endpoints, one tenant): ``https://login.microsoftonline.com/<tenant>/v2.0`` →
  ``https://login.microsoftonline.com/<tenant>/discovery/v2.0/keys`` (RSA keys without ``alg``:
  RS256);
- Keycloak: ``https://<host>/realms/<realm>`` → ``…/realms/<realm>/protocol/openid-connect/certs``;
- Cognito: ``https://cognito-idp.<region>.amazonaws.com/<user pool id>`` →
  ``…/<user pool id>/.well-known/jwks.json``.

The recipes for issuing the stack's claims from each are in ``docs/identity-providers/``.

The discovery document is read once per process: a ``jwks_uri`` changes far more rarely than
keys rotate, and a new Lambda container reads it again. Nothing here logs or raises a token.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import jwt

from engram_memory.binding.tokens import TokenVerifier

__all__ = [
    "DISCOVERY_PATH",
    "IssuerKeys",
    "IssuerKeysUnavailable",
    "discovery_url",
    "oidc_verifier",
]

DISCOVERY_PATH: Final = "/.well-known/openid-configuration"
DEFAULT_TTL_S: Final = 300.0
DEFAULT_REFETCH_COOLDOWN_S: Final = 30.0
DEFAULT_TIMEOUT_S: Final = 3.0
MAX_DOCUMENT_BYTES: Final = 1_000_000


class IssuerKeysUnavailable(Exception):
    """The issuer's discovery document or JWKS cannot be had (and none was fetched before)."""


def discovery_url(issuer: str) -> str:
    """Where ``issuer`` publishes its discovery document (OIDC Discovery §4)."""
    return issuer.rstrip("/") + DISCOVERY_PATH


def _https(url: object, what: str) -> str:
    if not isinstance(url, str) or urlsplit(url).scheme != "https" or not urlsplit(url).hostname:
        raise IssuerKeysUnavailable(f"the issuer's {what} is not an https URL")
    return url


class IssuerKeys:
    """The signing keys of one OIDC issuer, as a ``TokenVerifier`` key source (``kid`` → key).

    ``url_for`` maps a URL to where it is fetched from (identity by default; tests point the
    providers' hosts at a loopback server). ``ssl_context`` verifies the provider's certificate
    (the system's trust store by default). Safe to share between threads.
    """

    def __init__(
        self,
        issuer: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        refetch_cooldown_s: float = DEFAULT_REFETCH_COOLDOWN_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        url_for: Callable[[str], str] = lambda url: url,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.issuer = _https(issuer, "identifier")
        self._ttl_s = ttl_s
        self._cooldown_s = refetch_cooldown_s
        self._timeout_s = timeout_s
        self._ssl_context = ssl_context or ssl.create_default_context()
        self._url_for = url_for
        self._clock = clock
        self._lock = threading.Lock()
        self._client: jwt.PyJWKClient | None = None
        self._failed_at: float | None = None
        self.jwks_uri: str | None = None

    # -- discovery -----------------------------------------------------------------------------

    def _discover(self) -> jwt.PyJWKClient:
        if self._client is not None:
            return self._client
        document = self._fetch_json(discovery_url(self.issuer), "discovery document")
        if document.get("issuer") != self.issuer:
            raise IssuerKeysUnavailable(
                "the discovery document names another issuer than the configured one"
            )
        self.jwks_uri = _https(document.get("jwks_uri"), "jwks_uri")
        self._client = jwt.PyJWKClient(
            self._url_for(self.jwks_uri),
            cache_keys=False,  # PyJWT's per-kid LRU never expires: a revoked key would stay
            cache_jwk_set=True,
            lifespan=self._ttl_s,
            timeout=self._timeout_s,
            ssl_context=self._ssl_context,
            cooldown_duration=self._cooldown_s,
            headers={"Accept": "application/json"},
        )
        return self._client

    def _fetch_json(self, url: str, what: str) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 - an https URL, checked above
            self._url_for(url), headers={"Accept": "application/json"}
        )
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._ssl_context))
        try:
            with opener.open(request, timeout=self._timeout_s) as answer:
                loaded = json.loads(answer.read(MAX_DOCUMENT_BYTES))
        except (OSError, ValueError) as exc:
            raise IssuerKeysUnavailable(f"the issuer's {what} is unreachable or malformed") from exc
        if not isinstance(loaded, dict):
            raise IssuerKeysUnavailable(f"the issuer's {what} is not a JSON object")
        return loaded

    # -- keys ----------------------------------------------------------------------------------

    def prefetch(self) -> None:
        """Read the discovery document and the JWKS now (a cold start); raises
        ``IssuerKeysUnavailable`` when either cannot be had or the JWKS has no signing key."""
        with self._lock:
            try:
                self._discover().get_signing_keys()
            except (jwt.PyJWKClientError, jwt.PyJWKSetError) as exc:
                raise IssuerKeysUnavailable("the issuer's JWKS is unreachable or empty") from exc

    def __call__(self, kid: str) -> jwt.PyJWK | None:
        """The issuer's signing key named ``kid``, or None (see the module docstring)."""
        with self._lock:
            failed_at = self._failed_at
            recently_failed = failed_at is not None and self._clock() - failed_at < self._cooldown_s
            if self._client is None and recently_failed:
                raise IssuerKeysUnavailable("the issuer's discovery document is unreachable")
            try:
                client = self._discover()
            except IssuerKeysUnavailable:
                self._failed_at = self._clock()
                raise
            if recently_failed:
                return self._last_fetched(client, kid)  # the provider failed a moment ago
            try:
                key = client.get_signing_key(kid)
            except (jwt.PyJWKClientConnectionError, jwt.PyJWKSetError):
                # unreachable, or it answered a JWKS without a usable key: keep the last one
                self._failed_at = self._clock()
                return self._last_fetched(client, kid)
            except jwt.PyJWKClientError:  # no such kid, even after the refetch allowed
                self._failed_at = None
                return None
            self._failed_at = None
            return key

    @staticmethod
    def _last_fetched(client: jwt.PyJWKClient, kid: str) -> jwt.PyJWK | None:
        """``kid`` in the last JWKS fetched, expired or not; no network."""
        cached = client.jwk_set_cache.jwk_set_with_timestamp if client.jwk_set_cache else None
        if cached is None:
            raise IssuerKeysUnavailable("the issuer's JWKS is unreachable")
        keys = [key for key in cached.get_jwk_set().keys if key.public_key_use in ("sig", None)]
        return jwt.PyJWKClient.match_kid(keys, kid)


def oidc_verifier(
    issuer: str,
    *,
    audience: str,
    token_type: str | None = None,
    keys: IssuerKeys | None = None,
    audience_aliases: Sequence[str] = (),
) -> TokenVerifier:
    """A ``TokenVerifier`` for ``issuer``'s tokens whose keys follow its discovery document;
    the discovery document and the JWKS are fetched now (``IssuerKeysUnavailable`` if not).
    ``audience_aliases``: the resource's client id where the issuer names that as ``aud``."""
    source = keys if keys is not None else IssuerKeys(issuer)
    source.prefetch()
    return TokenVerifier.from_key_source(
        source,
        issuer=issuer,
        audience=audience,
        token_type=token_type,
        audience_aliases=audience_aliases,
    )
