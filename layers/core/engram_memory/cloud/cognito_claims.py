"""The stack's Cognito user pool's pre-token-generation trigger (``functions/cognito_claims``).

It writes the claims the stack requires into an agent's ID token (the token an agent sends:
Cognito access tokens carry no ``aud``, docs/identity-providers/cognito.md):

- ``tenant_id``: the stack's ``TenantId`` (``ENGRAM_TENANT_ID``), never a user attribute, so no
  user of this pool can hold a token for another tenant;
- ``workspace_id``, ``purpose_ref``: the user's ``custom:engram_workspace`` and
  ``custom:engram_purpose``;
- ``engram_tools``: ``custom:engram_tools``, comma-separated tool names;
- the approver claim (``ENGRAM_APPROVER_CLAIM``, default ``engram_approver``):
  ``custom:engram_approver``, the pool ``sub`` of the person who answers this agent's
  confirmations on the approval page, when the administrator set one (without it, nobody can
  approve the agent's withdraw or forget: the page never takes an agent's own sign-in).

Who is an agent: a member of the pool group ``engram-agents`` (``AGENTS_GROUP``). The template
makes the four attributes writable by no app client, so only an administrator
(``AdminUpdateUserAttributes``) binds an agent and names its approver. For an agent, a missing or malformed attribute
fails the trigger: Cognito then issues no token, rather than one the stack refuses later. Anyone
else (a person signing in to the approval page) gets the token Cognito made, unchanged.

The event must be ``V2_0`` (or ``V3_0``; the template's ``LambdaVersion`` is ``V2_0``, which
needs the Essentials plan): ``engram_tools`` is a list, and a ``V1_0`` trigger can add strings
only, which the verifier refuses for that claim. A ``V1_0`` event fails the trigger
(``TriggerMisconfigured``) rather than issue a token the stack refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from engram_memory.cloud.observability import get_logger
from engram_memory.cloud.settings import DEFAULT_APPROVER_CLAIM, CognitoClaimsSettings
from engram_memory.engine.context import TOOLS

AGENTS_GROUP: Final = "engram-agents"
WORKSPACE_ATTRIBUTE: Final = "custom:engram_workspace"
PURPOSE_ATTRIBUTE: Final = "custom:engram_purpose"
TOOLS_ATTRIBUTE: Final = "custom:engram_tools"
APPROVER_ATTRIBUTE: Final = "custom:engram_approver"


class AgentNotBound(Exception):
    """An agent's user lacks (or has a malformed) binding attribute: Cognito issues no token.

    The message names the attribute, never its value (it is in Cognito's error to the caller)."""


class TriggerMisconfigured(Exception):
    """The pool sends ``V1_0`` events: set its ``LambdaVersion`` to ``V2_0``."""


class _Groups(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    groupsToOverride: list[StrictStr] = Field(default_factory=list)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    userAttributes: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    groupConfiguration: _Groups = Field(default_factory=_Groups)


class PreTokenGenerationEvent(BaseModel):
    """What the trigger reads of Cognito's event (both versions share these fields)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: StrictStr
    triggerSource: StrictStr
    userPoolId: StrictStr
    request: _Request


def _attribute(attributes: Mapping[str, str], name: str) -> str:
    value = attributes.get(name, "").strip()
    if not value:
        raise AgentNotBound(f"the agent has no {name} attribute (an administrator sets it)")
    return value


def _tools(attributes: Mapping[str, str]) -> list[str]:
    names = [part.strip() for part in _attribute(attributes, TOOLS_ATTRIBUTE).split(",")]
    granted = [name for name in names if name]
    unknown = sorted(set(granted) - set(TOOLS))
    if unknown or not granted:
        raise AgentNotBound(
            f"{TOOLS_ATTRIBUTE} must name tools among {', '.join(TOOLS)}, comma-separated"
        )
    return list(dict.fromkeys(granted))


def agent_claims(
    event: PreTokenGenerationEvent, tenant_id: str, approver_claim: str = DEFAULT_APPROVER_CLAIM
) -> dict[str, Any] | None:
    """The claims to add for this event's user, or None when the user is not an agent."""
    if AGENTS_GROUP not in event.request.groupConfiguration.groupsToOverride:
        return None
    attributes = event.request.userAttributes
    claims: dict[str, Any] = {
        "tenant_id": tenant_id,
        "workspace_id": _attribute(attributes, WORKSPACE_ATTRIBUTE),
        "purpose_ref": _attribute(attributes, PURPOSE_ATTRIBUTE),
        "engram_tools": _tools(attributes),
    }
    approver = attributes.get(APPROVER_ATTRIBUTE, "").strip()
    if approver:
        claims[approver_claim] = approver
    return claims


def respond(
    raw: dict[str, Any], tenant_id: str, approver_claim: str = DEFAULT_APPROVER_CLAIM
) -> dict[str, Any]:
    """Cognito's event with its ``response`` filled in (the trigger's answer is the event)."""
    event = PreTokenGenerationEvent.model_validate(raw)
    if event.version not in ("2", "3"):
        raise TriggerMisconfigured(
            "the pool sends V1_0 trigger events, which cannot carry engram_tools (a list): "
            "set its PreTokenGenerationConfig LambdaVersion to V2_0"
        )
    try:
        claims = agent_claims(event, tenant_id, approver_claim)
    except AgentNotBound as refused:
        get_logger().warning(
            "no token for an unbound agent",
            extra={"reason": str(refused), "trigger_source": event.triggerSource},
        )
        raise
    if claims is None:
        return raw
    raw["response"] = {
        "claimsAndScopeOverrideDetails": {"idTokenGeneration": {"claimsToAddOrOverride": claims}}
    }
    return raw


def claims_handler(
    settings: CognitoClaimsSettings | None = None,
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda entry point; the stack's tenant is read once, at the first event."""
    held: list[CognitoClaimsSettings] = [settings] if settings is not None else []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if not held:
            held.append(CognitoClaimsSettings.from_env())
        return respond(event, held[0].tenant_id, held[0].approver_claim)

    return handler
