"""``engram-memory admin --stack NAME smoke``: the six tools through the deployed API, as an agent
calls them, with a person approving withdraw and forget on the stack's approval page.

The stack's ``McpUrl`` output is the endpoint (``--endpoint URL`` replaces it: another route to
the same API), reached with the official ``mcp`` client over streamable HTTP, protocol
2025-11-25, with the agent bearer token the operator provides. Each step is printed with its
outcome and how long it took:

1. ``connect``: initialize and ``tools/list``; the token must grant all six tools, and the
   purpose the tools' schemas fix (``const``) is the one the memories are captured under;
2. ``capture`` a memory labelled with the run's id, then ``request_admission``: accepted (a stack
   in ``AdmissionMode=manual`` holds it for adjudication, which fails the smoke saying so);
3. ``search`` for the label finds the record (retried while the projection catches up), ``get``
   reads it;
4. ``capture`` a second labelled memory and ``withdraw`` it, then ``forget`` the record: each
   answers ``-32042`` with the approval page's link, printed for the person (the approver the
   token names — else its principal, a person — signed in at the stack's identity provider) to
   approve; the command retries the same call with the same idempotency key every few seconds
   until it commits, at most for the 300 s a question lives;
5. ``drained``: search no longer finds the record and get answers ``NOT_FOUND``;
6. the functions' ``REPORT`` lines since the smoke started (init duration, duration, billed
   duration, memory), read from CloudWatch Logs: the stack's ``AWS::Logs::LogGroup`` resources
   under ``/aws/lambda/`` (the template gives every function its own).

What it needs from the operator's credentials: ``cloudformation:DescribeStacks`` and
``ListStackResources``, ``logs:FilterLogEvents`` on the functions' log groups; the agent's calls
are the token's. The token is sent in the ``Authorization`` header only: never printed, logged
or written anywhere.

What it leaves behind: nothing that matters. Both memories are labelled with the run's id and
end within the run — the record forgotten (tombstoned, its key destroyed, no projection left),
the second candidate withdrawn (its key destroyed); their journal events and receipts stay, as
for every forget. A failed step is one line naming the step and, when a memory was left, the
``admin`` command that ends it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from engram_memory.adapters.aws.calls import error_code
from engram_memory.cloud.operator_session import StackError

if TYPE_CHECKING:
    from boto3.session import Session

__all__ = [
    "ApprovalLink",
    "Report",
    "SmokeFailed",
    "SmokeRun",
    "SmokeTarget",
    "capture_arguments",
    "parse_report",
    "read_reports",
    "run_smoke",
    "smoke_target",
]

PROTOCOL: Final = "2025-11-25"  # a gated call answers -32042 with the page's link
TOOLS: Final = ("search", "get", "capture", "request_admission", "withdraw", "forget")
APPROVAL_WINDOW_S: Final = 300.0  # a question lives 300 s (docs/contract.md §8)
POLL_S: Final = 2.0
PROJECTION_WAIT_S: Final = 30.0  # an admitted record is searchable once its index refreshes
DRAIN_WAIT_S: Final = 120.0  # the forget's projection drop; the drainer's schedule is 1 minute
REPORT_SETTLE_S: Final = 30.0  # CloudWatch Logs shows a function's lines within seconds
FUNCTION_LOGS: Final = "/aws/lambda/"
_RETRIABLE_WAITS: Final = frozenset({"DEADLINE_EXCEEDED", "MUTATION_OUTCOME_UNKNOWN"})


class SmokeFailed(Exception):
    """A step failed; the message is the one line the command prints."""


@dataclass(frozen=True, slots=True)
class ApprovalLink:
    """A gated call's answer before a person approved: the approval page to open."""

    url: str


E = TypeVar("E", bound=BaseException)

# A tool's answer: its result envelope, or the approval page it waits on.
Answer = dict[str, Any] | ApprovalLink


class Agent(Protocol):
    """An MCP client with the agent's token (``McpAgent``; tests use a scripted one)."""

    async def tools(self) -> dict[str, dict[str, Any]]:
        """The granted tools' input schemas by tool name."""
        ...

    async def call(self, tool: str, arguments: dict[str, Any]) -> Answer: ...


@dataclass(frozen=True, slots=True)
class SmokeTarget:
    """Where the smoke goes: the MCP endpoint, and the functions' log groups."""

    stack_name: str
    region: str
    endpoint: str
    log_groups: tuple[str, ...]


def smoke_target(clients: Any, stack_name: str, endpoint: str | None) -> SmokeTarget:
    """The stack's ``McpUrl`` output (unless ``endpoint`` is given) and its function log groups
    (``describe_stacks``, ``list_stack_resources``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    cloudformation = clients.client("cloudformation")
    region = str(clients.session().region_name)
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        pages = cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack_name)
        resources = [s for page in pages for s in page.get("StackResourceSummaries", [])]
    except ClientError as exc:
        code = error_code(exc) or "error"
        raise StackError(f"stack {stack_name!r} not found in {region} ({code})") from None
    except BotoCoreError as exc:
        raise StackError(f"CloudFormation is unreachable: {type(exc).__name__}") from None
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stacks[0].get("Outputs", [])}
    url = endpoint or outputs.get("McpUrl", "")
    if not url:
        raise StackError(
            f"stack {stack_name!r} has no McpUrl output: not an Engram Memory stack, or pass"
            " --endpoint URL"
        )
    groups = sorted(
        str(r["PhysicalResourceId"])
        for r in resources
        if r.get("ResourceType") == "AWS::Logs::LogGroup"
        and str(r.get("PhysicalResourceId", "")).startswith(FUNCTION_LOGS)
    )
    return SmokeTarget(stack_name, region, url, tuple(groups))


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(text: str, key: str, purpose: str, now_ms: int) -> dict[str, Any]:
    """A capture of ``text`` citing the smoke command, valid from a minute ago (the functions'
    clock may lag the operator's)."""
    at = now_ms - 60_000
    citation = "citation:smoke"
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": purpose,
            "valid_time": {"t": at},
            "components": [
                {
                    "component_id": "component:smoke",
                    "kind": "context",
                    "text": text,
                    "citation_ids": [citation],
                }
            ],
            "primary_component_id": "component:smoke",
            "primary_event": {"at": at, "type_ref": "event:smoke-test", "citation_id": citation},
            "citations": [
                {
                    "citation_id": citation,
                    "source_ref": "source:engram-memory-smoke",
                    "locator": {"scheme": "command", "value": "engram-memory admin smoke"},
                    "content_digest": _sha(text),
                }
            ],
        },
        "evidence": {
            "evidence_ref": "evidence:smoke-test",
            "evidence_digest": _sha("evidence:" + text),
            "citation_ids": [citation],
        },
    }


@dataclass
class Step:
    step: str
    ok: bool
    outcome: str
    seconds: float


def _code(answer: Answer) -> str:
    if isinstance(answer, ApprovalLink):
        return "an approval link"
    return str((answer.get("error") or {}).get("code") or "")


def _value(tool: str, answer: Answer) -> dict[str, Any]:
    """The envelope's value; SmokeFailed with its error code when it is not ok."""
    if isinstance(answer, ApprovalLink) or answer.get("ok") is not True:
        raise SmokeFailed(f"{tool} answered {_code(answer) or 'no envelope'}")
    value: dict[str, Any] = answer["output"]["value"]
    return value


@dataclass
class SmokeRun:
    """The steps against one ``Agent`` (module doc); ``say`` prints a line for the operator."""

    agent: Agent
    say: Callable[[str], None]
    run_id: str
    now_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] | None = None
    steps: list[Step] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)  # what is not ended yet: id -> kind
    purpose: str = ""

    async def run(self) -> list[Step]:
        """Every step in order; SmokeFailed (with what was left behind) on the first failure."""
        await self._step("connect", self._connect)
        record_id = await self._step("capture", self._capture_first)
        record_id = await self._step("request_admission", lambda: self._admit(record_id))
        await self._step("search", lambda: self._found(record_id))
        await self._step("get", lambda: self._read(record_id))
        candidate_id = await self._step("capture", self._capture_second)
        await self._step("withdraw", lambda: self._withdraw(candidate_id))
        await self._step("forget", lambda: self._forget(record_id))
        await self._step("drained", lambda: self._drained(record_id))
        return self.steps

    async def _step(self, name: str, run: Callable[[], Awaitable[tuple[str, str]]]) -> str:
        """Run one step, print its line; its result (an id) for the next."""
        started = self.clock()
        try:
            result, outcome = await run()
        except SmokeFailed as failure:
            seconds = self.clock() - started
            self.steps.append(Step(name, False, str(failure), seconds))
            self.say(f"[FAIL] {name:<18} {seconds:6.2f} s  {failure}")
            raise SmokeFailed(f"{name}: {failure}") from None
        seconds = self.clock() - started
        self.steps.append(Step(name, True, outcome, seconds))
        self.say(f"[ok]   {name:<18} {seconds:6.2f} s  {outcome}")
        return result

    async def _pause(self) -> None:
        if self.sleep is not None:
            await self.sleep(POLL_S)
            return
        import anyio

        await anyio.sleep(POLL_S)

    async def _connect(self) -> tuple[str, str]:
        tools = await self.agent.tools()
        missing = [t for t in TOOLS if f"engram_memory_{t}" not in tools]
        if missing:
            raise SmokeFailed(
                f"the token does not grant {', '.join(missing)}: the smoke uses all six"
            )
        schema = tools["engram_memory_search"].get("properties", {}).get("purpose_ref", {})
        self.purpose = str(schema.get("const") or "")
        if not self.purpose:
            raise SmokeFailed("tools/list fixes no purpose_ref: not an Engram Memory endpoint?")
        return "", f"protocol {PROTOCOL}, the six tools, purpose {self.purpose}"

    def _text(self, what: str) -> str:
        # a nonce of its own: two runs' memories are never near-duplicates of each other
        nonce = secrets.token_hex(12)
        return (
            f"engram-memory smoke run {self.run_id} ({nonce}): {what} The operator's smoke"
            " command captured it and ends it within minutes."
        )

    async def _capture(self, text: str, key: str) -> str:
        arguments = capture_arguments(text, key, self.purpose, self.now_ms())
        value = _value("capture", await self.agent.call("capture", arguments))
        candidate_id = str(value["candidate_id"])
        self.left[candidate_id] = "candidate"
        return candidate_id

    async def _capture_first(self) -> tuple[str, str]:
        text = self._text("a labelled test memory, admitted, found, read and forgotten.")
        candidate_id = await self._capture(text, f"smoke-{self.run_id}-capture-1")
        return candidate_id, f"committed_pending {candidate_id}"

    async def _capture_second(self) -> tuple[str, str]:
        text = self._text("a second labelled test capture, withdrawn before admission.")
        candidate_id = await self._capture(text, f"smoke-{self.run_id}-capture-2")
        return candidate_id, f"committed_pending {candidate_id} (to withdraw)"

    async def _admit(self, candidate_id: str) -> tuple[str, str]:
        arguments = {"candidate_id": candidate_id, "idempotency_key": f"smoke-{self.run_id}-admit"}
        outcome = _value("request_admission", await self.agent.call("request_admission", arguments))
        status = outcome["outcome"]["status"]
        if status != "accepted":
            raise SmokeFailed(
                f"answered {status}"
                + (
                    " (the stack's AdmissionMode is manual, or a near-duplicate was held)"
                    if status == "pending_adjudication"
                    else ""
                )
            )
        record_id = str(outcome["outcome"]["record_id"])
        del self.left[candidate_id]
        self.left[record_id] = "record"
        return record_id, f"accepted, record {record_id}"

    async def _search(self) -> list[str]:
        arguments = {"query": f"smoke run {self.run_id}", "purpose_ref": self.purpose}
        value = _value("search", await self.agent.call("search", arguments))
        return [str(p["record"]["record_id"]) for p in value.get("records") or []]

    async def _found(self, record_id: str) -> tuple[str, str]:
        deadline = self.clock() + PROJECTION_WAIT_S
        while record_id not in (hits := await self._search()):
            if self.clock() > deadline:
                raise SmokeFailed(f"search did not find {record_id} in {PROJECTION_WAIT_S:.0f} s")
            await self._pause()
        return "", f"found {record_id} (rank {hits.index(record_id) + 1} of {len(hits)})"

    async def _read(self, record_id: str) -> tuple[str, str]:
        arguments = {"record_id": record_id, "purpose_ref": self.purpose}
        value = _value("get", await self.agent.call("get", arguments))
        return "", f"read {value['record']['record_id']}"

    async def _approved(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tool`` until it commits: the approval link printed once (again if it changes), the
        same call retried every ``POLL_S`` while nobody has answered or the commit is running."""
        deadline = self.clock() + APPROVAL_WINDOW_S
        shown = ""
        while True:
            answer = await self.agent.call(tool, arguments)
            if isinstance(answer, ApprovalLink):
                if answer.url != shown:
                    self.say(
                        f"[wait] {tool:<18} a person must approve: open {answer.url} and sign in"
                        f" as the token's approver (waiting up to {APPROVAL_WINDOW_S:.0f} s)"
                    )
                    shown = answer.url
            elif answer.get("ok") is True or _code(answer) not in _RETRIABLE_WAITS:
                return _value(tool, answer)
            if self.clock() > deadline:
                raise SmokeFailed(f"nobody approved within {APPROVAL_WINDOW_S:.0f} s ({shown})")
            await self._pause()

    def _ending(self, tool: str, target: str, target_id: str) -> dict[str, Any]:
        return {
            target: target_id,
            "idempotency_key": f"smoke-{self.run_id}-{tool}",
            "reason_ref": "reason:engram-memory-smoke",
        }

    async def _withdraw(self, candidate_id: str) -> tuple[str, str]:
        arguments = self._ending("withdraw", "candidate_id", candidate_id)
        value = await self._approved("withdraw", arguments)
        state = value["receipt"]["to_state"]
        self.left.pop(candidate_id, None)
        return "", f"{state} after approval, key destruction {value.get('key_destruction')}"

    async def _forget(self, record_id: str) -> tuple[str, str]:
        value = await self._approved("forget", self._ending("forget", "record_id", record_id))
        state = value["receipt"]["to_state"]
        self.left.pop(record_id, None)
        progress = value.get("projection_invalidation")
        return "", f"{state} after approval, projection invalidation {progress}"

    async def _drained(self, record_id: str) -> tuple[str, str]:
        deadline = self.clock() + DRAIN_WAIT_S
        while True:
            found = record_id in await self._search()
            got = await self.agent.call(
                "get", {"record_id": record_id, "purpose_ref": self.purpose}
            )
            if not found and _code(got) == "NOT_FOUND":
                return "", f"search no longer finds {record_id}, get answers NOT_FOUND"
            if self.clock() > deadline:
                still = "search still finds it" if found else f"get answers {_code(got) or 'ok'}"
                raise SmokeFailed(f"{still} after {DRAIN_WAIT_S:.0f} s")
            await self._pause()


# -- the functions' REPORT lines -----------------------------------------------------------------

_REPORT_FIELD: Final = re.compile(
    r"(Duration|Billed Duration|Memory Size|Max Memory Used|Init Duration): ([0-9.]+) (?:ms|MB)"
)


@dataclass(frozen=True, slots=True)
class Report:
    """One invocation's ``REPORT`` line, as Lambda writes it to the function's log group."""

    function: str
    at_ms: int
    request_id: str
    duration_ms: float
    billed_ms: float
    memory_mb: int
    max_memory_mb: int
    init_ms: float | None


def parse_report(function: str, at_ms: int, message: str) -> Report | None:
    """A ``REPORT RequestId: ...`` line's figures; None for any other line."""
    if not message.startswith("REPORT RequestId: "):
        return None
    request_id = message.removeprefix("REPORT RequestId: ").split(maxsplit=1)[0]
    figures = {name: float(number) for name, number in _REPORT_FIELD.findall(message)}
    if "Duration" not in figures:
        return None
    return Report(
        function=function,
        at_ms=at_ms,
        request_id=request_id,
        duration_ms=figures["Duration"],
        billed_ms=figures.get("Billed Duration", 0.0),
        memory_mb=int(figures.get("Memory Size", 0)),
        max_memory_mb=int(figures.get("Max Memory Used", 0)),
        init_ms=figures.get("Init Duration"),
    )


def _reports_in(logs: Any, group: str, since_ms: int) -> list[Report]:
    from botocore.exceptions import ClientError

    function = group.removeprefix(FUNCTION_LOGS)
    found: list[Report] = []
    try:
        for page in logs.get_paginator("filter_log_events").paginate(
            logGroupName=group, startTime=since_ms
        ):
            for event in page.get("events", []):
                report = parse_report(function, int(event["timestamp"]), event["message"])
                if report is not None:
                    found.append(report)
    except ClientError as exc:
        code = error_code(exc) or "error"
        if code == "ResourceNotFoundException":
            return []
        raise SmokeFailed(f"CloudWatch Logs answered {code} for {group}") from None
    return found


def read_reports(
    logs: Any,
    groups: Sequence[str],
    since_ms: int,
    *,
    sleep: Callable[[float], None] = time.sleep,
    settle_s: float = REPORT_SETTLE_S,
) -> list[Report]:
    """Every ``REPORT`` line of ``groups`` since ``since_ms``, read again until two reads agree
    (the last invocations' lines reach CloudWatch Logs within seconds), in time order."""
    waited = 0.0
    seen: list[Report] | None = None
    while True:
        found = sorted(
            (r for group in groups for r in _reports_in(logs, group, since_ms)),
            key=lambda r: (r.at_ms, r.function),
        )
        if (seen is not None and len(found) == len(seen)) or waited >= settle_s:
            return found
        seen = found
        sleep(POLL_S)
        waited += POLL_S


def report_lines(reports: Sequence[Report]) -> list[str]:
    """The REPORT lines as a table for the operator, then the totals."""
    if not reports:
        return ["  no REPORT lines yet (CloudWatch Logs can take a minute): read them later"]
    width = max(len(r.function) for r in reports)
    lines = [
        f"  {'time (UTC)':<12}  {'function':<{width}}  {'init ms':>8}  {'duration ms':>11}"
        f"  {'billed ms':>9}  {'memory MB':>9}  {'max used MB':>11}"
    ]
    for r in reports:
        at = time.strftime("%H:%M:%S", time.gmtime(r.at_ms / 1000)) + f".{r.at_ms % 1000:03d}"
        init = f"{r.init_ms:.1f}" if r.init_ms is not None else "-"
        lines.append(
            f"  {at:<12}  {r.function:<{width}}  {init:>8}  {r.duration_ms:>11.1f}"
            f"  {r.billed_ms:>9.0f}  {r.memory_mb:>9}  {r.max_memory_mb:>11}"
        )
    functions = len({r.function for r in reports})
    cold = sum(1 for r in reports if r.init_ms is not None)
    billed = sum(r.billed_ms for r in reports)
    lines.append(
        f"  {len(reports)} invocation(s) of {functions} function(s), {cold} cold start(s),"
        f" {billed:.0f} ms billed"
    )
    return lines


# -- the MCP client ------------------------------------------------------------------------------


def _inside(error: BaseException, kind: type[E]) -> E | None:
    """The ``kind`` exception inside ``error`` (itself, or in nested exception groups)."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := _inside(inner, kind)) is not None:
                return found
    return None


def _http_status(error: BaseException) -> int | None:
    """The HTTP status of an ``httpx2.HTTPStatusError`` inside ``error``, if any."""
    import httpx2

    found = _inside(error, httpx2.HTTPStatusError)
    return int(found.response.status_code) if found is not None else None


class McpAgent:
    """The official ``mcp`` client at the endpoint, with the agent's bearer token in its HTTP
    client's headers only. The SDK declares URL (and form) elicitation when given a callback; a
    form question is cancelled (the smoke never answers for a person), and at 2025-11-25 the
    stack answers a gated call with ``-32042`` and the approval page's link."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def tools(self) -> dict[str, dict[str, Any]]:
        listed = await self._client.list_tools()
        return {tool.name: dict(tool.input_schema) for tool in listed.tools}

    async def call(self, tool: str, arguments: dict[str, Any]) -> Answer:
        from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError

        try:
            result = await self._client.call_tool(f"engram_memory_{tool}", arguments)
        except Exception as exc:
            error = _inside(exc, MCPError)
            if error is None:
                status = _http_status(exc)
                raise SmokeFailed(
                    f"{tool}: the API answered HTTP {status}"
                    if status is not None
                    else f"{tool}: no answer ({type(exc).__name__})"
                ) from None
            if error.code == -32042:
                links = UrlElicitationRequiredError.from_error(error.error).elicitations
                if links:
                    return ApprovalLink(str(links[0].url))
            raise SmokeFailed(f"{tool}: JSON-RPC error {error.code}: {error.message}") from None
        envelope = result.structured_content
        if not isinstance(envelope, dict):
            raise SmokeFailed(f"{tool}: the answer has no result envelope")
        return envelope


@asynccontextmanager
async def mcp_agent(url: str, token: str) -> AsyncIterator[McpAgent]:
    """An ``McpAgent`` connected at ``url`` (initialize at 2025-11-25)."""
    import httpx2
    import mcp.types as types
    from mcp import Client
    from mcp.client.session import ClientRequestContext
    from mcp.client.streamable_http import streamable_http_client

    async def never_for_a_person(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        return types.ElicitResult(action="cancel")

    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60)
    ) as http:
        client = Client(
            streamable_http_client(url, http_client=http),
            mode="legacy",
            elicitation_callback=never_for_a_person,
            client_info=types.Implementation(name="engram-memory-smoke", version="1"),
        )
        connected = False
        try:
            async with client:
                connected = True
                yield McpAgent(client)
        except Exception as exc:
            if (failure := _inside(exc, SmokeFailed)) is not None:
                raise failure from None
            if connected:
                raise
            raise SmokeFailed(f"connect: {_unconnected(exc)}") from None


def _unconnected(error: BaseException) -> str:
    """Why the client could not connect, in a few words (never a header or the token)."""
    status = _http_status(error)
    if status == 401:
        return "the API answered HTTP 401 (the token: expired, for another audience or issuer?)"
    if status is not None:
        return f"the API answered HTTP {status}"
    return f"no connection ({type(error).__name__})"


# -- the command ---------------------------------------------------------------------------------


def token_workspace(token: str) -> str:
    """The workspace the token binds (read without checking: only to name it in a hint)."""
    import jwt

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return "WORKSPACE"
    workspace = claims.get("workspace_id") if isinstance(claims, dict) else None
    return str(workspace) if isinstance(workspace, str) and workspace else "WORKSPACE"


def _left_behind(run: SmokeRun, stack: str, workspace: str) -> str:
    """What a failed run left, with the admin commands that end it ('' when nothing)."""
    ends = {"candidate": "pending withdraw", "record": "records forget"}
    return "; ".join(
        f"left behind: {kind} {target} (end it: engram-memory admin --stack {stack}"
        f" {ends[kind]} {target} --workspace {workspace} --reason smoke)"
        for target, kind in run.left.items()
    )


def run_smoke(
    stack_name: str,
    *,
    token: str,
    say: Callable[[str], None],
    endpoint: str | None = None,
    region: str | None = None,
    session: Session | None = None,
) -> dict[str, Any]:
    """Run the smoke against ``stack_name`` (module doc): its document for ``--json``.
    StackError when the stack cannot be smoked, SmokeFailed on the first failed step."""
    import anyio
    import boto3

    from engram_memory.cloud.composition import AwsClients

    if session is None:
        session = boto3.session.Session(region_name=region) if region else boto3.session.Session()
    if not session.region_name:
        raise StackError("no AWS region: pass --region or set AWS_REGION")
    clients = AwsClients.of(session)
    target = smoke_target(clients, stack_name, endpoint)
    started_ms = int(time.time() * 1000)
    started = time.monotonic()
    run = SmokeRun(agent=_Unconnected(), say=say, run_id=secrets.token_hex(4))
    say(f"engram-memory smoke of stack {stack_name} ({target.region}) through {target.endpoint}")
    say(f"run {run.run_id}: two memories labelled 'engram-memory smoke run {run.run_id}'")

    async def steps() -> None:
        async with mcp_agent(target.endpoint, token) as agent:
            run.agent = agent
            await run.run()

    try:
        anyio.run(steps)
    except SmokeFailed as failure:
        left = _left_behind(run, stack_name, token_workspace(token))
        raise SmokeFailed(f"{failure}{'; ' + left if left else ''}") from None
    say(f"REPORT lines since the smoke started (CloudWatch Logs, {FUNCTION_LOGS}<function>):")
    reports = read_reports(clients.client("logs"), target.log_groups, started_ms)
    for line in report_lines(reports):
        say(line)
    seconds = time.monotonic() - started
    say(f"smoke passed: {len(run.steps)} steps in {seconds:.1f} s")
    return {
        "stack": stack_name,
        "endpoint": target.endpoint,
        "run": run.run_id,
        "passed": True,
        "seconds": round(seconds, 3),
        "steps": [asdict(step) for step in run.steps],
        "reports": [asdict(report) for report in reports],
    }


class _Unconnected:
    """The agent before the client connects (a placeholder the run never calls)."""

    async def tools(self) -> dict[str, dict[str, Any]]:
        raise SmokeFailed("not connected")

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> Answer:
        raise SmokeFailed("not connected")
