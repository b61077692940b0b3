"""The composition root of the cloud deployment: the engine of one tenant's functions.

``build_engine`` wires the engine from the environment the SAM template sets;
``build_execution_gate`` the Step Functions gate of withdraw and forget. Nothing here opens a
client or reads the environment when imported: boto3, the AWS Encryption SDK and opensearch-py
are imported inside, called on a function's first invocation (the cold-start singleton).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from ..engine.ports import (
    AuditSink,
    Clock,
    Embedder,
    LexicalIndex,
    RecordKeys,
    Store,
    Vault,
    VectorIndex,
)
from ..engine.service import Engine, EngineSettings

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_kms.client import KMSClient
    from mypy_boto3_s3.client import S3Client

    from ..engine.ports import AdmissionPolicy
    from .execution_gate import ExecutionGate

from .settings import (
    ConfigurationError,
    admission_mode,
    aws_session,
    client_config,
    fusion,
    read_cursor_key,
    required,
    semantic,
)

DEFAULT_OPENSEARCH_INDEX: Final = "engram-records"
# The tools whose human confirmation and commit run in a Step Functions execution.
GATED_TOOLS: Final = frozenset({"withdraw", "forget"})


def build_engine(
    env: Mapping[str, str] = os.environ,
    *,
    session: Session | None = None,
    dynamodb_client: DynamoDBClient | None = None,
    s3_client: S3Client | None = None,
    kms_client: KMSClient | None = None,
    secrets_client: Any = None,
    opensearch_client: Any = None,
    store: Store | None = None,
    vault: Vault | None = None,
    record_keys: RecordKeys | None = None,
    lexical_index: LexicalIndex | None = None,
    admission_policy: AdmissionPolicy | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    embedder: Embedder | None = None,
) -> Engine:
    """The cloud engine of one tenant, from the environment the SAM template sets.

    - store: ``DynamoStore`` over ``ENGRAM_TABLE`` with large attributes in
      ``ENGRAM_BLOB_BUCKET``;
    - vault: ``KmsVault`` under the key ARN ``ENGRAM_DATA_KEY_ARN``, data keys in
      ``ENGRAM_KEY_TABLE``;
    - record keys: ``KmsRecordKeys``, per-record keys in ``ENGRAM_KEY_TABLE`` under per-scope
      KMS data keys of ``ENGRAM_DATA_KEY_ARN`` (key class ``record-scope``);
    - lexical index: ``OpenSearchLexicalIndex`` at ``ENGRAM_OPENSEARCH_ENDPOINT``, index
      ``ENGRAM_OPENSEARCH_INDEX`` (default ``engram-records``), SigV4 service
      ``ENGRAM_OPENSEARCH_SERVICE`` (``es``, the default, for a domain; ``aoss`` for
      OpenSearch Serverless);
    - admission policy: ``BuiltinAdmissionPolicy(ENGRAM_ADMISSION_MODE)`` (``auto`` | ``manual``,
      default ``auto``);
    - search cursor key: the secret ``ENGRAM_CURSOR_SECRET_ARN``, read once, here;
    - semantic channel (off by default): ``ENGRAM_SEMANTIC=local`` loads the local embedder (the
      ``semantic`` extra must be in the layer; ``ConfigurationError`` otherwise), or pass
      ``embedder``; the vectors live in the lexical index's documents (OpenSearch k-NN), which
      must then also be a ``VectorIndex``. ``ENGRAM_FUSION`` = ``minmax`` (default) | ``rrf``;
    - clock: the system clock; audit: ``PowertoolsAuditSink``; clients: from ``session`` (default: a boto3 session in
      ``AWS_REGION``), created on first use.

    Every dependency may be passed instead (tests, local endpoints); a variable is only required
    when the dependency it configures is built here. ``ENGRAM_TENANT_ID`` and
    ``ENGRAM_RETENTION_CEILING_S`` bind the contexts, not the engine (``HostBinding``). Raises
    ``ConfigurationError`` for a missing or invalid variable or an unreadable secret.
    """
    sessions: list[Session] = [session] if session is not None else []

    def session_of_env() -> Session:
        if not sessions:
            sessions.append(aws_session(env))
        return sessions[0]

    def client(name: str) -> Any:  # every client with the one policy of ``client_config``
        return session_of_env().client(name, config=client_config())  # type: ignore[call-overload]

    mode = admission_mode(env)
    if (store is None or vault is None or record_keys is None) and dynamodb_client is None:
        dynamodb_client = client("dynamodb")

    if store is None:
        from ..adapters.aws.dynamo_store import DynamoStore

        store = DynamoStore(
            table_name=required(env, "ENGRAM_TABLE"),
            bucket=required(env, "ENGRAM_BLOB_BUCKET"),
            dynamodb=dynamodb_client,
            s3=s3_client if s3_client is not None else client("s3"),
            session=session_of_env(),
        )
    if vault is None:
        from ..adapters.aws.kms_vault import KmsVault

        try:
            vault = KmsVault(
                kms_key_id=required(env, "ENGRAM_DATA_KEY_ARN"),
                key_table=required(env, "ENGRAM_KEY_TABLE"),
                kms_client=kms_client if kms_client is not None else client("kms"),
                dynamodb_client=dynamodb_client,
                session=session_of_env(),
            )
        except ValueError as exc:
            raise ConfigurationError("ENGRAM_DATA_KEY_ARN must be a KMS key ARN") from exc
    if record_keys is None:
        from ..adapters.aws.kms_record_keys import KmsRecordKeys

        record_keys = KmsRecordKeys(
            kms_key_id=required(env, "ENGRAM_DATA_KEY_ARN"),
            key_table=required(env, "ENGRAM_KEY_TABLE"),
            kms_client=kms_client if kms_client is not None else client("kms"),
            dynamodb_client=dynamodb_client,
            session=session_of_env(),
        )
    if lexical_index is None:
        from ..adapters.aws.opensearch_index import OpenSearchLexicalIndex

        service = env.get("ENGRAM_OPENSEARCH_SERVICE", "").strip() or "es"
        if service not in ("es", "aoss"):
            raise ConfigurationError("ENGRAM_OPENSEARCH_SERVICE must be 'es' or 'aoss'")
        index_name = env.get("ENGRAM_OPENSEARCH_INDEX", "").strip() or DEFAULT_OPENSEARCH_INDEX
        try:
            if opensearch_client is not None:
                lexical_index = OpenSearchLexicalIndex(
                    client=opensearch_client, index_name=index_name
                )
            else:
                lexical_index = OpenSearchLexicalIndex(
                    endpoint=required(env, "ENGRAM_OPENSEARCH_ENDPOINT"),
                    region=session_of_env().region_name,
                    index_name=index_name,
                    session=session_of_env(),
                    service=service,
                )
        except ValueError as exc:
            raise ConfigurationError(
                "ENGRAM_OPENSEARCH_ENDPOINT must be https://host[:port] and "
                "ENGRAM_OPENSEARCH_INDEX a lowercase index name"
            ) from exc
    if admission_policy is None:
        from ..policy.builtin import BuiltinAdmissionPolicy

        admission_policy = BuiltinAdmissionPolicy(mode)
    if secrets_client is None:
        secrets_client = client("secretsmanager")
    cursor_key = read_cursor_key(secrets_client, required(env, "ENGRAM_CURSOR_SECRET_ARN"))
    if clock is None:
        from ..adapters.local.clock import SystemClock

        clock = SystemClock()
    if audit is None:
        from ..observability import PowertoolsAuditSink

        audit = PowertoolsAuditSink()
    fused = fusion(env)
    if embedder is None and semantic(env):
        from ..adapters.local.embedder import SemanticExtraMissing, load_local_embedder

        try:
            embedder = load_local_embedder()
        except SemanticExtraMissing as exc:
            raise ConfigurationError(f"ENGRAM_SEMANTIC is 'local' but {exc}") from None
    vector_index: VectorIndex | None = None
    if embedder is not None:
        if not callable(getattr(lexical_index, "nearest", None)):
            raise ConfigurationError("ENGRAM_SEMANTIC needs an index that stores vectors")
        vector_index = cast("VectorIndex", lexical_index)
    return Engine(
        store=store,
        vault=vault,
        record_keys=record_keys,
        lexical_index=lexical_index,
        admission_policy=admission_policy,
        clock=clock,
        audit=audit,
        settings=EngineSettings(cursor_key=cursor_key, fusion=fused),
        embedder=embedder,
        vector_index=vector_index,
    )


def build_execution_gate(tool: str, env: Mapping[str, str]) -> ExecutionGate:
    """The gate of ``tool`` (withdraw | forget) from the environment the SAM template sets.

    ``ENGRAM_WITHDRAW_STATE_MACHINE_ARN`` / ``ENGRAM_FORGET_STATE_MACHINE_ARN`` (the function's
    own machine), ``ENGRAM_TABLE`` (parked approvals) and ``ENGRAM_APPROVAL_BASE_URL`` (the
    approval page's origin, e.g. the HTTP API's URL); clients in ``AWS_REGION``.
    """
    from .approvals import ApprovalStore
    from .execution_gate import ExecutionGate

    machine = required(env, f"ENGRAM_{tool.upper()}_STATE_MACHINE_ARN")
    table = required(env, "ENGRAM_TABLE")
    base_url = required(env, "ENGRAM_APPROVAL_BASE_URL")
    if not base_url.startswith("https://"):
        raise ConfigurationError("ENGRAM_APPROVAL_BASE_URL must be an https:// URL")
    session = aws_session(env)
    config = client_config()
    return ExecutionGate(
        sfn=session.client("stepfunctions", config=config),
        approvals=ApprovalStore(session.client("dynamodb", config=config), table),
        state_machine_arn=machine,
        approval_base_url=base_url,
    )
