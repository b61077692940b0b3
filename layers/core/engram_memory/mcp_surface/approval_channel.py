"""The approval channel: the port through which the MCP surface asks a human, whatever the host.

A host that keeps its questions beyond the request that asked them (the embedded server's
``ApprovalBook``, answered on its page, at the terminal or in the client's form) hands the
surface an ``ApprovalChannel`` (``SurfaceRuntime.approvals``). The surface then
(``EngramMcp``):

1. takes the answer already given for the operation (``given``): the client's retry after an
   answer on the page or at the terminal commits, or fails after a decline, and never asks twice;
2. else picks the mode from the client's capabilities (``confirmation_mode``), opens a question
   (``ask``) and sends its message: a link (URL mode) or a form whose answer it records
   (``answer``); a stateless round trip's ``requestState`` carries the question's own id;
3. closes the question of a stateless round trip the client answered itself
   (``close_round_trip``), unless a human declined it first;
4. passes every envelope of a gated call through ``reported``: a host that carries out an
   approval as soon as a person gives it (the embedded host's withdraw and forget: ``ask`` keeps
   the call's arguments for it) reports that commit to the agent's retry as no replay the first
   time, as the cloud's run does.

A question is spent by its first answer, whatever it is (CONTRACT.md §8): a decline reaches the
surface as ``Declined``, and the surface has the engine spend the question's id
(``Engine.decline``), so no replay of its ``requestState`` and no later answer can commit.

``pending`` lists the questions still waiting for a human and ``answer_by_id`` answers one
named by its id: the operator's terminal (``engram-memory approvals``) goes through these two.

The cloud passes no channel. There a question is a Step Functions run parked on a task token
(``cloud.parked_approvals.ParkedApprovalBook``): the tool function starts the run and answers
``confirmation_required`` with the run's approval page, which reaches the surface as a
``ConfirmationNeeded`` with a ``url``; the page (or the form's answer, handed to the tool function
with the retried call) sends the task token back, and the run, not the surface, carries out the
operation. The adapter Lambda that runs the surface is stateless: it holds no question between
two requests, so there is nothing for it to ask, record or expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import mcp.types as types

from engram_memory.engine.context import TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationRequest

# How the human is asked: a link (URL mode), a form in the client, or, for a client that can do
# neither, only at the host's terminal (the -32603's ``data`` names the command).
Mode = Literal["url", "form", "terminal"]


def confirmation_mode(capabilities: types.ClientCapabilities | None) -> Mode | None:
    """How to ask this client's human: ``form`` when it declared form elicitation (or the bare
    ``{}``, which means form), ``url`` when it declared URL only, None when it declared neither.

    Form first: the human answers inside the client, and the form carries the page's whole
    summary; the page's link (and the terminal) answer the same question when the client stops
    waiting."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return None
    if elicitation.form is not None or elicitation.url is None:
        return "form"
    return "url"


@dataclass(frozen=True, slots=True)
class Declined:
    """A human's decline of the question ``approval`` (its id is what the engine spends)."""

    approval: Approval


@dataclass(frozen=True, slots=True)
class Question:
    """An open question, as the surface holds it while it asks: the handle ``ask`` returns."""

    approval_id: str
    issued_at_ms: int
    expires_at_ms: int
    message: str  # what the human reads, for the mode it was asked in
    link: str | None  # the page that answers it too (None: the host serves no page)
    # the host's command that answers it, as a person types it (the bare program name, never a
    # path): the -32603's ``data.approve_with`` for a client that cannot ask
    approve_with: str | None = None


class ApprovalChannel(Protocol):
    """A host's questions to humans (see the module doc). Blocking: the surface calls each in a
    worker thread."""

    @property
    def has_page(self) -> bool:
        """Does the host serve an approval page (URL mode)? Not over stdio."""
        ...

    def given(self, request: ConfirmationRequest) -> Approval | Declined | None:
        """The answer already given for this operation: an approval still usable, ``Declined``
        (reported once: the next call asks anew, under a new id), or None."""
        ...

    def ask(
        self, request: ConfirmationRequest, ctx: TrustedContext, mode: Mode, arguments: Any = None
    ) -> Question:
        """The open question for this operation (the one already open, or a new one);
        ``arguments``: the call's, for a host that carries out the approval itself."""
        ...

    def reported(
        self, tool: str, ctx: TrustedContext, arguments: Any, envelope: dict[str, Any]
    ) -> dict[str, Any]:
        """The envelope the agent's gated call gets: ``envelope``, or, for the first report of
        a commit the host carried out when a person approved, the same with ``replayed:
        false``."""
        ...

    def answer(self, question: Question, approve: bool) -> Approval | Declined | None:
        """The client's form answered ``question``: the approval, ``Declined``, or None when the
        question is gone. The first answer wins (the page or the terminal may have answered
        meanwhile)."""
        ...

    def answer_by_id(
        self,
        approval_id: str,
        approve: bool,
        *,
        by: Literal["terminal", "client"],
        approver: str | None = None,
    ) -> tuple[bool, Approval | None]:
        """A human answered the question ``approval_id`` outside a form's round trip (``by``:
        the operator's terminal; ``approver``: the operator, journaled with the transition it
        authorizes): whether this answer was the first, and the question as it stands after it
        (None: no such question). The first answer wins."""
        ...

    def close_round_trip(self, approval: Approval) -> bool:
        """The client answered the stateless round trip of the question ``approval`` (its
        ``requestState``) itself: the question is closed. False when a human declined it first,
        on the page or at the terminal: the first answer wins."""
        ...

    def pending(self) -> Sequence[Approval]:
        """The questions waiting for a human, oldest first."""
        ...


__all__ = ["ApprovalChannel", "Declined", "Mode", "Question", "confirmation_mode"]
