"""Bearer tokens: minting, verification, and the mapping of claims to the trusted context."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engram_memory.binding.host_config import HostConfig, RetentionConfig
from engram_memory.binding.tokens import (
    InvalidToken,
    TokenIssuer,
    TokenVerifier,
    VerifiedClaims,
    context_from_claims,
    key_id,
    public_jwks,
)
from engram_memory.contract.errors import TRUSTED_CONTEXT_UNAVAILABLE, TrustedContextUnavailable
from engram_memory.embedded.data_dir import ISSUER_KEY_FILE, key_path
from engram_memory.embedded.issuer_keys import (
    load_or_create_issuer_key,
    local_issuer,
    local_verifier,
)
from engram_memory.engine.context import TOOLS, RetentionPolicy

RESOURCE = "http://127.0.0.1:8765/mcp"
ISSUER = "engram-memory-local"
KID = "key-1"


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def issuer(key: Ed25519PrivateKey) -> TokenIssuer:
    return TokenIssuer(key, issuer=ISSUER, audience=RESOURCE, kid=KID)


@pytest.fixture(scope="module")
def verifier(key: Ed25519PrivateKey) -> TokenVerifier:
    return TokenVerifier.from_public_key(key.public_key(), issuer=ISSUER, audience=RESOURCE)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _mint(issuer: TokenIssuer, **overrides: Any) -> str:
    arguments: dict[str, Any] = {
        "principal": "agent-alice",
        "tenant_id": "local",
        "workspace_id": "ws-research",
        "purpose_ref": "purpose:general",
        "tools": list(TOOLS),
        "expires_in_s": 600,
    }
    arguments.update(overrides)
    return issuer.mint(**arguments)


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": RESOURCE,
        "sub": "agent-alice",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "jti": "jti-1",
        "tenant_id": "local",
        "workspace_id": "ws-research",
        "purpose_ref": "purpose:general",
        "engram_tools": ["search", "get"],
        "engram_confirm": [],
    }
    claims.update(overrides)
    return {name: value for name, value in claims.items() if value is not _ABSENT}


_ABSENT: Any = object()


def _sign(key: Any, claims: dict[str, Any], *, alg: str = "EdDSA", kid: str | None = KID) -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _hand_made(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    if secret is None:
        return signing_input + "."
    signature = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def _context(verifier: TokenVerifier, token: str, host: HostConfig | None = None) -> Any:
    return context_from_claims(
        verifier.verify(token), audit_id="aud_test", host=host or HostConfig(), raw_token=token
    )


# --------------------------------------------------------------------------------------------
# Round trip
# --------------------------------------------------------------------------------------------


def test_a_minted_token_verifies_and_maps_to_the_trusted_context(
    issuer: TokenIssuer, verifier: TokenVerifier
) -> None:
    token = _mint(
        issuer,
        tools=["search", "get", "capture", "request_admission"],
        confirm=["capture"],
        agent_id="agent-7",
        session_id="session-9",
    )
    claims = verifier.verify(token)
    assert (claims.issuer, claims.audience, claims.subject) == (ISSUER, RESOURCE, "agent-alice")
    assert claims.expires_at - claims.issued_at == 600
    assert claims.algorithm == "EdDSA" and claims.key_id == KID and claims.token_id

    ctx = context_from_claims(
        claims, audit_id="aud_1", host=HostConfig(), deadline_ms=123, raw_token=token
    )
    assert (ctx.tenant_id, ctx.workspace_id, ctx.principal) == (
        "local",
        "ws-research",
        "agent-alice",
    )
    assert ctx.purpose_ref == "purpose:general" and ctx.audit_id == "aud_1"
    assert ctx.grants == frozenset({"search", "get", "capture", "request_admission"})
    assert ctx.confirm_required == frozenset({"capture"})
    assert (ctx.agent_id, ctx.session_id, ctx.deadline_ms) == ("agent-7", "session-9", 123)
    assert ctx.host_facts == (token,)
    assert ctx.retention == RetentionPolicy(allow_retain=False, max_expires_in_s=31_536_000)
    assert ctx.reconcile_consent is False


def test_the_minted_token_carries_the_contract_claims_and_its_key_id(issuer: TokenIssuer) -> None:
    token = _mint(
        issuer,
        confirm=["capture", "request_admission"],
        agent_id="agent-7",
        session_id="s-1",
        retention={"allow_retain": True, "max_expires_in_s": 3600},
        reconcile=True,
        now=1_800_000_000,
    )
    header = jwt.get_unverified_header(token)
    payload = jwt.decode(token, options={"verify_signature": False})
    assert header["alg"] == "EdDSA" and header["kid"] == KID
    assert set(payload) == {
        "iss",
        "aud",
        "sub",
        "iat",
        "nbf",
        "exp",
        "jti",
        "tenant_id",
        "workspace_id",
        "agent_id",
        "sid",
        "purpose_ref",
        "engram_tools",
        "engram_confirm",
        "engram_retention",
        "engram_reconcile",
    }
    assert payload["iat"] == payload["nbf"] == 1_800_000_000
    assert payload["exp"] == 1_800_000_600
    assert payload["engram_tools"] == list(TOOLS)
    assert payload["engram_retention"] == {"allow_retain": True, "max_expires_in_s": 3600}
    assert payload["engram_reconcile"] is True


def test_each_minted_token_has_its_own_id(issuer: TokenIssuer) -> None:
    first = jwt.decode(_mint(issuer), options={"verify_signature": False})
    second = jwt.decode(_mint(issuer), options={"verify_signature": False})
    assert first["jti"] != second["jti"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"tools": ["search", "delete"]},
        {"tools": "search"},
        {"tools": ["search"], "confirm": ["capture"]},
        {"confirm": ["approve"]},
        {"expires_in_s": 0},
        {"expires_in_s": True},
        {"principal": ""},
        {"workspace_id": "  "},
        {"purpose_ref": ""},
        {"agent_id": ""},
        {"retention": {"allow_retain": "yes", "max_expires_in_s": 10}},
        {"retention": {"allow_retain": True}},
        {"retention": {"allow_retain": True, "max_expires_in_s": -1}},
        {"reconcile": "true"},
    ],
)
def test_minting_refuses_bad_grants_identifiers_and_policies(
    issuer: TokenIssuer, overrides: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is checked elsewhere
        _mint(issuer, **overrides)


def test_minting_names_the_unknown_tool(issuer: TokenIssuer) -> None:
    with pytest.raises(ValueError, match="delete"):
        _mint(issuer, tools=["search", "delete"])


def test_a_token_a_little_past_expiry_still_verifies_within_the_leeway(
    issuer: TokenIssuer, verifier: TokenVerifier
) -> None:
    token = _mint(issuer, now=int(time.time()) - 610, expires_in_s=600)  # expired 10 s ago
    assert verifier.verify(token).subject == "agent-alice"


# --------------------------------------------------------------------------------------------
# Refused tokens
# --------------------------------------------------------------------------------------------


def _refused_tokens(
    key: Ed25519PrivateKey, rsa_key: rsa.RSAPrivateKey
) -> dict[str, tuple[str, str]]:
    now = int(time.time())
    other_key = Ed25519PrivateKey.generate()
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    valid = _sign(key, _claims())
    head, _body, signature = valid.split(".")
    tampered_claims = _claims(sub="agent-mallory")
    return {
        "wrong audience": (_sign(key, _claims(aud="http://127.0.0.1:9999/mcp")), "audience"),
        "several audiences": (_sign(key, _claims(aud=[RESOURCE, "https://other"])), "audience"),
        "wrong issuer": (_sign(key, _claims(iss="https://idp.example")), "issuer"),
        "expired": (_sign(key, _claims(iat=now - 7200, nbf=now - 7200, exp=now - 3600)), "expired"),
        "not yet valid (nbf)": (_sign(key, _claims(nbf=now + 3600)), "not_yet_valid"),
        "issued in the future": (_sign(key, _claims(iat=now + 3600)), "not_yet_valid"),
        "signed by another key": (_sign(other_key, _claims()), "signature"),
        "tampered claims": (
            f"{head}.{_b64(json.dumps(tampered_claims).encode())}.{signature}",
            "signature",
        ),
        "alg none": (_hand_made({"alg": "none", "kid": KID}, _claims(), None), "algorithm"),
        "HS256 with the public key as secret": (
            _hand_made({"alg": "HS256", "typ": "JWT", "kid": KID}, _claims(), public_pem),
            "algorithm",
        ),
        "RS256 where the key is Ed25519": (_sign(rsa_key, _claims(), alg="RS256"), "algorithm"),
        "missing sub": (_sign(key, _claims(sub=_ABSENT)), "missing_claim"),
        "missing exp": (_sign(key, _claims(exp=_ABSENT)), "missing_claim"),
        "missing iat": (_sign(key, _claims(iat=_ABSENT)), "missing_claim"),
        "missing aud": (_sign(key, _claims(aud=_ABSENT)), "missing_claim"),
        "missing iss": (_sign(key, _claims(iss=_ABSENT)), "missing_claim"),
        "missing tenant_id": (_sign(key, _claims(tenant_id=_ABSENT)), "missing_claim"),
        "missing workspace_id": (_sign(key, _claims(workspace_id=_ABSENT)), "missing_claim"),
        "missing purpose_ref": (_sign(key, _claims(purpose_ref=_ABSENT)), "missing_claim"),
        "null purpose_ref": (_sign(key, _claims(purpose_ref=None)), "missing_claim"),
        "string exp": (_sign(key, _claims(exp=str(now + 600))), "malformed"),
        "numeric sub": (_sign(key, _claims(sub=42)), "malformed"),
        "garbage": ("not-a-token", "malformed"),
        "three garbage parts": ("abc.def.ghi", "malformed"),
        "empty": ("", "malformed"),
        "oversized": (valid + "A" * 20_000, "malformed"),
    }


_REFUSALS = sorted(
    _refused_tokens(Ed25519PrivateKey.generate(), rsa.generate_private_key(65537, 2048))
)


@pytest.mark.parametrize("case", _REFUSALS)
def test_a_bad_token_is_refused_without_echoing_it(
    case: str, key: Ed25519PrivateKey, rsa_key: rsa.RSAPrivateKey, verifier: TokenVerifier
) -> None:
    token, reason = _refused_tokens(key, rsa_key)[case]
    with pytest.raises(InvalidToken) as raised:
        verifier.verify(token)
    assert raised.value.reason == reason
    if token:
        for text in (str(raised.value), repr(raised.value)):
            assert token not in text
            assert all(part not in text for part in token.split(".") if len(part) > 8)
    # Nothing chained either: a logged traceback must not reveal the token through a cause.
    error = raised.value
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_a_refusal_message_is_a_sentence_for_a_person(
    issuer: TokenIssuer, key: Ed25519PrivateKey
) -> None:
    other = TokenVerifier.from_public_key(
        key.public_key(), issuer=ISSUER, audience="https://memory.example/mcp"
    )
    with pytest.raises(InvalidToken, match="issued for another service"):
        other.verify(_mint(issuer))


# --------------------------------------------------------------------------------------------
# Claims the host cannot bind
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"engram_grants": ["read", "maintain"]}, id="engram_grants read+maintain"),
        pytest.param({"engram_grants": "read maintain"}, id="engram_grants as a string"),
        pytest.param({"scope": "read maintain"}, id="scope read maintain"),
        pytest.param({"scp": ["maintain"]}, id="scp maintain"),
        pytest.param({"tenant_id": "tenant-other"}, id="foreign tenant"),
        pytest.param({"engram_tools": ["search", "history"]}, id="unknown tool"),
        pytest.param({"engram_tools": ["engram_memory_search"]}, id="full tool name"),
        pytest.param({"engram_confirm": ["approve"]}, id="unknown confirmation"),
        pytest.param({"engram_tools": "search get"}, id="tools as a string"),
        pytest.param({"engram_tools": [1, 2]}, id="tools as numbers"),
        pytest.param({"engram_confirm": {"capture": True}}, id="confirm as an object"),
        pytest.param({"tenant_id": 7}, id="numeric tenant"),
        pytest.param({"workspace_id": ["ws"]}, id="list workspace"),
        pytest.param({"workspace_id": ""}, id="empty workspace"),
        pytest.param({"purpose_ref": {"p": 1}}, id="object purpose"),
        pytest.param({"sub": ""}, id="empty principal"),
        pytest.param({"agent_id": 5}, id="numeric agent_id"),
        pytest.param({"sid": ""}, id="empty sid"),
        pytest.param(
            {"engram_retention": {"allow_retain": "yes", "max_expires_in_s": 60}},
            id="retention flag as a string",
        ),
        pytest.param(
            {"engram_retention": {"allow_retain": True, "max_expires_in_s": 1.5}},
            id="retention ceiling as a float",
        ),
        pytest.param(
            {"engram_retention": {"allow_retain": True, "max_expires_in_s": 60, "x": 1}},
            id="retention with an extra key",
        ),
        pytest.param({"engram_retention": True}, id="retention as a boolean"),
        pytest.param({"engram_reconcile": "true"}, id="reconcile as a string"),
        pytest.param({"scope": 42}, id="scope as a number"),
    ],
)
def test_an_authentic_token_that_binds_no_usable_context_is_refused(
    overrides: dict[str, Any], key: Ed25519PrivateKey, verifier: TokenVerifier
) -> None:
    token = _sign(key, _claims(**overrides))
    claims = verifier.verify(token)  # authentic and current: the refusal is the context's
    with pytest.raises(TrustedContextUnavailable) as raised:
        context_from_claims(claims, audit_id="aud_x", host=HostConfig(), raw_token=token)
    assert str(raised.value) == TRUSTED_CONTEXT_UNAVAILABLE
    assert raised.value.jsonrpc_code == -32603
    assert token not in repr(raised.value)


def test_a_read_only_scope_is_not_a_maintenance_grant(
    key: Ed25519PrivateKey, verifier: TokenVerifier
) -> None:
    ctx = _context(verifier, _sign(key, _claims(scope="openid read", engram_grants=["read"])))
    assert ctx.grants == frozenset({"search", "get"})


@pytest.mark.parametrize("tools", [_ABSENT, []], ids=["absent", "empty"])
def test_a_token_without_tools_means_memory_is_disabled(
    tools: Any, key: Ed25519PrivateKey, verifier: TokenVerifier
) -> None:
    ctx = _context(verifier, _sign(key, _claims(engram_tools=tools, engram_confirm=_ABSENT)))
    assert ctx.grants == frozenset() and ctx.confirm_required == frozenset()


def test_only_capture_and_request_admission_are_host_confirmable(
    issuer: TokenIssuer, verifier: TokenVerifier
) -> None:
    token = _mint(issuer, confirm=["capture", "withdraw", "forget"])
    ctx = _context(verifier, token)
    assert ctx.confirm_required == frozenset({"capture"})
    assert ctx.needs_confirmation("withdraw") and ctx.needs_confirmation("forget")
    assert not ctx.needs_confirmation("request_admission")


@pytest.mark.parametrize(
    ("token_policy", "host_policy", "expected"),
    [
        ({"allow_retain": True, "max_expires_in_s": 999_999_999}, (False, 1000), (False, 1000)),
        ({"allow_retain": True, "max_expires_in_s": 60}, (True, 1000), (True, 60)),
        ({"allow_retain": False, "max_expires_in_s": 5000}, (True, 1000), (False, 1000)),
        ({"allow_retain": False, "max_expires_in_s": 0}, (True, 1000), (False, 0)),
        (None, (True, 1000), (True, 1000)),
    ],
)
def test_retention_is_the_token_policy_capped_by_the_host(
    token_policy: dict[str, Any] | None,
    host_policy: tuple[bool, int],
    expected: tuple[bool, int],
    issuer: TokenIssuer,
    verifier: TokenVerifier,
) -> None:
    host = HostConfig(
        retention=RetentionConfig(allow_retain=host_policy[0], max_expires_in_s=host_policy[1])
    )
    ctx = _context(verifier, _mint(issuer, retention=token_policy), host)
    assert ctx.retention == RetentionPolicy(allow_retain=expected[0], max_expires_in_s=expected[1])


@pytest.mark.parametrize(
    ("token_consent", "host_consent", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (None, True, False)],
)
def test_reconciliation_needs_the_consent_of_token_and_host(
    token_consent: bool | None,
    host_consent: bool,
    expected: bool,
    issuer: TokenIssuer,
    verifier: TokenVerifier,
) -> None:
    host = HostConfig(reconcile_consent=host_consent)
    ctx = _context(verifier, _mint(issuer, reconcile=token_consent), host)
    assert ctx.reconcile_consent is expected


def test_the_approver_claim_names_who_answers_the_agents_confirmations(
    key: Ed25519PrivateKey, verifier: TokenVerifier
) -> None:
    with_approver = _sign(key, _claims(engram_approver="person-dana"))
    assert _context(verifier, with_approver).approver == "person-dana"
    assert _context(verifier, _sign(key, _claims())).approver is None  # the principal answers
    renamed = HostConfig(approver_claim="approver_sub")
    token = _sign(key, _claims(approver_sub="person-dana", engram_approver="person-mallory"))
    assert _context(verifier, token, renamed).approver == "person-dana"
    for malformed in ("", "  ", 7, ["person-dana"]):
        with pytest.raises(TrustedContextUnavailable):
            _context(verifier, _sign(key, _claims(engram_approver=malformed)))


@pytest.mark.parametrize("name", ["sub", "tenant_id", "engram_tools", "scope", "bad name", ""])
def test_the_approver_claim_is_never_one_the_host_reads_for_something_else(name: str) -> None:
    with pytest.raises(ValueError, match="approver_claim"):
        HostConfig(approver_claim=name)


def test_without_the_raw_token_the_context_has_no_host_facts(
    issuer: TokenIssuer, verifier: TokenVerifier
) -> None:
    claims = verifier.verify(_mint(issuer))
    assert context_from_claims(claims, audit_id="a", host=HostConfig()).host_facts == ()


def test_a_hand_built_claims_object_is_judged_like_a_token() -> None:
    claims = VerifiedClaims(
        issuer=ISSUER,
        audience=RESOURCE,
        subject="agent-alice",
        issued_at=0,
        expires_at=1,
        not_before=None,
        token_id=None,
        key_id=None,
        algorithm="EdDSA",
        tenant_id="local",
        workspace_id="ws",
        purpose_ref="p",
        engram_tools=("search",),  # a tuple is not what JSON gives
    )
    with pytest.raises(TrustedContextUnavailable):
        context_from_claims(claims, audit_id="a", host=HostConfig())


# --------------------------------------------------------------------------------------------
# Keys: JWKS, external identity providers, the local issuer key
# --------------------------------------------------------------------------------------------


def _rsa_jwk(private_key: rsa.RSAPrivateKey, kid: str, **extra: Any) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private_key.public_key()))
    return {**jwk, "kid": kid, **extra}


def _ec_jwk(private_key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private_key.public_key()))
    return {**jwk, "kid": kid}


def test_jwks_verification_picks_the_key_by_kid(key: Ed25519PrivateKey) -> None:
    second = Ed25519PrivateKey.generate()
    jwks = {"keys": [*public_jwks(key, "k1")["keys"], *public_jwks(second, "k2")["keys"]]}
    verifier = TokenVerifier.from_jwks(jwks, issuer=ISSUER, audience=RESOURCE)
    assert verifier.verify(_sign(second, _claims(), kid="k2")).key_id == "k2"
    assert verifier.verify(_sign(key, _claims(), kid="k1")).key_id == "k1"
    with pytest.raises(InvalidToken) as wrong_key:
        verifier.verify(_sign(key, _claims(), kid="k2"))
    assert wrong_key.value.reason == "signature"
    for kid in ("k3", None):
        with pytest.raises(InvalidToken) as unknown:
            verifier.verify(_sign(key, _claims(), kid=kid))
        assert unknown.value.reason == "unknown_key"


def test_jwks_from_an_identity_provider_verifies_rs256_and_es256(
    rsa_key: rsa.RSAPrivateKey,
) -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwks = {
        "keys": [
            _rsa_jwk(rsa_key, "rsa-1", alg="RS256", use="sig"),
            _ec_jwk(ec_key, "ec-1"),
            _rsa_jwk(rsa_key, "rsa-512", alg="RS512"),  # not on the allow-list: ignored
            _rsa_jwk(rsa_key, "rsa-enc", use="enc"),  # an encryption key: ignored
            {"kty": "OKP", "crv": "Ed25519", "x": "AAAA"},  # no kid: ignored
        ]
    }
    issuer = "https://idp.example"
    verifier = TokenVerifier.from_jwks(jwks, issuer=issuer, audience=RESOURCE)
    rs = verifier.verify(_sign(rsa_key, _claims(iss=issuer), alg="RS256", kid="rsa-1"))
    es = verifier.verify(_sign(ec_key, _claims(iss=issuer), alg="ES256", kid="ec-1"))
    assert (rs.algorithm, es.algorithm) == ("RS256", "ES256")
    for kid, alg in (("rsa-512", "RS512"), ("rsa-enc", "RS256")):
        with pytest.raises(InvalidToken):
            verifier.verify(_sign(rsa_key, _claims(iss=issuer), alg=alg, kid=kid))
    # The key fixes the algorithm: an RSA key's kid with an ES256 token is refused.
    with pytest.raises(InvalidToken) as confused:
        verifier.verify(_sign(ec_key, _claims(iss=issuer), alg="ES256", kid="rsa-1"))
    assert confused.value.reason == "algorithm"


@pytest.mark.parametrize(
    "jwks",
    [
        {},
        {"keys": "none"},
        {"keys": ["x"]},
        {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}]},
        {"keys": [{"kty": "RSA", "alg": "RS512", "n": "AQAB", "e": "AQAB", "kid": "r"}]},
    ],
    ids=["no keys", "keys not a list", "entry not an object", "symmetric key", "only unusable"],
)
def test_a_malformed_or_unusable_jwks_is_a_configuration_error(jwks: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several distinct messages
        TokenVerifier.from_jwks(jwks, issuer=ISSUER, audience=RESOURCE)


def test_a_jwks_with_private_key_material_or_repeated_kids_is_refused(
    key: Ed25519PrivateKey,
) -> None:
    private_jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(key))
    with pytest.raises(ValueError, match="private"):
        TokenVerifier.from_jwks(
            {"keys": [{**private_jwk, "kid": "k"}]}, issuer=ISSUER, audience=RESOURCE
        )
    twice = {"keys": public_jwks(key, "k")["keys"] * 2}
    with pytest.raises(ValueError, match="repeats"):
        TokenVerifier.from_jwks(twice, issuer=ISSUER, audience=RESOURCE)


def test_a_single_public_key_verifier_accepts_rsa_and_p256_but_not_weak_keys(
    rsa_key: rsa.RSAPrivateKey,
) -> None:
    rs = TokenVerifier.from_public_key(rsa_key.public_key(), issuer=ISSUER, audience=RESOURCE)
    assert rs.verify(_sign(rsa_key, _claims(), alg="RS256")).algorithm == "RS256"
    ec_key = ec.generate_private_key(ec.SECP256R1())
    es = TokenVerifier.from_public_key(ec_key.public_key(), issuer=ISSUER, audience=RESOURCE)
    assert es.verify(_sign(ec_key, _claims(), alg="ES256")).algorithm == "ES256"
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
    with pytest.raises(ValueError, match="2048"):
        TokenVerifier.from_public_key(weak.public_key(), issuer=ISSUER, audience=RESOURCE)
    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(ValueError, match="P-256"):
        TokenVerifier.from_public_key(p384.public_key(), issuer=ISSUER, audience=RESOURCE)


def test_the_key_id_is_the_rfc7638_thumbprint() -> None:
    # RFC 8037, appendix A.2 and A.3: the Ed25519 test key and its JWK thumbprint.
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    raw = base64.urlsafe_b64decode(x + "=")
    assert key_id(Ed25519PublicKey.from_public_bytes(raw)) == (
        "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    )


def test_the_published_jwks_holds_only_the_public_key(key: Ed25519PrivateKey) -> None:
    (jwk,) = public_jwks(key, "k1")["keys"]
    assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}
    assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == ("OKP", "Ed25519", "EdDSA", "sig")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_issuer_key_is_created_once_and_kept_private(tmp_path: Path) -> None:
    path = key_path(tmp_path / "data", ISSUER_KEY_FILE)
    first = load_or_create_issuer_key(path)
    second = load_or_create_issuer_key(path)
    raw = serialization.Encoding.Raw
    assert first.private_bytes_raw() == second.private_bytes_raw()
    assert first.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_an_issuer_key_file_that_is_not_ed25519_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key")
    with pytest.raises(ValueError, match="PEM private key"):
        load_or_create_issuer_key(garbage)
    ec_pem = tmp_path / "ec.pem"
    ec_pem.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(ValueError, match="Ed25519"):
        load_or_create_issuer_key(ec_pem)


def test_the_local_issuer_and_verifier_of_a_data_dir_agree(tmp_path: Path) -> None:
    config = HostConfig(resource="https://memory.example/mcp", issuer="local-host")
    token = local_issuer(tmp_path, config).mint(
        principal="p",
        tenant_id="local",
        workspace_id="w",
        purpose_ref="r",
        tools=["search"],
        expires_in_s=60,
    )
    claims = local_verifier(tmp_path, config).verify(token)
    assert (claims.audience, claims.issuer) == ("https://memory.example/mcp", "local-host")
    assert claims.key_id == key_id(
        load_or_create_issuer_key(key_path(tmp_path, ISSUER_KEY_FILE)).public_key()
    )


@pytest.mark.parametrize(
    ("typ", "accepted"),
    [
        ("at+jwt", True),
        ("application/at+jwt", True),
        ("AT+JWT", True),
        ("JWT", False),
        (None, False),
        ("id+jwt", False),
    ],
)
def test_the_local_verifier_accepts_only_access_tokens_rfc_9068(
    tmp_path: Path, typ: str | None, accepted: bool
) -> None:
    config = HostConfig()
    issuer = local_issuer(tmp_path, config)
    verifier = local_verifier(tmp_path, config)
    assert verifier.verify(_mint(issuer)).subject == "agent-alice"  # what the issuer mints
    private_key = load_or_create_issuer_key(key_path(tmp_path, ISSUER_KEY_FILE))
    headers: dict[str, Any] = {"kid": issuer.kid, "typ": typ}
    claims = _claims(iss=config.issuer, aud=config.resource)
    token = jwt.encode(claims, private_key, algorithm="EdDSA", headers=headers)
    if typ is None:  # PyJWT writes typ JWT unless told to leave it out
        token = _hand_signed_without_typ(private_key, issuer.kid, claims)
    if accepted:
        assert verifier.verify(token).subject == claims["sub"]
    else:
        with pytest.raises(InvalidToken) as refused:
            verifier.verify(token)
        assert refused.value.reason == "token_type"


def _hand_signed_without_typ(key: Ed25519PrivateKey, kid: str, claims: dict[str, Any]) -> str:
    header = {"alg": "EdDSA", "kid": kid}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(key.sign(signing_input.encode('ascii')))}"
