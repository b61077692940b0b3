"""The cloud projection: the ``LexicalIndex`` and ``VectorIndex`` ports over Amazon OpenSearch.

One index (default ``engram-records``) holds the projection documents of every scope of the
deployment::

    _id  = hex SHA-256 of (tenant_id, workspace_id, record_id), length-prefixed
    body = {tenant_id, workspace_id, record_id (keyword),
            primary, decision, evidence, context, citations (text),
            embedding (knn_vector, 384), has_embedding (boolean)   -- semantic channel only}

**Semantic channel.** With an embedder, the record's vector (``ProjectionDoc.vector``) is stored
in the same document, so it is written and deleted with the lexical fields (forget drops the
whole document). ``nearest`` is an *exact* k-NN search with the k-NN plugin's scoring script
(``script_score`` / ``knn_score``, ``space_type: cosinesimil``) over the scope's documents that
have a vector: a brute-force scan, like the embedded index, so both rank the same (no
approximate HNSW recall loss; per-tenant indexes are small). The script's score is
``1 + cosine``; ``nearest`` reports ``score - 1``. Differences from the embedded scan: the
cluster computes in 32-bit floats (the embedded index stores float32 and sums in float64), so
near-equal similarities may tie or split differently (the ``record_id`` tie-break still holds).
``has_embedding`` makes ``has_vector`` a realtime GET.

The ``_id`` is scope-qualified, so a record id in one scope can never overwrite or delete the
document of the same record id in another scope. The five text fields hold the terms the engine
already analyzed (``lexical.projection_fields``), space-joined; the index tokenizes them on
whitespace only and never lowercases, stems or splits them again, and the query side does the
same. The mapping (``INDEX_BODY``, kept equal to ``infra/opensearch/index.json`` by the tests)
is strict: no dynamic fields, and the text fields are left out of ``_source`` (the index keeps
only what search needs; the canonical store holds the text).

The adapter is **not** maintained by the store (``maintained_by_store = False``): the engine
runs upserts and drops through its outbox (written in the commit's transaction). An upsert
returns only once a refresh made the document searchable (``refresh=wait_for``, at most the
index's refresh interval, 1 s by default): the engine marks the outbox item done after it, and a
search answers ``PROJECTION_STALE`` while an upsert of its scope is pending, so an admitted
record is never silently missing. Deletes and ``bulk_apply`` (reindexing) do not refresh
(``refresh=false``); ``contains`` (a realtime GET) sees writes at once. Search results are
revalidated against the canonical store by the engine, so a lagging delete never serves a
forgotten record.

Search is a ``bool`` query whose ``filter`` holds term queries on ``tenant_id`` and
``workspace_id`` (the scope is part of the query, never applied to its results) and whose
``should`` holds one ``match`` clause per field, boosted by ``lexical.FIELD_WEIGHTS``, with
``minimum_should_match: 1``; it sorts by ``_score`` descending then ``record_id`` ascending.

**Ranking differences from the embedded FTS5 index** (and from ``MemoryLexicalIndex``, the
in-memory reference that matches FTS5). The contract's profile is BM25F over the whole record
with per-scope statistics; OpenSearch cannot run exactly that, so scores differ and orderings
can differ, most visibly between records whose scores are close:

1. *Per-field BM25, not BM25F.* FTS5 first sums a term's frequencies over the fields, weighted
   (``tf = Σ w_f · tf_f``), then saturates once against the whole record's length. Here each
   field is a separate BM25 clause, saturated against that field's own length and average
   length, and the weighted clause scores are summed (``Σ w_f · bm25_f``): a term found in two
   fields scores more than under BM25F, and a weight scales a saturated score instead of a
   frequency. (OpenSearch ≥ 3.2's ``combined_fields`` is Lucene's BM25F, but it rejects field
   weights below 1.0, which ``citations`` (0.5) is, and it weights lengths as well.)
2. *Index-wide statistics, not per-scope.* Document frequency, document count and average
   length come from the whole index, i.e. every tenant and workspace stored in it, not from the
   searched scope: what other scopes contain shifts a scope's IDF. The filter restricts which
   documents match, not which documents count. A consequence worth knowing: score values carry
   a faint signal about other scopes' term statistics; give each tenant its own domain or index
   (the deployment is per tenant) when that matters.
3. *Per-field IDF over the field's documents.* Lucene's IDF uses the documents that have a
   term in *that field* (``docFreq``) out of the documents that have the field at all
   (``docCount``); FTS5 counts documents that have the term in any field, out of all documents.
4. *Lucene's BM25 variant.* IDF is ``ln(1 + (N − n + 0.5) / (n + 0.5))``, always positive
   (FTS5's ``ln((N − n + 0.5) / (n + 0.5))`` is floored at 1e-6, so a term in more than half
   of the documents contributes almost nothing there); the ``(k1 + 1)`` numerator factor is
   dropped (a constant scale); field lengths are stored lossily in one byte per document
   (``SmallFloat``), so long fields are approximated; scores are 32-bit floats, so close scores
   may tie (the tie-break on ``record_id`` still applies) or split differently.
5. *Deleted and updated documents* keep counting in the statistics until their segments merge.
6. *Very long terms.* Tokens longer than 8,191 characters are split by the tokenizer (Lucene
   refuses terms over 32,766 bytes); FTS5 keeps them whole.

Mitigations applied: ``search_type=dfs_query_then_fetch`` (statistics gathered over all shards
before scoring, not per shard), one primary shard in the mapping (per-tenant indexes are small;
index-wide statistics are then exact and ``dfs`` is cheap), a ``preference`` string derived
from the scope so repeated searches of one scope hit the same shard copies (replicas with
different deleted-document counts would otherwise reorder close scores between pages), the same
k1 (1.2) and b (0.75) and a whitespace analyzer on both sides. Hits are re-sorted locally by
(score descending, ``record_id`` ascending) so the port's order holds whatever the cluster does.
A search whose shards partly failed or that timed out raises ``IndexUnavailable`` rather than
returning a partial list.

Clients: an ``opensearchpy.OpenSearch`` client is injected, or created lazily on first use from
``(endpoint, region)``: HTTPS only, certificates verified, requests signed with SigV4
(``RequestsAWSV4SignerAuth``, service ``es``) using the boto3 session's (refreshable)
credentials. Nothing is contacted or created at import or construction. ``ensure_index()``
creates the index idempotently; the first write of each adapter instance calls it once
(``ensure_on_write``), because OpenSearch would otherwise auto-create a missing index with a
dynamic mapping (analyzed ``tenant_id``, standard analyzer) that silently breaks the scope
filter and the ranking.

Error translation: every client, transport or HTTP failure (connection errors, timeouts, 429,
5xx, 4xx, a missing index on search or ``contains``, missing credentials) raises
``IndexUnavailable``; a 404 on delete is success (the delete is idempotent); a 404 document on
``contains`` is ``False``. Messages carry the operation, the HTTP status and the error type
only, never terms or document content. A 403 — the domain's access policy refusing the role,
or fine-grained access control's ``security_exception``, for a request or a bulk item — is also
handed to ``on_denied`` (a ``denials.Denial``: the SigV4 service, the operation, the error
type), the composition root's ``AwsAccessDenied`` counter.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, cast
from urllib.parse import urlsplit

import boto3
from botocore.exceptions import BotoCoreError
from opensearchpy import OpenSearch, RequestsHttpConnection
from opensearchpy.exceptions import ImproperlyConfigured, NotFoundError, OpenSearchException
from opensearchpy.helpers.signer import RequestsAWSV4SignerAuth

from engram_memory.adapters.aws.client_config import READ_TIMEOUT_S
from engram_memory.adapters.aws.denials import Denial
from engram_memory.adapters.lazy import Lazy
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    IndexHit,
    IndexMissing,
    IndexUnavailable,
    ProjectionChange,
    ProjectionDoc,
)

__all__ = [
    "DEFAULT_INDEX",
    "EMBEDDING_DIMENSIONS",
    "INDEX_BODY",
    "MAX_RESULT_WINDOW",
    "OpenSearchLexicalIndex",
    "document_id",
]

log = logging.getLogger(__name__)

DEFAULT_INDEX: Final = "engram-records"
MAX_RESULT_WINDOW: Final = 10_000
"""OpenSearch's default ``index.max_result_window``: ``search`` never asks for more hits."""

_FIELDS: Final = tuple(lexical.FIELD_WEIGHTS)
EMBEDDING_DIMENSIONS: Final = 384
"""The local embedder's vector size (all-MiniLM-L6-v2); the mapping fixes it."""
_ANALYZER: Final = "engram_terms"
_SIMILARITY: Final = "engram_bm25"
_MAX_TOKEN_CHARS: Final = 8191  # 4 bytes a character at most: below Lucene's 32,766-byte terms
_BULK_CHUNK: Final = 500
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def _text_field() -> dict[str, Any]:
    return {
        "type": "text",
        "analyzer": _ANALYZER,
        "search_analyzer": _ANALYZER,
        "similarity": _SIMILARITY,
        "index_options": "freqs",
    }


INDEX_BODY: Final[Mapping[str, Any]] = {
    "settings": {
        "index": {
            "number_of_shards": 1,
            "similarity": {
                _SIMILARITY: {"type": "BM25", "k1": lexical.BM25_K1, "b": lexical.BM25_B}
            },
            "analysis": {
                "tokenizer": {
                    "engram_whitespace": {
                        "type": "whitespace",
                        "max_token_length": _MAX_TOKEN_CHARS,
                    }
                },
                "analyzer": {_ANALYZER: {"type": "custom", "tokenizer": "engram_whitespace"}},
            },
        }
    },
    "mappings": {
        "dynamic": "strict",
        "_source": {"excludes": [*_FIELDS, "embedding"]},
        "properties": {
            "tenant_id": {"type": "keyword"},
            "workspace_id": {"type": "keyword"},
            "record_id": {"type": "keyword"},
            **{name: _text_field() for name in _FIELDS},
            "embedding": {"type": "knn_vector", "dimension": EMBEDDING_DIMENSIONS},
            "has_embedding": {"type": "boolean"},
        },
    },
}
"""The index's settings and mappings, as ``PUT /<index>`` takes them (= infra/opensearch/index.json)."""


def document_id(scope: Scope, record_id: str) -> str:
    """The scope-qualified ``_id`` of a record's projection document (64 hex characters)."""
    h = hashlib.sha256(b"engram-lexical-doc\x00")
    for part in (scope.tenant_id, scope.workspace_id, record_id):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _preference(scope: Scope) -> str:
    """A stable shard-copy preference per scope (custom strings must not start with ``_``)."""
    return "scope-" + document_id(scope, "")[:32]


def _status(exc: OpenSearchException) -> str:
    status = getattr(exc, "status_code", None)
    error = getattr(exc, "error", None)
    parts = [str(status)] if isinstance(status, int | str) and status != "N/A" else []
    if isinstance(error, str) and _IDENTIFIER.fullmatch(error):
        parts.append(error)
    return " ".join(parts) or type(exc).__name__


def _unavailable(operation: str, exc: BaseException) -> IndexUnavailable:
    detail = _status(exc) if isinstance(exc, OpenSearchException) else type(exc).__name__
    return IndexUnavailable(f"lexical index unavailable: {operation} failed ({detail})")


def _error_type(exc: NotFoundError) -> str:
    """``index_not_found_exception`` for a missing index, ``""`` for a missing document."""
    error = exc.error
    return error if isinstance(error, str) and error.endswith("_exception") else ""


def _https_endpoint(endpoint: str) -> tuple[str, int]:
    """Host and port of an HTTPS endpoint (``https://host[:port]`` or a bare host name)."""
    parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    if parts.scheme != "https":
        raise ValueError("the OpenSearch endpoint must use https")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("the OpenSearch endpoint must be https://host[:port] with nothing else")
    if not parts.hostname:
        raise ValueError("the OpenSearch endpoint has no host")
    return parts.hostname, parts.port or 443


def _bulk_request(index: str, body: Sequence[Mapping[str, Any]]) -> Callable[[OpenSearch], Any]:
    # POST /<index>/_bulk, its actions naming no index: the request's path is the one index it
    # writes, which an IAM grant scoped to the tenant's index can judge (POST /_bulk with the
    # index in the body would need a grant on the whole domain)
    return lambda client: client.bulk(body=body, index=index, refresh="false")


class OpenSearchLexicalIndex:
    """The ``LexicalIndex`` port over one OpenSearch index (see the module docstring)."""

    name: Final = "lexical"
    maintained_by_store: Final = False
    # Per-field Lucene BM25 summed with boosts, index-wide statistics (see the module docstring).
    scoring_formula_ref: Final = (
        "opensearch-bm25:k1=1.2,b=0.75;per-field-sum;boosts=primary:3,decision:2,evidence:1.5,"
        "context:1,citations:0.5;dfs_query_then_fetch"
    )
    vector_formula_ref: Final = "opensearch-knn-script:cosinesimil,exact,float32"

    def __init__(
        self,
        *,
        client: OpenSearch | None = None,
        endpoint: str | None = None,
        region: str | None = None,
        index_name: str = DEFAULT_INDEX,
        session: boto3.session.Session | None = None,
        service: str = "es",
        timeout_s: float = READ_TIMEOUT_S,  # the stack's one read timeout (client_config)
        max_retries: int = 2,
        ensure_on_write: bool = True,
        replicas: int | None = None,
        on_denied: Callable[[Denial], None] | None = None,
    ) -> None:
        if not index_name or index_name != index_name.lower() or index_name.startswith("_"):
            raise ValueError("index_name must be a lowercase OpenSearch index name")
        self._host: tuple[str, int] | None = None
        if client is None:
            if not endpoint or not region:
                raise ValueError("give either a client or both an endpoint and a region")
            self._host = _https_endpoint(endpoint)
        self._client = Lazy(self._build_client, client)
        self._region = region
        self._session = session
        self._service = service
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._ensure_on_write = ensure_on_write
        self._ensured = False
        self._replicas = replicas
        self._on_denied = on_denied
        self.index_name: Final = index_name

    # -- client ------------------------------------------------------------------------------

    @property
    def client(self) -> OpenSearch:
        """The OpenSearch client, created (not contacted) on first use."""
        return self._client.get()

    def _build_client(self) -> OpenSearch:
        assert self._host is not None and self._region is not None
        try:
            session = self._session or boto3.session.Session()
            credentials = session.get_credentials()
        except BotoCoreError as exc:
            raise _unavailable("credentials", exc) from exc
        if credentials is None:
            raise IndexUnavailable("lexical index unavailable: no AWS credentials to sign with")
        host, port = self._host
        try:
            return OpenSearch(
                hosts=[{"host": host, "port": port}],
                http_auth=RequestsAWSV4SignerAuth(credentials, self._region, self._service),
                use_ssl=True,
                verify_certs=True,
                connection_class=RequestsHttpConnection,
                timeout=self._timeout_s,
                max_retries=self._max_retries,
                retry_on_timeout=True,
                http_compress=True,
            )
        except (ImproperlyConfigured, ValueError) as exc:
            raise _unavailable("client setup", exc) from exc

    def _call(self, operation: str, request: Callable[[OpenSearch], Any]) -> dict[str, Any]:
        """Run one client request; every failure but ``NotFoundError`` → ``IndexUnavailable``."""
        client = self.client
        try:
            response = request(client)
        except NotFoundError:
            raise
        except (OpenSearchException, BotoCoreError) as exc:
            self._denied(operation, getattr(exc, "status_code", None), getattr(exc, "error", None))
            raise _unavailable(operation, exc) from exc
        return cast("dict[str, Any]", response) if isinstance(response, dict) else {}

    def _denied(self, operation: str, status: Any, error: Any) -> None:
        """Hand a 403 to ``on_denied`` (never its message: it names the role and the index)."""
        if status != 403 or self._on_denied is None:
            return
        code = error if isinstance(error, str) and _IDENTIFIER.fullmatch(error) else "403"
        try:
            self._on_denied(Denial(self._service, operation, code, 403, None))
        except Exception:  # the call's own failure must stand, whatever telemetry does
            log.exception("reporting an OpenSearch access denial failed")

    # -- index lifecycle -----------------------------------------------------------------------

    def index_body(self) -> dict[str, Any]:
        """``INDEX_BODY`` with this index's replica count, when one is set: a one-node domain
        needs 0 (else the replica stays unassigned and the cluster yellow), three AZs 1."""
        if self._replicas is None:
            return dict(INDEX_BODY)
        settings = dict(INDEX_BODY["settings"]["index"], number_of_replicas=self._replicas)
        return {**INDEX_BODY, "settings": {"index": settings}}

    def ensure_index(self) -> bool:
        """Create the index with ``INDEX_BODY``; True if created, False if it already existed."""
        client = self.client
        try:
            client.indices.create(index=self.index_name, body=self.index_body())
        except OpenSearchException as exc:
            if getattr(exc, "error", None) != "resource_already_exists_exception":
                self._denied(
                    "create index", getattr(exc, "status_code", None), getattr(exc, "error", None)
                )
                raise _unavailable("create index", exc) from exc
            created = False
        except BotoCoreError as exc:
            raise _unavailable("create index", exc) from exc
        else:
            created = True
        self._ensured = True
        return created

    def _ensure_once(self) -> None:
        if self._ensure_on_write and not self._ensured:
            self.ensure_index()

    def refresh(self) -> None:
        """Make every write so far searchable now (operators and live tests; writes never do)."""
        try:
            self._call("refresh", lambda c: c.indices.refresh(index=self.index_name))
        except NotFoundError as exc:
            raise _unavailable("refresh", exc) from exc

    # -- the port ------------------------------------------------------------------------------

    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        """Hits ordered by score descending, then ``record_id`` ascending; at most ``depth``."""
        wanted = [t for t in dict.fromkeys(terms) if t.strip()]
        size = min(depth, MAX_RESULT_WINDOW)
        if not wanted or size <= 0:
            return []
        try:
            body = self.search_body(scope, wanted, size)
            response = self._call(
                "search",
                lambda c: c.search(
                    index=self.index_name,
                    body=body,
                    search_type="dfs_query_then_fetch",
                    preference=_preference(scope),
                ),
            )
        except NotFoundError as exc:  # the index itself is missing: not "no match"
            raise IndexMissing(str(_unavailable("search", exc))) from exc
        return self._hits(response, size)

    @staticmethod
    def search_body(scope: Scope, terms: Sequence[str], size: int) -> dict[str, Any]:
        """The request body ``search`` sends (exposed for tests and for operators' debugging)."""
        query = " ".join(terms)
        return {
            "size": size,
            "query": {
                "bool": {
                    "filter": [
                        {"term": {"tenant_id": scope.tenant_id}},
                        {"term": {"workspace_id": scope.workspace_id}},
                    ],
                    "should": [
                        {"match": {name: {"query": query, "operator": "or", "boost": weight}}}
                        for name, weight in lexical.FIELD_WEIGHTS.items()
                    ],
                    "minimum_should_match": 1,
                }
            },
            "sort": [{"_score": {"order": "desc"}}, {"record_id": {"order": "asc"}}],
            "track_scores": True,
            "track_total_hits": False,
            "_source": ["record_id"],
        }

    def nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        """The scope's records by exact cosine similarity (module docstring), at most ``depth``."""
        size = min(depth, MAX_RESULT_WINDOW)
        if size <= 0:
            return []
        hits = self._hits(self._knn_search(scope, self.nearest_body(scope, vector, size)), size)
        return [IndexHit(h.record_id, h.score - 1.0) for h in hits]

    def similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The similarity of each of ``record_ids`` that has a vector: one k-NN request
        filtered to those ids."""
        wanted = list(dict.fromkeys(record_ids))[:MAX_RESULT_WINDOW]
        if not wanted:
            return {}
        body = self.nearest_body(scope, vector, len(wanted))
        body["query"]["script_score"]["query"]["bool"]["filter"].append(
            {"terms": {"record_id": wanted}}
        )
        hits = self._hits(self._knn_search(scope, body), len(wanted))
        return {hit.record_id: hit.score - 1.0 for hit in hits}

    def score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        """The similarity at ``rank`` (one hit from ``rank - 1``), or, when the scope holds fewer
        vectors, the lowest (one hit in ascending order): one small request either way."""
        if rank <= 0:
            return None
        for start, order in ((min(rank, MAX_RESULT_WINDOW) - 1, "desc"), (0, "asc")):
            body = self.nearest_body(scope, vector, 1)
            body["from"] = start
            body["sort"] = [{"_score": {"order": order}}, {"record_id": {"order": "asc"}}]
            hits = self._hits(self._knn_search(scope, body), 1)
            if hits:
                return hits[0].score - 1.0
        return None

    def _knn_search(self, scope: Scope, body: dict[str, Any]) -> Any:
        try:
            return self._call(
                "knn search",
                lambda c: c.search(index=self.index_name, body=body, preference=_preference(scope)),
            )
        except NotFoundError as exc:
            raise _unavailable("knn search", exc) from exc

    @staticmethod
    def nearest_body(scope: Scope, vector: Sequence[float], size: int) -> dict[str, Any]:
        """The request body ``nearest`` sends (exposed for tests and operators)."""
        return {
            "size": size,
            "query": {
                "script_score": {
                    "query": {
                        "bool": {
                            "filter": [
                                {"term": {"tenant_id": scope.tenant_id}},
                                {"term": {"workspace_id": scope.workspace_id}},
                                {"term": {"has_embedding": True}},
                            ]
                        }
                    },
                    "script": {
                        "source": "knn_score",
                        "lang": "knn",
                        "params": {
                            "field": "embedding",
                            "query_value": [float(x) for x in vector],
                            "space_type": "cosinesimil",
                        },
                    },
                }
            },
            "sort": [{"_score": {"order": "desc"}}, {"record_id": {"order": "asc"}}],
            "track_scores": True,
            "track_total_hits": False,
            "_source": ["record_id"],
        }

    def has_vector(self, scope: Scope, record_id: str) -> bool:
        """Whether the scope's document for ``record_id`` holds a vector (a realtime GET)."""
        source = self._get_source(
            scope, record_id, "tenant_id,workspace_id,record_id,has_embedding"
        )
        return source is not None and source.get("has_embedding") is True

    @staticmethod
    def _hits(response: Mapping[str, Any], size: int) -> list[IndexHit]:
        if response.get("timed_out"):
            raise IndexUnavailable("lexical index unavailable: search failed (timed out)")
        shards = response.get("_shards") or {}
        if shards.get("failed"):
            raise IndexUnavailable("lexical index unavailable: search failed (shard failures)")
        hits: list[IndexHit] = []
        try:
            for hit in response["hits"]["hits"]:
                score = hit.get("_score")
                if score is None:
                    score = hit["sort"][0]
                hits.append(IndexHit(str(hit["_source"]["record_id"]), float(score)))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise IndexUnavailable("lexical index unavailable: malformed search response") from exc
        hits.sort(key=lambda h: (-h.score, h.record_id))
        return hits[:size]

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        """Upsert (index, returning once a refresh made it searchable) then delete (no refresh;
        404 is success), as the change asks."""
        if change.upsert is not None:
            self._ensure_once()
            doc_id = document_id(scope, change.upsert.record_id)
            source = self.document(scope, change.upsert)
            self._call(
                "index",
                lambda c: c.index(
                    index=self.index_name, id=doc_id, body=source, refresh="wait_for"
                ),
            )
        if change.delete_record_id is not None:
            gone_id = document_id(scope, change.delete_record_id)
            try:
                self._call(
                    "delete",
                    lambda c: c.delete(index=self.index_name, id=gone_id, refresh="false"),
                )
            except NotFoundError:
                return  # already gone (or never indexed): the delete is idempotent

    def bulk_apply(self, changes: Iterable[tuple[Scope, ProjectionChange]]) -> None:
        """Apply many changes with ``_bulk`` requests (500 actions each), in order.

        A per-item 404 on delete is success; any other item failure raises ``IndexUnavailable``
        after the whole request ran (every action is idempotent, so retrying all is safe).
        """
        actions = list(self._bulk_actions(changes))
        if not actions:
            return
        if any("index" in action for action, _ in actions):
            self._ensure_once()
        for start in range(0, len(actions), _BULK_CHUNK):
            body: list[Mapping[str, Any]] = []
            for action, source in actions[start : start + _BULK_CHUNK]:
                body.append(action)
                if source is not None:
                    body.append(source)
            try:
                response = self._call("bulk", _bulk_request(self.index_name, body))
            except NotFoundError as exc:
                raise _unavailable("bulk", exc) from exc
            if response.get("errors"):
                self._check_bulk_items(response)

    def _bulk_actions(
        self, changes: Iterable[tuple[Scope, ProjectionChange]]
    ) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
        for scope, change in changes:
            if change.upsert is not None:
                doc = change.upsert
                meta = {"_id": document_id(scope, doc.record_id)}
                yield {"index": meta}, self.document(scope, doc)
            if change.delete_record_id is not None:
                yield {"delete": {"_id": document_id(scope, change.delete_record_id)}}, None

    def _check_bulk_items(self, response: Mapping[str, Any]) -> None:
        failed: list[str] = []
        for item in response.get("items", []):
            for kind, result in item.items():
                status = result.get("status", 0)
                if kind == "delete" and status == 404:
                    continue
                if "error" in result or not 200 <= status < 300:
                    error = result.get("error")
                    reason = error.get("type", "") if isinstance(error, Mapping) else ""
                    failed.append(f"{status} {reason}".strip())
        if any(f.startswith("403") for f in failed):  # one report for the request
            self._denied("bulk", 403, next(f for f in failed if f.startswith("403"))[4:])
        if failed:
            summary = ", ".join(sorted(set(failed)))
            raise IndexUnavailable(
                f"lexical index unavailable: bulk failed for {len(failed)} item(s) ({summary})"
            )

    def contains(self, scope: Scope, record_id: str) -> bool:
        """Whether the scope's document for ``record_id`` exists (a realtime GET by ``_id``)."""
        return self._get_source(scope, record_id, "tenant_id,workspace_id,record_id") is not None

    def _get_source(self, scope: Scope, record_id: str, fields: str) -> dict[str, Any] | None:
        """The scope's document's ``fields`` (a realtime GET by ``_id``); None when absent."""
        try:
            doc_id = document_id(scope, record_id)
            response = self._call(
                "get",
                lambda c: c.get(index=self.index_name, id=doc_id, _source_includes=fields),
            )
        except NotFoundError as exc:
            if _error_type(exc):  # index_not_found_exception: the surface is not there
                raise _unavailable("get", exc) from exc
            return None
        source = response.get("_source") or {}
        found = bool(response.get("found")) and (
            source.get("tenant_id"),
            source.get("workspace_id"),
            source.get("record_id"),
        ) == (scope.tenant_id, scope.workspace_id, record_id)
        return dict(source) if found else None

    # -- documents -----------------------------------------------------------------------------

    @staticmethod
    def document(scope: Scope, doc: ProjectionDoc) -> dict[str, Any]:
        """The indexed document: the scope, the record id, the five analyzed fields and, with a
        semantic channel, the record's vector."""
        source: dict[str, Any] = {
            "tenant_id": scope.tenant_id,
            "workspace_id": scope.workspace_id,
            "record_id": doc.record_id,
            **{name: doc.fields.get(name, "") for name in _FIELDS},
        }
        if doc.vector is not None:
            source["embedding"] = list(doc.vector)
            source["has_embedding"] = True
        return source
