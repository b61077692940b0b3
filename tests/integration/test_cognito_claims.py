"""The stack's Cognito pre-token-generation trigger on Cognito's own event shapes
(``events/cognito_claims*.json``), and the claims it writes verified by the adapter's verifier as
the cloud composition builds it for a created pool (``ENGRAM_ISSUER`` = the pool's issuer,
``ENGRAM_AUDIENCE_ALIASES`` = the agent client's id)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Final

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from engram_memory.binding.host_config import HostConfig
from engram_memory.binding.tokens import InvalidToken, TokenVerifier, context_from_claims
from engram_memory.cloud.cognito_claims import AgentNotBound, TriggerMisconfigured, claims_handler
from engram_memory.cloud.mcp_adapter import host_config_of, token_verifier
from engram_memory.cloud.settings import AdapterSettings, CognitoClaimsSettings

EVENTS: Final = Path(__file__).resolve().parents[2] / "events"
TENANT: Final = "dev"
REGION: Final = "eu-west-1"
POOL: Final = "eu-west-1_AbCdEf123"  # the events' userPoolId
AGENT_CLIENT: Final = "4k2v9q8r1s7t3u6w0x5y2z8a1b"  # the events' callerContext.clientId
RESOURCE: Final = "https://memory.example.com/mcp"
APPROVER: Final = "9c4d1e7f-2a3b-4c5d-8e6f-7a8b9c0d1e2f"  # the event's custom:engram_approver
# What the template sets when CreateCognitoUserPool=true (Globals.Function.Environment).
ISSUER: Final = f"https://cognito-idp.{REGION}.amazonaws.com/{POOL}"


def sample(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text("utf-8"))
    return loaded


def trigger(event: dict[str, Any]) -> dict[str, Any]:
    handler = claims_handler(CognitoClaimsSettings.from_env({"ENGRAM_TENANT_ID": TENANT}))
    return handler(copy.deepcopy(event), None)


def test_a_v2_event_gets_the_four_claims_in_the_id_token_with_the_tools_as_a_list() -> None:
    answer = trigger(sample("cognito_claims"))
    assert answer["response"] == {
        "claimsAndScopeOverrideDetails": {
            "idTokenGeneration": {
                "claimsToAddOrOverride": {
                    "tenant_id": TENANT,
                    "workspace_id": "ws-0001",
                    "purpose_ref": "purpose:general",
                    "engram_tools": ["search", "get", "capture"],
                    "engram_approver": APPROVER,
                }
            }
        }
    }
    assert answer["request"] == sample("cognito_claims")["request"]  # Cognito's event, answered


def test_a_v1_event_fails_the_trigger_since_it_cannot_carry_the_tools_list() -> None:
    event = sample("cognito_claims")
    event["version"] = "1"
    event["response"] = {"claimsOverrideDetails": None}
    with pytest.raises(TriggerMisconfigured) as refused:
        trigger(event)
    assert "V2_0" in str(refused.value)


def test_a_user_outside_the_agents_group_gets_the_token_unchanged() -> None:
    event = sample("cognito_claims_approver")
    assert trigger(event) == event


def test_the_tenant_is_the_stacks_never_an_attribute() -> None:
    event = sample("cognito_claims")
    event["request"]["userAttributes"]["custom:tenant_id"] = "another-tenant"
    added = trigger(event)["response"]["claimsAndScopeOverrideDetails"]["idTokenGeneration"]
    assert added["claimsToAddOrOverride"]["tenant_id"] == TENANT


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("custom:engram_workspace", None),
        ("custom:engram_purpose", " "),
        ("custom:engram_tools", None),
        ("custom:engram_tools", "search,delete_everything"),
        ("custom:engram_tools", ",,"),
    ],
)
def test_an_unbound_agent_fails_the_trigger_so_cognito_issues_no_token(
    attribute: str, value: str | None
) -> None:
    event = sample("cognito_claims")
    attributes = event["request"]["userAttributes"]
    if value is None:
        del attributes[attribute]
    else:
        attributes[attribute] = value
    with pytest.raises(AgentNotBound) as refused:
        trigger(event)
    assert attribute in str(refused.value)
    assert "delete_everything" not in str(refused.value)  # no attribute value in the message


def test_the_approver_attribute_is_optional_and_its_claim_is_named_by_the_stack() -> None:
    event = sample("cognito_claims")
    del event["request"]["userAttributes"]["custom:engram_approver"]
    added = trigger(event)["response"]["claimsAndScopeOverrideDetails"]["idTokenGeneration"]
    assert "engram_approver" not in added["claimsToAddOrOverride"]  # nobody approves for it
    renamed = claims_handler(
        CognitoClaimsSettings.from_env(
            {"ENGRAM_TENANT_ID": TENANT, "ENGRAM_APPROVER_CLAIM": "approver_sub"}
        )
    )(sample("cognito_claims"), None)
    claims = renamed["response"]["claimsAndScopeOverrideDetails"]["idTokenGeneration"]
    assert claims["claimsToAddOrOverride"]["approver_sub"] == APPROVER
    assert "engram_approver" not in claims["claimsToAddOrOverride"]


def test_the_trigger_reads_its_tenant_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENGRAM_TENANT_ID", "acme")
    answer = claims_handler()(sample("cognito_claims"), None)
    added = answer["response"]["claimsAndScopeOverrideDetails"]["idTokenGeneration"]
    assert added["claimsToAddOrOverride"]["tenant_id"] == "acme"


# --------------------------------------------------------------------------------------------
# The pool's ID token through the adapter's verifier
# --------------------------------------------------------------------------------------------

SIGNING_KEY: Final = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KID: Final = "cognito-id-key-1"


def pool_verifier() -> tuple[TokenVerifier, HostConfig]:
    """The verifier ``build_adapter`` makes from the environment the template sets for a pool."""
    env = {
        "ENGRAM_TENANT_ID": TENANT,
        "ENGRAM_ISSUER": ISSUER,
        "ENGRAM_RESOURCE_URI": RESOURCE,
        # the template's join of the agent client and an empty AudienceAliases
        "ENGRAM_AUDIENCE_ALIASES": f"{AGENT_CLIENT},",
        "ENGRAM_TOOL_FUNCTIONS": json.dumps({"search": "engram-dev-search"}),
        "ENGRAM_REQUEST_STATE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:1:secret:x",
        "ENGRAM_INVOCATION_KEY_ARN": "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-0000000000aa",
    }
    settings = AdapterSettings.from_env(env)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(SIGNING_KEY.public_key(), as_dict=True)
    jwks = {"keys": [public | {"kid": KID, "alg": "RS256", "use": "sig"}]}
    host = host_config_of(settings)
    return token_verifier(host, jwks, None, settings.audience_aliases), host


def pool_id_token(added: dict[str, Any], **overrides: Any) -> str:
    """An ID token as the pool issues it: Cognito's claims, then what the trigger added."""
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "aud": AGENT_CLIENT,
        "sub": "5f8e2c1a-3b4d-4e6f-8a9b-0c1d2e3f4a5b",
        "token_use": "id",
        "auth_time": now,
        "iat": now,
        "exp": now + 3600,
        "cognito:username": "agent-alice",
        "cognito:groups": ["engram-agents"],
        "custom:engram_workspace": "ws-0001",
        **added,
        **overrides,
    }
    return jwt.encode(body, SIGNING_KEY, algorithm="RS256", headers={"kid": KID})


def added_claims(event_name: str) -> dict[str, Any]:
    response = trigger(sample(event_name))["response"]
    if response.get("claimsAndScopeOverrideDetails") is None:
        return {}  # the trigger added nothing
    details = response["claimsAndScopeOverrideDetails"]["idTokenGeneration"]
    added: dict[str, Any] = details["claimsToAddOrOverride"]
    return added


def test_the_pools_id_token_with_the_triggers_claims_binds_an_agent_context() -> None:
    verifier, host = pool_verifier()
    claims = verifier.verify(pool_id_token(added_claims("cognito_claims")))
    ctx = context_from_claims(claims, audit_id="aud_cognito", host=host)
    assert (ctx.tenant_id, ctx.workspace_id, ctx.purpose_ref) == (
        TENANT,
        "ws-0001",
        "purpose:general",
    )
    assert ctx.grants == frozenset({"search", "get", "capture"})
    assert ctx.principal == "5f8e2c1a-3b4d-4e6f-8a9b-0c1d2e3f4a5b"
    assert ctx.approver == APPROVER  # who answers this agent's confirmations on the page


def test_a_token_of_a_user_the_trigger_left_alone_is_refused() -> None:
    """An approver's (or an agent outside the group's) ID token carries none of the claims."""
    with pytest.raises(InvalidToken) as refused:
        pool_verifier()[0].verify(pool_id_token(added_claims("cognito_claims_approver")))
    assert refused.value.reason == "missing_claim"


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"iss": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_Other"}, "issuer"),
        ({"aud": "7h3j5k2l9m1n4p6q8r0s2t4u6v"}, "audience"),  # the approval page's client
    ],
)
def test_another_pools_or_another_clients_token_is_refused(
    override: dict[str, str], reason: str
) -> None:
    token = pool_id_token(added_claims("cognito_claims"), **override)
    with pytest.raises(InvalidToken) as refused:
        pool_verifier()[0].verify(token)
    assert refused.value.reason == reason
