"""The composition root of the cloud deployment: the engine of one tenant's functions.

``build_engine`` wires the engine from the environment the SAM template sets;
``build_workflow_runs`` the Step Functions runs of withdraw and forget. Nothing here opens a
client or reads the environment when imported: boto3, the AWS Encryption SDK and opensearch-py
are imported inside, called on a function's first invocation (the cold-start singleton).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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

    from engram_memory.cloud.approval_page import ApprovalHandler, ApprovalPageParts
    from engram_memory.cloud.parked_approvals import ParkedApprovalBook
    from engram_memory.cloud.proofs import MacKey
    from engram_memory.cloud.settings import StoredRecordsSettings
    from engram_memory.cloud.workflow_runs import WorkflowRuns
    from engram_memory.engine.ports import AdmissionPolicy
    from engram_memory.mcp_surface.server import EngramMcp

from engram_memory.cloud.settings import (
    MIN_SESSION_KEY_BYTES,
    AdapterSettings,
    ApprovalSettings,
    ConfigurationError,
    EngineEnvironment,
    GateSettings,
    client_config,
    gate_settings,
    read_cursor_key,
    read_secret_versions,
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


class AwsClients:
    """The one place a client of the cloud host is made: every client from one boto3 session,
    made on first use (a caller passing every client never needs credentials or a region), with
    the one timeout and retry policy of ``client_config``.

    A session made here (``make_session``: a function's, from its settings) reports every call
    AWS refuses for want of permission (``adapters.aws.denials``, counted as ``AwsAccessDenied``
    by ``observability.record_access_denied``) from each client made from it; a session given
    (the operator's command line, a test's) is used as it is: the operator reads refusals on
    their terminal, and a metric document on stdout would corrupt the command's output."""

    def __init__(self, make_session: Callable[[], Session], session: Session | None = None) -> None:
        self._make_session = make_session
        self._session = session

    @classmethod
    def of(cls, session: Session) -> AwsClients:
        """The clients of a session already made (the operator's, a test's)."""
        return cls(lambda: session, session)

    def session(self) -> Session:
        if self._session is None:
            from engram_memory.adapters.aws.denials import watch_denials
            from engram_memory.cloud.observability import record_access_denied

            self._session = watch_denials(self._make_session(), record_access_denied)
        return self._session

    def client(
        self, name: str, *, read_timeout_s: float | None = None, retries: bool = True
    ) -> Any:
        config = (
            client_config(retries=retries)
            if read_timeout_s is None
            else client_config(read_timeout_s=read_timeout_s, retries=retries)
        )
        return self.session().client(name, config=config)  # type: ignore[call-overload]


class _Aws(AwsClients):
    """The engine's settings and the clients it is wired from."""

    def __init__(
        self, settings: EngineEnvironment | Mapping[str, str], session: Session | None
    ) -> None:
        self.env = (
            settings
            if isinstance(settings, EngineEnvironment)
            else EngineEnvironment.from_env(settings)
        )
        super().__init__(self.env.session, session)


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
        store = canonical_store(aws, env, dynamodb_client, s3_client)

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


def canonical_store(
    clients: AwsClients,
    tables: StoredRecordsSettings,
    dynamodb_client: DynamoDBClient | None = None,
    s3_client: S3Client | None = None,
) -> Store:
    """``DynamoStore`` over ``ENGRAM_TABLE``, large attributes in ``ENGRAM_BLOB_BUCKET``."""
    from engram_memory.adapters.aws.dynamo_store import DynamoStore

    return DynamoStore(
        table_name=tables.table,
        bucket=tables.blob_bucket,
        dynamodb=dynamodb_client if dynamodb_client is not None else clients.client("dynamodb"),
        s3=s3_client if s3_client is not None else clients.client("s3"),
        session=clients.session(),
    )


def mac_key(clients: AwsClients, key_arn: str) -> MacKey:
    """A KMS HMAC key of the stack (``cloud.proofs``): what the role may do with it is the
    template's."""
    from engram_memory.cloud.proofs import KmsMacKey

    return KmsMacKey(clients.client("kms"), key_arn)


def approval_store(clients: AwsClients, table: str) -> ParkedApprovalBook:
    """The parked approvals of withdraw and forget runs, in the canonical table."""
    from engram_memory.cloud.parked_approvals import ParkedApprovalBook

    return ParkedApprovalBook(clients.client("dynamodb"), table)


def build_approval_page(handler: ApprovalHandler, settings: ApprovalSettings) -> ApprovalPageParts:
    """The approval function's parts: ``ApprovalSettings`` in; what ``handler`` was given
    before its first invocation (tests: the store, Step Functions, memories, the session key,
    the identity provider's fetch and keys) is kept, the rest built here."""
    from engram_memory.cloud.approval_page import StoredMemories

    clients = AwsClients(settings.session)
    if handler.approvals is None:
        handler.approvals = approval_store(clients, settings.table)
    if handler.sfn is None:
        handler.sfn = clients.client("stepfunctions")
    if handler.memories is None:
        from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys

        dynamodb = clients.client("dynamodb")
        handler.memories = StoredMemories(
            canonical_store(clients, settings, dynamodb),
            KmsRecordKeys(
                kms_key_id=settings.data_key_arn,
                key_table=settings.key_table,
                kms_client=clients.client("kms"),
                dynamodb_client=dynamodb,
            ),
        )
    fixed = handler.session_key

    def versions() -> tuple[bytes, ...]:
        """The session secret's current version, then its previous one (after a rotation)."""
        if fixed is not None:  # a test's key
            return (fixed,)
        return read_secret_versions(
            clients.client("secretsmanager"),
            settings.session_secret_arn,
            name="approval session",
            variable="ENGRAM_APPROVAL_SESSION_SECRET_ARN",
            minimum=MIN_SESSION_KEY_BYTES,
        )

    return _approval_page_parts(handler, settings, handler.approvals, versions)


def _approval_page_parts(
    handler: ApprovalHandler,
    settings: ApprovalSettings,
    approvals: ParkedApprovalBook,
    versions: Callable[[], tuple[bytes, ...]],
) -> ApprovalPageParts:
    import hashlib
    import hmac
    from urllib.parse import urlsplit

    from engram_memory.cloud.approval_page import (
        CALLBACK_PATH,
        ApprovalPageParts,
        CloudDesk,
        https_fetch,
    )
    from engram_memory.cloud.approver_signin import (
        CookieKeys,
        OidcClient,
        PersonRule,
        SignedCookies,
    )
    from engram_memory.cloud.oidc import IssuerKeys

    # one secret, two keys: the cookies' MAC and the CSRF tokens' (never the same bytes). The
    # cookies verify under every version read; a form's CSRF token lives as long as the page.
    def cookie_keys(secrets: tuple[bytes, ...]) -> tuple[bytes, ...]:
        return tuple(hmac.new(key, b"cookies", hashlib.sha256).digest() for key in secrets)

    def clock() -> float:
        return handler.now_ms() / 1000

    held = versions()
    csrf_key = hmac.new(held[0], b"csrf", hashlib.sha256).digest()
    keys = CookieKeys(lambda: cookie_keys(versions()), clock=clock, held=cookie_keys(held))
    cookies = SignedCookies(keys, clock=clock)
    signin = OidcClient(
        issuer=settings.issuer,
        client_id=settings.client_id,
        redirect_uri=settings.base_url + CALLBACK_PATH,
        fetch=handler.fetch or https_fetch(),
        keys=handler.keys or IssuerKeys(settings.issuer),
        refused_audiences=frozenset({settings.resource_uri}),
        person=PersonRule(groups_claim=settings.groups_claim, agents_group=settings.agents_group),
        clock=clock,
    )
    assert handler.memories is not None
    if handler.proof_key is None:
        handler.proof_key = mac_key(AwsClients(settings.session), settings.approval_proof_key_arn)
    desk = CloudDesk(approvals, handler.sfn, cookies, csrf_key, handler.memories, handler.proof_key)
    origin = urlsplit(settings.base_url)
    return ApprovalPageParts(approvals, desk, cookies, signin, f"{origin.scheme}://{origin.netloc}")


def _lexical_index(aws: _Aws, opensearch_client: Any) -> LexicalIndex:
    """``OpenSearchLexicalIndex`` at ``ENGRAM_OPENSEARCH_ENDPOINT`` (or over
    ``opensearch_client``), index ``ENGRAM_OPENSEARCH_INDEX`` (default ``engram-records``; the
    template names it per tenant) with ``ENGRAM_OPENSEARCH_REPLICAS`` replicas, SigV4
    service ``ENGRAM_OPENSEARCH_SERVICE`` (``es``, the default, for a domain; ``aoss`` for
    OpenSearch Serverless); its 403s are counted as ``AwsAccessDenied``."""
    from engram_memory.adapters.aws.opensearch_index import OpenSearchLexicalIndex
    from engram_memory.cloud.observability import record_access_denied

    index_name, replicas = aws.env.opensearch_index, aws.env.opensearch_replicas
    try:
        if opensearch_client is not None:
            return OpenSearchLexicalIndex(
                client=opensearch_client,
                index_name=index_name,
                replicas=replicas,
                on_denied=record_access_denied,
            )
        return OpenSearchLexicalIndex(
            endpoint=aws.env.opensearch_endpoint,
            region=aws.session().region_name,
            index_name=index_name,
            replicas=replicas,
            session=aws.session(),
            service=aws.env.opensearch_service,
            on_denied=record_access_denied,
        )
    except ValueError as exc:
        raise ConfigurationError(
            "ENGRAM_OPENSEARCH_ENDPOINT must be https://host[:port] and "
            "ENGRAM_OPENSEARCH_INDEX a lowercase index name"
        ) from exc


def _clock_and_audit(clock: Clock | None, audit: AuditSink | None) -> tuple[Clock, AuditSink]:
    if clock is None:
        from engram_memory.adapters.clock import SystemClock

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


def build_workflow_runs(
    tool: str, settings: GateSettings | Mapping[str, str] = os.environ
) -> WorkflowRuns:
    """The runs of ``tool`` (withdraw | forget): ``GateSettings`` in (or the environment:
    ``ENGRAM_WITHDRAW_STATE_MACHINE_ARN`` / ``ENGRAM_FORGET_STATE_MACHINE_ARN``, the function's
    own machine; ``ENGRAM_TABLE``, parked approvals; ``ENGRAM_APPROVAL_BASE_URL``, the approval
    page's https origin), gate out; clients in ``AWS_REGION``."""
    from engram_memory.cloud.parked_approvals import ApprovalTopic
    from engram_memory.cloud.workflow_runs import WorkflowRuns

    gate = settings if isinstance(settings, GateSettings) else gate_settings(tool, settings)
    clients = AwsClients(gate.session)
    topic = gate.approval_topic_arn
    return WorkflowRuns(
        sfn=clients.client("stepfunctions"),
        approvals=approval_store(clients, gate.table),
        state_machine_arn=gate.state_machine_arn,
        approval_base_url=gate.approval_base_url,
        topic=ApprovalTopic(clients.client("sns"), topic) if topic else None,
    )


def build_adapter(
    settings: AdapterSettings | Mapping[str, str] = os.environ,
    *,
    session: Session | None = None,
    lambda_client: Any = None,
    secrets_client: Any = None,
    jwks: Mapping[str, Any] | None = None,
    jwks_fetcher: Callable[[str], dict[str, Any]] | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    invocation_key: MacKey | None = None,
) -> EngramMcp:
    """The MCP surface of the adapter Lambda: ``AdapterSettings`` in (or the template's
    environment, parsed here), surface out.

    Reads the issuer's discovery document and JWKS (``jwks`` / ``jwks_fetcher`` pin a static
    JWKS instead; call this once per cold start) and the request-state secret; the
    Lambda client is created on first use. Raises ``ConfigurationError``.
    """
    from engram_memory.cloud.mcp_adapter import (
        TOOL_INVOKE_TIMEOUT_S,
        LambdaToolEngine,
        host_config_of,
        request_state_key,
        token_verifier,
    )
    from engram_memory.mcp_surface.request_state import RequestStateSealer
    from engram_memory.mcp_surface.server import EngramMcp, SurfaceRuntime

    env = settings if isinstance(settings, AdapterSettings) else AdapterSettings.from_env(settings)
    clients = AwsClients(env.session, session)
    host = host_config_of(env)
    verifier = token_verifier(host, jwks, jwks_fetcher, env.audience_aliases)
    if secrets_client is None:
        secrets_client = clients.client("secretsmanager")
    sealer = RequestStateSealer(request_state_key(secrets_client, env.request_state_secret_arn))
    clock, audit = _clock_and_audit(clock, audit)

    def new_lambda_client() -> Any:
        # invocations may take the tool function's whole timeout: no retries of a slow call
        return clients.client("lambda", read_timeout_s=TOOL_INVOKE_TIMEOUT_S, retries=False)

    engine = LambdaToolEngine(
        {str(tool): name for tool, name in env.tool_functions.items()},
        clock=clock,
        audit=audit,
        lambda_client=lambda_client,
        client_factory=new_lambda_client,
        invocation_key=invocation_key or mac_key(clients, env.invocation_key_arn),
    )
    # No approval channel: a run asks, not the surface (``mcp_surface.approval_channel``).
    return EngramMcp(
        SurfaceRuntime(engine=engine, verifier=verifier, host=host, sealer=sealer, clock=clock)
    )


def _configured_embedder(env: EngineEnvironment) -> Embedder:
    """The shipped MiniLM, or the model in ``ENGRAM_EMBEDDING_MODEL_DIR`` pinned by its sha256
    (the OpenSearch mapping's ``knn_vector`` has a fixed width, so the model must match it)."""
    from engram_memory.adapters.aws.opensearch_index import EMBEDDING_DIMENSIONS
    from engram_memory.adapters.embedder import (
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
