"""The MCP adapter Lambda, fed API Gateway v2 events (``events/mcp_adapter_*.json``).

The tool functions are the real ``functions/<tool>/app.py`` handlers on moto, reached through an
in-process fake Lambda client; tokens come from a test issuer whose JWKS is injected.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
from aws_testing import TABLE, FakeLambdaContext
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_tool_handlers import Cloud, capture_event, cloud, event, warm_apps

from engram_memory.adapters.clock import SystemClock
from engram_memory.binding.tokens import TokenIssuer
from engram_memory.cloud.composition import build_adapter
from engram_memory.cloud.mcp_adapter import LambdaAdapter, execute_api_host
from engram_memory.engine.context import TOOLS
from engram_memory.operator_plane.usecases import revoke_credentials

__all__ = ["cloud"]  # the fixture, re-used

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
ISSUER = "https://issuer.example.com"
RESOURCE = "https://memory.example.com/mcp"
TENANT = "dev"


@dataclass
class FakeLambdaClient:
    """``lambda.invoke`` dispatching to the tool functions' handlers in process."""

    apps: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)
    override: Callable[[str, dict[str, Any]], dict[str, Any] | None] | None = None

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, Any]:
        assert InvocationType == "RequestResponse"
        payload = json.loads(Payload)
        self.calls.append({"function": FunctionName, "payload": payload})
        if self.override is not None:
            answer = self.override(FunctionName, payload)
            if answer is not None:
                return answer
        tool = FunctionName.removeprefix("engram-dev-").replace("-", "_")
        result = self.apps[tool].handler(payload, FakeLambdaContext(function_name=FunctionName))
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(result).encode())}


@dataclass
class Adapter:
    handler: LambdaAdapter
    lam: FakeLambdaClient
    issuer: TokenIssuer
    builds: list[int]

    def token(self, tools: tuple[str, ...] = TOOLS, **claims: Any) -> str:
        return self.issuer.mint(
            principal="agent-alice",
            tenant_id=TENANT,
            workspace_id="ws-research-0001",
            purpose_ref="purpose:general",
            tools=tools,
            expires_in_s=600,
            **claims,
        )

    def send(self, name: str, *, token: str | None = None, body: Any = None) -> dict[str, Any]:
        event: dict[str, Any] = json.loads((EVENTS / f"mcp_adapter_{name}.json").read_text())
        if token is not None:
            event["headers"]["authorization"] = f"Bearer {token}"
        if body is not None:
            event["body"] = json.dumps(body)
        response: dict[str, Any] = self.handler(event, FakeLambdaContext())
        json.dumps(response)
        return response

    def rpc(self, method: str, params: dict[str, Any], *, token: str | None = None) -> Any:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        response = self.send("tools_list", token=token or self.token(), body=body)
        assert response["statusCode"] == 200, response
        return json.loads(response["body"])

    def call(self, tool: str, arguments: dict[str, Any], **kw: Any) -> Any:
        return self.rpc(
            "tools/call", {"name": f"engram_memory_{tool}", "arguments": arguments}, **kw
        )


@pytest.fixture
def adapter(cloud: Cloud) -> Adapter:
    return adapter_over(cloud, warm_apps(cloud))


def adapter_over(
    cloud: Cloud, apps: dict[str, Any], clock: Any = None, **variables: str
) -> Adapter:
    """The MCP adapter Lambda in front of the tool functions ``apps`` (invoked in process)."""
    lam = FakeLambdaClient(apps)
    key = Ed25519PrivateKey.generate()
    issuer = TokenIssuer(key, issuer=ISSUER, audience=RESOURCE, kid="k1")
    secret_arn = cloud.clients["secretsmanager"].create_secret(
        Name="engram-dev-request-state", SecretString="r" * 64
    )["ARN"]
    functions = {t: f"engram-dev-{t.replace('_', '-')}" for t in TOOLS}
    env = {
        "AWS_REGION": "us-east-1",
        "ENGRAM_TOOL_FUNCTIONS": json.dumps(functions),
        "ENGRAM_RESOURCE_URI": RESOURCE,
        "ENGRAM_ISSUER": ISSUER,
        "ENGRAM_ALLOWED_ORIGINS": "https://app.example.com",
        "ENGRAM_REQUEST_STATE_SECRET_ARN": secret_arn,
        "ENGRAM_TENANT_ID": TENANT,
        "ENGRAM_TABLE": TABLE,
        "ENGRAM_INVOCATION_KEY_ARN": cloud.env["ENGRAM_INVOCATION_KEY_ARN"],
        **variables,
    }
    builds: list[int] = []

    def build(environment: Any) -> Any:
        builds.append(1)
        return build_adapter(
            environment,
            session=cloud.session,
            lambda_client=lam,
            secrets_client=cloud.clients["secretsmanager"],
            jwks_fetcher=lambda url: issuer.public_jwks(),
            clock=clock or cloud.clock,
        )

    return Adapter(LambdaAdapter(env=env, build=build), lam, issuer, builds)


def test_the_metadata_route_needs_no_token(adapter: Adapter) -> None:
    response = adapter.send("metadata")
    assert response["statusCode"] == 200, response
    metadata = json.loads(response["body"])
    assert metadata["resource"] == RESOURCE
    assert metadata["authorization_servers"] == [ISSUER + "/"] or metadata[
        "authorization_servers"
    ] == [ISSUER]


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_a_missing_or_invalid_token_is_a_401_pointing_at_the_metadata(
    adapter: Adapter, token: str | None
) -> None:
    response = adapter.send("no_token", token=token)
    assert response["statusCode"] == 401, response
    challenge = response["headers"]["www-authenticate"]
    assert challenge.startswith("Bearer") and "resource_metadata=" in challenge
    assert adapter.lam.calls == []


def test_initialize_answers_in_json(adapter: Adapter) -> None:
    response = adapter.send("initialize", token=adapter.token())
    assert response["statusCode"] == 200, response
    assert response["headers"]["content-type"].startswith("application/json")
    result = json.loads(response["body"])["result"]
    assert result["serverInfo"]["name"]
    assert "mcp-session-id" not in response["headers"]  # stateless


def test_tools_list_shows_only_granted_tools(adapter: Adapter) -> None:
    response = adapter.send("tools_list", token=adapter.token(tools=("search", "get")))
    assert response["statusCode"] == 200, response
    names = {tool["name"] for tool in json.loads(response["body"])["result"]["tools"]}
    assert names == {"engram_memory_search", "engram_memory_get"}


def test_a_capture_is_admitted_and_found_through_the_adapter(adapter: Adapter) -> None:
    text = "The adapter reaches the capture function through Lambda invoke."
    captured = adapter.call("capture", capture_event(text, "adapter-key-000001")["arguments"])[
        "result"
    ]
    assert captured["isError"] is False, captured
    value = captured["structuredContent"]["output"]["value"]
    assert json.loads(captured["content"][0]["text"]) == captured["structuredContent"]
    admitted = adapter.call(
        "request_admission",
        event(
            "request_admission",
            candidate_id=value["candidate_id"],
            idempotency_key="admit-adapter-key-000001",
        )["arguments"],
    )["result"]
    assert admitted["structuredContent"]["ok"] is True, admitted
    outcome = admitted["structuredContent"]["output"]["value"]["outcome"]
    assert outcome["status"] == "accepted", outcome
    found = adapter.call(
        "search", event("search", query="capture function Lambda invoke")["arguments"]
    )["result"]
    assert found["structuredContent"]["ok"] is True, found
    assert outcome["record_id"] in json.dumps(found["structuredContent"])
    sent = adapter.lam.calls[0]
    assert sent["function"] == "engram-dev-capture"
    assert sent["payload"]["context"]["tenant_id"] == TENANT
    assert sent["payload"]["audit_id"] == captured["structuredContent"]["auditId"]
    assert adapter.builds == [1]  # one cold start for every invocation


def test_an_ungranted_tool_is_minus_32602_without_an_invocation(adapter: Adapter) -> None:
    answer = adapter.call("capture", {"x": 1}, token=adapter.token(tools=("search",)))
    assert answer["error"]["code"] == -32602, answer
    assert adapter.lam.calls == []


@pytest.mark.parametrize("code", [-32602, -32603])
def test_a_protocol_error_of_the_function_is_the_same_jsonrpc_error(
    adapter: Adapter, code: int
) -> None:
    def refuse(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = {"protocol_error": {"code": code, "message": "whatever"}}
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(body).encode())}

    adapter.lam.override = refuse
    answer = adapter.call("search", {"query": "q", "purpose_ref": "purpose:general"})
    assert answer["error"]["code"] == code, answer
    assert "whatever" not in json.dumps(answer)


@pytest.mark.parametrize("failure", ["function_error", "transport"])
def test_a_function_error_is_minus_32603_and_leaks_nothing(adapter: Adapter, failure: str) -> None:
    leak = "Traceback: secret-table-name exploded"

    def broken(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        if failure == "transport":
            raise ConnectionError(leak)
        body = {"errorMessage": leak, "errorType": "RuntimeError"}
        return {
            "StatusCode": 200,
            "FunctionError": "Unhandled",
            "Payload": io.BytesIO(json.dumps(body).encode()),
        }

    adapter.lam.override = broken
    answer = adapter.call("search", {"query": "q", "purpose_ref": "purpose:general"})
    assert answer["error"]["code"] == -32603, answer
    assert "secret" not in json.dumps(answer) and "Traceback" not in json.dumps(answer)


def test_nothing_is_kept_between_invocations(adapter: Adapter) -> None:
    first = adapter.send("initialize", token=adapter.token())
    assert first["statusCode"] == 200
    # a request carrying a session id from nowhere is served like any other (stateless)
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_list.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token(tools=('get',))}"
    event["headers"]["mcp-session-id"] = "made-up"
    second = adapter.handler(copy.deepcopy(event), FakeLambdaContext())
    assert second["statusCode"] == 200, second
    names = [t["name"] for t in json.loads(second["body"])["result"]["tools"]]
    assert names == ["engram_memory_get"]
    assert adapter.builds == [1]
    assert adapter.handler.bridge is not None and adapter.handler.surface is not None


def test_a_foreign_origin_is_refused(adapter: Adapter) -> None:
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_list.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    event["headers"]["origin"] = "https://evil.example.net"
    response = adapter.handler(event, FakeLambdaContext())
    assert response["statusCode"] == 403, response


def test_a_2026_07_28_call_is_served_statelessly(adapter: Adapter) -> None:
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_call.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    event["headers"]["mcp-protocol-version"] = "2026-07-28"
    event["headers"]["mcp-method"] = "tools/call"
    event["headers"]["mcp-name"] = "engram_memory_search"
    body = json.loads(event["body"])
    body["params"]["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    event["body"] = json.dumps(body)
    response = adapter.handler(event, FakeLambdaContext())
    assert response["statusCode"] == 200, response
    result = json.loads(response["body"])["result"]
    assert result["structuredContent"]["ok"] is True, result


def modern_call(
    adapter: Adapter,
    tool: str,
    arguments: dict[str, Any],
    *,
    elicitation: dict[str, Any] | None = None,
    **extra: Any,
) -> Any:
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_call.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    event["headers"]["mcp-protocol-version"] = "2026-07-28"
    event["headers"]["mcp-method"] = "tools/call"
    event["headers"]["mcp-name"] = f"engram_memory_{tool}"
    params: dict[str, Any] = {
        "name": f"engram_memory_{tool}",
        "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {
                "elicitation": elicitation if elicitation is not None else {"form": {}}
            },
        },
        **extra,
    }
    event["body"] = json.dumps(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
    )
    response = adapter.handler(event, FakeLambdaContext())
    assert response["statusCode"] == 200, response
    return json.loads(response["body"])["result"]


def remembered_then_forget(adapter: Adapter, text: str, key: str) -> tuple[str, dict[str, Any]]:
    """Capture and admit ``text`` through the adapter; its record id and forget arguments."""
    captured = adapter.call("capture", capture_event(text, f"capture-{key}-0000000")["arguments"])
    candidate_id = captured["result"]["structuredContent"]["output"]["value"]["candidate_id"]
    admitted = adapter.call(
        "request_admission",
        event(
            "request_admission", candidate_id=candidate_id, idempotency_key=f"admit-{key}-00000000"
        )["arguments"],
    )["result"]["structuredContent"]["output"]["value"]["outcome"]
    forget = {
        "record_id": admitted["record_id"],
        "idempotency_key": f"forget-{key}-0000000",
        "reason_ref": "reason:obsolete",
    }
    return admitted["record_id"], forget


def test_a_forget_is_confirmed_through_the_adapter_and_the_approval_reaches_the_function(
    adapter: Adapter,
) -> None:
    _, forget = remembered_then_forget(
        adapter, "The adapter carries the human's approval to the forget function.", "adapter-09"
    )

    asked = modern_call(adapter, "forget", forget)
    assert "requestState" in asked and "engram_confirmation" in asked["inputRequests"], asked
    approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
    done = modern_call(
        adapter, "forget", forget, inputResponses=approve, requestState=asked["requestState"]
    )
    assert done["structuredContent"]["ok"] is True, done
    assert done["structuredContent"]["output"]["value"]["receipt"]["to_state"] == "tombstoned"
    carried = [c["payload"].get("approval") for c in adapter.lam.calls if "forget" in c["function"]]
    assert carried[0] is None and carried[-1]["approval_id"].startswith("rs_")

    replay = modern_call(
        adapter,
        "forget",
        {**forget, "idempotency_key": "forget-adapter-0010"},
        inputResponses=approve,
        requestState=asked["requestState"],
    )
    # The record is tombstoned: the state check comes before any confirmation (CONTRACT §12), and
    # the request state is claimed only by an operation it binds, so it never authorizes this one.
    assert replay["structuredContent"]["error"]["code"] == "ALREADY_TERMINAL"


def test_a_host_that_requires_the_page_never_asks_the_clients_form(cloud: Cloud) -> None:
    """``RequireApprovalPage``: a client that offers only a form is not asked (-32603, the
    approval not taken from it); nothing is forgotten."""
    adapter = adapter_over(cloud, warm_apps(cloud), ENGRAM_APPROVAL_PAGE_REQUIRED="true")
    record_id, forget = remembered_then_forget(
        adapter, "Only the page may approve forgetting this.", "adapter-page"
    )
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_call.json").read_text())
    event["headers"].update(
        {
            "authorization": f"Bearer {adapter.token()}",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "engram_memory_forget",
        }
    )
    capabilities: dict[str, Any] = {"elicitation": {"form": {}}}
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    params = {"name": "engram_memory_forget", "arguments": forget, "_meta": meta}
    event["body"] = json.dumps(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
    )
    answered = json.loads(adapter.handler(event, FakeLambdaContext())["body"])
    assert answered["error"]["code"] == -32603, answered
    assert answered["error"]["message"] == "Trusted invocation context unavailable"
    assert answered["error"]["data"]["reason"] == "no_elicitation"
    got = adapter.call("get", {"record_id": record_id, "purpose_ref": "purpose:general"})
    assert got["result"]["structuredContent"]["ok"] is True


def test_a_declined_forget_is_gate_failed_and_the_record_stays(adapter: Adapter) -> None:
    record_id, forget = remembered_then_forget(
        adapter, "A declined confirmation leaves this record in place.", "adapter-11"
    )
    asked = modern_call(adapter, "forget", forget)
    declined = modern_call(
        adapter,
        "forget",
        forget,
        inputResponses={"engram_confirmation": {"action": "decline"}},
        requestState=asked["requestState"],
    )
    assert declined["structuredContent"]["error"]["code"] == "gate_failed"
    (handed,) = [c["payload"] for c in adapter.lam.calls if c["payload"].get("declined")]
    assert handed["approval"]["approval_id"].startswith("rs_")  # the function spends its id

    # the same state, replayed with an approval: spent by the decline (CONTRACT.md §8)
    approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
    replayed = modern_call(
        adapter, "forget", forget, inputResponses=approve, requestState=asked["requestState"]
    )
    assert replayed["structuredContent"]["error"]["code"] == "gate_failed"
    got = adapter.call("get", {"record_id": record_id, "purpose_ref": "purpose:general"})
    assert got["result"]["structuredContent"]["ok"] is True


@pytest.mark.parametrize(
    "body",
    [
        [],
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}],
        "tools/list",
        {"jsonrpc": "2.0", "id": 1},
    ],
    ids=["empty-batch", "batch", "string", "no-method"],
)
def test_a_body_that_is_not_one_json_rpc_object_is_a_constant_invalid_request(
    adapter: Adapter, body: Any
) -> None:
    response = adapter.send("initialize", token=adapter.token(), body=body)
    assert response["statusCode"] == 400, response
    answer = json.loads(response["body"])
    assert answer == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Invalid Request"},
    }
    assert "pydantic" not in response["body"] and "tools/list" not in response["body"]
    assert adapter.lam.calls == []


def test_the_host_header_is_matched_exactly(adapter: Adapter) -> None:
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_list.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    host = event["headers"].get("host") or event["requestContext"]["domainName"]
    event["headers"]["host"] = host + ".evil.example"
    assert adapter.handler(event, FakeLambdaContext())["statusCode"] == 421


# --------------------------------------------------------------------------------------------
# Hosts: the resource URI's, and the API's default endpoint as API Gateway names it
# --------------------------------------------------------------------------------------------

API_HOST = "abcd1234.execute-api.us-east-1.amazonaws.com"  # the sample events' apiId


def _initialize_through(adapter: Adapter, host: str, domain_name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_initialize.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    event["headers"]["host"] = host
    event["requestContext"]["domainName"] = domain_name
    response: dict[str, Any] = adapter.handler(event, FakeLambdaContext())
    return response


def test_the_api_default_endpoint_is_accepted_from_the_request_context(adapter: Adapter) -> None:
    assert _initialize_through(adapter, API_HOST, API_HOST)["statusCode"] == 200
    # and the resource URI's host still is
    assert (
        _initialize_through(adapter, "memory.example.com", "memory.example.com")["statusCode"]
        == 200
    )


@pytest.mark.parametrize(
    ("host", "domain_name"),
    [
        ("evil.example.net", "evil.example.net"),  # a custom domain nobody configured
        ("zzzz9999.execute-api.us-east-1.amazonaws.com",) * 2,  # another API's endpoint
        ("abcd1234.execute-api.eu-west-1.amazonaws.com",) * 2,  # another region's
        (API_HOST, "memory.example.com"),  # a Host the request context does not vouch for
    ],
)
def test_any_other_host_is_refused(adapter: Adapter, host: str, domain_name: str) -> None:
    assert _initialize_through(adapter, host, domain_name)["statusCode"] == 421


@pytest.mark.parametrize(
    ("context", "region", "expected"),
    [
        ({"apiId": "abcd1234", "domainName": API_HOST}, "us-east-1", API_HOST),
        (
            {"apiId": "abcd1234", "domainName": "abcd1234.execute-api.cn-north-1.amazonaws.com.cn"},
            "cn-north-1",
            "abcd1234.execute-api.cn-north-1.amazonaws.com.cn",
        ),
        ({"apiId": "abcd1234", "domainName": API_HOST}, "eu-west-1", None),
        ({"apiId": "abcd1234", "domainName": "memory.example.com"}, "us-east-1", None),
        ({"apiId": "abcd1234", "domainName": API_HOST + ".evil.net"}, "us-east-1", None),
        (
            {"apiId": "ab.cd", "domainName": "ab.cd.execute-api.us-east-1.amazonaws.com"},
            "us-east-1",
            None,
        ),
        ({"domainName": API_HOST}, "us-east-1", None),
        ({"apiId": "abcd1234", "domainName": API_HOST}, "", None),
    ],
)
def test_execute_api_host_is_only_this_api_in_this_region(
    context: dict[str, Any], region: str, expected: str | None
) -> None:
    assert execute_api_host({"requestContext": context}, region) == expected


def test_a_function_that_does_not_answer_in_time_is_deadline_exceeded(adapter: Adapter) -> None:
    from botocore.exceptions import ReadTimeoutError

    def slow(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise ReadTimeoutError(endpoint_url="https://lambda.us-east-1.amazonaws.com")

    adapter.lam.override = slow
    answer = adapter.call("search", {"query": "q", "purpose_ref": "purpose:general"})

    error = answer["result"]["structuredContent"]["error"]
    assert (error["code"], error["retriable"]) == ("DEADLINE_EXCEEDED", True)


@pytest.mark.parametrize(
    ("code", "answered"),
    [("TooManyRequestsException", "RATE_LIMITED"), ("ResourceNotFoundException", None)],
)
def test_a_throttled_tool_function_is_rate_limited_and_retriable(
    adapter: Adapter, code: str, answered: str | None
) -> None:
    """The tool functions reserve concurrency (the tenant's budget): when it is taken, Lambda
    throttles the invoke; the agent gets the contract's retriable RATE_LIMITED, not -32603.
    Any other invoke failure stays an internal error."""
    from botocore.exceptions import ClientError

    def throttled(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        error = {"Error": {"Code": code, "Message": "Rate Exceeded."}}
        raise ClientError(error, "Invoke")  # type: ignore[arg-type]

    adapter.lam.override = throttled
    answer = adapter.call("search", {"query": "q", "purpose_ref": "purpose:general"})
    if answered is None:
        assert answer["error"]["code"] == -32603
        return
    error = answer["result"]["structuredContent"]["error"]
    assert (error["code"], error["retriable"]) == (answered, True)


def test_the_adapter_passes_its_deadline_and_a_spent_one_invokes_nothing(
    adapter: Adapter,
) -> None:
    search = {"query": "q", "purpose_ref": "purpose:general"}
    adapter.call("search", search)
    (sent,) = adapter.lam.calls
    deadline = sent["payload"]["context"]["deadline_ms"]
    # API Gateway's 30 s integration limit bounds it, less the adapter's own margin
    surface = adapter.handler.surface
    assert surface is not None
    assert 0 < deadline - surface.runtime.clock.now_ms() <= 30_000

    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    body["params"] = {"name": "engram_memory_search", "arguments": search}
    event: dict[str, Any] = json.loads((EVENTS / "mcp_adapter_tools_list.json").read_text())
    event["headers"]["authorization"] = f"Bearer {adapter.token()}"
    event["body"] = json.dumps(body)
    response = adapter.handler(event, FakeLambdaContext(remaining_ms=1_000))  # inside the margin

    error = json.loads(response["body"])["result"]["structuredContent"]["error"]
    assert error["code"] == "DEADLINE_EXCEEDED"
    assert len(adapter.lam.calls) == 1  # the spent call never reached a function


def test_a_revoked_token_answers_authorization_revoked_through_the_adapter(
    adapter: Adapter, cloud: Cloud
) -> None:
    """``admin tokens revoke`` in the cloud: the operator's revocation item in DynamoDB, read by
    the tool function's engine for the token the adapter verified (its jti and iat travel in
    the invocation's context: no credential does)."""
    search = event("search", query="anything at all")["arguments"]
    kept, revoked = adapter.token(), adapter.token()
    jti = jwt.decode(revoked, options={"verify_signature": False})["jti"]
    revoke_credentials(cloud.engine(), TENANT, "arn:aws:iam::123456789012:role/ops", token_id=jti)
    answer = adapter.call("search", search, token=revoked)["result"]["structuredContent"]
    assert answer["ok"] is False and answer["error"]["code"] == "AUTHORIZATION_REVOKED"
    sent = adapter.lam.calls[-1]["payload"]["context"]
    assert sent["credential_id"] == jti and revoked not in json.dumps(adapter.lam.calls)
    assert adapter.call("search", search, token=kept)["result"]["structuredContent"]["ok"]

    unused = adapter.token()
    operator = cloud.engine(clock=SystemClock())  # the tokens' iat is the real time
    revoke_credentials(operator, TENANT, "ops", principal="agent-alice")
    answer = adapter.call("search", search, token=unused)["result"]["structuredContent"]
    assert answer["error"]["code"] == "AUTHORIZATION_REVOKED"  # issued before: revoked too
