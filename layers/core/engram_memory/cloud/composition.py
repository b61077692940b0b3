"""The composition root of the cloud deployment: the engine of one tenant's functions.

``build_engine`` wires the engine from the environment the SAM template sets;
``build_execution_gate`` the Step Functions gate of withdraw and forget. Nothing here opens a
client or reads the environment when imported: boto3, the AWS Encryption SDK and opensearch-py
are imported inside, called on a function's first invocation (the cold-start singleton).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from engram_memory.engine.ports import (
    AuditSink,
    Clock,
    Embedder,
    LexicalIndex,
    RecordKeys,
    Store,
    Vault,
    VectorIndex,
)
from engram_memory.engine.service import Engine, EngineSettings

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_kms.client import KMSClient
    from mypy_boto3_s3.client import S3Client

    from engram_memory.cloud.execution_gate import ExecutionGate
    from engram_memory.engine.ports import AdmissionPolicy

from engram_memory.cloud.settings import (
    ConfigurationError,
    EngineEnvironment,
    GateSettings,
    client_config,
    gate_settings,
    read_cursor_key,
)

# The tools whose human confirmation and commit run in a Step Functions execution.
GATED_TOOLS: Final = frozenset({"withdraw", "forget"})


def build_engine(
    settings: EngineEnvironment | Mapping[str, str] = os.environ,
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
    """The cloud engine of one tenant: ``settings`` (an ``EngineEnvironment``, or the
    environment the SAM template sets, parsed here: one model, one line per bad variable) in,
    engine out. The store, vault and record keys are ``_canonical_adapters``', the index
    ``_lexical_index``'s, the semantic channel ``_semantic_channel``'s; the admission policy is
    ``BuiltinAdmissionPolicy(ENGRAM_ADMISSION_MODE)`` (``auto`` | ``manual``, default ``auto``),
    the search cursor key the secret ``ENGRAM_CURSOR_SECRET_ARN`` (read once, here), the fusion
    ``ENGRAM_FUSION`` (``minmax``, the default, | ``rrf``), the clock the system's, the audit
    ``PowertoolsAuditSink``; clients come from ``session`` (default: a boto3 session in
    ``AWS_REGION``), created on first use. Every dependency may be passed instead (tests, local
    endpoints). ``ENGRAM_TENANT_ID`` and ``ENGRAM_RETENTION_CEILING_S`` bind the contexts, not
    the engine (``settings.binding()``). Raises ``ConfigurationError`` for a missing or invalid
    variable or an unreadable secret.
    """
    aws = _Aws(settings, session)
    store, vault, record_keys = _canonical_adapters(
        aws, store, vault, record_keys, dynamodb_client, s3_client, kms_client
    )
    if lexical_index is None:
        lexical_index = _lexical_index(aws, opensearch_client)
    if admission_policy is None:
        from engram_memory.policy.builtin import BuiltinAdmissionPolicy

        admission_policy = BuiltinAdmissionPolicy(aws.env.admission_mode)
    if secrets_client is None:
        secrets_client = aws.client("secretsmanager")
    cursor_key = read_cursor_key(secrets_client, aws.env.cursor_secret_arn)
    clock, audit = _clock_and_audit(clock, audit)
    embedder, vector_index = _semantic_channel(aws.env, embedder, lexical_index)
    return Engine(
        store=store,
        vault=vault,
        record_keys=record_keys,
        lexical_index=lexical_index,
        admission_policy=admission_policy,
        clock=clock,
        audit=audit,
        settings=EngineSettings(
            cursor_key=cursor_key, fusion=aws.env.fusion, time_aware=aws.env.time_aware
        ),
        embedder=embedder,
        vector_index=vector_index,
    )


class _Aws:
    """The settings and the boto3 session one engine is wired from. The session is made on
    first use, so a caller passing every client never needs credentials or a region."""

    def __init__(
        self, settings: EngineEnvironment | Mapping[str, str], session: Session | None
    ) -> None:
        self.env = (
            settings
            if isinstance(settings, EngineEnvironment)
            else EngineEnvironment.from_env(settings)
        )
        self._session = session

    def session(self) -> Session:
        if self._session is None:
            self._session = self.env.session()
        return self._session

    def client(self, name: str) -> Any:  # every client with the one policy of ``client_config``
        return self.session().client(name, config=client_config())  # type: ignore[call-overload]


def _canonical_adapters(
    aws: _Aws,
    store: Store | None,
    vault: Vault | None,
    record_keys: RecordKeys | None,
    dynamodb_client: DynamoDBClient | None,
    s3_client: S3Client | None,
    kms_client: KMSClient | None,
) -> tuple[Store, Vault, RecordKeys]:
    """The ones not passed of: the store, ``DynamoStore`` over ``ENGRAM_TABLE`` with large
    attributes in ``ENGRAM_BLOB_BUCKET``; the vault, ``KmsVault`` under the key ARN
    ``ENGRAM_DATA_KEY_ARN``, data keys in ``ENGRAM_KEY_TABLE``; the record keys,
    ``KmsRecordKeys``, per-record keys in ``ENGRAM_KEY_TABLE`` under per-scope KMS data keys of
    ``ENGRAM_DATA_KEY_ARN`` (key class ``record-scope``)."""
    env = aws.env
    if (store is None or vault is None or record_keys is None) and dynamodb_client is None:
        dynamodb_client = aws.client("dynamodb")
    if store is None:
        from engram_memory.adapters.aws.dynamo_store import DynamoStore

        store = DynamoStore(
            table_name=env.table,
            bucket=env.blob_bucket,
            dynamodb=dynamodb_client,
            s3=s3_client if s3_client is not None else aws.client("s3"),
            session=aws.session(),
        )

    def key_table() -> dict[str, Any]:  # each adapter its own KMS client, as when built apart
        return {
            "kms_key_id": env.data_key_arn,
            "key_table": env.key_table,
            "kms_client": kms_client if kms_client is not None else aws.client("kms"),
            "dynamodb_client": dynamodb_client,
            "session": aws.session(),
        }

    if vault is None:
        from engram_memory.adapters.aws.kms_vault import KmsVault

        try:
            vault = KmsVault(**key_table())
        except ValueError as exc:
            raise ConfigurationError("ENGRAM_DATA_KEY_ARN must be a KMS key ARN") from exc
    if record_keys is None:
        from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys

        record_keys = KmsRecordKeys(**key_table())
    return store, vault, record_keys


def _lexical_index(aws: _Aws, opensearch_client: Any) -> LexicalIndex:
    """``OpenSearchLexicalIndex`` at ``ENGRAM_OPENSEARCH_ENDPOINT`` (or over
    ``opensearch_client``), index ``ENGRAM_OPENSEARCH_INDEX`` (default ``engram-records``), SigV4
    service ``ENGRAM_OPENSEARCH_SERVICE`` (``es``, the default, for a domain; ``aoss`` for
    OpenSearch Serverless)."""
    from engram_memory.adapters.aws.opensearch_index import OpenSearchLexicalIndex

    index_name = aws.env.opensearch_index
    try:
        if opensearch_client is not None:
            return OpenSearchLexicalIndex(client=opensearch_client, index_name=index_name)
        return OpenSearchLexicalIndex(
            endpoint=aws.env.opensearch_endpoint,
            region=aws.session().region_name,
            index_name=index_name,
            session=aws.session(),
            service=aws.env.opensearch_service,
        )
    except ValueError as exc:
        raise ConfigurationError(
            "ENGRAM_OPENSEARCH_ENDPOINT must be https://host[:port] and "
            "ENGRAM_OPENSEARCH_INDEX a lowercase index name"
        ) from exc


def _clock_and_audit(clock: Clock | None, audit: AuditSink | None) -> tuple[Clock, AuditSink]:
    if clock is None:
        from engram_memory.adapters.local.clock import SystemClock

        clock = SystemClock()
    if audit is None:
        from engram_memory.cloud.observability import PowertoolsAuditSink

        audit = PowertoolsAuditSink()
    return clock, audit


def _semantic_channel(
    env: EngineEnvironment, embedder: Embedder | None, lexical_index: LexicalIndex
) -> tuple[Embedder | None, VectorIndex | None]:
    """The semantic channel, off by default: ``ENGRAM_SEMANTIC=local`` loads the local embedder
    (the ``semantic`` extra must be in the layer; ``ConfigurationError`` otherwise), or the
    caller passes ``embedder``; the vectors live in the lexical index's documents (OpenSearch
    k-NN), which must then also be a ``VectorIndex``."""
    if embedder is None and env.semantic == "local":
        embedder = _configured_embedder(env)
    elif env.embedding_model_dir is not None:
        raise ConfigurationError("ENGRAM_EMBEDDING_MODEL_DIR needs ENGRAM_SEMANTIC=local")
    if embedder is None:
        return None, None
    if not callable(getattr(lexical_index, "nearest", None)):
        raise ConfigurationError("ENGRAM_SEMANTIC needs an index that stores vectors")
    return embedder, cast("VectorIndex", lexical_index)


def build_execution_gate(
    tool: str, settings: GateSettings | Mapping[str, str] = os.environ
) -> ExecutionGate:
    """The gate of ``tool`` (withdraw | forget): ``GateSettings`` in (or the environment:
    ``ENGRAM_WITHDRAW_STATE_MACHINE_ARN`` / ``ENGRAM_FORGET_STATE_MACHINE_ARN``, the function's
    own machine; ``ENGRAM_TABLE``, parked approvals; ``ENGRAM_APPROVAL_BASE_URL``, the approval
    page's https origin), gate out; clients in ``AWS_REGION``."""
    from engram_memory.cloud.approvals import ApprovalStore
    from engram_memory.cloud.execution_gate import ExecutionGate

    gate = settings if isinstance(settings, GateSettings) else gate_settings(tool, settings)
    session = gate.session()
    config = client_config()
    return ExecutionGate(
        sfn=session.client("stepfunctions", config=config),
        approvals=ApprovalStore(session.client("dynamodb", config=config), gate.table),
        state_machine_arn=gate.state_machine_arn,
        approval_base_url=gate.approval_base_url,
    )


def _configured_embedder(env: EngineEnvironment) -> Embedder:
    """The shipped MiniLM, or the model in ``ENGRAM_EMBEDDING_MODEL_DIR`` pinned by its sha256
    (the OpenSearch mapping's ``knn_vector`` has a fixed width, so the model must match it)."""
    from engram_memory.adapters.aws.opensearch_index import EMBEDDING_DIMENSIONS
    from engram_memory.adapters.local.embedder import (
        EmbeddingModelError,
        OnnxSentenceEmbedder,
        SemanticExtraMissing,
        load_local_embedder,
    )

    try:
        if env.embedding_model_dir is None:
            return load_local_embedder()
        if env.embedding_model_sha256 is None:
            raise ConfigurationError(
                "ENGRAM_EMBEDDING_MODEL_SHA256 is not set: set it to the sha256 of"
                " ENGRAM_EMBEDDING_MODEL_DIR's model.onnx"
            )
        embedder = OnnxSentenceEmbedder(
            Path(env.embedding_model_dir), sha256=env.embedding_model_sha256
        )
    except SemanticExtraMissing as exc:
        raise ConfigurationError(f"ENGRAM_SEMANTIC is 'local' but {exc}") from None
    except EmbeddingModelError as exc:
        raise ConfigurationError(f"ENGRAM_EMBEDDING_MODEL_DIR: {exc}") from None
    if embedder.dimensions != EMBEDDING_DIMENSIONS:
        raise ConfigurationError(
            f"ENGRAM_EMBEDDING_MODEL_DIR: the model has {embedder.dimensions} dimensions but the"
            f" OpenSearch mapping stores {EMBEDDING_DIMENSIONS}: use a {EMBEDDING_DIMENSIONS}-"
            "dimensional model"
        )
    return embedder
