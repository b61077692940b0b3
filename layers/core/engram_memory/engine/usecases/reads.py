"""search and get: only current accepted records, revalidated, redacted, with receipts (§7.1, §7.2)."""

from __future__ import annotations

import logging
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
from engram_memory.engine.ports import EmbedderUnavailable, IndexHit, IndexUnavailable, RecordRow
from engram_memory.engine.records import receipt, scope_ref
from engram_memory.engine.redaction import redact

log = logging.getLogger(__name__)


def search(k: Kernel, call: Call, args: SearchInput) -> dict[str, Any]:
    k.check_purpose(call, args.purpose_ref)
    if (
        args.capability_policy.minimum_channels == "lexical_and_semantic"
        and not k.semantic_available
    ):
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE)
    now = call.now_ms
    request_digest = digest(
        "search-request",
        {
            "query": args.query,
            "purpose_ref": args.purpose_ref,
            "limit": args.limit,
            "max_packet_bytes": args.max_packet_bytes,
            "capability_policy": args.capability_policy.model_dump(mode="json"),
        },
    )
    call.digests["request_digest"] = request_digest
    binding = digest(
        "page-binding", {"scope_ref": scope_ref(call.scope), "principal": call.ctx.principal}
    )
    head = k.read(lambda: k.store.head(call.scope))
    # After the head: every admission this search's receipt covers has its upsert either done
    # (and searchable) or still in the outbox, which makes the answer PROJECTION_STALE.
    k.check_projection_current(call.scope)

    require_semantic = args.capability_policy.minimum_channels == "lexical_and_semantic"
    # Fixed by the page size, so every page of one search ranks the same list.
    depth = k.search_depth(args.limit)
    hits, ranked, rows, profile = _rank(k, call, args.query, now, require_semantic, depth)
    ordered_ids = [h.record_id for h in ranked]
    ordered_digest = digest("ordered-ids", ordered_ids)

    offset, valid_as_of, system_as_of = 0, now, str(head.cursor)
    if args.page_cursor is not None:
        state = decode_cursor(args.page_cursor, k.settings.cursor_key)
        if (
            state.request_digest != request_digest
            or state.binding != binding
            or state.ordered_ids_digest != ordered_digest
            or not 0 < state.offset < len(ordered_ids)
        ):
            raise EngramError(ErrorCode.STALE_PAGE)
        offset, valid_as_of, system_as_of = state.offset, state.valid_as_of, state.system_as_of

    packets: list[dict[str, Any]] = []
    packet_bytes: list[bytes] = []  # each packet's canonical bytes: sized once, digested as is
    used = 0
    next_offset = offset  # past the last hit this page answered or skipped
    page = ranked[offset : offset + args.limit]
    # The page's bodies, opened together: one key-store read, no KMS call (RecordKeys).
    opened = k.bodies(call.scope, [rows[hit.record_id] for hit in page])
    for position, hit in enumerate(page, start=offset):
        row = rows[hit.record_id]
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

    revalidation = digest(
        "revalidation",
        {
            "valid_as_of": now,
            "system_as_of": str(head.cursor),
            "checked": len(hits),
            "eligible": len(ranked),
            "ordered_ids_digest": ordered_digest,
        },
    )
    rank_receipt = receipt(
        "rank-receipt",
        {
            "request_digest": request_digest,
            **profile,
            "valid_as_of": valid_as_of,
            "system_as_of": system_as_of,
            "candidate_count": len(hits),
            "candidate_ids_digest": digest("candidate-ids", sorted(h.record_id for h in hits)),
            "ordered_ids_digest": ordered_digest,
            "revalidation_receipt_digest": revalidation,
            "issued_at": format_instant(now),
        },
    )
    value: dict[str, Any] = {"records": packets, "rank_receipt": rank_receipt}
    if next_offset < len(ranked):
        value["next_page_cursor"] = encode_cursor(
            PageState(
                request_digest=request_digest,
                binding=binding,
                valid_as_of=valid_as_of,
                system_as_of=system_as_of,
                ordered_ids_digest=ordered_digest,
                offset=next_offset,
            ),
            k.settings.cursor_key,
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


def _rank(
    k: Kernel,
    call: Call,
    query: str,
    now: int,
    require_semantic: bool,
    depth: int,
) -> tuple[list[IndexHit], list[IndexHit], dict[str, RecordRow], dict[str, str]]:
    """Query the channels, revalidate each list against the store, fuse, and weigh the times the
    query names against the records' valid time (``engine/temporal.py``; the host's
    ``time_aware``), reading ``valid_time`` from the rows the revalidation already read.

    Returns every index hit (the candidates), the eligible records in rank order, their rows,
    and the rank receipt's profile fields (``profile``, version, config digest, formula).

    When the semantic channel fails (embedder or vector index down): ``RANKING_UNAVAILABLE`` if
    the caller required ``lexical_and_semantic`` (or the host ranks by vectors alone), else the
    lexical ranking, and the receipt names the profile that ran (``offline_lexical_v1``).
    """
    semantic_on = k.semantic_available
    lexical_on = not semantic_on or k.settings.semantic_mode == "hybrid"
    terms = lexical.query_terms(query) if lexical_on else []
    try:
        lexical_hits = k.lexical.search(call.scope, terms, depth) if terms else []
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    semantic_hits: list[IndexHit] = []
    semantic_floor: float | None = None
    semantic_list: list[IndexHit] | None = None  # with the lexical hits' similarities (hybrid)
    if k.embedder is not None and k.vectors is not None:
        try:
            (vector,) = k.embedder.embed([query])
            semantic_hits = k.vectors.nearest(call.scope, vector, depth)
            semantic_floor = semantic.normalization_floor(
                k.vectors, call.scope, vector, semantic_hits, depth
            )
            if lexical_on and lexical_hits:
                semantic_list = semantic.completed(
                    k.vectors, call.scope, vector, semantic_hits, lexical_hits
                )
        except (IndexUnavailable, EmbedderUnavailable):
            if require_semantic or not lexical_on:
                raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
            log.warning("semantic channel down: lexical ranking only")
            semantic_on = False
    hits = list({h.record_id: h for h in [*lexical_hits, *semantic_hits]}.values())
    rows = k.read(lambda: k.store.records_get(call.scope, [h.record_id for h in hits]))

    def eligible(channel: list[IndexHit]) -> list[IndexHit]:
        return [h for h in channel if h.record_id in rows and k.eligible(rows[h.record_id], now)]

    time_aware = k.settings.time_aware
    intervals = temporal.query_intervals(query, now) if time_aware else []
    if not semantic_on or k.embedder is None or k.vectors is None:
        version, config_digest = lexical.receipt_profile(time_aware)
        profile = {
            "profile": lexical.PROFILE,
            "profile_version": version,
            "profile_config_digest": config_digest,
            "scoring_formula_ref": k.lexical.scoring_formula_ref,
        }
        ranked = temporal.rerank(
            eligible(lexical_hits), rows, intervals, text_channels=1, normalized=False
        )
        return hits, ranked, rows, profile
    mode, fusion = k.settings.semantic_mode, k.settings.fusion
    profile = {
        "profile": semantic.PROFILE,
        "profile_version": semantic.profile_version(time_aware),
        "profile_config_digest": semantic.profile_config_digest(
            k.embedder.model_id, mode, fusion, time_aware
        ),
        "scoring_formula_ref": (
            f"{k.vectors.vector_formula_ref}"
            if mode == "semantic_only"
            else f"{fusion}({k.lexical.scoring_formula_ref}|{k.vectors.vector_formula_ref})"
        ),
    }
    if mode == "semantic_only":
        ranked = temporal.rerank(
            eligible(semantic_hits), rows, intervals, text_channels=1, normalized=False
        )
        return hits, ranked, rows, profile
    fused = semantic.fuse(
        eligible(lexical_hits),
        eligible(semantic_list if semantic_list is not None else semantic_hits),
        fusion,
        semantic_floor,
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
