"""Moving in and out: other memory systems' files read as captures, and our records written as
the MCP memory server's file (``admin import``, ``admin export --format mcp-memory``).

Sources (``read_source``), each item one capture citing its place (``file:line`` or
``file[index]``) and the digest of its content:

- ``mcp-memory``: the JSONL file of ``@modelcontextprotocol/server-memory`` (one entity or
  relation per line);
- ``mem0``: a mem0 export (a JSON list of memories, or ``{"results": [...]}``);
- ``markdown``: a folder of notes (basic-memory / Obsidian: YAML front matter, ``- [category]
  text`` observations, ``[[links]]``), one capture per note;
- ``engram``: our own export (``admin export``), one capture per record.

Every item is parsed and validated as a ``CaptureInput`` before anything is written (a malformed
file is one line naming its place, and nothing is imported). ``import_items`` then runs each
through the agent's own capture and request_admission under the principal, workspace and
purpose the operator names, so the admission policy decides as for any agent write. The
idempotency key derives from the source's id and the content digest: a re-run adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from engram_memory.contract.models import CaptureInput
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope, TrustedContext, new_audit_id
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.ports import AdmissionRequest, PolicyUnavailable
from engram_memory.engine.records import build_record, evidence_object, stored_payload
from engram_memory.engine.usecases.admission import forgotten, neighbours
from engram_memory.operator_plane.seat import UsageError
from engram_memory.operator_plane.text import progress

if TYPE_CHECKING:
    from engram_memory.engine.service import Engine

__all__ = ["FORMATS", "ImportItem", "import_items", "mcp_memory_lines", "read_source"]

FORMATS: Final = ("mcp-memory", "mem0", "markdown", "engram")
ENTITY: Final = "mcp-memory:entity"
RELATION: Final = "mcp-memory:relation"
_MAX_COMPONENTS: Final = 64
_MAX_REF: Final = 512


@dataclass(frozen=True, slots=True)
class ImportItem:
    """One source item as the capture it becomes; ``place`` names it (never its content)."""

    place: str
    arguments: dict[str, Any]  # the capture's arguments, validated


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _sha(data: str | bytes) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _ref(text: str) -> str:
    """A reference of at most 512 UTF-8 bytes: the text, or its digest when longer."""
    text = _nfc(text)
    return text if len(text.encode("utf-8")) <= _MAX_REF else _sha(text)


def _instant(value: Any, place: str) -> int | None:
    """Epoch ms of a source's timestamp (ISO-8601 or a date; naive means UTC), or None."""
    if value is None or value == "":
        return None
    from datetime import UTC, date, datetime

    from dateutil import parser as dateparse

    if isinstance(value, datetime | date):  # YAML front matter parses dates itself
        moment = value if isinstance(value, datetime) else datetime(*value.timetuple()[:3])
    else:
        try:
            moment = dateparse.isoparse(str(value))
        except (ValueError, OverflowError):
            raise UsageError(f"{place}: not an ISO-8601 date") from None  # the value unechoed
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _item(
    place: str,
    source: str,
    content: str,
    components: Sequence[tuple[str, str, str]],
    *,
    type_ref: str,
    purpose: str,
    valid_from_ms: int,
    observed_ms: int | None = None,
) -> ImportItem:
    """The capture of one source item: ``components`` as (id, kind, text), the first primary,
    each citing the source (``source`` its id, ``place`` its location, ``content`` its text)."""
    content_digest = _sha(content)
    citation: dict[str, Any] = {
        "citation_id": "source",
        "source_ref": _ref(source),
        "locator": {"scheme": "file", "value": _ref(place)},
        "content_digest": content_digest,
    }
    if observed_ms is not None:
        citation["observed_at"] = format_instant(observed_ms)
    kept = [(cid, kind, _nfc(text)) for cid, kind, text in components if text.strip()]
    arguments = {
        "idempotency_key": "import:" + _sha(f"{source}\n{content_digest}")[7:55],
        "payload": {
            "schema_version": 2,
            "purpose_ref": purpose,
            "valid_time": {"t": valid_from_ms},
            "components": [
                {"component_id": cid, "kind": kind, "text": text, "citation_ids": ["source"]}
                for cid, kind, text in kept[:_MAX_COMPONENTS]
            ],
            "primary_component_id": kept[0][0] if kept else "",
            "primary_event": {"at": valid_from_ms, "type_ref": type_ref, "citation_id": "source"},
            "citations": [citation],
        },
        "evidence": {
            "evidence_ref": _ref(f"import:{source}"),
            "evidence_digest": content_digest,
            "citation_ids": ["source"],
        },
    }
    if not kept:
        raise UsageError(f"{place}: nothing to import (no text)")
    try:
        CaptureInput.model_validate(arguments)
    except ValidationError as error:
        first = error.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise UsageError(f"{place}: {first['msg']} ({where})") from None
    return ImportItem(place, arguments)


# --------------------------------------------------------------------------------------------
# The sources
# --------------------------------------------------------------------------------------------


def read_source(fmt: str, path: Path, purpose: str, now_ms: int) -> list[ImportItem]:
    """Every item of ``path`` in format ``fmt``, validated; ``UsageError`` (one line naming the
    place) at the first malformed one, before anything is written."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if fmt == "markdown":
        return _markdown(path, purpose, now_ms)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; --format {fmt} reads one file")
    if fmt == "mcp-memory":
        return _mcp_memory(path, purpose, now_ms)
    if fmt == "mem0":
        return _mem0(path, purpose, now_ms)
    return _engram(path, purpose, now_ms)


def _json_lines(path: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(place, line text, object) of each non-empty line of a JSON Lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path.name}: not UTF-8 text") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        place = f"{path.name}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{place}: not JSON ({error.msg})") from None
        if not isinstance(value, dict):
            raise UsageError(f"{place}: not a JSON object")
        yield place, line, value


def _strings(value: Mapping[str, Any], place: str, *keys: str) -> list[str]:
    found = [value.get(key) for key in keys]
    missing = [key for key, item in zip(keys, found, strict=True) if not isinstance(item, str)]
    if missing:
        raise UsageError(f"{place}: {', '.join(missing)} missing or not a string")
    return [str(item) for item in found]


def _mcp_memory(path: Path, purpose: str, now_ms: int) -> list[ImportItem]:
    items: list[ImportItem] = []
    for place, line, value in _json_lines(path):
        kind = value.get("type")
        if kind == "entity":
            name, entity_type = _strings(value, place, "name", "entityType")
            observations = value.get("observations", [])
            if not isinstance(observations, list) or not all(
                isinstance(o, str) for o in observations
            ):
                raise UsageError(f"{place}: observations must be a list of strings")
            components = [("name", "context", name), ("type", "context", entity_type)]
            components += [(f"obs-{i}", "evidence", o) for i, o in enumerate(observations, 1)]
            source, type_ref = f"mcp-memory:entity:{name}", ENTITY
        elif kind == "relation":
            start, end, relation = _strings(value, place, "from", "to", "relationType")
            components = [
                ("relation", "context", f"{start} {relation} {end}"),
                ("from", "context", start),
                ("to", "context", end),
                ("relationType", "context", relation),
            ]
            source, type_ref = f"mcp-memory:relation:{start}\n{relation}\n{end}", RELATION
        else:
            raise UsageError(f"{place}: type must be 'entity' or 'relation'")
        items.append(
            _item(
                place, source, line, components, type_ref=type_ref, purpose=purpose,
                valid_from_ms=now_ms,
            )
        )  # fmt: skip
    return items


def _mem0(path: Path, purpose: str, now_ms: int) -> list[ImportItem]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path.name}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path.name}:{error.lineno}: not JSON ({error.msg})") from None
    if isinstance(document, dict) and isinstance(document.get("results"), list):
        document = document["results"]  # mem0's get_all answer
    if not isinstance(document, list):
        raise UsageError(f"{path.name}: not a JSON list of memories")
    items: list[ImportItem] = []
    for index, memory in enumerate(document):
        place = f"{path.name}[{index}]"
        if not isinstance(memory, dict):
            raise UsageError(f"{place}: not a JSON object")
        memory_id, text = _strings(memory, place, "id", "memory")
        created = _instant(memory.get("created_at"), f"{place}.created_at")
        updated = _instant(memory.get("updated_at"), f"{place}.updated_at")
        user = memory.get("user_id")
        source = f"mem0:{user}:{memory_id}" if isinstance(user, str) else f"mem0:{memory_id}"
        content = json.dumps(memory, sort_keys=True, ensure_ascii=False)
        items.append(
            _item(
                place, source, content, [("memory", "context", text)], type_ref="mem0:memory",
                purpose=purpose, valid_from_ms=created if created is not None else now_ms,
                observed_ms=updated if updated is not None else created,
            )
        )  # fmt: skip
    return items


def _front_matter(text: str, place: str) -> tuple[dict[str, Any], str, int]:
    """A note's YAML front matter, its body, and the body's first line number."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text, 1
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() in ("---", "..."))
    except StopIteration:
        raise UsageError(f"{place}:1: front matter not closed with ---") from None
    import yaml

    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = 2 + mark.line if mark is not None else 1
        raise UsageError(f"{place}:{line}: front matter is not YAML") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{place}:2: front matter is not a mapping")
    return meta, "\n".join(lines[end + 1 :]), end + 2


def _observation(line: str) -> tuple[str, str] | None:
    """(category, text) of a ``- [category] text`` bullet, else None."""
    stripped = line.strip()
    if not stripped.startswith(("- [", "* [")) or "]" not in stripped:
        return None
    category, _, rest = stripped[3:].partition("]")
    if not category.strip() or category.strip() in ("x", " ") or not rest.strip():
        return None  # a task list item, not an observation
    return category.strip(), rest.strip()


def _markdown(root: Path, purpose: str, now_ms: int) -> list[ImportItem]:
    files = sorted(root.rglob("*.md")) if root.is_dir() else [root]
    base = root if root.is_dir() else root.parent
    items: list[ImportItem] = []
    for number, path in enumerate(files, 1):
        name = path.relative_to(base).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{name}: not UTF-8 text") from None
        meta, body, _first = _front_matter(text, name)
        title = str(meta.get("title") or path.stem)
        prose: list[str] = []
        observations: list[tuple[str, str]] = []
        for line in body.splitlines():
            found = _observation(line)
            if found is None:
                prose.append(line)
            else:
                observations.append(found)
        when = _instant(meta.get("date") or meta.get("created"), f"{name}:1")
        source = f"markdown:{meta.get('permalink') or name}"
        # A capture holds at most 64 components: a note with more observations than fit beside
        # its prose continues in further captures ("part 2", ...) rather than losing the rest.
        per_part = _MAX_COMPONENTS - 1
        parts = [observations[i : i + per_part] for i in range(0, len(observations), per_part)]
        for part, chunk in enumerate(parts or [[]], 1):
            heading = f"# {title}" if part == 1 else f"# {title} (part {part} of {len(parts)})"
            components = [("note", "context", f"{heading}\n" + "\n".join(prose).strip())]
            components += [
                (f"obs-{i}", "decision" if cat == "decision" else "evidence", f"[{cat}] {o}")
                for i, (cat, o) in enumerate(chunk, (part - 1) * per_part + 1)
            ]
            items.append(
                _item(
                    f"{name}:1", source if part == 1 else f"{source}#part-{part}", text, components,
                    type_ref=f"note:{meta.get('type') or 'note'}", purpose=purpose,
                    valid_from_ms=when if when is not None else now_ms,
                )
            )  # fmt: skip
        progress(number, len(files), "notes read")
    return items


def _engram(path: Path, purpose: str, now_ms: int) -> list[ImportItem]:
    """Our export: each line's record captured again, citing the record it came from."""
    items: list[ImportItem] = []
    for place, line, value in _json_lines(path):
        record = value.get("record")
        if not isinstance(record, dict) or not isinstance(record.get("components"), list):
            raise UsageError(f"{place}: not a line of `admin export` (no record)")
        record_id, _digest = _strings(record, place, "record_id", "record_digest")
        components = [
            (str(c.get("component_id")), str(c.get("kind")), str(c.get("text")))
            for c in record["components"]
            if isinstance(c, dict)
        ]
        primary = str(record.get("primary_component_id"))
        components.sort(key=lambda c: c[0] != primary)  # the primary first, order kept
        event = record.get("primary_event") or {}
        valid = record.get("valid_time") or {}
        items.append(
            _item(
                place, f"engram:{record_id}", line, components,
                type_ref=str(event.get("type_ref") or "engram:record"), purpose=purpose,
                valid_from_ms=int(valid.get("t", now_ms)),
            )
        )  # fmt: skip
    return items


# --------------------------------------------------------------------------------------------
# The import
# --------------------------------------------------------------------------------------------


def _context(scope: Scope, principal: str, purpose: str) -> TrustedContext:
    return TrustedContext.for_operator(scope, principal, purpose, ("capture", "request_admission"))


def _verdict(engine: Kernel, ctx: TrustedContext, item: ImportItem, now_ms: int) -> tuple[str, str]:
    """What the policy would answer for ``item`` now, without writing: (outcome, rule)."""
    model = CaptureInput.model_validate(item.arguments)
    payload = stored_payload(model, ctx.scope)
    evidence = evidence_object(model)
    record = build_record(
        payload,
        evidence,
        recorded_at_ms=now_ms,
        recorded_cursor=0,
        authorization_receipt_digest=_sha("dry-run"),
    )
    try:
        decision = engine.policy.decide(
            AdmissionRequest(
                ctx.scope,
                ctx.principal,
                "dry-run",
                record,
                evidence,
                (),
                neighbours=neighbours(engine, ctx.scope, record, now_ms),
            )
        )
    except PolicyUnavailable:
        return "failed", "POLICY_UNAVAILABLE"
    outcome = {"accept": "accepted", "reject": "rejected"}.get(
        decision.decision, "pending_adjudication"
    )
    if outcome == "accepted" and forgotten(engine, ctx.scope, record["payload_digest"]):
        return "pending_adjudication", "tombstone"
    return outcome, decision.rule


def _code(answer: object) -> str:
    """The error code of a failure envelope (a confirmation asked for: the tool's own)."""
    if isinstance(answer, dict):
        return str(answer.get("error", {}).get("code"))
    return "CONFIRMATION_PENDING"


def _full_engine(engine: Kernel) -> Engine:
    """The engine with its tools' entry point: an import runs the agent's own calls."""
    from engram_memory.engine.service import Engine

    assert isinstance(engine, Engine)  # every host's seat opens the whole engine
    return engine


def _imported(engine: Kernel, ctx: TrustedContext, item: ImportItem) -> dict[str, Any] | None:
    """The capture an earlier import of ``item`` committed (its key is the item's), or None."""
    return _full_engine(engine).committed("capture", ctx, item.arguments["idempotency_key"])


def _admit(engine: Kernel, ctx: TrustedContext, item: ImportItem) -> tuple[str, str]:
    """Capture ``item`` and request its admission, as the agent would: (outcome, code)."""
    engine = _full_engine(engine)
    key = item.arguments["idempotency_key"]
    before = _imported(engine, ctx, item)
    captured = before or engine.handle(
        "capture", item.arguments, replace(ctx, audit_id=new_audit_id())
    )
    if not isinstance(captured, dict) or not captured.get("ok"):
        return "failed", _code(captured)
    candidate = captured["output"]["value"]["candidate_id"]
    admitted = engine.handle(
        "request_admission",
        {"candidate_id": candidate, "idempotency_key": "admit:" + key},
        replace(ctx, audit_id=new_audit_id()),
    )
    if not isinstance(admitted, dict) or not admitted.get("ok"):
        return ("already_imported", "") if before is not None else ("failed", _code(admitted))
    value = admitted["output"]["value"]
    if before is not None and value.get("replayed"):
        return "already_imported", ""
    return str(value["outcome"]["status"]), ""


def import_items(
    engine: Kernel,
    scope: Scope,
    operator: str,
    items: Sequence[ImportItem],
    *,
    principal: str,
    purpose: str,
    dry_run: bool,
) -> dict[str, Any]:
    """Run ``items`` through capture and admission under ``principal`` and ``purpose`` (or, with
    ``dry_run``, ask the policy only): counts by outcome, and the place and rule or code of each
    item not accepted (never its content). Audited as ``admin.import``."""
    from engram_memory.operator_plane.auditing import audited

    ctx = _context(scope, principal, purpose)
    counts = dict.fromkeys(
        ("accepted", "rejected", "pending_adjudication", "already_imported", "failed"), 0
    )
    details: list[dict[str, str]] = []

    def run(call: Call) -> dict[str, Any]:
        for done, item in enumerate(items, 1):
            imported = _imported(engine, ctx, item)
            expected, rule = _verdict(engine, ctx, item, call.now_ms)
            outcome = expected
            if imported is not None and dry_run:
                outcome, rule = "already_imported", ""
            elif not dry_run:
                outcome, code = _admit(engine, ctx, item)
                # The policy's rule when admission answered what it foresaw (it names no rule
                # to the caller), else the error code (or nothing: the store moved in between).
                rule = rule if outcome == expected else code
            counts[outcome] += 1
            if outcome not in ("accepted", "already_imported"):
                details.append({"place": item.place, "outcome": outcome, "reason": rule})
            progress(done, len(items), "items")
        call.digests["imported_items"] = str(len(items))
        return {"dry_run": dry_run, "items": len(items), **counts, "not_accepted": details}

    return audited(engine, scope, operator, "import", None, run)


# --------------------------------------------------------------------------------------------
# Export as the MCP memory server's file
# --------------------------------------------------------------------------------------------


def mcp_memory_lines(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``admin export``'s lines as the MCP memory server's JSONL objects: what came from it as
    it was (entities merged by name), any other record as an entity named by its record id."""
    entities: dict[str, dict[str, Any]] = {}
    relations: list[dict[str, Any]] = []
    for line in lines:
        record = line["record"]
        texts = {c["component_id"]: c["text"] for c in record["components"]}
        kind = record["primary_event"]["type_ref"]
        if kind == RELATION:
            relations.append(
                {"type": "relation", "from": texts["from"], "to": texts["to"],
                 "relationType": texts["relationType"]}
            )  # fmt: skip
            continue
        if kind == ENTITY:
            name, entity_type = texts["name"], texts["type"]
            observations = [t for cid, t in texts.items() if cid.startswith("obs-")]
        else:
            name, entity_type = record["record_id"], kind
            observations = [c["text"] for c in record["components"]]
        entity = entities.setdefault(
            name, {"type": "entity", "name": name, "entityType": entity_type, "observations": []}
        )
        entity["observations"] += [o for o in observations if o not in entity["observations"]]
    return [*entities.values(), *relations]
