"""What a person is asked to approve: one view, rendered as the HTML page and as the form
elicitation's text, so the page and the form say the same thing."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Final, Protocol

# by the engine's tool (grant) name; the MCP names add the "engram_memory_" prefix
ACTIONS: Final = {
    "forget": ("Forget this memory?", "permanently forget this memory record"),
    "withdraw": (
        "Withdraw this pending memory?",
        "withdraw this pending memory candidate (it will never be admitted)",
    ),
    "capture": ("Capture a new memory?", "capture a new pending memory"),
    "request_admission": (
        "Request admission of this memory?",
        "ask the admission policy to decide on this pending memory",
    ),
}


def action_of(tool: str) -> tuple[str, str]:
    """The page's title and the sentence for a tool (``forget`` or ``engram_memory_forget``)."""
    grant = tool.removeprefix("engram_memory_")
    return ACTIONS.get(grant, ("Approve this memory operation?", f"run {grant}"))


@dataclass(frozen=True, slots=True)
class Citation:
    citation_id: str
    source_ref: str
    locator: str  # "scheme: value"


@dataclass(frozen=True, slots=True)
class Component:
    kind: str  # context | decision | evidence
    text: str
    citation_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Memory:
    """The memory the operation acts on: its text and citations, or (``withheld``) only its
    digest and capture time when the text may not be opened for this approver."""

    digest: str
    components: tuple[Component, ...] = ()
    citations: tuple[Citation, ...] = ()
    captured_at_ms: int | None = None

    @property
    def withheld(self) -> bool:
        return not self.components


def memory_from_record(
    record: Mapping[str, Any], *, digest: str, captured_at_ms: int | None = None
) -> Memory:
    """The shown memory from a stored record (or an opened candidate's record): its components
    (primary first) and citations."""
    primary = record.get("primary_component_id")
    components = sorted(
        record.get("components", []), key=lambda c: c.get("component_id") != primary
    )
    return Memory(
        digest=digest,
        components=tuple(
            Component(
                kind=str(c.get("kind", "")),
                text=str(c.get("text", "")),
                citation_ids=tuple(str(i) for i in c.get("citation_ids", [])),
            )
            for c in components
        ),
        citations=tuple(
            Citation(
                citation_id=str(c.get("citation_id", "")),
                source_ref=str(c.get("source_ref", "")),
                locator=_locator(c.get("locator")),
            )
            for c in record.get("citations", [])
        ),
        captured_at_ms=captured_at_ms,
    )


def _locator(locator: Any) -> str:
    if isinstance(locator, Mapping):
        return f"{locator.get('scheme', '')}: {locator.get('value', '')}"
    return ""


class Decision(enum.StrEnum):
    APPROVE = "approve"
    DECLINE = "decline"


class Asked(Protocol):
    """A question as a host keeps it: the open ``Approval`` and who asked (the embedded book's
    ``OpenApproval``, the cloud's ``ParkedApproval``)."""

    @property
    def approval_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def principal(self) -> str: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def workspace_id(self) -> str: ...
    @property
    def reason_ref(self) -> str | None: ...
    @property
    def expires_at_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """One confirmation as the approver sees it."""

    approval_id: str
    tool: str
    target: str | None
    principal: str
    agent_id: str | None
    session_id: str | None
    tenant_id: str
    workspace_id: str
    reason_ref: str | None
    expires_at_ms: int
    memory: Memory | None
    # the host commits an approval as soon as it is given (the cloud's run, the embedded host's
    # withdraw and forget), whenever the agent retries
    committed_by_run: bool = False
    # the embedded host: answering takes the question's one-time code, shown on its terminal only
    asks_code: bool = False

    @classmethod
    def of(
        cls,
        asked: Asked,
        memory: Memory | None,
        *,
        committed_by_run: bool = False,
        asks_code: bool = False,
    ) -> ApprovalView:
        """The view of a host's question and the memory it acts on (None: none shown)."""
        asked_fields = {name: getattr(asked, name) for name in _ASKED_FIELDS}
        return cls(
            **asked_fields, memory=memory, committed_by_run=committed_by_run, asks_code=asks_code
        )

    @property
    def title(self) -> str:
        return action_of(self.tool)[0]

    @property
    def action(self) -> str:
        return action_of(self.tool)[1]

    def time_left(self, now_ms: int) -> str:
        """``4 min (until 13:45:02 UTC)``, ``45 s (until …)``, or ``none, it has expired``: the
        value of the "Time left" line, so it does not say "left" again."""
        left_s = (self.expires_at_ms - now_ms) // 1000
        if left_s <= 0:
            return "none, it has expired"
        until = datetime.fromtimestamp(self.expires_at_ms / 1000, UTC).strftime("%H:%M:%S")
        amount = f"{left_s // 60} min" if left_s >= 60 else f"{left_s} s"
        return f"{amount} (until {until} UTC)"

    def facts(self, now_ms: int) -> list[tuple[str, str]]:
        """The request's facts, in the order the page and the form show them."""
        return [
            ("Requested by", self.principal),
            ("Agent", self.agent_id or "(not stated by the host)"),
            ("Session", self.session_id or "(not stated by the host)"),
            ("Reason", self.reason_ref or "(none given)"),
            ("Scope", f"tenant {self.tenant_id}, workspace {self.workspace_id}"),
            ("Target", self.target or "(a new memory)"),
            ("Time left", self.time_left(now_ms)),
        ]


# What the view takes of a host's question (``Asked``): all but what the host adds.
_ASKED_FIELDS: Final = tuple(
    field.name
    for field in fields(ApprovalView)
    if field.name not in {"memory", "committed_by_run", "asks_code"}
)


def plain_summary(view: ApprovalView, now_ms: int) -> str:
    """The page's content as text, for the form elicitation's message."""
    lines = [f"{view.title} An agent asks to {view.action}.", ""]
    lines += [f"{name}: {value}" for name, value in view.facts(now_ms)]
    memory = view.memory
    if memory is not None:
        lines.append("")
        if memory.withheld:
            lines.append(f"The memory (text not shown): digest {memory.digest}")
            if memory.captured_at_ms is not None:
                lines.append(f"Captured at {iso_time(memory.captured_at_ms)}")
        else:
            lines.append("The memory:")
            for component in memory.components:
                cited = ", ".join(component.citation_ids)
                lines.append(f"[{component.kind}] {component.text} (cites {cited})")
            lines.append("Citations:")
            lines += [f"- {c.citation_id}: {c.source_ref} ({c.locator})" for c in memory.citations]
    lines += ["", "Choose approve or decline. Nothing changes unless you approve."]
    return "\n".join(lines)


def iso_time(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# The one retry window every person and agent is told (the engine's gate, engine/gate.py:
# EXECUTION_WINDOW_MS and APPROVAL_TTL_MS, decides it; tests/unit checks the two agree).
RETRY_WINDOW: Final = "within 30 s of the approval and 5 minutes of the request"
# What an approval does where the host carries it out as soon as it is given (the cloud's run;
# the embedded host's withdraw and forget): the words the agent, the page and the terminal use.
CARRIED_OUT: Final = (
    "an approval carries the change out at once, and the agent's retry of the same call (the"
    " same idempotency key) returns its result, whenever it comes"
)


class PageError(enum.Enum):
    """Why the page cannot show or take an answer; each renders with a next step."""

    NOT_FOUND = "not_found"
    INCOMPLETE_LINK = "incomplete_link"  # the embedded host: a link without its secret
    EXPIRED = "expired"
    ANSWERED = "answered"
    CSRF = "csrf"
    FORBIDDEN = "forbidden"
    BAD_REQUEST = "bad_request"
    UNAVAILABLE = "unavailable"
    SIGN_IN = "sign_in"  # the cloud: no session (expired, or a sign-in that did not complete)
    NOT_A_PERSON = "not_a_person"  # the cloud: an agent's or an application's sign-in
    STALE_SIGN_IN = "stale_sign_in"  # the cloud: the provider kept reusing an old sign-in
    WRONG_CODE = "wrong_code"  # the embedded host: not the question's one-time code
    NO_MORE_ATTEMPTS = "no_more_attempts"  # the embedded host: too many wrong codes
