"""The OpenSearch lexical projection: the requests it sends, its error mapping, and (live) ranking.

The offline tests drive a real ``opensearchpy.OpenSearch`` client whose transport talks to a
recording connection (``FakeCluster``): every request the adapter sends is captured after
opensearch-py built it (method, path, query parameters, JSON body), and scripted responses go
back through opensearch-py's own error handling, so status codes raise the exceptions a real
cluster would cause. The SigV4 test goes one layer lower, to ``requests``, to see the signed
HTTPS request. The live test runs only when ``ENGRAM_OPENSEARCH_URL`` names a cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
import requests
from aws_testing import MemoryLexicalIndex
from opensearchpy import Connection, OpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import ConnectionTimeout

from engram_memory.adapters.aws import opensearch_index
from engram_memory.adapters.aws.opensearch_index import (
    DEFAULT_INDEX,
    EMBEDDING_DIMENSIONS,
    INDEX_BODY,
    MAX_RESULT_WINDOW,
    OpenSearchLexicalIndex,
    document_id,
)
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    IndexHit,
    IndexMissing,
    IndexUnavailable,
    LexicalIndex,
    ProjectionChange,
    ProjectionDoc,
)

REPO = Path(__file__).resolve().parents[2]
INDEX_JSON = REPO / "infra" / "opensearch" / "index.json"
SCOPE = Scope("tenant-acme-0001", "ws-research-0001")
OTHER = Scope("tenant-acme-0001", "ws-legal-0002")
FIELDS = {
    "primary": "retry budget exhausted",
    "decision": "raise the budget",
    "evidence": "pager log",
    "context": "",
    "citations": "runbook md",
}

# --------------------------------------------------------------------------------------------
# A recording cluster behind opensearch-py's transport
# --------------------------------------------------------------------------------------------

Response = tuple[int, dict[str, Any]]
Responder = Callable[["Request"], "Response | BaseException | None"]


class Request:
    def __init__(self, method: str, url: str, params: dict[str, Any], body: Any) -> None:
        self.method = method
        self.path = url.split("?", 1)[0]
        self.params = {  # opensearch-py escapes query parameters to bytes
            key: value.decode() if isinstance(value, bytes) else value
            for key, value in params.items()
        }
        self.body = body

    def __repr__(self) -> str:
        return f"{self.method} {self.path} {self.params}"


class FakeCluster(Connection):
    """An opensearch-py connection that records requests and answers like a tiny cluster."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[Request] = []
        self.responders: list[Responder] = []

    def perform_request(
        self,
        method: str,
        url: str,
        params: Any = None,
        body: Any = None,
        timeout: Any = None,
        ignore: Any = (),
        headers: Any = None,
    ) -> tuple[int, dict[str, str], str]:
        request = Request(method, url, dict(params or {}), _decode(url, body))
        self.requests.append(request)
        for responder in self.responders:
            answer = responder(request)
            if answer is None:
                continue
            if isinstance(answer, BaseException):
                raise answer
            status, payload = answer
            break
        else:
            status, payload = _default_answer(request)
        raw = json.dumps(payload)
        if not 200 <= status < 300 and status not in (ignore or ()):
            self._raise_error(status, raw, "application/json")
        return status, {"content-type": "application/json"}, raw

    def answer(self, method: str, path_pattern: str, response: Response | BaseException) -> None:
        """Answer requests matching (method, path regex) with ``response`` from now on."""
        pattern = re.compile(path_pattern)

        def responder(request: Request) -> Response | BaseException | None:
            if request.method == method and pattern.fullmatch(request.path):
                return response
            return None

        self.responders.insert(0, responder)


def _decode(url: str, body: Any) -> Any:
    if body is None:
        return None
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    if url.split("?", 1)[0].endswith("/_bulk"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _default_answer(request: Request) -> Response:
    parts = request.path.strip("/").split("/")
    if request.method == "PUT" and len(parts) == 1:
        return 200, {"acknowledged": True, "index": parts[0]}
    if request.method in ("PUT", "POST") and len(parts) == 3 and parts[1] == "_doc":
        return 201, {"_id": parts[2], "result": "created"}
    if request.method == "DELETE" and len(parts) == 3:
        return 200, {"_id": parts[2], "result": "deleted"}
    if request.path.endswith("/_search"):
        return 200, {"timed_out": False, "_shards": {"failed": 0}, "hits": {"hits": []}}
    if request.path.endswith("/_bulk"):
        return 200, {"errors": False, "items": []}
    if request.path.endswith("/_refresh"):
        return 200, {"_shards": {"failed": 0}}
    return 404, {"error": {"type": "unexpected_request"}, "status": 404}


@pytest.fixture
def client() -> OpenSearch:
    return OpenSearch(
        hosts=[{"host": "search-engram.example", "port": 443}],
        connection_class=FakeCluster,
        max_retries=0,
    )


@pytest.fixture
def cluster(client: OpenSearch) -> FakeCluster:
    connection = client.transport.get_connection()
    assert isinstance(connection, FakeCluster)
    return connection


@pytest.fixture
def index(client: OpenSearch) -> OpenSearchLexicalIndex:
    return OpenSearchLexicalIndex(client=client)


def _upsert(record_id: str, fields: dict[str, str] | None = None) -> ProjectionChange:
    return ProjectionChange(upsert=ProjectionDoc(record_id, fields or FIELDS))


def _hits_response(*hits: tuple[str, float], **extra: Any) -> Response:
    return 200, {
        "timed_out": False,
        "_shards": {"total": 1, "successful": 1, "failed": 0},
        "hits": {
            "hits": [
                {"_id": "x", "_score": score, "_source": {"record_id": rid}, "sort": [score, rid]}
                for rid, score in hits
            ]
        },
        **extra,
    }


# --------------------------------------------------------------------------------------------
# Shape of the adapter
# --------------------------------------------------------------------------------------------


def test_it_is_a_lexical_index_the_engine_maintains(index: OpenSearchLexicalIndex) -> None:
    port: LexicalIndex = index
    assert port.name == "lexical"
    assert port.maintained_by_store is False
    assert index.index_name == DEFAULT_INDEX == "engram-records"


def test_construction_sends_nothing(client: OpenSearch, cluster: FakeCluster) -> None:
    OpenSearchLexicalIndex(client=client, index_name="engram-records-eu")
    assert cluster.requests == []


def test_construction_from_an_endpoint_builds_no_client() -> None:
    with mock.patch.object(opensearch_index, "OpenSearch", side_effect=AssertionError):
        index = OpenSearchLexicalIndex(
            endpoint="https://search-x.eu-west-1.es.amazonaws.com", region="eu-west-1"
        )
    assert not index._client.made


def test_import_and_construction_create_nothing() -> None:
    """In a fresh interpreter where any client, transport or boto3 session would explode."""
    script = textwrap.dedent(
        """
        import boto3.session, opensearchpy, opensearchpy.transport

        def boom(*args, **kwargs):
            raise SystemExit("created something")

        opensearchpy.OpenSearch.__init__ = boom
        opensearchpy.transport.Transport.__init__ = boom
        boto3.session.Session.__init__ = boom
        from engram_memory.adapters.aws.opensearch_index import OpenSearchLexicalIndex
        OpenSearchLexicalIndex(endpoint="search-x.eu-west-1.es.amazonaws.com", region="eu-west-1")
        print("ok")
        """
    )
    done = subprocess.run(  # noqa: S603 - a fixed script, this interpreter
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://search-x.eu-west-1.es.amazonaws.com",
        "https://search-x.eu-west-1.es.amazonaws.com/some/path",
        "https://user:pw@search-x.eu-west-1.es.amazonaws.com",
        "https://",
    ],
)
def test_only_plain_https_endpoints_are_accepted(endpoint: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        OpenSearchLexicalIndex(endpoint=endpoint, region="eu-west-1")


def test_a_client_or_an_endpoint_and_region_is_required() -> None:
    with pytest.raises(ValueError, match="client"):
        OpenSearchLexicalIndex()
    with pytest.raises(ValueError, match="client"):
        OpenSearchLexicalIndex(endpoint="https://search-x.example")
    with pytest.raises(ValueError, match="index_name"):
        OpenSearchLexicalIndex(client=mock.Mock(), index_name="Engram")


# --------------------------------------------------------------------------------------------
# The mapping and ensure_index
# --------------------------------------------------------------------------------------------


def test_the_mapping_file_is_the_mapping_the_adapter_creates(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    assert index.ensure_index() is True
    [create] = cluster.requests
    assert (create.method, create.path) == ("PUT", "/engram-records")
    assert create.body == json.loads(INDEX_JSON.read_text(encoding="utf-8")) == INDEX_BODY


@pytest.mark.parametrize("replicas", [0, 1])
def test_the_index_is_created_with_the_profiles_replica_count(
    client: OpenSearch, cluster: FakeCluster, replicas: int
) -> None:
    # dev (one node) needs 0 replicas to be green; production (three AZs) keeps one copy.
    named = OpenSearchLexicalIndex(
        client=client, index_name="engram-acme-records", replicas=replicas
    )
    assert named.ensure_index() is True
    [create] = cluster.requests
    assert (create.method, create.path) == ("PUT", "/engram-acme-records")
    assert create.body["settings"]["index"]["number_of_replicas"] == replicas
    assert create.body["mappings"] == INDEX_BODY["mappings"]


def test_the_mapping_indexes_the_engine_terms_as_they_are() -> None:
    settings = INDEX_BODY["settings"]["index"]
    assert settings["similarity"]["engram_bm25"] == {
        "type": "BM25",
        "k1": lexical.BM25_K1,
        "b": lexical.BM25_B,
    }
    analyzer = settings["analysis"]["analyzer"]["engram_terms"]
    assert analyzer == {"type": "custom", "tokenizer": "engram_whitespace"}  # no lowercasing
    assert settings["analysis"]["tokenizer"]["engram_whitespace"]["type"] == "whitespace"
    mappings = INDEX_BODY["mappings"]
    assert mappings["dynamic"] == "strict"
    properties = mappings["properties"]
    for name in ("tenant_id", "workspace_id", "record_id"):
        assert properties[name] == {"type": "keyword"}
    assert set(properties) == {
        "tenant_id",
        "workspace_id",
        "record_id",
        *lexical.FIELD_WEIGHTS,
        "embedding",
        "has_embedding",
    }
    assert properties["embedding"] == {"type": "knn_vector", "dimension": EMBEDDING_DIMENSIONS}
    assert mappings["_source"]["excludes"] == [*lexical.FIELD_WEIGHTS, "embedding"]
    for name in lexical.FIELD_WEIGHTS:
        assert properties[name]["type"] == "text"
        assert properties[name]["analyzer"] == properties[name]["search_analyzer"] == "engram_terms"
        assert properties[name]["similarity"] == "engram_bm25"


def test_ensure_index_is_idempotent(index: OpenSearchLexicalIndex, cluster: FakeCluster) -> None:
    assert index.ensure_index() is True
    cluster.answer(
        "PUT",
        "/engram-records",
        (400, {"error": {"type": "resource_already_exists_exception"}, "status": 400}),
    )
    assert index.ensure_index() is False
    assert index.ensure_index() is False
    assert [r.path for r in cluster.requests] == ["/engram-records"] * 3


def test_ensure_index_reports_other_refusals(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "PUT",
        "/engram-records",
        (400, {"error": {"type": "mapper_parsing_exception"}, "status": 400}),
    )
    with pytest.raises(IndexUnavailable, match="mapper_parsing_exception"):
        index.ensure_index()
    cluster.answer("PUT", "/engram-records", (403, {"error": {"type": "security_exception"}}))
    with pytest.raises(IndexUnavailable, match="403"):
        index.ensure_index()


def test_the_first_write_ensures_the_index_once(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.apply(SCOPE, ProjectionChange(delete_record_id="mem_gone"))  # a drop creates nothing
    index.apply(SCOPE, _upsert("mem_a"))
    index.apply(SCOPE, _upsert("mem_b"))
    assert [(r.method, r.path.count("/")) for r in cluster.requests] == [
        ("DELETE", 3),
        ("PUT", 1),
        ("PUT", 3),
        ("PUT", 3),
    ]


def test_ensure_on_write_can_be_turned_off(client: OpenSearch, cluster: FakeCluster) -> None:
    index = OpenSearchLexicalIndex(client=client, index_name="engram-custom", ensure_on_write=False)
    index.apply(SCOPE, _upsert("mem_a"))
    [put] = cluster.requests
    assert put.path == f"/engram-custom/_doc/{document_id(SCOPE, 'mem_a')}"


# --------------------------------------------------------------------------------------------
# Documents: scope-qualified ids, upsert and delete
# --------------------------------------------------------------------------------------------


def test_document_ids_are_scope_qualified() -> None:
    a = document_id(SCOPE, "mem_a")
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    assert a == document_id(Scope(SCOPE.tenant_id, SCOPE.workspace_id), "mem_a")
    assert a != document_id(OTHER, "mem_a")
    assert a != document_id(Scope("tenant-other", SCOPE.workspace_id), "mem_a")
    assert a != document_id(SCOPE, "mem_b")
    # No separator ambiguity: the parts are length-prefixed.
    assert document_id(Scope("a", "b#c"), "d") != document_id(Scope("a#b", "c"), "d")
    assert document_id(Scope("a", "b"), "c\x00d") != document_id(Scope("a", "b\x00c"), "d")


def test_upsert_indexes_the_scoped_document_and_waits_until_it_is_searchable(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.ensure_index()
    cluster.requests.clear()
    index.apply(SCOPE, _upsert("mem_a", {"primary": "alpha beta", "decision": "gamma"}))
    [put] = cluster.requests
    assert put.method == "PUT"
    assert put.path == f"/engram-records/_doc/{document_id(SCOPE, 'mem_a')}"
    assert put.params == {"refresh": "wait_for"}
    assert put.body == {
        "tenant_id": SCOPE.tenant_id,
        "workspace_id": SCOPE.workspace_id,
        "record_id": "mem_a",
        "primary": "alpha beta",
        "decision": "gamma",
        "evidence": "",
        "context": "",
        "citations": "",
    }


def test_the_same_record_id_in_two_scopes_are_two_documents(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.ensure_index()
    cluster.requests.clear()
    index.apply(SCOPE, _upsert("mem_same"))
    index.apply(OTHER, _upsert("mem_same"))
    index.apply(OTHER, ProjectionChange(delete_record_id="mem_same"))
    put_a, put_b, delete_b = cluster.requests
    assert put_a.path != put_b.path
    assert delete_b.path == put_b.path and delete_b.method == "DELETE"
    assert put_a.body["workspace_id"] == SCOPE.workspace_id
    assert put_b.body["workspace_id"] == OTHER.workspace_id


def test_delete_sends_the_scoped_id(index: OpenSearchLexicalIndex, cluster: FakeCluster) -> None:
    index.apply(SCOPE, ProjectionChange(delete_record_id="mem_a"))
    [delete] = cluster.requests
    assert (delete.method, delete.path) == (
        "DELETE",
        f"/engram-records/_doc/{document_id(SCOPE, 'mem_a')}",
    )
    assert delete.params == {"refresh": "false"}


@pytest.mark.parametrize(
    "payload",
    [
        {"_id": "x", "result": "not_found"},
        {"error": {"type": "index_not_found_exception"}, "status": 404},
    ],
)
def test_a_404_on_delete_is_success(
    index: OpenSearchLexicalIndex, cluster: FakeCluster, payload: dict[str, Any]
) -> None:
    cluster.answer("DELETE", r"/engram-records/_doc/.*", (404, payload))
    index.apply(SCOPE, ProjectionChange(delete_record_id="mem_a"))
    index.apply(SCOPE, ProjectionChange(delete_record_id="mem_a"))
    assert len(cluster.requests) == 2


def test_a_change_with_both_upserts_then_deletes(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.ensure_index()
    cluster.requests.clear()
    index.apply(
        SCOPE, ProjectionChange(upsert=ProjectionDoc("mem_new", FIELDS), delete_record_id="mem_old")
    )
    assert [(r.method, r.path.rsplit("/", 1)[1]) for r in cluster.requests] == [
        ("PUT", document_id(SCOPE, "mem_new")),
        ("DELETE", document_id(SCOPE, "mem_old")),
    ]


def test_bulk_apply_sends_ordered_actions_in_chunks(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.ensure_index()
    cluster.requests.clear()
    changes = [(SCOPE, _upsert(f"mem_{i:04d}")) for i in range(499)]
    changes.append((OTHER, ProjectionChange(delete_record_id="mem_0000")))
    changes.append((SCOPE, ProjectionChange(delete_record_id="mem_0001")))
    index.bulk_apply(changes)
    first, second = cluster.requests
    path = ("POST", "/engram-records/_bulk", {"refresh": "false"})
    assert (first.method, first.path, first.params) == path  # the index in the path, not the body
    assert len(first.body) == 2 * 499 + 1  # 500 actions: 499 index (+ source) and one delete
    assert first.body[0] == {"index": {"_id": document_id(SCOPE, "mem_0000")}}
    assert first.body[1]["record_id"] == "mem_0000"
    assert first.body[1]["tenant_id"] == SCOPE.tenant_id
    assert first.body[-1] == {"delete": {"_id": document_id(OTHER, "mem_0000")}}
    assert second.body == [{"delete": {"_id": document_id(SCOPE, "mem_0001")}}]


def test_bulk_apply_with_nothing_sends_nothing(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.bulk_apply([])
    assert cluster.requests == []


def test_bulk_item_failures(index: OpenSearchLexicalIndex, cluster: FakeCluster) -> None:
    index.ensure_index()
    changes = [
        (SCOPE, _upsert("mem_a")),
        (SCOPE, ProjectionChange(delete_record_id="mem_gone")),
    ]

    def bulk_answers(*items: dict[str, Any]) -> None:
        cluster.answer(
            "POST", "/engram-records/_bulk", (200, {"errors": True, "items": list(items)})
        )

    bulk_answers(
        {"index": {"status": 201, "result": "created"}},
        {"delete": {"status": 404, "result": "not_found"}},
    )
    index.bulk_apply(changes)  # a delete that found nothing is success
    rejected = {"status": 429, "error": {"type": "es_rejected_execution_exception"}}
    bulk_answers({"index": rejected}, {"delete": {"status": 200, "result": "deleted"}})
    with pytest.raises(IndexUnavailable, match=r"1 item.*429 es_rejected_execution_exception"):
        index.bulk_apply(changes)


# --------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------


def test_the_search_request(index: OpenSearchLexicalIndex, cluster: FakeCluster) -> None:
    index.search(SCOPE, ["retry", "budget", "retry"], 25)
    [search] = cluster.requests
    assert (search.method, search.path) == ("POST", "/engram-records/_search")
    assert search.params["search_type"] == "dfs_query_then_fetch"
    assert search.params["preference"] == opensearch_index._preference(SCOPE)
    assert not search.params["preference"].startswith("_")
    body = search.body
    assert body["size"] == 25
    query = body["query"]["bool"]
    # The scope is part of the query: both term filters, inside the bool query itself.
    assert query["filter"] == [
        {"term": {"tenant_id": SCOPE.tenant_id}},
        {"term": {"workspace_id": SCOPE.workspace_id}},
    ]
    assert query["minimum_should_match"] == 1
    boosts = {}
    for clause in query["should"]:
        [(field, spec)] = clause["match"].items()
        assert spec["query"] == "retry budget"  # distinct terms, first-seen order
        assert spec["operator"] == "or"
        boosts[field] = spec["boost"]
    assert boosts == dict(lexical.FIELD_WEIGHTS)
    assert body["sort"] == [{"_score": {"order": "desc"}}, {"record_id": {"order": "asc"}}]
    assert body["_source"] == ["record_id"]
    assert set(body) == {"size", "query", "sort", "_source", "track_scores", "track_total_hits"}


def test_each_scope_searches_with_its_own_filter(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.search(SCOPE, ["alpha"], 5)
    index.search(OTHER, ["alpha"], 5)
    mine, theirs = (r.body["query"]["bool"]["filter"] for r in cluster.requests)
    assert mine[1] == {"term": {"workspace_id": SCOPE.workspace_id}}
    assert theirs[1] == {"term": {"workspace_id": OTHER.workspace_id}}
    assert cluster.requests[0].params["preference"] != cluster.requests[1].params["preference"]


def test_search_returns_hits_in_port_order(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "POST",
        r"/engram-records/_search",
        _hits_response(("mem_c", 1.5), ("mem_b", 2.25), ("mem_a", 1.5)),
    )
    assert index.search(SCOPE, ["alpha"], 3) == [
        IndexHit("mem_b", 2.25),
        IndexHit("mem_a", 1.5),
        IndexHit("mem_c", 1.5),
    ]


def test_search_reads_the_score_from_sort_values_when_needed(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "POST",
        r"/engram-records/_search",
        (
            200,
            {
                "_shards": {"failed": 0},
                "hits": {
                    "hits": [{"_score": None, "_source": {"record_id": "a"}, "sort": [0.5, "a"]}]
                },
            },
        ),
    )
    assert index.search(SCOPE, ["alpha"], 3) == [IndexHit("a", 0.5)]


@pytest.mark.parametrize(
    ("terms", "depth"), [([], 10), (["", " "], 10), (["alpha"], 0), (["alpha"], -1)]
)
def test_a_search_that_cannot_match_sends_nothing(
    index: OpenSearchLexicalIndex, cluster: FakeCluster, terms: list[str], depth: int
) -> None:
    assert index.search(SCOPE, terms, depth) == []
    assert cluster.requests == []


def test_search_depth_is_capped_at_the_result_window(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.search(SCOPE, ["alpha"], MAX_RESULT_WINDOW + 5)
    assert cluster.requests[0].body["size"] == MAX_RESULT_WINDOW


@pytest.mark.parametrize(
    "response",
    [
        _hits_response(("mem_a", 1.0), _shards={"total": 2, "successful": 1, "failed": 1}),
        _hits_response(("mem_a", 1.0), timed_out=True),
        (200, {"_shards": {"failed": 0}, "hits": {"hits": [{"_score": 1.0}]}}),
        (404, {"error": {"type": "index_not_found_exception"}, "status": 404}),
    ],
    ids=["shard-failure", "timed-out", "malformed", "missing-index"],
)
def test_partial_or_missing_answers_are_unavailable_never_empty(
    index: OpenSearchLexicalIndex, cluster: FakeCluster, response: Response
) -> None:
    cluster.answer("POST", r"/engram-records/_search", response)
    with pytest.raises(IndexUnavailable):
        index.search(SCOPE, ["alpha"], 10)


def test_a_missing_index_is_told_apart_from_an_outage(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    # an admission's neighbours on a new stack: no index yet holds nothing (admission.neighbours)
    missing = (404, {"error": {"type": "index_not_found_exception"}, "status": 404})
    cluster.answer("POST", r"/engram-records/_search", missing)
    with pytest.raises(IndexMissing, match="index_not_found_exception"):
        index.search(SCOPE, ["alpha"], 10)
    cluster.answer("POST", r"/engram-records/_search", (503, {"error": "down", "status": 503}))
    with pytest.raises(IndexUnavailable) as down:
        index.search(SCOPE, ["alpha"], 10)
    assert not isinstance(down.value, IndexMissing)


# --------------------------------------------------------------------------------------------
# contains
# --------------------------------------------------------------------------------------------


def _found(scope: Scope, record_id: str) -> Response:
    return 200, {
        "found": True,
        "_source": {
            "tenant_id": scope.tenant_id,
            "workspace_id": scope.workspace_id,
            "record_id": record_id,
        },
    }


def test_contains_gets_the_scoped_document(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer("GET", r"/engram-records/_doc/.*", _found(SCOPE, "mem_a"))
    assert index.contains(SCOPE, "mem_a") is True
    [get] = cluster.requests
    assert get.path == f"/engram-records/_doc/{document_id(SCOPE, 'mem_a')}"
    assert get.params == {"_source_includes": "tenant_id,workspace_id,record_id"}


def test_contains_is_false_for_a_missing_or_foreign_document(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer("GET", r"/engram-records/_doc/.*", (404, {"_id": "x", "found": False}))
    assert index.contains(SCOPE, "mem_a") is False
    cluster.answer("GET", r"/engram-records/_doc/.*", _found(OTHER, "mem_a"))
    assert index.contains(SCOPE, "mem_a") is False


def test_contains_on_a_missing_index_is_unavailable(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "GET",
        r"/engram-records/_doc/.*",
        (404, {"error": {"type": "index_not_found_exception"}, "status": 404}),
    )
    with pytest.raises(IndexUnavailable, match="index_not_found_exception"):
        index.contains(SCOPE, "mem_a")


# --------------------------------------------------------------------------------------------
# Error mapping
# --------------------------------------------------------------------------------------------

FAILURES: dict[str, Response | BaseException] = {
    "connection": OSConnectionError("N/A", "connection refused", None),
    "timeout": ConnectionTimeout("TIMEOUT", "read timed out", None),
    "429": (429, {"error": {"type": "too_many_requests"}, "status": 429}),
    "500": (500, {"error": {"type": "internal_server_error"}, "status": 500}),
    "502": (502, {"error": "bad gateway"}),
    "503": (503, {"error": {"type": "cluster_block_exception"}, "status": 503}),
    "504": (504, {}),
    "403": (403, {"Message": "User is not authorized"}),
}

OPERATIONS: dict[str, Callable[[OpenSearchLexicalIndex], object]] = {
    "search": lambda ix: ix.search(SCOPE, ["secret", "terms"], 10),
    "upsert": lambda ix: ix.apply(SCOPE, _upsert("mem_a", {"primary": "secret terms"})),
    "delete": lambda ix: ix.apply(SCOPE, ProjectionChange(delete_record_id="mem_a")),
    "bulk": lambda ix: ix.bulk_apply([(SCOPE, _upsert("mem_a", {"primary": "secret terms"}))]),
    "contains": lambda ix: ix.contains(SCOPE, "mem_a"),
    "ensure_index": lambda ix: ix.ensure_index(),
    "refresh": lambda ix: ix.refresh(),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_failures_map_to_index_unavailable(
    client: OpenSearch, cluster: FakeCluster, operation: str, failure: str
) -> None:
    index = OpenSearchLexicalIndex(client=client, ensure_on_write=False)
    cluster.responders.append(lambda request: FAILURES[failure])
    with pytest.raises(IndexUnavailable) as raised:
        OPERATIONS[operation](index)
    message = str(raised.value)
    assert message.startswith("lexical index unavailable")
    assert "secret" not in message and "terms" not in message  # never content in messages
    assert raised.value.__cause__ is not None


def test_transient_failures_are_retried_by_the_transport() -> None:
    client = OpenSearch(
        hosts=[{"host": "search-engram.example", "port": 443}],
        connection_class=FakeCluster,
        max_retries=2,
    )
    connection = client.transport.get_connection()
    answers: Iterator[Response] = iter([(503, {}), (503, {}), _hits_response(("mem_a", 1.0))])
    connection.responders.append(lambda request: next(answers))
    index = OpenSearchLexicalIndex(client=client)
    assert index.search(SCOPE, ["alpha"], 10) == [IndexHit("mem_a", 1.0)]
    assert len(connection.requests) == 3


def test_missing_credentials_are_unavailable() -> None:
    session = mock.Mock(spec=boto3.session.Session)
    session.get_credentials.return_value = None
    index = OpenSearchLexicalIndex(
        endpoint="https://search-x.eu-west-1.es.amazonaws.com", region="eu-west-1", session=session
    )
    with pytest.raises(IndexUnavailable, match="credentials"):
        index.search(SCOPE, ["alpha"], 10)


# --------------------------------------------------------------------------------------------
# The lazily built client: HTTPS, SigV4 for service "es"
# --------------------------------------------------------------------------------------------


def test_the_built_client_signs_https_requests_with_sigv4() -> None:
    session = boto3.session.Session(
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        region_name="eu-west-1",
    )
    index = OpenSearchLexicalIndex(
        endpoint="search-engram-abc.eu-west-1.es.amazonaws.com",
        region="eu-west-1",
        session=session,
        index_name="engram-records",
    )
    sent: list[requests.PreparedRequest] = []

    def send(self: requests.Session, prepared: requests.PreparedRequest, **kwargs: Any) -> Any:
        sent.append(prepared)
        response = requests.Response()
        response.status_code = 200
        response._content = json.dumps({"_shards": {"failed": 0}, "hits": {"hits": []}}).encode()
        response.headers["Content-Type"] = "application/json"
        response.request = prepared
        response.url = prepared.url or ""
        return response

    with mock.patch.object(requests.Session, "send", send):
        assert index.search(SCOPE, ["alpha"], 10) == []
    [request] = sent
    assert str(request.url).startswith(
        "https://search-engram-abc.eu-west-1.es.amazonaws.com:443/engram-records/_search?"
    )
    authorization = str(request.headers["Authorization"])
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/es/aws4_request" in authorization
    assert "x-amz-date" in {k.lower() for k in request.headers}
    connection = index.client.transport.get_connection()
    assert connection.use_ssl is True
    assert index.client.transport.retry_on_timeout is True


# --------------------------------------------------------------------------------------------
# Live: a real cluster, compared with the in-memory BM25F reference
# --------------------------------------------------------------------------------------------

LIVE_URL = os.environ.get("ENGRAM_OPENSEARCH_URL", "")


def _live_index(name: str) -> OpenSearchLexicalIndex:
    region = os.environ.get("ENGRAM_OPENSEARCH_REGION") or os.environ.get("AWS_REGION")
    if LIVE_URL.startswith("https://") and region:
        return OpenSearchLexicalIndex(endpoint=LIVE_URL, region=region, index_name=name)
    # A development cluster (http, or https with user:password in the URL): no SigV4.
    return OpenSearchLexicalIndex(client=OpenSearch(hosts=[LIVE_URL]), index_name=name)


@pytest.fixture
def live() -> Iterator[OpenSearchLexicalIndex]:
    index = _live_index(f"engram-test-{uuid.uuid4().hex[:12]}")
    try:
        yield index
    finally:
        index.client.indices.delete(index=index.index_name, ignore=[404])


def _doc(term_field: str | None) -> dict[str, str]:
    """Two tokens in every field, the query term in one: equal lengths, one weighted field."""
    return {
        name: ("alpha pad" if name == term_field else "pad pad") for name in lexical.FIELD_WEIGHTS
    }


@pytest.mark.skipif(
    not LIVE_URL,
    reason="live OpenSearch test: runs only when ENGRAM_OPENSEARCH_URL is set "
    "(https + ENGRAM_OPENSEARCH_REGION or AWS_REGION signs with SigV4)",
)
def test_live_isolation_and_ordering_match_the_reference(live: OpenSearchLexicalIndex) -> None:
    reference = MemoryLexicalIndex()
    mine = {
        "rec-1": _doc("primary"),
        "rec-0": _doc("primary"),  # ties rec-1: record_id ascending decides
        "rec-2": _doc("decision"),
        "rec-3": _doc("evidence"),
        "rec-4": _doc("context"),
        "rec-5": _doc("citations"),
        "rec-6": _doc(None),  # no match
    }
    theirs = {
        "rec-1": _doc("citations"),  # the same record id as one of mine, another document
        "rec-7": _doc("primary"),
        "rec-8": _doc("decision"),
        "rec-9": _doc("evidence"),
    }
    changes = [(SCOPE, _upsert(rid, fields)) for rid, fields in mine.items()]
    changes += [(OTHER, _upsert(rid, fields)) for rid, fields in theirs.items()]
    assert live.ensure_index() is True
    assert live.ensure_index() is False
    live.bulk_apply(changes[:4])
    for scope, change in changes[4:]:
        live.apply(scope, change)
    for scope, change in changes:
        reference.apply(scope, change)
    live.refresh()

    expected = [hit.record_id for hit in reference.search(SCOPE, ["alpha"], 10)]
    assert expected == ["rec-0", "rec-1", "rec-2", "rec-3", "rec-4", "rec-5"]
    hits = live.search(SCOPE, ["alpha"], 10)
    assert [hit.record_id for hit in hits] == expected
    assert hits[0].score == hits[1].score > hits[2].score > 0
    assert [hit.record_id for hit in live.search(SCOPE, ["alpha"], 3)] == expected[:3]

    other_expected = [hit.record_id for hit in reference.search(OTHER, ["alpha"], 10)]
    assert other_expected == ["rec-7", "rec-8", "rec-9", "rec-1"]
    assert [hit.record_id for hit in live.search(OTHER, ["alpha"], 10)] == other_expected
    assert "rec-7" not in expected and "rec-6" not in other_expected

    assert live.contains(SCOPE, "rec-1") and live.contains(OTHER, "rec-1")
    assert not live.contains(SCOPE, "rec-7")
    live.apply(OTHER, ProjectionChange(delete_record_id="rec-1"))
    live.apply(OTHER, ProjectionChange(delete_record_id="rec-1"))  # idempotent
    live.refresh()
    assert live.contains(SCOPE, "rec-1") and not live.contains(OTHER, "rec-1")
    assert [hit.record_id for hit in live.search(SCOPE, ["alpha"], 10)] == expected
    assert "rec-1" not in [hit.record_id for hit in live.search(OTHER, ["alpha"], 10)]


# --------------------------------------------------------------------------------------------
# The semantic channel: vectors in the same document, exact k-NN by scoring script
# --------------------------------------------------------------------------------------------


def test_an_upsert_with_a_vector_stores_it_in_the_same_document(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    index.ensure_index()
    cluster.requests.clear()
    vector = (0.6, 0.8)
    index.apply(SCOPE, ProjectionChange(upsert=ProjectionDoc("mem_a", FIELDS, vector)))
    [put] = cluster.requests
    assert put.body["embedding"] == [0.6, 0.8]
    assert put.body["has_embedding"] is True
    assert put.body["record_id"] == "mem_a" and put.body["primary"] == FIELDS["primary"]


def test_nearest_is_an_exact_cosine_script_score_within_the_scope(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "POST", r"/engram-records/_search", _hits_response(("mem_b", 1.5), ("mem_a", 1.5))
    )
    hits = index.nearest(SCOPE, [0.6, 0.8], 10)
    assert hits == [IndexHit("mem_a", 0.5), IndexHit("mem_b", 0.5)]  # 1 + cos → cos; ties by id
    [request] = cluster.requests
    assert request.params == {"preference": request.params["preference"]}
    body = request.body
    assert body == OpenSearchLexicalIndex.nearest_body(SCOPE, [0.6, 0.8], 10)
    script_score = body["query"]["script_score"]
    assert script_score["query"]["bool"]["filter"] == [
        {"term": {"tenant_id": SCOPE.tenant_id}},
        {"term": {"workspace_id": SCOPE.workspace_id}},
        {"term": {"has_embedding": True}},
    ]
    assert script_score["script"] == {
        "source": "knn_score",
        "lang": "knn",
        "params": {"field": "embedding", "query_value": [0.6, 0.8], "space_type": "cosinesimil"},
    }
    assert body["sort"] == [{"_score": {"order": "desc"}}, {"record_id": {"order": "asc"}}]
    assert index.nearest(SCOPE, [0.6, 0.8], 0) == []


def test_score_at_asks_for_one_hit_at_the_rank_then_the_lowest(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer("POST", r"/engram-records/_search", _hits_response(("mem_q", 1.25)))
    assert index.score_at(SCOPE, [0.6, 0.8], 1000) == 0.25  # 1 + cos -> cos
    [request] = cluster.requests
    expected = OpenSearchLexicalIndex.nearest_body(SCOPE, [0.6, 0.8], 1)
    assert request.body == {**expected, "from": 999}

    # Fewer vectors than the rank: the page at 999 is empty, so the lowest, in ascending order.
    cluster.requests.clear()
    pages = iter([_hits_response(), _hits_response(("mem_z", 0.9))])
    cluster.responders.insert(0, lambda request: next(pages))
    assert index.score_at(SCOPE, [0.6, 0.8], 1000) == pytest.approx(-0.1)
    first, second = cluster.requests
    assert first.body["from"] == 999 and first.body["size"] == 1
    assert second.body["from"] == 0
    assert second.body["sort"] == [{"_score": {"order": "asc"}}, {"record_id": {"order": "asc"}}]
    assert index.score_at(SCOPE, [0.6, 0.8], 0) is None


def test_similarities_are_one_knn_request_filtered_to_the_ids(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "POST", r"/engram-records/_search", _hits_response(("mem_b", 1.5), ("mem_a", 0.75))
    )
    found = index.similarities(SCOPE, [0.6, 0.8], ["mem_a", "mem_b", "mem_a", "mem_c"])
    assert found == {"mem_a": -0.25, "mem_b": 0.5}
    [request] = cluster.requests
    expected = OpenSearchLexicalIndex.nearest_body(SCOPE, [0.6, 0.8], 3)
    expected["query"]["script_score"]["query"]["bool"]["filter"].append(
        {"terms": {"record_id": ["mem_a", "mem_b", "mem_c"]}}
    )
    assert request.body == expected
    assert index.similarities(SCOPE, [0.6, 0.8], []) == {}
    assert len(cluster.requests) == 1  # nothing asked for nothing


def test_has_vector_reads_the_document_in_realtime(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    status, found = _found(SCOPE, "mem_a")
    cluster.answer("GET", r"/engram-records/_doc/.*", (status, found))
    assert index.has_vector(SCOPE, "mem_a") is False  # a lexical-only document
    found["_source"]["has_embedding"] = True
    assert index.has_vector(SCOPE, "mem_a") is True
    assert cluster.requests[-1].params == {
        "_source_includes": "tenant_id,workspace_id,record_id,has_embedding"
    }
    cluster.answer("GET", r"/engram-records/_doc/.*", (404, {"_id": "x", "found": False}))
    assert index.has_vector(SCOPE, "mem_a") is False  # forgotten: the document is gone


def test_a_failed_knn_search_is_unavailable(
    index: OpenSearchLexicalIndex, cluster: FakeCluster
) -> None:
    cluster.answer(
        "POST", r"/engram-records/_search", _hits_response(("mem_a", 1.0), timed_out=True)
    )
    with pytest.raises(IndexUnavailable):
        index.nearest(SCOPE, [1.0, 0.0], 10)
