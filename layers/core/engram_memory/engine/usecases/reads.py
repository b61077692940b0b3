"""search and get: only current accepted records, revalidated, redacted, with receipts (§7.1, §7.2)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from engram_memory.contract.canonical import (
    canonical_array,
    canonical_bytes,
    canonical_object,
    digest,
    digest_of_canonical,
)
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import GetInput, SearchInput
from engram_memory.contract.types import format_instant
from engram_memory.engine import lexical, semantic, temporal
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.paging import PageState, decode_cursor, encode_cursor
from engram_memory.engine.ports import (
    Embedder,
    EmbedderUnavailable,
    IndexHit,
    IndexUnavailable,
    RecordRow,
    VectorIndex,
)
from engram_memory.engine.records import receipt, scope_ref
from engram_memory.engine.redaction import redact

log = logging.getLogger(__name__)


def search(k: Kernel, call: Call, args: SearchInput) -> dict[str, Any]:
    k.check_purpose(call, args.purpose_ref)
    require_semantic = args.capability_policy.minimum_channels == "lexical_and_semantic"
    if require_semantic and not k.semantic_available:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE)
    now = call.now_ms
    request_digest = _request_digest(args)
    call.digests["request_digest"] = request_digest
    binding = digest(
        "page-binding", {"scope_ref": scope_ref(call.scope), "principal": call.ctx.principal}
    )
    head = k.read(lambda: k.store.head(call.scope))
    # After the head: every admission this search's receipt covers has its upsert either done
    # (and searchable) or still in the outbox, which makes the answer PROJECTION_STALE.
    k.check_projection_current(call.scope)

    # Fixed by the page size, so every page of one search ranks the same list.
    depth = k.search_depth(args.limit)
    hits, ranked, rows, profile = _rank(k, call, args, now, require_semantic, depth)
    ordered_digest = digest("ordered-ids", [h.record_id for h in ranked])
    page = PageState(
        request_digest=request_digest,
        binding=binding,
        valid_as_of=now,
        system_as_of=str(head.cursor),
        ordered_ids_digest=ordered_digest,
        offset=0,
    )
    if args.page_cursor is not None:
        page = _resumed(k, args.page_cursor, page, len(ranked))
    packets, packet_bytes, next_offset = _packets(k, call, args, ranked, rows, page.offset)
    rank_receipt = receipt(
        "rank-receipt",
        {
            "request_digest": request_digest,
            **profile,
            "valid_as_of": page.valid_as_of,
            "system_as_of": page.system_as_of,
            "candidate_count": len(hits),
            "candidate_ids_digest": digest("candidate-ids", sorted(h.record_id for h in hits)),
            "ordered_ids_digest": ordered_digest,
            "revalidation_receipt_digest": _revalidation(now, head.cursor, hits, ranked, page),
            "issued_at": format_instant(now),
        },
    )
    value: dict[str, Any] = {"records": packets, "rank_receipt": rank_receipt}
    if next_offset < len(ranked):
        value["next_page_cursor"] = encode_cursor(
            replace(page, offset=next_offset), k.settings.cursor_key
        )
    value["response_digest"] = digest_of_canonical(
        "search-response",
        canonical_object(
            {
                "records": canonical_array(packet_bytes),
                **{key: canonical_bytes(item) for key, item in value.items() if key != "records"},
            }
        ),
    )
    return value


def _request_digest(args: SearchInput) -> str:
    """What binds a page cursor to its search: the request without its cursor."""
    return digest(
        "search-request",
        {
            "query": args.query,
            "purpose_ref": args.purpose_ref,
            "limit": args.limit,
            "max_packet_bytes": args.max_packet_bytes,
            "capability_policy": args.capability_policy.model_dump(mode="json"),
        },
    )


def _resumed(k: Kernel, cursor: str, first: PageState, ranked: int) -> PageState:
    """The state a page cursor carries, refused (STALE_PAGE) unless it continues this very
    search: the same request, caller and ranked list, at an offset inside it."""
    state = decode_cursor(cursor, k.settings.cursor_key)
    if (
        state.request_digest != first.request_digest
        or state.binding != first.binding
        or state.ordered_ids_digest != first.ordered_ids_digest
        or not 0 < state.offset < ranked
    ):
        raise EngramError(ErrorCode.STALE_PAGE)
    return replace(
        first,
        valid_as_of=state.valid_as_of,
        system_as_of=state.system_as_of,
        offset=state.offset,
    )


def _revalidation(
    now: int, cursor: int, hits: list[IndexHit], ranked: list[IndexHit], page: PageState
) -> str:
    return digest(
        "revalidation",
        {
            "valid_as_of": now,
            "system_as_of": str(cursor),
            "checked": len(hits),
            "eligible": len(ranked),
            "ordered_ids_digest": page.ordered_ids_digest,
        },
    )


def _packets(
    k: Kernel,
    call: Call,
    args: SearchInput,
    ranked: list[IndexHit],
    rows: dict[str, RecordRow],
    offset: int,
) -> tuple[list[dict[str, Any]], list[bytes], int]:
    """The page's packets from ``offset`` while they fit ``max_packet_bytes``, each one's
    canonical bytes (sized once, digested as they are), and the offset past the last hit the
    page answered or skipped."""
    packets: list[dict[str, Any]] = []
    packet_bytes: list[bytes] = []
    used = 0
    next_offset = offset
    page = ranked[offset : offset + args.limit]
    rows = _page_rows(k, call, page, rows)
    # The page's bodies, opened together: one key-store read, no KMS call (RecordKeys).
    opened = k.bodies(call.scope, [rows[hit.record_id] for hit in page if hit.record_id in rows])
    for position, hit in enumerate(page, start=offset):
        row = rows.get(hit.record_id)
        if row is None:
            next_offset = position + 1
            continue  # no longer eligible when its body was read: not on the page
        full = opened.get(hit.record_id)
        if full is None and row.body is not None:
            next_offset = position + 1
            continue  # its key is destroyed: forgotten since a restored copy was taken
        if full is None:
            full = k.body(call.scope, row)  # BLOB_MISSING: an operator must hear of it
        record, redacted, redaction_digest = redact(full, k.settings.redaction)
        packet = {
            "record": record,
            "redacted_fields": redacted,
            "redaction_receipt_digest": redaction_digest,
            "score": round(hit.score, 6),
            "rank": position + 1,
        }
        encoded = canonical_bytes(packet)
        size = len(encoded)
        if size > args.max_packet_bytes:
            raise EngramError(ErrorCode.PROJECTION_OVERSIZED)
        if used + size > args.max_packet_bytes:
            break
        used += size
        packets.append(packet)
        packet_bytes.append(encoded)
        next_offset = position + 1
    return packets, packet_bytes, next_offset


def _page_rows(
    k: Kernel, call: Call, page: list[IndexHit], rows: dict[str, RecordRow]
) -> dict[str, RecordRow]:
    """``rows`` with the page's bodies: the page's rows ranked without theirs are read again,
    whole, and revalidated; one that is gone or no longer eligible is left out of the answer."""
    missing = [hit.record_id for hit in page if not rows[hit.record_id].body_read]
    if not missing:
        return rows
    whole = k.read(lambda: k.store.records_get(call.scope, missing))
    fresh = {
        record_id: row
        for record_id in missing
        if (row := whole.get(record_id)) is not None and k.eligible(row, call.now_ms)
    }
    return {**{i: r for i, r in rows.items() if r.body_read}, **fresh}


@dataclass(slots=True)
class _Channels:
    """What the ranking channels answered for one query."""

    semantic_on: bool
    lexical_on: bool
    lexical_hits: list[IndexHit]
    semantic_hits: list[IndexHit] = field(default_factory=list)
    semantic_floor: float | None = None
    semantic_list: list[IndexHit] | None = None  # with the lexical hits' similarities (hybrid)


def _rank(
    k: Kernel,
    call: Call,
    args: SearchInput,
    now: int,
    require_semantic: bool,
    depth: int,
) -> tuple[list[IndexHit], list[IndexHit], dict[str, RecordRow], dict[str, str]]:
    """Query the channels, revalidate each list against the store, fuse, and weigh the times the
    query names against the records' valid time (``engine/temporal.py``; the host's
    ``time_aware``), reading ``valid_time`` from the rows the revalidation already read.

    Every hit is revalidated; when there are more than a page of them, their rows are read
    without the sealed bodies, which only the page needs (``_page_rows``).

    Returns every index hit (the candidates), the eligible records in rank order, their rows,
    and the rank receipt's profile fields (``profile``, version, config digest, formula).
    """
    query = args.query
    found = _query_channels(k, call, query, require_semantic, depth)
    hits = list({h.record_id: h for h in [*found.lexical_hits, *found.semantic_hits]}.values())
    ids, bodies = [h.record_id for h in hits], len(hits) <= args.limit
    rows = k.read(lambda: k.store.records_get(call.scope, ids, bodies=bodies))

    def eligible(channel: list[IndexHit]) -> list[IndexHit]:
        return [h for h in channel if h.record_id in rows and k.eligible(rows[h.record_id], now)]

    time_aware = k.settings.time_aware
    intervals = temporal.query_intervals(query, now) if time_aware else []
    if not found.semantic_on or k.embedder is None or k.vectors is None:
        ranked = temporal.rerank(
            eligible(found.lexical_hits), rows, intervals, text_channels=1, normalized=False
        )
        return hits, ranked, rows, _lexical_profile(k, time_aware)
    mode, fusion = k.settings.semantic_mode, k.settings.fusion
    profile = _semantic_profile(k, k.embedder, k.vectors, time_aware)
    if mode == "semantic_only":
        ranked = temporal.rerank(
            eligible(found.semantic_hits), rows, intervals, text_channels=1, normalized=False
        )
        return hits, ranked, rows, profile
    semantic_list = found.semantic_list
    fused = semantic.fuse(
        eligible(found.lexical_hits),
        eligible(semantic_list if semantic_list is not None else found.semantic_hits),
        fusion,
        found.semantic_floor,
    )
    ranked = temporal.rerank(
        fused,
        rows,
        intervals,
        text_channels=2,
        normalized=True,
        rrf_k=semantic.RRF_K if fusion == "rrf" else None,
    )
    return hits, ranked, rows, profile


def _query_channels(
    k: Kernel, call: Call, query: str, require_semantic: bool, depth: int
) -> _Channels:
    """The lexical and semantic hits of ``query``.

    When the semantic channel fails (embedder or vector index down): ``RANKING_UNAVAILABLE`` if
    the caller required ``lexical_and_semantic`` (or the host ranks by vectors alone), else the
    lexical hits alone, so the receipt names the profile that ran (``offline_lexical_v1``).
    """
    semantic_on = k.semantic_available
    lexical_on = not semantic_on or k.settings.semantic_mode == "hybrid"
    terms = lexical.query_terms(query) if lexical_on else []
    try:
        lexical_hits = k.lexical.search(call.scope, terms, depth) if terms else []
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    found = _Channels(semantic_on, lexical_on, lexical_hits)
    if k.embedder is None or k.vectors is None:
        return found
    try:
        (vector,) = k.embedder.embed([query])
        found.semantic_hits = k.vectors.nearest(call.scope, vector, depth)
        found.semantic_floor = semantic.normalization_floor(
            k.vectors, call.scope, vector, found.semantic_hits, depth
        )
        if lexical_on and lexical_hits:
            found.semantic_list = semantic.completed(
                k.vectors, call.scope, vector, found.semantic_hits, lexical_hits
            )
    except (IndexUnavailable, EmbedderUnavailable):
        if require_semantic or not lexical_on:
            raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
        log.warning("semantic channel down: lexical ranking only")
        found.semantic_on = False
    return found


def _lexical_profile(k: Kernel, time_aware: bool) -> dict[str, str]:
    version, config_digest = lexical.receipt_profile(time_aware)
    return {
        "profile": lexical.PROFILE,
        "profile_version": version,
        "profile_config_digest": config_digest,
        "scoring_formula_ref": k.lexical.scoring_formula_ref,
    }


def _semantic_profile(
    k: Kernel, embedder: Embedder, vectors: VectorIndex, time_aware: bool
) -> dict[str, str]:
    mode, fusion = k.settings.semantic_mode, k.settings.fusion
    return {
        "profile": semantic.PROFILE,
        "profile_version": semantic.profile_version(time_aware),
        "profile_config_digest": semantic.profile_config_digest(
            embedder.model_id, mode, fusion, time_aware
        ),
        "scoring_formula_ref": (
            f"{vectors.vector_formula_ref}"
            if mode == "semantic_only"
            else f"{fusion}({k.lexical.scoring_formula_ref}|{vectors.vector_formula_ref})"
        ),
    }


def get(k: Kernel, call: Call, args: GetInput) -> dict[str, Any]:
    k.check_purpose(call, args.purpose_ref)
    call.target = args.record_id
    now = call.now_ms
    row = k.read(lambda: k.store.record_get(call.scope, args.record_id))
    if row is None or not k.eligible(row, now):
        raise EngramError(ErrorCode.NOT_FOUND)
    head = k.read(lambda: k.store.head(call.scope))
    full = k.body(call.scope, row)
    record, redacted, redaction_digest = redact(full, k.settings.redaction)
    read_receipt = receipt(
        "read-receipt",
        {
            "record_id": row.record_id,
            "record_digest": row.record_digest,
            "valid_as_of": now,
            "system_as_of": str(head.cursor),
            "validated_through_cursor": str(head.cursor),
            "authorization_receipt_digest": k.authorization_receipt(
                call, None, {"purpose_ref": call.ctx.purpose_ref, "at": format_instant(now)}
            ),
            "revalidation_receipt_digest": digest(
                "revalidation",
                {
                    "record_id": row.record_id,
                    "state": row.state,
                    "valid_as_of": now,
                    "system_as_of": str(head.cursor),
                },
            ),
            "checked_at": format_instant(now),
        },
    )
    value: dict[str, Any] = {
        "record": record,
        "redacted_fields": redacted,
        "redaction_receipt_digest": redaction_digest,
        "read_receipt": read_receipt,
    }
    members = {key: canonical_bytes(item) for key, item in value.items()}
    value["packet_digest"] = digest_of_canonical("get-packet", canonical_object(members))
    members["packet_digest"] = canonical_bytes(value["packet_digest"])
    call.digests["record_digest"] = row.record_digest
    if len(canonical_object(members)) > args.max_packet_bytes:
        raise EngramError(ErrorCode.PROJECTION_OVERSIZED)
    return value
