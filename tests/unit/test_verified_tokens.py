"""Verified tokens kept until they expire: fewer signature checks, nothing more accepted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import Client

from engram_memory.binding.tokens import LEEWAY_S, InvalidToken, TokenIssuer, TokenVerifier
from engram_memory.binding.verified_tokens import VerifiedTokenCache, cached
from engram_memory.embedded.cli import main
from engram_memory.embedded.serve import default_token, open_server
from engram_memory.mcp_surface.catalog import TOOL_NAMES

RESOURCE = "http://127.0.0.1:8765/mcp"
ISSUER = "engram-memory-local"


class CountingVerifier(TokenVerifier):
    """A real verifier that counts the verifications it does."""

    calls = 0

    def verify(self, token: str) -> Any:
        self.calls += 1
        return super().verify(token)


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def issuer(key: Ed25519PrivateKey) -> TokenIssuer:
    return TokenIssuer(key, issuer=ISSUER, audience=RESOURCE, kid="key-1")


@pytest.fixture
def verifier(key: Ed25519PrivateKey) -> CountingVerifier:
    built = CountingVerifier.from_public_key(key.public_key(), issuer=ISSUER, audience=RESOURCE)
    assert isinstance(built, CountingVerifier)
    return built


def mint(issuer: TokenIssuer, principal: str = "agent", **options: Any) -> str:
    return issuer.mint(
        principal=principal,
        tenant_id="local",
        workspace_id="default",
        purpose_ref="purpose:test",
        tools=["search"],
        expires_in_s=options.pop("expires_in_s", 900),
        **options,
    )


def test_a_token_is_verified_once_while_it_lives(
    issuer: TokenIssuer, verifier: CountingVerifier
) -> None:
    cache = VerifiedTokenCache(verifier)
    token = mint(issuer)
    first = cache.verify(token)
    assert [cache.verify(token) for _ in range(5)] == [first] * 5
    assert verifier.calls == 1
    assert first == verifier.verify(token)  # the very claims the verifier gives


def test_an_expired_token_is_refused_as_the_verifier_would_refuse_it(
    issuer: TokenIssuer, verifier: CountingVerifier
) -> None:
    # Minted in the past so that it stops verifying (exp + leeway) two seconds from now.
    lifetime = 60
    token = mint(issuer, expires_in_s=lifetime, now=int(time.time()) - lifetime - LEEWAY_S + 2)
    cache = VerifiedTokenCache(verifier)
    cache.verify(token)
    cache.verify(token)
    assert verifier.calls == 1
    time.sleep(3)
    with pytest.raises(InvalidToken) as refused:
        cache.verify(token)
    assert refused.value.reason == "expired"
    assert len(cache) == 0


def test_a_refused_token_is_never_kept(key: Ed25519PrivateKey, verifier: CountingVerifier) -> None:
    impostor = TokenIssuer(
        Ed25519PrivateKey.generate(), issuer=ISSUER, audience=RESOURCE, kid="key-1"
    )
    forged = mint(impostor)
    cache = VerifiedTokenCache(verifier)
    for attempt in range(1, 4):
        with pytest.raises(InvalidToken):
            cache.verify(forged)
        assert verifier.calls == attempt
    assert len(cache) == 0


def test_the_cache_is_bounded_least_recently_used_first(
    issuer: TokenIssuer, verifier: CountingVerifier
) -> None:
    cache = VerifiedTokenCache(verifier, max_entries=2)
    first, second, third = (mint(issuer, principal=f"agent-{i}") for i in range(3))
    cache.verify(first)
    cache.verify(second)
    cache.verify(first)  # the second is now the least recently used
    cache.verify(third)
    assert len(cache) == 2
    calls = verifier.calls
    cache.verify(first)
    assert verifier.calls == calls
    cache.verify(second)
    assert verifier.calls == calls + 1


def test_a_verifier_whose_keys_come_from_a_key_source_is_not_cached() -> None:
    sourced = TokenVerifier.from_key_source(lambda kid: None, issuer=ISSUER, audience=RESOURCE)
    assert cached(sourced) is sourced
    fixed = TokenVerifier.from_public_key(
        Ed25519PrivateKey.generate().public_key(), issuer=ISSUER, audience=RESOURCE
    )
    assert isinstance(cached(fixed), VerifiedTokenCache)


def test_revocation_wins_over_a_cached_token(tmp_path: Path) -> None:
    """The embedded server keeps the token verified; revoking it still refuses the next call."""
    data = tmp_path / "data"
    first = open_server(data)  # initializes the data directory
    token = default_token(first)
    first.close()
    server = open_server(data, stdio_token=token)
    cache = server.surface.runtime.verifier
    assert isinstance(cache, VerifiedTokenCache)
    search = {"query": "anything", "purpose_ref": "general"}

    async def call() -> dict[str, Any]:
        async with Client(server.surface.server, mode="legacy") as client:
            result = await client.call_tool(TOOL_NAMES["search"], search)
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    try:
        assert anyio.run(call)["ok"]
        assert len(cache) == 1
        assert main(["admin", "tokens", "revoke", "--data-dir", str(data), "--token", token]) == 0
        refused = anyio.run(call)
        assert len(cache) == 1  # still verified ...
        assert refused["error"]["code"] == "AUTHORIZATION_REVOKED"  # ... and still refused
    finally:
        server.close()
