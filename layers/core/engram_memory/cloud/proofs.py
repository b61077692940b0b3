"""What makes an approval, or a tool invocation, something only its rightful author could send.

Two KMS HMAC keys (``KeySpec: HMAC_256``), each producible by one role and verifiable by those
that act on it (template.yaml; docs/deploying-aws.md, "Proofs"):

- **The approval proof key** (``ENGRAM_APPROVAL_PROOF_KEY_ARN``): only the approval function may
  ``GenerateMac`` with it, after a signed-in person pressed Approve on the page; the workflow's
  commit step ``VerifyMac``\\ s it before it commits. A stolen task token, a forged
  ``SendTaskSuccess`` or a replayed proof therefore commits nothing: a proof is bound to the
  approval id (single use), the operation digest, the tool, the target, the principal and scope,
  the decision, the approver and an expiry.
- **The invocation key** (``ENGRAM_INVOCATION_KEY_ARN``): only the MCP adapter — the one
  function that verifies bearer tokens — may ``GenerateMac`` with it. It signs every tool
  invocation it sends (the trusted context included), so ``lambda:InvokeFunction`` on a tool
  function is not an identity: the tool refuses an invocation that does not verify (-32603,
  audited). It also attests a form-mode approval (the client's answer to the form the adapter
  sent): the commit step accepts such an approval only when the host lets forms answer
  (``ENGRAM_APPROVAL_PAGE_REQUIRED`` unset), and never as a page's.

A proof's message is the SHA-256 of what it binds, as sorted-key ASCII JSON (KMS MAC messages
are at most 4 KiB; an invocation's arguments may be larger), prefixed by its ``purpose`` so an
invocation's MAC never verifies as an approval's. Not RFC 8785: the arguments are the agent's
raw input, which may be what JCS refuses (a non-NFC string, NaN) and the engine answers
``INVALID_SCHEMA`` for; both sides run this module on the JSON the adapter sent, so the bytes
agree.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from engram_memory.adapters.aws.calls import unless_refused
from engram_memory.engine.gate import FORM_ANSWER, Approval, approver_label
from engram_memory.engine.ports import StoreUnavailable

__all__ = [
    "MAC_ALGORITHM",
    "ApprovalProof",
    "Channel",
    "FixedMacKey",
    "KmsMacKey",
    "MacKey",
    "attest_form",
    "form_proof",
    "invocation_mac",
    "invocation_verifies",
    "prove_on_page",
    "proven_approval",
    "signed_event",
]

MAC_ALGORITHM: Final = "HMAC_SHA_256"
# The fields of an invocation event its MAC covers: all but the approval (which has its own) and
# the MAC itself — so the execution's copy of the call (its approval left out) still verifies.
_UNSIGNED_FIELDS: Final = frozenset({"approval", "approval_mac", "proof"})

Channel = Literal["page", "form"]


class MacKey(Protocol):
    """An HMAC key the caller may use (``mac``: generate, ``verifies``: check)."""

    def mac(self, message: bytes) -> bytes: ...

    def verifies(self, message: bytes, mac: bytes) -> bool: ...


class KmsMacKey:
    """A KMS HMAC key: ``GenerateMac`` / ``VerifyMac`` (the role's policy decides which).

    KMS unreachable or refusing is ``StoreUnavailable`` (retriable); a MAC that does not verify
    is ``False``.
    """

    def __init__(self, kms: Any, key_arn: str) -> None:
        self._kms = kms
        self.key_arn = key_arn

    def mac(self, message: bytes) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self._kms.generate_mac(
                KeyId=self.key_arn, Message=message, MacAlgorithm=MAC_ALGORITHM
            )
        except (BotoCoreError, ClientError) as exc:
            raise StoreUnavailable("the proof key is unavailable") from exc
        return bytes(answer["Mac"])

    def verifies(self, message: bytes, mac: bytes) -> bool:
        answer = unless_refused(
            lambda: self._kms.verify_mac(
                KeyId=self.key_arn, Message=message, Mac=mac, MacAlgorithm=MAC_ALGORITHM
            ),
            "KMSInvalidMacException",
            "the proof key is unavailable",
        )
        return answer is not None and bool(answer.get("MacValid"))


class FixedMacKey:
    """An HMAC key held in memory (tests, and compositions without KMS)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def mac(self, message: bytes) -> bytes:
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def verifies(self, message: bytes, mac: bytes) -> bool:
        return hmac.compare_digest(self.mac(message), mac)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None


def _message(purpose: str, bound: Any) -> bytes:
    encoded = json.dumps(bound, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    digest = hashlib.sha256(encoded.encode("ascii")).hexdigest()
    return f"engram-{purpose}-v1:{digest}".encode("ascii")


def _checks(key: MacKey, purpose: str, bound: Any, mac: str | None) -> bool:
    raw = _unb64(mac) if mac else None
    return raw is not None and key.verifies(_message(purpose, bound), raw)


# -- invocations ------------------------------------------------------------------------------


def _signed_part(event: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in event.items() if name not in _UNSIGNED_FIELDS}


def invocation_mac(key: MacKey, event: Mapping[str, Any]) -> str:
    """The adapter's MAC of an invocation event (``ToolInvocation.to_event()``)."""
    return _b64(key.mac(_message("invocation", _signed_part(event))))


def signed_event(key: MacKey, event: Mapping[str, Any]) -> dict[str, Any]:
    """``event`` (``ToolInvocation.to_event()``) as the adapter sends it: with its attestation of
    the form answer it carries (``approval_mac``; none for a decline) and its MAC (``proof``)."""
    sent = {name: value for name, value in event.items() if name not in ("approval_mac", "proof")}
    approval = sent.get("approval")
    if isinstance(approval, dict) and not sent.get("declined"):
        sent["approval_mac"] = attest_form(key, Approval.model_validate(approval))
    sent["proof"] = invocation_mac(key, sent)
    return sent


def invocation_verifies(key: MacKey, event: Mapping[str, Any]) -> bool:
    """Whether ``event`` carries the adapter's MAC of itself (``proof``)."""
    proof = event.get("proof")
    return isinstance(proof, str) and _checks(key, "invocation", _signed_part(event), proof)


# -- approvals --------------------------------------------------------------------------------

_Subject = Annotated[StrictStr, Field(min_length=1, max_length=1024)]


class ApprovalProof(BaseModel):
    """A human's approval as the commit step receives it (the ``SendTaskSuccess`` output).

    ``channel`` says who vouches for it: ``page`` (the approval function, for the signed-in
    ``approver``) or ``form`` (the adapter, for the client's answer; ``approver`` is then the
    principal, the only person the client speaks for). ``mac`` covers every other field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval: Approval
    channel: Channel
    approver: _Subject
    expires_at_ms: StrictInt
    mac: Annotated[StrictStr, Field(min_length=1, max_length=512)]

    def bound(self) -> dict[str, Any]:
        return {
            "approval": self.approval.model_dump(mode="json"),
            "channel": self.channel,
            "approver": self.approver,
            "decision": "approve",
            "expires_at_ms": self.expires_at_ms,
        }


def _proof(key: MacKey, approval: Approval, channel: Channel, approver: str) -> ApprovalProof:
    unsigned = ApprovalProof(
        approval=approval,
        channel=channel,
        approver=approver,
        expires_at_ms=approval.expires_at_ms,
        mac="-",
    )
    mac = _b64(key.mac(_message("approval", unsigned.bound())))
    return unsigned.model_copy(update={"mac": mac})


def prove_on_page(key: MacKey, approval: Approval, approver: str) -> ApprovalProof:
    """The approval function's proof that ``approver``, signed in, approved ``approval``."""
    return _proof(key, approval, "page", approver)


def attest_form(key: MacKey, approval: Approval) -> str:
    """The adapter's MAC of a form answer (``ToolInvocation.approval_mac``)."""
    return _proof(key, approval, "form", approval.principal).mac


def form_proof(approval: Approval, mac: str) -> ApprovalProof:
    """The proof a tool function hands the run for a form answer the adapter attested."""
    return ApprovalProof(
        approval=approval,
        channel="form",
        approver=approval.principal,
        expires_at_ms=approval.expires_at_ms,
        mac=mac,
    )


def proven_approval(
    proof: ApprovalProof,
    *,
    page_key: MacKey | None,
    form_key: MacKey | None,
    now_ms: int,
) -> Approval | None:
    """The approval ``proof`` vouches for, or None: a MAC that does not verify under its
    channel's key, a channel whose key the caller does not accept (``None``: a form answer where
    the host requires the page; a page's proof where only form answers are checked), an approval
    for another principal than the form's, or a proof past its expiry.

    The approval names who gave it from what the MAC covers (``approved_by``, journaled with the
    transition): the page's signed-in approver, or the client's form."""
    if proof.expires_at_ms != proof.approval.expires_at_ms or now_ms > proof.expires_at_ms:
        return None
    if proof.channel == "page":
        key: MacKey | None = page_key
    else:
        key = form_key if proof.approver == proof.approval.principal else None
    if key is None or not _checks(key, "approval", proof.bound(), proof.mac):
        return None
    by = approver_label("page", proof.approver) if proof.channel == "page" else FORM_ANSWER
    return proof.approval.model_copy(update={"approved_by": by})
