"""The AWS adapter set for the behavioural suite: DynamoDB, S3 and KMS on moto, an in-memory index.

``aws_harness`` builds the engine over ``DynamoStore`` and ``KmsVault`` (moto) and
``MemoryLexicalIndex``, an honest stand-in for the OpenSearch projection: it is not
maintained by the store, so the engine's deferred-projection path (upserts after the commit,
drops through the outbox) runs exactly as in the cloud, and it ranks with the same BM25F profile
as the embedded FTS5 index.

Faults are injected with botocore's own event hooks on the store's clients (``inject``), the
same seam a real network failure goes through.
"""

from __future__ import annotations

import json
import math
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber

from engram_memory.adapters.aws.dynamo_store import DynamoStore, create_bucket, create_tables
from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys
from engram_memory.adapters.aws.kms_vault import KmsVault, create_key_table
from engram_memory.adapters.local.audit import MemoryAuditLog
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import Embedder, IndexHit, IndexUnavailable, ProjectionChange
from engram_memory.engine.service import Engine, EngineSettings

from engram_testing import FakeClock, Harness, ScriptedConfirmations

REGION = "us-east-1"
TABLE = "engram-canonical"
BUCKET = "engram-blobs"
KEY_TABLE = "engram-keys"


class MemoryLexicalIndex:
    """The ``LexicalIndex`` port in memory: per-scope BM25F, the contract's ranking profile.

    Scores like SQLite FTS5's ``bm25()`` with column weights: per query term, the term frequency
    is the weighted sum of its occurrences over the fields of ``ProjectionDoc.fields``
    (``lexical.FIELD_WEIGHTS``), document length is the whole document's term count, the average
    length and IDF (``log((N - n + 0.5) / (n + 0.5))``, floored at 1e-6) are those of the scope.
    Like the OpenSearch index, it also holds each document's vector (``ProjectionDoc.vector``)
    and serves the ``VectorIndex`` port with exact cosine similarity.
    Set ``available = False`` to make every call raise ``IndexUnavailable``, ``writable = False``
    to make only writes raise it (a domain that answers queries and refuses writes: the upsert
    after a commit fails, the admission's neighbours are still found).
    """

    name = "lexical"
    maintained_by_store = False
    scoring_formula_ref = lexical.SCORING_FORMULA_REF  # the same BM25F as FTS5
    vector_formula_ref = "cosine:exact-scan,float32"  # stored as float32, as OpenSearch does

    def __init__(self) -> None:
        self.available = True
        self.writable = True
        self._docs: dict[Scope, dict[str, dict[str, list[str]]]] = {}
        self._vectors: dict[Scope, dict[str, tuple[float, ...]]] = {}
        self._lock = threading.Lock()

    def _check(self) -> None:
        if not self.available:
            raise IndexUnavailable("the lexical index is unavailable")

    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        self._check()
        with self._lock:
            docs = {rid: dict(fields) for rid, fields in self._docs.get(scope, {}).items()}
        wanted = list(dict.fromkeys(terms))
        if not docs or not wanted or depth <= 0:
            return []
        total = len(docs)
        lengths = {
            rid: sum(len(words) for words in fields.values()) for rid, fields in docs.items()
        }
        average = sum(lengths.values()) / total
        idf: dict[str, float] = {}
        for term in wanted:
            having = sum(1 for fields in docs.values() if any(term in w for w in fields.values()))
            value = math.log((total - having + 0.5) / (having + 0.5))
            idf[term] = value if value > 0 else 1e-6
        k1, b = lexical.BM25_K1, lexical.BM25_B
        hits: list[IndexHit] = []
        for rid, fields in docs.items():
            score, matched = 0.0, False
            norm = k1 * (1 - b + b * lengths[rid] / average) if average else k1
            for term in wanted:
                frequency = sum(
                    weight * fields.get(name, []).count(term)
                    for name, weight in lexical.FIELD_WEIGHTS.items()
                )
                if frequency:  # every weight is positive: the document matches the term
                    matched = True
                    score += idf[term] * (frequency * (k1 + 1)) / (frequency + norm)
            if matched:
                hits.append(IndexHit(rid, score))
        hits.sort(key=lambda hit: (-hit.score, hit.record_id))
        return hits[:depth]

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        self._check()
        if not self.writable:
            raise IndexUnavailable("the lexical index refuses writes")
        with self._lock:
            docs = self._docs.setdefault(scope, {})
            vectors = self._vectors.setdefault(scope, {})
            if change.upsert is not None:
                docs[change.upsert.record_id] = {
                    name: change.upsert.fields.get(name, "").split()
                    for name in lexical.FIELD_WEIGHTS
                }
                vectors.pop(change.upsert.record_id, None)
                if change.upsert.vector is not None:
                    vectors[change.upsert.record_id] = tuple(array("f", change.upsert.vector))
            if change.delete_record_id is not None:
                docs.pop(change.delete_record_id, None)
                vectors.pop(change.delete_record_id, None)

    def nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        self._check()
        with self._lock:
            vectors = dict(self._vectors.get(scope, {}))
        hits = [
            IndexHit(rid, math.fsum(a * b for a, b in zip(vector, stored, strict=True)))
            for rid, stored in vectors.items()
        ]
        hits.sort(key=lambda hit: (-hit.score, hit.record_id))
        return hits[: max(depth, 0)]

    def similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        scored = {h.record_id: h.score for h in self.nearest(scope, vector, 10**9)}
        return {rid: scored[rid] for rid in record_ids if rid in scored}

    def score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        hits = self.nearest(scope, vector, len(self._vectors.get(scope, {})))
        return hits[min(rank, len(hits)) - 1].score if hits and rank > 0 else None

    def has_vector(self, scope: Scope, record_id: str) -> bool:
        self._check()
        with self._lock:
            return record_id in self._vectors.get(scope, {})

    def contains(self, scope: Scope, record_id: str) -> bool:
        self._check()
        with self._lock:
            return record_id in self._docs.get(scope, {})


# --------------------------------------------------------------------------------------------
# moto
# --------------------------------------------------------------------------------------------

_MOTO_LOCK = threading.RLock()


@contextmanager
def moto_aws(*, execute_state_machines: bool = False) -> Iterator[None]:
    """moto with its requests serialized.

    moto applies a transaction item by item and rolls back by restoring a copy of the table, so
    two threads inside it at once can lose each other's writes; real DynamoDB transactions are
    serializable. One lock around moto's request dispatch restores that isolation.
    ``execute_state_machines`` makes moto run the ASL of every execution (in its own thread).
    """
    original = BotocoreStubber.process_request

    def serialized(self: BotocoreStubber, request: Any) -> Any:
        with _MOTO_LOCK:
            return original(self, request)

    config: Any = {"stepfunctions": {"execute_state_machine": execute_state_machines}}
    with mock_aws(config=config), mock.patch.object(BotocoreStubber, "process_request", serialized):
        yield


TENANT = "dev"  # the sample events' tenant: the default stack's TenantId


def client_error(code: str, status: int, operation: str, message: str) -> ClientError:
    """What botocore raises for an AWS error response."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {
                "HTTPStatusCode": status,
                "HTTPHeaders": {},
                "HostId": "",
                "RequestId": "test",
                "RetryAttempts": 0,
            },
        },
        operation,
    )


@dataclass
class FakeLambdaContext:
    """The Lambda context a handler reads (name, request id, remaining time)."""

    function_name: str = "engram-memory-dev-tool"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = (
        "arn:aws:lambda:us-east-1:123456789012:function:engram-memory-dev-tool"
    )
    aws_request_id: str = "5a3b2c1d-0e9f-4a8b-9c7d-6e5f4a3b2c1d"
    log_stream_name: str = "2026/12/03/[$LATEST]0123456789abcdef"
    remaining_ms: int = 30_000

    @classmethod
    def of(
        cls, function_name: str, *, remaining_ms: int = 30_000, memory_limit_in_mb: int = 512
    ) -> FakeLambdaContext:
        """The context of the function with that name (and the ARN to match)."""
        arn = f"arn:aws:lambda:{REGION}:123456789012:function:{function_name}"
        return cls(
            function_name=function_name,
            invoked_function_arn=arn,
            memory_limit_in_mb=memory_limit_in_mb,
            remaining_ms=remaining_ms,
        )

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def tenant_resources(
    session: boto3.session.Session, endpoint_url: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """One tenant's tables, bucket, data key and cursor secret on moto (inside ``moto_aws``, or
    on a moto server at ``endpoint_url``), with the clients that made them and the environment
    the template gives the tool functions."""
    clients: dict[str, Any] = {
        name: session.client(name, endpoint_url=endpoint_url)
        for name in ("dynamodb", "s3", "kms", "secretsmanager")
    }
    create_tables(clients["dynamodb"], TABLE)
    create_key_table(clients["dynamodb"], KEY_TABLE)
    create_bucket(clients["s3"], BUCKET, REGION)
    key_arn = clients["kms"].create_key(Description="engram dev data key")["KeyMetadata"]["Arn"]
    secret_arn = clients["secretsmanager"].create_secret(
        Name="engram-dev-cursor", SecretString="c" * 64
    )["ARN"]
    invocation_key, proof_key = (hmac_key(clients["kms"], name) for name in ("invocation", "proof"))
    env = {
        "AWS_REGION": REGION,
        "ENGRAM_TABLE": TABLE,
        "ENGRAM_KEY_TABLE": KEY_TABLE,
        "ENGRAM_BLOB_BUCKET": BUCKET,
        "ENGRAM_DATA_KEY_ARN": key_arn,
        "ENGRAM_OPENSEARCH_ENDPOINT": "https://search-engram-dev.us-east-1.es.amazonaws.com",
        "ENGRAM_OPENSEARCH_INDEX": "engram-records",
        "ENGRAM_TENANT_ID": TENANT,
        "ENGRAM_ADMISSION_MODE": "auto",
        "ENGRAM_RETENTION_CEILING_S": "2592000",
        "ENGRAM_CURSOR_SECRET_ARN": secret_arn,
        "ENGRAM_INVOCATION_KEY_ARN": invocation_key,
        "ENGRAM_APPROVAL_PROOF_KEY_ARN": proof_key,
    }
    return clients, env


def hmac_key(kms: Any, name: str) -> str:
    """A KMS HMAC key on moto (the template's ``AWS::KMS::Key`` with ``KeySpec: HMAC_256``)."""
    metadata = kms.create_key(
        Description=f"engram dev {name} key", KeySpec="HMAC_256", KeyUsage="GENERATE_VERIFY_MAC"
    )["KeyMetadata"]
    return str(metadata["Arn"])


# An invocation key held in the test (``cloud.proofs.FixedMacKey``): for tests about something
# else than the MAC, whose faults (a KMS refusal) must not meet the adapter's signature.
HELD_INVOCATION_KEY = b"held-invocation-key-for-tests-0123456789"


def held_key() -> Any:
    from engram_memory.cloud.proofs import FixedMacKey

    return FixedMacKey(HELD_INVOCATION_KEY)


def signed_with_held_key(event: Any) -> Any:
    """``event`` signed as the adapter would, with ``held_key()`` (no AWS call)."""
    return signed_with(held_key(), event)


def signed(event: Any, env: dict[str, str], kms: Any) -> Any:
    """``event`` as the MCP adapter sends it, signed under the stack's invocation key (KMS)."""
    from engram_memory.cloud.proofs import KmsMacKey

    return signed_with(KmsMacKey(kms, env["ENGRAM_INVOCATION_KEY_ARN"]), event)


def signed_with(key: Any, event: Any) -> Any:
    """``event`` as the adapter signs it (``cloud.proofs.signed_event``): the event as the model
    writes it, when it is a valid invocation; a malformed one as it is (the function refuses
    it), and not an object not at all."""
    from engram_memory.cloud.proofs import signed_event
    from engram_memory.cloud.tool_invocation import ToolInvocation

    if not isinstance(event, dict):
        return event
    with suppress(ValueError):
        event = ToolInvocation.model_validate(event).to_event()
    with suppress(ValueError):  # a malformed approval: the function refuses the event
        return signed_event(key, event)
    return event


_SESSION: list[boto3.session.Session] = []


def aws_clients() -> tuple[Any, Any]:
    """DynamoDB and S3 clients (one shared session: creating clients from it stays cheap)."""
    if not _SESSION:
        _SESSION.append(boto3.session.Session(region_name=REGION))
    session = _SESSION[0]
    return session.client("dynamodb"), session.client("s3")


def provision(*, inline_limit_bytes: int | None = None) -> DynamoStore:
    """Create the table and the bucket (inside an active moto) and a store over them."""
    dynamodb, s3 = aws_clients()
    create_tables(dynamodb, TABLE)
    create_bucket(s3, BUCKET, REGION)
    extra: dict[str, Any] = {}
    if inline_limit_bytes is not None:
        extra["inline_limit_bytes"] = inline_limit_bytes
    return DynamoStore(table_name=TABLE, bucket=BUCKET, dynamodb=dynamodb, s3=s3, **extra)


Hook = Callable[..., Any]


def inject(client: Any, event: str, hook: Hook) -> Callable[[], None]:
    """Register a botocore event hook on ``client`` (e.g. ``before-call.dynamodb.Query``).

    Returns the function that removes it. ``before-call`` hooks run before the request is sent
    (raise to fail it unsent); ``after-call`` hooks run after moto applied it (raise to lose the
    response of an applied request).
    """
    client.meta.events.register(event, hook)
    return lambda: client.meta.events.unregister(event, hook)


def aws_harness(
    tmp_path: Path, *, inline_limit_bytes: int | None = None, embedder: Embedder | None = None
) -> Harness:
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

    moto = ExitStack()
    moto.enter_context(moto_aws())
    try:
        store = provision(inline_limit_bytes=inline_limit_bytes)
        clock = FakeClock()
        kms = boto3.client("kms", region_name=REGION)
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        key_arn = kms.create_key(Description="engram data keys")["KeyMetadata"]["Arn"]
        create_key_table(dynamodb, KEY_TABLE)
        vault = KmsVault(
            kms_key_id=key_arn, key_table=KEY_TABLE, kms_client=kms, dynamodb_client=dynamodb
        )
        record_keys = KmsRecordKeys(
            kms_key_id=key_arn, key_table=KEY_TABLE, kms_client=kms, dynamodb_client=dynamodb
        )
        index = MemoryLexicalIndex()
        confirmations = ScriptedConfirmations(clock)
        audit = MemoryAuditLog()
        engine = Engine(
            store=store,
            vault=vault,
            record_keys=record_keys,
            lexical_index=index,
            admission_policy=BuiltinAdmissionPolicy(),
            clock=clock,
            audit=audit,
            settings=EngineSettings(cursor_key=b"\x01" * 32),
            embedder=embedder,  # the index also serves the vectors, as OpenSearch does
        )
    except BaseException:
        moto.close()
        raise

    def held_keys() -> list[bytes]:
        return _held_kms_keys(store, vault, dynamodb)

    parts = (engine, store, vault, record_keys, index, clock, confirmations, audit)
    return Harness(*parts, closers=[moto.close], held_keys=held_keys)


def another_engine(harness: Harness, **settings: Any) -> Engine:
    """A second engine over the harness's tables: another Lambda instance of the stack (its
    in-process scope lock does not serialize it against the first)."""
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

    return Engine(
        store=harness.store,
        vault=harness.vault,
        record_keys=harness.record_keys,
        lexical_index=harness.index,
        admission_policy=BuiltinAdmissionPolicy(),
        clock=harness.clock,
        audit=harness.audit,
        settings=EngineSettings(cursor_key=b"\x01" * 32, **settings),
    )


def _held_kms_keys(store: DynamoStore, vault: KmsVault, dynamodb: Any) -> list[bytes]:
    """Every key the cloud system holds: each wrapped item, and each data key KMS will unwrap."""
    from engram_memory.adapters.aws.kms_vault import _wrap_context

    candidates = [
        (Scope(fields["tenant_id"], fields["workspace_id"]), fields["candidate_id"])
        for fields in map(dict, store.table_snapshot()["items"])
        if fields.get("kind") == "candidate"
    ]
    keys: list[bytes] = []
    for item in dynamodb.scan(TableName=KEY_TABLE)["Items"]:
        key_ref, wrapped = item["key_ref"]["S"], bytes(item["wrapped"]["B"])
        keys.append(wrapped[:32])
        for scope, candidate_id in candidates:
            try:
                keys.append(vault._unwrap(wrapped, _wrap_context(key_ref, scope, candidate_id)))
            except Exception:  # noqa: S112 - wrong binding: not this item's key
                continue
    return keys


@pytest.fixture
def aws(tmp_path: Path) -> Iterator[Harness]:
    """The engine over the AWS adapter set (DynamoDB, S3 and KMS on moto); integration's fixture."""
    harness = aws_harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


# --------------------------------------------------------------------------------------------
# template.yaml as a stack in moto's CloudFormation
# --------------------------------------------------------------------------------------------

ACCOUNT = "123456789012"  # moto's
STACK_PARAMETERS: dict[str, str] = {
    "TenantId": TENANT,
    "IssuerUrl": "https://issuer.example.com",
    "Audience": "https://memory.example.com/mcp",
    "ApprovalAudience": "engram-approvals",
    "KeyAdminRoleArn": f"arn:aws:iam::{ACCOUNT}:role/engram-key-admin",
    "DeployRoleArn": f"arn:aws:iam::{ACCOUNT}:role/engram-deployer",
    # moto has no OpenSearch domains: the stack names an existing one (OpenSearchMode=existing,
    # the template's own option), whose endpoint the operator's plane only hands to the engine
    "OpenSearchMode": "existing",
    "ExistingOpenSearchEndpoint": "https://search-engram-ops.us-east-1.es.amazonaws.com",
    "ExistingOpenSearchDomainName": "engram-ops",
    # a shared domain needs the role its owner mapped to security_manager (the template's rule)
    "ExistingOpenSearchSecurityRoleName": "engram-opensearch-security-manager",
}


@dataclass(frozen=True)
class MotoTemplate:
    """The SAM-translated template.yaml as moto's CloudFormation can create it: the resources
    the parameters deploy, less those moto cannot create and whatever refers to them."""

    body: dict[str, Any]  # what create_stack receives
    deployed: dict[str, dict[str, Any]]  # what CloudFormation would create (conditions decided)
    outputs: dict[str, dict[str, Any]]  # the outputs it would report
    removed: dict[str, str]  # logical id -> why moto cannot create it
    removed_outputs: frozenset[str]


def _moto_models() -> dict[str, Any]:
    """moto's CloudFormation resource types, with the two this module teaches it."""
    from moto.cloudformation import parsing

    _teach_moto()
    return parsing.get_model_map()


def moto_lacks(kind: str) -> str | None:
    """Why moto's CloudFormation cannot create a resource of this type (None: it can)."""
    if kind.startswith("Custom::"):
        return "custom resource: its Lambda runs on create (moto runs Lambda code only in Docker)"
    if kind not in _moto_models():
        return f"moto's CloudFormation has no {kind}"
    return None


def _depends_on(body: dict[str, Any]) -> set[str]:
    depends = body.get("DependsOn", [])
    return {depends} if isinstance(depends, str) else set(depends)


@cache
def _translated() -> str:
    from scripts.cloud_template import ROOT, translate

    return json.dumps(translate(ROOT / "template.yaml"))


def moto_template(**given: str) -> MotoTemplate:
    """template.yaml, SAM-translated as ``sam deploy`` hands it over, for the parameter values
    ``given`` (conditions decided), less what moto's CloudFormation cannot create."""
    from scripts.cloud_template import deployed, references

    translated = json.loads(_translated())
    resources = deployed(translated, **given)
    removed = {name: why for name, body in resources.items() if (why := moto_lacks(body["Type"]))}
    while True:  # then whatever refers to a removed resource, until nothing more goes
        more = {
            name: f"refers to {min(named)}"
            for name, body in resources.items()
            if name not in removed
            and (named := (references(body) | _depends_on(body)) & removed.keys())
        }
        if not more:
            break
        removed |= more
    outputs = deployed(translated, section="Outputs", **given)
    gone = frozenset(name for name, body in outputs.items() if references(body) & removed.keys())
    body = {
        "AWSTemplateFormatVersion": translated["AWSTemplateFormatVersion"],
        "Parameters": translated["Parameters"],
        "Resources": {n: decided(r) for n, r in resources.items() if n not in removed},
        "Outputs": {n: decided(o) for n, o in outputs.items() if n not in gone},
    }
    return MotoTemplate(body, resources, outputs, removed, gone)


def decided(body: dict[str, Any]) -> dict[str, Any]:
    """A resource or output once its condition held: without the ``Condition`` key."""
    return {key: value for key, value in body.items() if key != "Condition"}


def create_template_stack(session: boto3.session.Session, name: str, **given: str) -> MotoTemplate:
    """Create stack ``name`` from template.yaml in moto's CloudFormation (inside ``moto_aws``),
    with STACK_PARAMETERS and ``given``. The functions' and the layer's packages are
    placeholders in the packaging bucket (moto stores Lambda code, it never runs it here)."""
    from scripts.cloud_template import PACKAGE_BUCKET

    parameters = {**STACK_PARAMETERS, **given}
    template = moto_template(**parameters)
    s3 = session.client("s3")
    # one per account in moto (S3's names are global): the first stack made it
    with suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        create_bucket(s3, PACKAGE_BUCKET, str(session.region_name))
    for body in template.body["Resources"].values():
        package = body["Properties"].get("Code") or body["Properties"].get("Content") or {}
        if "S3Key" in package:
            s3.put_object(Bucket=PACKAGE_BUCKET, Key=package["S3Key"], Body=_PLACEHOLDER_ZIP)
    session.client("cloudformation").create_stack(
        StackName=name,
        TemplateBody=json.dumps(template.body),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    )
    return template


def _placeholder_zip() -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "# sam package uploads the build here; moto never runs it\n")
    return buffer.getvalue()


_PLACEHOLDER_ZIP = _placeholder_zip()


class _Created:
    """A resource type taught to moto's CloudFormation: ``TYPE`` made by ``make`` (properties,
    account, region -> physical id, what ``Ref`` answers), named by its ``NAME`` property."""

    TYPE: ClassVar[str]
    NAME: ClassVar[str]

    def __init__(self, physical_id: str) -> None:
        self.physical_id = physical_id

    @property
    def physical_resource_id(self) -> str:
        return self.physical_id

    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.TYPE

    @classmethod
    def cloudformation_name_type(cls) -> str:
        return cls.NAME

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @staticmethod
    def make(properties: dict[str, Any], account_id: str, region_name: str) -> str:
        raise NotImplementedError

    @classmethod
    def create_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str,
        **kwargs: Any,
    ) -> _Created:  # fmt: skip
        properties = {"Name": resource_name, **cloudformation_json["Properties"]}
        return cls(cls.make(properties, account_id, region_name))


def _make_secret(properties: dict[str, Any], account_id: str, region_name: str) -> str:
    from moto.secretsmanager.models import secretsmanager_backends

    backend = secretsmanager_backends[account_id][region_name]
    generate = properties.get("GenerateSecretString", {})
    value = (
        properties.get("SecretString")
        or json.loads(
            backend.get_random_password(
                password_length=int(generate.get("PasswordLength", 32)),
                exclude_characters=generate.get("ExcludeCharacters", ""),
                exclude_numbers=False,
                exclude_punctuation=bool(generate.get("ExcludePunctuation", False)),
                exclude_uppercase=False,
                exclude_lowercase=False,
                include_space=bool(generate.get("IncludeSpace", False)),
                require_each_included_type=False,
            )
        )["RandomPassword"]
    )
    created = backend.create_secret(
        name=properties["Name"],
        secret_string=value,
        secret_binary=None,
        description=properties.get("Description"),
        tags=properties.get("Tags"),
        kms_key_id=properties.get("KmsKeyId"),
        client_request_token=None,
        replica_regions=[],
        force_overwrite=False,
    )
    return str(json.loads(created)["ARN"])


def _put_role_policy(properties: dict[str, Any], account_id: str, region_name: str) -> str:
    from moto.iam.models import iam_backends

    iam_backends[account_id]["aws"].put_role_policy(
        properties["RoleName"], properties["PolicyName"], json.dumps(properties["PolicyDocument"])
    )
    return str(properties["PolicyName"])


@cache
def _teach_moto() -> None:
    """Two resource types moto's CloudFormation lacks, taught to it through moto's own
    backends: ``AWS::SecretsManager::Secret`` (the cursor secret is what the operator's plane
    reads) and ``AWS::IAM::RolePolicy`` (every function DependsOn its role's policy). moto
    registers the direct subclasses of ``CloudFormationModel``, tracked per service (the
    ``__module__``)."""
    from moto.cloudformation import parsing
    from moto.core.common_models import CloudFormationModel

    class CfnSecret(_Created, CloudFormationModel):
        __module__ = "moto.secretsmanager.engram_testing"
        TYPE, NAME, make = "AWS::SecretsManager::Secret", "Name", staticmethod(_make_secret)

    class CfnRolePolicy(_Created, CloudFormationModel):
        __module__ = "moto.iam.engram_testing"
        TYPE, NAME, make = "AWS::IAM::RolePolicy", "PolicyName", staticmethod(_put_role_policy)

    parsing.get_model_list.cache_clear()
    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
