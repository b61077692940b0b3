"""The gate's fixed values: where things are, the stack's names, the principal and its tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from ..cloud_template import tools

ROOT: Final = Path(__file__).resolve().parents[2]
EVENTS: Final = ROOT / "events"
WORKER: Final = ROOT / "scripts" / "lambda_worker.py"
REGION: Final = "us-east-1"
ACCOUNT: Final = "123456789012"
TENANT: Final = "dev"
STACK_NAME: Final = f"engram-memory-{TENANT}"  # AWS::StackName (the CloudFormation stack's)
API_ID: Final = "abcd1234"  # the HTTP API's id (events/mcp_adapter_*.json's requestContext.apiId)
AUDIENCE: Final = "https://memory.example.com/mcp"
APPROVAL_AUDIENCE: Final = "https://memory.example.com/approvals"
PRINCIPAL: Final = "agent-alice"
# The person the agent's token names as its approver (engram_approver): who signs in to the
# approval page. The agent itself, at the stand-in issuer, is a member of the agents' group.
APPROVER: Final = "person-dana"
AGENTS_GROUP: Final = "engram-agents"  # the template's AgentsGroup default
WORKSPACE: Final = "ws-research-0001"
TOOLS: Final = tools()  # the registry's, as published (a new tool is in the run by itself)
AUDIT_MESSAGE: Final = (
    "audit"  # engram_memory.cloud.observability.AUDIT_MESSAGE (not importable here)
)
# Errors that mean the code could not run as built (not a behaviour of the product).
BROKEN_BUILD_ERRORS: Final = frozenset(
    {
        "Runtime.ImportModuleError",
        "ImportError",
        "ModuleNotFoundError",
        "NameError",
        "AttributeError",
        "SyntaxError",
        "TypeError",
    }
)


# Each principal of the run signs with its own access key, so the services see who called them as
# AWS would (a function's role, a state machine's role, the operator's role). The harness's own
# set-up signs with another key and is not recorded.
ACCESS_KEY_PREFIX: Final = "gate-"
OPERATOR: Final = "Operator"  # the principal of `engram-memory admin --stack ...`
OPERATOR_ROLE_ARN: Final = f"arn:aws:iam::{ACCOUNT}:role/engram-operator"  # OperatorRoleArn
KEY_ADMIN: Final = "KeyAdmin"  # the principal of `admin --stack ... keys rotate`
KEY_ADMIN_ROLE_ARN: Final = f"arn:aws:iam::{ACCOUNT}:role/engram-key-admin"  # KeyAdminRoleArn
# The roles the stack's managed policies are for (the template's logical ids of the policies).
PERSON_POLICIES: Final = {OPERATOR: "OperatorPolicy", KEY_ADMIN: "KeyAdminPolicy"}
# A run that checks a refusal (a stack that does not exist) signs with this suffix: AWS may refuse
# its calls or answer them, the command's one line is the same, so the judge leaves them out.
REFUSAL_SUFFIX: Final = "~refusal"
STATES: Final = "StepFunctions"  # the state machines' Lambda tasks (the machine: the event's)


def access_key(principal: str) -> str:
    """The access key id ``principal`` (a template logical id, OPERATOR or STATES) signs with."""
    return f"{ACCESS_KEY_PREFIX}{principal}"


def principal_of_key(access_key_id: str) -> str | None:
    """The principal that signed with ``access_key_id``; None for the harness's own calls and
    for a refusal check's (``REFUSAL_SUFFIX``)."""
    if not access_key_id.startswith(ACCESS_KEY_PREFIX) or access_key_id.endswith(REFUSAL_SUFFIX):
        return None
    return access_key_id.removeprefix(ACCESS_KEY_PREFIX)


def sample(name: str) -> Any:
    """``events/<name>``, parsed (a fresh copy on every call)."""
    return json.loads((EVENTS / name).read_text("utf-8"))
