"""The fake OpenSearch domain: the subset of the REST API the index adapter sends.

Create index, index/get/delete a document, ``_bulk``, ``_search`` (term filters, ``match``
clauses by field boost, a plain term-count score; not BM25), ``_refresh``, and the security
plugin's API (the custom resource). Any other request is answered 400 and counted as unknown, so
a request shape the fake does not know cannot pass unnoticed.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Final
from urllib.parse import unquote

from .settings import REGION

BOOST_RE: Final = re.compile(r"^[a-z_]+$")
SECURITY_API_RE: Final = re.compile(
    r"^/_plugins/_security/api/(roles/[a-z0-9_-]+|rolesmapping/[a-z0-9_-]+|audit/config)$"
)
SIGV4_ES_SCOPE_RE: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/" + REGION + r"/es/aws4_request, "
    r"SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$"
)
SHARDS: Final = {"total": 1, "successful": 1, "failed": 0}


def _not_found(kind: str) -> tuple[int, Any]:
    return 404, {"error": {"type": kind}, "status": 404}


def _writes(method: str, parts: list[str]) -> bool:
    """Whether a request writes documents: a document's index or delete, or ``_bulk``."""
    document = len(parts) == 3 and parts[1] == "_doc" and method in ("PUT", "POST", "DELETE")
    return document or (len(parts) == 2 and parts[1] == "_bulk")


class FakeOpenSearch:
    def __init__(self) -> None:
        self.indices: dict[str, dict[str, dict[str, Any]]] = {}
        self.unknown: list[str] = []
        self.requests: list[str] = []
        # the security plugin's API (the custom resource): path -> last body, and whether every
        # request to it carried a SigV4 signature for service es in the region
        self.security: dict[str, Any] = {}
        self.security_unsigned: list[str] = []
        # while True, every data request answers 503 (a domain briefly unavailable)
        self.unavailable = False
        # while True, every document write answers 503 and searches are answered (a domain
        # whose writes fail: an admission still finds its neighbours, its upsert fails)
        self.refusing_writes = False
        self.lock = threading.Lock()

    def record_ids(self, workspace: str) -> set[str]:
        """The record ids the domain holds for ``workspace``."""
        with self.lock:
            return {
                str(doc.get("record_id"))
                for docs in self.indices.values()
                for doc in docs.values()
                if doc.get("workspace_id") == workspace
            }

    def handle(
        self, method: str, path: str, body: bytes, authorization: str = ""
    ) -> tuple[int, Any]:
        bare = path.split("?", 1)[0]
        parts = [unquote(p) for p in bare.strip("/").split("/") if p]
        with self.lock:
            self.requests.append(f"{method} /{'/'.join(parts[:1] + ['…'] * (len(parts) > 1))}")
            if self.unavailable and not SECURITY_API_RE.match(bare):
                return 503, {"error": {"type": "cloud_check_unavailable"}, "status": 503}
            if self.refusing_writes and _writes(method, parts):
                return 503, {"error": {"type": "cloud_check_unavailable"}, "status": 503}
            if method == "PUT" and SECURITY_API_RE.match(bare):
                if not SIGV4_ES_SCOPE_RE.match(authorization):
                    self.security_unsigned.append(bare)
                    return 403, {"error": {"type": "security_exception"}, "status": 403}
                self.security[bare] = json.loads(body)
                return 200, {"status": "OK"}
            return self._route(method, parts, body)

    def _route(self, method: str, parts: list[str], body: bytes) -> tuple[int, Any]:
        if method == "HEAD" and not parts:
            return 200, {}
        if len(parts) == 2 and parts[1] == "_bulk":  # the index in the path (its IAM grant)
            return 200, self._bulk(body, parts[0])
        if len(parts) == 1 and method == "PUT":
            if parts[0] in self.indices:
                return 400, {"error": {"type": "resource_already_exists_exception"}, "status": 400}
            self.indices[parts[0]] = {}
            return 200, {"acknowledged": True, "index": parts[0]}
        if len(parts) == 2 and parts[1] == "_refresh":
            return 200, {"_shards": SHARDS}
        if len(parts) == 2 and parts[1] == "_search" and method in ("GET", "POST"):
            if parts[0] not in self.indices:
                return _not_found("index_not_found_exception")
            return 200, self._search(parts[0], json.loads(body or b"{}"))
        if len(parts) == 3 and parts[1] == "_doc":
            answered = self._document(method, parts[0], parts[2], body)
            if answered is not None:
                return answered
        self.unknown.append(f"{method} /{'/'.join(parts)}")
        return 400, {"error": {"type": "cloud_check_unknown_request"}, "status": 400}

    def _document(
        self, method: str, index: str, doc_id: str, body: bytes
    ) -> tuple[int, Any] | None:
        """``/<index>/_doc/<id>``: PUT/POST, GET, DELETE; None for another method."""
        if method in ("PUT", "POST"):
            docs = self.indices.setdefault(index, {})
            created = doc_id not in docs
            docs[doc_id] = json.loads(body)
            result = "created" if created else "updated"
            return (201 if created else 200), {"_id": doc_id, "result": result}
        if index not in self.indices:
            return _not_found("index_not_found_exception")
        if method == "GET":
            source = self.indices[index].get(doc_id)
            if source is None:
                return 404, {"_id": doc_id, "found": False}
            return 200, {"_id": doc_id, "found": True, "_source": source}
        if method == "DELETE":
            gone = self.indices[index].pop(doc_id, None)
            return (200 if gone else 404), {
                "_id": doc_id,
                "result": "deleted" if gone else "not_found",
            }
        return None

    def _bulk(self, body: bytes, default_index: str) -> dict[str, Any]:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        items: list[dict[str, Any]] = []
        position = 0
        while position < len(lines):
            action = lines[position]
            ((kind, meta),) = action.items()
            index = meta.get("_index", default_index)
            docs = self.indices.setdefault(index, {})
            if kind == "index":
                docs[meta["_id"]] = lines[position + 1]
                items.append({"index": {"_id": meta["_id"], "status": 201}})
                position += 2
            elif kind == "delete":
                gone = docs.pop(meta["_id"], None)
                items.append({"delete": {"_id": meta["_id"], "status": 200 if gone else 404}})
                position += 1
            else:
                self.unknown.append(f"_bulk action {kind}")
                items.append({kind: {"status": 400, "error": {"type": "unknown"}}})
                position += 1
        return {"took": 1, "errors": False, "items": items}

    def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        query = body.get("query", {}).get("bool", {})
        filters = {
            field: value
            for clause in query.get("filter", [])
            for field, value in clause.get("term", {}).items()
        }
        matches: list[tuple[str, float, str]] = []
        for clause in query.get("should", []):
            for field, spec in clause.get("match", {}).items():
                if BOOST_RE.match(field):
                    matches.append((field, float(spec.get("boost", 1.0)), str(spec["query"])))
        scored: list[tuple[float, str]] = []
        for source in self.indices[index].values():
            if any(source.get(field) != value for field, value in filters.items()):
                continue
            score = 0.0
            for field, boost, text in matches:
                words = str(source.get(field, "")).split()
                score += boost * sum(words.count(term) for term in text.split())
            if score > 0:
                scored.append((score, str(source["record_id"])))
        scored.sort(key=lambda hit: (-hit[0], hit[1]))
        hits = [{"_score": score, "_source": {"record_id": rid}} for score, rid in scored]
        return {
            "timed_out": False,
            "_shards": SHARDS,
            "hits": {"hits": hits[: int(body.get("size", 10))]},
        }
