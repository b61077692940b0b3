"""The approver is never the agent, in each identity mode the docs offer: the stack's Cognito
pool, a generic OIDC provider (Keycloak-shaped), Entra ID and Okta.

Per mode, the agent's token as that provider issues it (with the approver claim the operator set:
Cognito's ``custom:engram_approver`` copied by the pool's trigger, a mapped claim at Entra and
Okta) goes the whole way a confirmation goes: the adapter's verifier and host configuration
(``ENGRAM_APPROVER_CLAIM``), the trusted context, the tool invocation, the execution input, and
the token parked by ``ParkedApprovalBook.park`` on moto's DynamoDB. Then the approval function (the
settings the template sets for the mode: the groups claim and the agents' group) meets the
people who open the link at the local OIDC provider over HTTPS: the agent's own credentials,
in each shape they can come back in (a member of the agents' group, an application's token, no
``auth_time``, a stale ``auth_time``, or a person-shaped sign-in that is not the approver), are
refused and answer nothing; the designated person approves.
"""

from __future__ import annotations

import copy
import json
import ssl
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import jwt
import pytest
from approval_testing import (
    APPROVAL_ENV,
    CLIENT_ID,
    PROOF_KEY,
    RESOURCE,
    PageContext,
    RecordedSfn,
    outcome,
)
from approval_testing import page_event as event
from aws_testing import TABLE, aws_clients, moto_aws
from cryptography.hazmat.primitives.asymmetric import rsa
from test_cloud_approval_page import provider, tls  # the HTTPS provider and its certificate

from engram_memory.adapters.aws.dynamo_store import create_tables
from engram_memory.binding.tokens import context_from_claims
from engram_memory.cloud.approval_page import ApprovalHandler, https_fetch
from engram_memory.cloud.cognito_claims import claims_handler
from engram_memory.cloud.composition import build_approval_page
from engram_memory.cloud.mcp_adapter import host_config_of, token_verifier
from engram_memory.cloud.oidc import IssuerKeys
from engram_memory.cloud.parked_approvals import ParkedApprovalBook, WorkflowRequest
from engram_memory.cloud.settings import AdapterSettings, CognitoClaimsSettings
from engram_memory.cloud.tool_invocation import ToolInvocation
from engram_memory.engine.context import new_audit_id

from oidc_provider import LocalOidcProvider, sign_in

__all__ = ["provider", "tls"]  # the fixtures, re-used

EVENTS: Final = Path(__file__).resolve().parents[2] / "events"
TENANT: Final = "dev"
AGENT_KEY: Final = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ENTRA_AGENTS: Final = "0b7d7e2c-4a8f-4c1e-9d3b-6f2a1e5c8b90"  # the agents group's object id
RECORD: Final = "mem_" + "b" * 52


@dataclass(frozen=True)
class Mode:
    """One identity mode: its agent, the agent's token, and how people come back from sign-in."""

    name: str
    agent: str  # the agent's sub: the principal
    approver: str  # the person the operator named in the agent's token
    aliases: str  # ENGRAM_AUDIENCE_ALIASES: the client id the provider writes as aud, if any
    page_env: Mapping[str, str]  # what the template sets for the approval function
    agent_token: Mapping[str, Any]  # the agent's token, as the provider issues it
    agent_signs_in: Mapping[str, Mapping[str, Any]]  # the agent at the page, by refusal
    person: Mapping[str, Any] = field(default_factory=dict)  # the approver's ID token's own claims
    honours_max_age: bool = True


def cognito_agent_token(agent: str, approver: str) -> dict[str, Any]:
    """The pool's ID token of an agent: Cognito's claims, then what the stack's trigger adds
    (from the sample event, the administrator having set ``custom:engram_approver``)."""
    sample = json.loads((EVENTS / "cognito_claims.json").read_text("utf-8"))
    sample["request"]["userAttributes"]["custom:engram_approver"] = approver
    handler = claims_handler(CognitoClaimsSettings.from_env({"ENGRAM_TENANT_ID": TENANT}))
    answered = handler(copy.deepcopy(sample), None)["response"]
    added = answered["claimsAndScopeOverrideDetails"]["idTokenGeneration"]["claimsToAddOrOverride"]
    return {
        "aud": "4k2v9q8r1s7t3u6w0x5y2z8a1b",  # the agents' app client
        "sub": agent,
        "token_use": "id",
        "cognito:username": "agent-research",
        "cognito:groups": ["engram-agents"],
        **added,
    }


def engram_claims(approver: str) -> dict[str, Any]:
    """The Engram claims an Entra, Okta or Keycloak recipe maps into an agent's access token."""
    return {
        "tenant_id": TENANT,
        "workspace_id": "ws-0001",
        "purpose_ref": "purpose:general",
        "engram_tools": ["search", "get", "capture", "forget"],
        "engram_approver": approver,
    }


COGNITO_AGENT: Final = "5f8e2c1a-3b4d-4e6f-8a9b-0c1d2e3f4a5b"
COGNITO_DANA: Final = "9c4d1e7f-2a3b-4c5d-8e6f-7a8b9c0d1e2f"
ENTRA_AGENT: Final = "Zm9vYmFyLWFnZW50LXByaW5jaXBhbA"  # pairwise sub of the agent's principal
MODES: Final = (
    Mode(
        name="cognito",
        agent=COGNITO_AGENT,
        approver=COGNITO_DANA,
        aliases="4k2v9q8r1s7t3u6w0x5y2z8a1b,",
        page_env={"ENGRAM_APPROVER_GROUPS_CLAIM": "cognito:groups"},
        agent_token=cognito_agent_token(COGNITO_AGENT, COGNITO_DANA),
        agent_signs_in={
            "group": {"cognito:groups": ["engram-agents"], "token_use": "id"},
            "app": {"token_use": "access", "client_id": "4k2v9q8r1s7t3u6w0x5y2z8a1b"},
            "no_auth_time": {"token_use": "id", "auth_time": None},
            "stale": {"token_use": "id"},
            "person_shaped": {"token_use": "id"},
        },
        person={"token_use": "id", "cognito:username": "dana"},
        honours_max_age=False,  # Cognito ignores max_age: the page asks again with prompt=login
    ),
    Mode(
        name="oidc",
        agent="agent-research",
        approver="dana",
        aliases="",
        page_env={},  # the defaults: groups, engram-agents
        agent_token={"aud": RESOURCE, "sub": "agent-research", **engram_claims("dana")},
        agent_signs_in={
            "group": {"groups": ["staff", "engram-agents"], "azp": CLIENT_ID},
            "app": {"gty": "client-credentials"},
            "no_auth_time": {"auth_time": None},
            "stale": {},
            "person_shaped": {"groups": ["staff"]},
        },
        person={"groups": ["staff"], "azp": CLIENT_ID},
    ),
    Mode(
        name="entra",
        agent=ENTRA_AGENT,
        approver="dana-pairwise-sub",
        aliases="api://engram-api-client-id,",
        page_env={"ENGRAM_AGENTS_GROUP": ENTRA_AGENTS},
        agent_token={
            "aud": "api://engram-api-client-id",
            "sub": ENTRA_AGENT,
            "idtyp": "app",  # an app-only agent (client credentials)
            "roles": ["Engram.Agent"],
            "tid": "11111111-2222-4333-8444-555555555555",
            **engram_claims("dana-pairwise-sub"),
        },
        agent_signs_in={
            "group": {"groups": [ENTRA_AGENTS]},
            "app": {"idtyp": "app"},
            "overage": {"_claim_names": {"groups": "src1"}},
            "no_auth_time": {"auth_time": None},
            "stale": {},
            "person_shaped": {"groups": []},
        },
        person={"groups": ["5e1c0a3b-8d7f-4e2a-9b6c-1f0e2d3c4b5a"], "tid": "x"},
    ),
    Mode(
        name="okta",
        agent="0oa1agentclientid",
        approver="00u1danauserid",
        aliases="",
        page_env={},
        agent_token={
            "aud": RESOURCE,
            "sub": "0oa1agentclientid",  # a service app: sub is its client id
            "cid": "0oa1agentclientid",
            "scp": ["engram.memory"],
            **engram_claims("00u1danauserid"),
        },
        agent_signs_in={
            "group": {"groups": ["Everyone", "engram-agents"]},
            "app": {"cid": "0oa1agentclientid"},  # sub == cid: no user
            "no_auth_time": {"auth_time": None},
            "stale": {},
            "person_shaped": {"groups": ["Everyone"]},
        },
        person={"groups": ["Everyone"], "amr": ["pwd"]},
    ),
)
REFUSED: Final = {
    "group": (403, "not_a_person"),
    "app": (403, "not_a_person"),
    "overage": (403, "not_a_person"),
    "no_auth_time": (403, "not_a_person"),
    "stale": (401, "stale_sign_in"),
    "person_shaped": (403, "forbidden"),  # a person's sign-in, but not the approver's
}


def issuer_of(mode: Mode) -> str:
    return {
        "cognito": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_AbCdEf123",
        "oidc": "https://sso.example.com/realms/acme",
        "entra": "https://login.microsoftonline.com/11111111-2222-4333-8444-555555555555/v2.0",
        "okta": "https://acme.okta.com/oauth2/default",
    }[mode.name]


def parked_for(mode: Mode, store: ParkedApprovalBook) -> str:
    """The agent's forget, from its token to the parked task token: the approval id."""
    env = {
        "ENGRAM_TENANT_ID": TENANT,
        "ENGRAM_ISSUER": issuer_of(mode),
        "ENGRAM_RESOURCE_URI": RESOURCE,
        "ENGRAM_AUDIENCE_ALIASES": mode.aliases,
        "ENGRAM_TOOL_FUNCTIONS": json.dumps({"forget": "engram-dev-forget"}),
        "ENGRAM_REQUEST_STATE_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:1:secret:x",
        "ENGRAM_INVOCATION_KEY_ARN": "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-0000000000aa",
    }
    settings = AdapterSettings.from_env(env)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(AGENT_KEY.public_key(), as_dict=True)
    jwks = {"keys": [public | {"kid": "k1", "alg": "RS256", "use": "sig"}]}
    host = host_config_of(settings)
    verifier = token_verifier(host, jwks, None, settings.audience_aliases)
    now = int(time.time())
    token = jwt.encode(
        {"iss": issuer_of(mode), "iat": now, "exp": now + 600, **mode.agent_token},
        AGENT_KEY,
        algorithm="RS256",
        headers={"kid": "k1"},
    )
    ctx = context_from_claims(verifier.verify(token), audit_id=new_audit_id(), host=host)
    assert (ctx.principal, ctx.approver) == (mode.agent, mode.approver)
    arguments = {"record_id": RECORD, "idempotency_key": "forget-1", "reason_ref": "obsolete"}
    request = WorkflowRequest(
        invocation=ToolInvocation.from_trusted("forget", arguments, ctx),
        target=RECORD,
        operation_digest="sha256:" + "0" * 64,
        reason_ref="reason:obsolete",
    )
    started = WorkflowRequest.model_validate_json(request.model_dump_json())  # the execution input
    return store.park(
        approval_id=ParkedApprovalBook.new_approval_id(),
        task_token="task-token",
        execution_name="forget-" + "1" * 64,
        workflow="forget",
        request=started,
        issued_at_ms=now * 1000,
    )


@dataclass
class Site:
    """The approval function for one mode, the provider its people sign in at, a browser."""

    mode: Mode
    handler: ApprovalHandler
    provider: LocalOidcProvider
    trust: ssl.SSLContext
    store: ParkedApprovalBook
    sfn: RecordedSfn
    approval_id: str

    def __call__(self, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.handler(ev, PageContext())
        return answer

    def sign_in(self, location: str, username: str) -> str:
        """At the provider as ``username``: the callback's query."""
        return urlsplit(sign_in(location, username, verify=self.trust)).query

    def visit(self, username: str) -> tuple[dict[str, Any], str | None]:
        """Open the link signed out, sign in as ``username`` (again, when the page asks): the
        page then shown (or the refusal), and the session cookie if one was set."""
        answer = self(event(self.approval_id))
        for _ in range(2):  # the first sign-in, and the one asked again with prompt=login
            if answer["statusCode"] != 302:
                break
            signin = answer["cookies"][0].split(";")[0]
            query = self.sign_in(answer["headers"]["Location"], username)
            answer = self(event("", path="/approvals/callback", query=query, cookies=[signin]))
        sessions = [c for c in answer.get("cookies", []) if c.startswith("engram_approver=")]
        if answer["statusCode"] != 200 or not sessions:
            return answer, None
        session = sessions[0].split(";")[0]
        return self(event(self.approval_id, cookies=[session])), session


@pytest.fixture(params=MODES, ids=[mode.name for mode in MODES])
def site(
    request: pytest.FixtureRequest, provider: LocalOidcProvider, tls: tuple[Path, Path]
) -> Iterator[Site]:
    mode: Mode = request.param
    provider.claims_for[mode.approver] = dict(mode.person)
    provider.honours_max_age = mode.honours_max_age
    trust = ssl.create_default_context(cafile=str(tls[0]))
    with moto_aws():
        dynamodb, _ = aws_clients()
        create_tables(dynamodb, TABLE)
        store = ParkedApprovalBook(dynamodb, TABLE)
        approval_id = parked_for(mode, store)
        handler = ApprovalHandler(
            build=build_approval_page,
            env={**APPROVAL_ENV, "ENGRAM_ISSUER": provider.issuer, **mode.page_env},
        )
        sfn = RecordedSfn()
        handler.approvals, handler.sfn = store, sfn
        handler.memories = lambda parked: None
        handler.session_key = b"k" * 32
        handler.proof_key = PROOF_KEY
        handler.fetch = https_fetch(trust)
        handler.keys = IssuerKeys(provider.issuer, ssl_context=trust)
        yield Site(mode, handler, provider, trust, store, sfn, approval_id)
    provider.reset()


def test_the_agents_token_names_its_approver_in_the_parked_approval(site: Site) -> None:
    parked = site.store.get(site.approval_id)
    assert parked is not None
    assert (parked.principal, parked.approver) == (site.mode.agent, site.mode.approver)


@pytest.mark.parametrize(
    ("site", "shape"),
    [pytest.param(m, shape, id=f"{m.name}-{shape}") for m in MODES for shape in m.agent_signs_in],
    indirect=["site"],
)
def test_the_agents_own_credentials_cannot_approve(site: Site, shape: str) -> None:
    site.provider.claims_for[site.mode.agent] = dict(site.mode.agent_signs_in[shape])
    if shape == "stale":  # a provider that reuses the agent's old session whatever it is asked
        site.provider.signed_in_s_ago = 3600
        site.provider.honours_max_age = site.provider.honours_prompt = False

    answer, session = site.visit(site.mode.agent)

    assert (answer["statusCode"], outcome(answer)) == REFUSED[shape]
    assert (session is None) == (shape != "person_shaped")  # no session, or one that is refused
    assert 'name="csrf_token"' not in answer["body"]
    if session is not None:
        posted = site(
            event(site.approval_id, "POST", cookies=[session], form={"decision": "approve"})
        )
        assert posted["statusCode"] == 403
    parked = site.store.get(site.approval_id)
    assert site.sfn.answers == [] and parked is not None and not parked.used


def test_the_designated_person_approves(site: Site) -> None:
    site.provider.signed_in_s_ago = 3600  # signed in at the provider an hour ago

    shown, session = site.visit(site.mode.approver)

    assert shown["statusCode"] == 200 and session is not None, shown["body"]
    asked = site.provider.asked
    assert all(params["max_age"] == "300" for params in asked)
    # a provider that ignores max_age reused the old sign-in: asked again, once, prompt=login
    prompts = [params.get("prompt") for params in asked]
    assert prompts == ([None] if site.mode.honours_max_age else [None, "login"])
    token = shown["body"].split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    form = {"csrf_token": token, "decision": "approve"}
    posted = site(event(site.approval_id, "POST", cookies=[session], form=form))

    assert outcome(posted) == "approve" and site.sfn.answers == ["success"]
    parked = site.store.get(site.approval_id)
    assert parked is not None and parked.used
