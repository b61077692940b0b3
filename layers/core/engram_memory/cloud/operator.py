"""The operator's plane against a deployed stack: ``engram-memory admin --stack NAME ...``.

The same operations as the embedded host (``operator_plane``), run from the operator's
machine with the operator's own AWS credentials: ``StackSeat`` opens the stack on first need
(``cloud.operator_session.open_stack``: the engine built as the functions build it, audited into
the stack's operator audit log group, the projection left to the outbox drainer) and runs each
command there.

Withdraw and forget commit directly, not through the stack's Step Functions executions: those
exist to obtain a human's confirmation of an *agent's* request (the approval page), and here the
human is the operator, authenticated by IAM. The commit is the one use case the executions run
(``commit_withdraw`` / ``commit_forget``), with a journal event and a receipt whose authorization
digest binds the operator and the reason; the key destruction runs in the same CLI call (the
executions' ``destroy_keys`` step) and the projection drop is the drainer's (their
``invalidate_projections`` step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from engram_memory.adapters.aws.calls import error_code
from engram_memory.cloud.operator_session import OperatorSession, StackError, open_stack
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.operator_plane.seat import AuditPage, SeatFailure, UsageError

if TYPE_CHECKING:
    from engram_memory.operator_plane.seat import UseCase

T = TypeVar("T")

__all__ = ["StackSeat"]


def reindex_stack(op: OperatorSession, workspace_id: str) -> dict[str, Any]:
    """Rebuild a workspace's OpenSearch documents: the drainer's reindex (``ReindexRequest``),
    run by the function whose role OpenSearch maps. Audited as ``admin.reindex``."""
    from engram_memory.operator_plane.auditing import audited

    def run(call: Any) -> dict[str, Any]:
        answer = op.invoke_drainer({"operation": "reindex", "workspace_id": workspace_id})
        return {"workspace": workspace_id, **{k: v for k, v in answer.items() if k != "operation"}}

    return audited(op.engine, op.scope(workspace_id), op.operator, "reindex", None, run)


def rotate_stack_keys(op: OperatorSession) -> dict[str, Any]:
    """``keys rotate`` on a stack: new key material for the KMS key that wraps the data keys.

    ``RotateKeyOnDemand`` on the stack's data key (the key admin role may; the template also
    turns on yearly automatic rotation). KMS keeps every earlier key material of the key and
    picks the right one to decrypt, so the data keys wrapped before the rotation open as they
    did and nothing needs re-wrapping: a data key wrapped anew is only wrapped under the new
    material. What a rotation cannot do is make an earlier material unusable; that is what
    forgetting is for (the data key's item is deleted). Token signing keys are the identity
    provider's (``ENGRAM_ISSUER``): rotate them there; the adapter follows its JWKS, and tokens
    signed with a key the JWKS still lists verify until they expire. Audited as
    ``admin.keys_rotate``.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from engram_memory.operator_plane.auditing import audited
    from engram_memory.operator_plane.backup_checks import OperationRefused

    key = op.resources.data_key_arn

    def run(call: Any) -> dict[str, Any]:
        try:
            op.kms.rotate_key_on_demand(KeyId=key)
            status = op.kms.get_key_rotation_status(KeyId=key)
        except ClientError as exc:
            code = error_code(exc) or "error"
            raise OperationRefused(
                ErrorCode.STORE_UNAVAILABLE,
                f"KMS answered {code} (the stack's KeyAdminRoleArn may rotate the data key)",
            ) from None
        except BotoCoreError:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
        return {
            "data_key": key,
            "rotated": "on_demand",
            "automatic_rotation": bool(status.get("KeyRotationEnabled")),
            "rotation_period_days": status.get("RotationPeriodInDays"),
            "wrapped_data_keys_rewrapped": 0,
            "why": "KMS decrypts with every earlier material of the key: wrapped data keys stay"
            " valid; new ones are wrapped under the new material",
            "signing_keys": "the identity provider's (the stack's IssuerUrl): rotate them there",
        }

    return audited(
        op.engine, op.scope("*"), op.operator, "keys_rotate", op.resources.data_key_arn, run
    )


class StackSeat:
    """A deployed stack, opened for the caller of the operator's AWS credentials: the cloud's
    ``operator_plane.seat.OperatorSeat``. The stack is resolved on first need, so a command this
    host does not have (``audit``, ``policy``) is refused without touching AWS."""

    def __init__(self, stack_name: str, *, region: str | None = None, **open_options: Any) -> None:
        self._stack_name = stack_name
        self._region = region
        self._open_options = open_options
        self._op: OperatorSession | None = None
        self.notes: list[str] = []

    @property
    def session(self) -> OperatorSession:
        if self._op is None:
            try:
                self._op = open_stack(self._stack_name, region=self._region, **self._open_options)
            except StackError as error:
                raise SeatFailure(str(error)) from None
            self.notes = self._op.notes
        return self._op

    @property
    def operator(self) -> str:
        return self.session.operator

    @property
    def tenant_id(self) -> str:
        return self.session.resources.tenant_id

    def _aws(self, run: Callable[[OperatorSession], T]) -> T:
        """Run against AWS; a refusal of the operator's role is one line, not a traceback."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return run(self.session)
        except (BotoCoreError, ClientError) as error:  # e.g. AccessDenied for the operator's role
            raise SeatFailure(f"AWS answered {error_code(error) or type(error).__name__}") from None

    def call(self, workspace: str, run: UseCase[T], *, mutates: bool) -> T:
        def on_stack(op: OperatorSession) -> T:
            result = run(op.engine, op.scope(workspace), op.operator)
            if mutates:  # the drainer applies the projection changes the operation left
                op.finish()
            return result

        return self._aws(on_stack)

    def backup(self, target: str | None) -> dict[str, Any]:
        from engram_memory.cloud.stack_backup import backup_stack

        return self._aws(lambda op: backup_stack(op, to=target))

    def restore(self, source: str, *, new_keys: bool) -> dict[str, Any]:
        from engram_memory.cloud.stack_backup import restore_stack

        return self._aws(lambda op: restore_stack(op, source, new_keys=new_keys))

    def rotate_keys(self) -> dict[str, Any]:
        return self._aws(rotate_stack_keys)

    def token_issued(self, token_id: str) -> bool | None:
        """The stack's tokens come from its identity provider: which ids it issued is not known
        here."""
        return None

    def reindex(self, workspace: str) -> dict[str, Any]:
        return self._aws(lambda op: reindex_stack(op, workspace))

    def audit(self, limit: int) -> AuditPage:
        raise UsageError(
            "with --stack, the audit is in CloudWatch Logs: the functions' log groups and the"
            " stack's OperatorAuditLogGroupName output (e.g. CloudWatch Logs Insights,"
            " message = 'audit')"
        )

    def policy_lines(self) -> list[str]:
        raise UsageError(_POLICY_ON_STACK)

    def set_admission_mode(self, mode: str) -> list[str]:
        raise UsageError(_POLICY_ON_STACK)

    def smoke(self, token: str, endpoint: str | None, say: Callable[[str], None]) -> dict[str, Any]:
        """``smoke``: the six tools through the stack's API (``cloud.smoke``). It needs no engine
        over the stack: only the stack's outputs and its functions' log groups."""
        from botocore.exceptions import BotoCoreError, ClientError

        from engram_memory.cloud.smoke import SmokeFailed, run_smoke

        try:
            return run_smoke(
                self._stack_name, token=token, say=say, endpoint=endpoint, region=self._region
            )
        except (StackError, SmokeFailed) as error:
            raise SeatFailure(str(error)) from None
        except (BotoCoreError, ClientError) as error:
            raise SeatFailure(f"AWS answered {error_code(error) or type(error).__name__}") from None

    def close(self) -> None:
        """The clients close with the process; nothing is held open on the stack."""


_POLICY_ON_STACK: Final = (
    "with --stack, the admission mode is the stack's AdmissionMode parameter (sam deploy)"
)
