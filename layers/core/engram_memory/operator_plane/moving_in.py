"""Moving in and out: other memory systems' files read as captures, and our records written as
the MCP memory server's file (``admin import``, ``admin export --format mcp-memory``).

Sources (``read_source``), each item one capture citing its place (``file:line`` or
``file[index]``) and the digest of its content:

- ``mcp-memory``: the JSONL file of ``@modelcontextprotocol/server-memory`` (one entity or
  relation per line); an observation that is a secret or junk is left out of its entity and
  reported by its place (line, entity, observation number), so its clean siblings still arrive;
  a relation reads as a sentence;
- ``mem0``: saved ``get_all()`` answers (a list of memories, or pages ``{"results": [...]}``),
  one file or a folder of pages; each memory's principal may be its ``user_id`` (``Principals``);
- ``markdown``: a folder of notes (basic-memory / Obsidian: YAML front matter, ``- [category]
  text`` observations, ``[[links]]``), one capture per note, its title once, no empty headings;
- ``engram``: our own export (``admin export``), one capture per record.

Every item is parsed and validated as a ``CaptureInput`` before anything is written (a malformed
file is one line naming its place, or the format it looks like, and nothing is imported); the
source is then read a second time, one item at a time (``ImportSource``), so an import of any
size holds one item in memory. ``import_items`` runs each through the agent's own capture and request_admission under
the principal, workspace and purpose the operator names, so the admission policy decides as for
any agent write. The idempotency key derives from the source's id and the content digest: a
re-run adds nothing, and reports each earlier item as it stands (imported, rejected or held).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from engram_memory.contract.models import CaptureInput
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope, TrustedContext, new_audit_id
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.ports import AdmissionRequest, PolicyUnavailable
from engram_memory.engine.records import build_record, evidence_object, stored_payload
from engram_memory.engine.usecases import inspection as canonical
from engram_memory.engine.usecases.admission import forgotten, neighbours
from engram_memory.operator_plane.seat import UsageError
from engram_memory.operator_plane.text import progress
from engram_memory.policy.secrets import SecretScanner

if TYPE_CHECKING:
    from engram_memory.engine.service import Engine

__all__ = [
    "FORMATS",
    "ImportItem",
    "Principals",
    "import_items",
    "mcp_memory_lines",
    "read_source",
]

FORMATS: Final = ("mcp-memory", "mem0", "markdown", "engram")
ENTITY: Final = "mcp-memory:entity"
RELATION: Final = "mcp-memory:relation"
_MAX_COMPONENTS: Final = 64
_MAX_REF: Final = 512
_MAX_TEXT: Final = 65_536  # a component's text, UTF-8 bytes


@dataclass(frozen=True, slots=True)
class ImportItem:
    """One source item as the capture it becomes; ``place`` names it (never its content)."""

    place: str
    arguments: dict[str, Any]  # the capture's arguments, validated
    # The principal it is captured as when the source names one (mem0's ``--principal-from``);
    # None: the import's ``--principal``.
    principal: str | None = None
    # The parts of the source item left out (a secret or junk observation): where each was and
    # why, never its text.
    dropped: tuple[dict[str, Any], ...] = ()


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _sha(data: str | bytes) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _ref(text: str) -> str:
    """A one-line reference of at most 512 UTF-8 bytes: the text with its runs of whitespace
    (newlines too) as one space, or its digest when longer."""
    text = " ".join(_nfc(text).split())
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


@dataclass(frozen=True, slots=True)
class ImportSource:
    """A source read through once and found valid: how many items it holds, the first that
    names no principal, and its items read again, one at a time, for the import — so an import
    holds one item in memory, not the file's worth."""

    total: int
    first_unnamed: str | None  # the place of the first item that names no principal
    read: Callable[[], Iterator[ImportItem]]

    def __iter__(self) -> Iterator[ImportItem]:
        return self.read()

    def __len__(self) -> int:
        return self.total


def read_source(
    fmt: str, path: Path, purpose: str, now_ms: int, principals: Principals | None = None
) -> ImportSource:
    """``path`` in format ``fmt``, every item validated first; ``UsageError`` (one line naming
    the place) at the first malformed one, before anything is written. A file that fails to
    read as ``fmt`` but looks like another format is refused naming that format."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if principals is not None and fmt != "mem0":
        raise UsageError("--principal-from reads mem0's user_id or agent_id: --format mem0 only")
    total, first_unnamed = 0, None
    try:
        for total, item in enumerate(_read(fmt, path, purpose, now_ms, principals), 1):
            if item.principal is None and first_unnamed is None:
                first_unnamed = item.place
            progress(total, None, "items read")
    except UsageError:
        looks = _looks_like(path)
        if looks is not None and looks[0] != fmt:
            name = path.name or str(path)
            raise UsageError(
                f"{name}: this looks like {looks[1]}; use --format {looks[0]}"
            ) from None
        raise
    return ImportSource(total, first_unnamed, lambda: _read(fmt, path, purpose, now_ms, principals))


def _read(
    fmt: str, path: Path, purpose: str, now_ms: int, principals: Principals | None
) -> Iterator[ImportItem]:
    if fmt == "markdown":
        looks = _looks_like(path) if path.is_file() and path.suffix.lower() != ".md" else None
        if looks is not None and looks[0] != "markdown":
            raise UsageError(f"{path.name}: not a Markdown note")
        return _markdown(path, purpose, now_ms)
    if fmt == "mem0":
        return _mem0(path, purpose, now_ms, principals)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; --format {fmt} reads one file")
    if fmt == "mcp-memory":
        return _mcp_memory(path, purpose, now_ms)
    return _engram(path, purpose, now_ms)


def _looks_like(path: Path) -> tuple[str, str] | None:
    """(format, what it is) of the file or folder ``path`` by its shape, or None."""
    if path.is_dir():
        if any(path.rglob("*.md")):
            return "markdown", "a folder of Markdown notes"
        pages = sorted(path.glob("*.json"))
        return _looks_like(pages[0]) if pages else None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    first = next((line for line in text.splitlines() if line.strip()), "")
    for candidate in (text, first):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        return _json_shape(value)
    if path.suffix.lower() == ".md" or first.startswith(("---", "#")):
        return "markdown", "a Markdown note"
    return None


def _json_shape(value: object) -> tuple[str, str] | None:
    """(format, what it is) of a parsed JSON document or JSON Lines line, or None."""
    if isinstance(value, list) and value:
        value = value[0]
    if not isinstance(value, dict):
        return None
    if value.get("type") in ("entity", "relation"):
        return "mcp-memory", "a server-memory JSONL file (@modelcontextprotocol/server-memory)"
    if isinstance(value.get("record"), dict):
        return "engram", "an `admin export` file"
    if _is_page(value) or isinstance(value.get("memory"), str):
        return "mem0", "a saved mem0 get_all() answer"
    return None


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


def _mcp_memory(path: Path, purpose: str, now_ms: int) -> Iterator[ImportItem]:
    for place, line, value in _json_lines(path):
        kind = value.get("type")
        dropped: tuple[dict[str, Any], ...] = ()
        if kind == "entity":
            name, entity_type = _strings(value, place, "name", "entityType")
            kept, dropped = _observations(value.get("observations", []), place, name)
            head = [("name", "context", name), ("type", "context", entity_type)]
            # A capture holds 64 components: an entity with more observations continues in
            # further captures of the same name (the export merges them back by name).
            per_part = _MAX_COMPONENTS - len(head)
            chunks = [kept[i : i + per_part] for i in range(0, len(kept), per_part)] or [[]]
            source, type_ref = f"mcp-memory:entity:{name}", ENTITY
            parts = [
                (source if n == 1 else f"{source}#part-{n}", [*head, *chunk])
                for n, chunk in enumerate(chunks, 1)
            ]
        elif kind == "relation":
            start, end, relation = _strings(value, place, "from", "to", "relationType")
            components = [
                ("relation", "context", _sentence(start, relation, end)),
                ("from", "context", start),
                ("to", "context", end),
                ("relationType", "context", relation),
            ]
            # The key's identity keeps the newlines it always had: a re-run stays idempotent.
            type_ref = RELATION
            parts = [(f"mcp-memory:relation:{start}\n{relation}\n{end}", components)]
        else:
            raise UsageError(f"{place}: type must be 'entity' or 'relation'")
        for number, (source, components) in enumerate(parts):
            item = _item(
                place, source, line, components, type_ref=type_ref, purpose=purpose,
                valid_from_ms=now_ms,
            )  # fmt: skip
            yield replace(item, dropped=dropped if number == 0 else ())


def _observations(
    observations: object, place: str, entity: str
) -> tuple[list[tuple[str, str, str]], tuple[dict[str, Any], ...]]:
    """An entity's observations as components (``obs-<n>``, numbered as in the file), and the
    ones left out: a secret (the admission policy would reject the whole entity for it) or junk
    (not a string, blank, longer than a component holds), each named by its place alone."""
    if not isinstance(observations, list):
        raise UsageError(f"{place}: observations must be a list of strings")
    scanner = _scanner()
    # The entity is named only when its name is clean (a secret name rejects it whole anyway).
    label = "(withheld)" if scanner.first([entity]) is not None else entity
    kept: list[tuple[str, str, str]] = []
    dropped: list[dict[str, Any]] = []
    for number, text in enumerate(observations, 1):
        reason = _junk(text)
        if reason is None and (finding := scanner.first([_nfc(str(text))])) is not None:
            reason = f"secret:{finding.kind}"
        if reason is None:
            kept.append((f"obs-{number}", "evidence", str(text)))
        else:
            dropped.append(
                {"place": place, "entity": label, "observation": number, "reason": reason}
            )
    return kept, tuple(dropped)


def _junk(text: object) -> str | None:
    """Why an observation cannot be a component, or None."""
    if not isinstance(text, str):
        return "not a string"
    if not text.strip():
        return "empty"
    if len(_nfc(text).encode("utf-8")) > _MAX_TEXT:
        return "too long"
    return None


@cache
def _scanner() -> SecretScanner:
    """The admission policy's secret scanner (built once: its detectors are compiled)."""
    return SecretScanner()


def _sentence(start: str, relation: str, end: str) -> str:
    """``Alice works at Acme.``: a relation as one line of prose (``works_at`` and ``worksAt``
    read as ``works at``), so that it ranks and reads like the text around it."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", relation.replace("_", " ").replace("-", " "))
    verb = " ".join(w.lower() if w[:1].isupper() and w[1:].islower() else w for w in words.split())
    text = " ".join(f"{start} {verb} {end}".split())
    return text if text.endswith((".", "!", "?")) else text + "."


@dataclass(frozen=True, slots=True)
class Principals:
    """Whose items a source's own field names (mem0's ``user_id`` or ``agent_id``), and the
    principal each of its values becomes (a value not in ``mapping`` is its own principal)."""

    field: str
    mapping: Mapping[str, str]

    def of(self, memory: Mapping[str, Any], place: str) -> str | None:
        """The principal of ``memory``, or None when it names none (the import's own)."""
        value = memory.get(self.field)
        if value is None or value == "":
            return None
        if not isinstance(value, str) or not value.strip() or not value.isprintable():
            raise UsageError(f"{place}.{self.field}: not a usable principal")  # value unechoed
        principal = self.mapping.get(value, value)
        if len(principal.encode("utf-8")) > _MAX_REF:
            raise UsageError(f"{place}.{self.field}: longer than a principal may be")
        return principal


def _mem0(
    path: Path, purpose: str, now_ms: int, principals: Principals | None
) -> Iterator[ImportItem]:
    """Saved ``get_all()`` answers: one file, or a folder of them (one page a file)."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{path}: no .json files (saved get_all() pages) in this folder")
    latest: dict[str, tuple[int, str, dict[str, Any]]] = {}
    for file in files:
        for place, memory in _mem0_memories(file):
            memory_id, _text = _strings(memory, place, "id", "memory")
            created = _instant(memory.get("created_at"), f"{place}.created_at")
            updated = _instant(memory.get("updated_at"), f"{place}.updated_at")
            when = max(created or 0, updated or 0)
            # Pages saved while the memories changed repeat an id: its latest version counts.
            if memory_id not in latest or when > latest[memory_id][0]:
                latest[memory_id] = (when, place, memory)
    for _when, place, memory in latest.values():
        yield _mem0_item(place, memory, purpose, now_ms, principals)


def _mem0_memories(file: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(place, memory) of each memory of a saved get_all() answer: a list of memories (v1), a
    page ``{"results": [...]}`` (v1 paginated, v2, the open-source ``Memory.get_all()``), or a
    list of such pages."""
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{file.name}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{file.name}:{error.lineno}: not JSON ({error.msg})") from None
    if isinstance(document, list) and document and all(_is_page(p) for p in document):
        pages = [(f"{file.name}[{n}]", page["results"]) for n, page in enumerate(document)]
    elif _is_page(document):
        pages = [(file.name, document["results"])]
    elif isinstance(document, list):
        pages = [(file.name, document)]
    else:
        raise UsageError(f"{file.name}: not a saved mem0 get_all() answer (a list of memories"
                         " or a page with results)")  # fmt: skip
    for name, memories in pages:
        for index, memory in enumerate(memories):
            place = f"{name}[{index}]"
            if not isinstance(memory, dict):
                raise UsageError(f"{place}: not a JSON object")
            yield place, memory


def _is_page(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("results"), list)


def _mem0_item(
    place: str,
    memory: dict[str, Any],
    purpose: str,
    now_ms: int,
    principals: Principals | None,
) -> ImportItem:
    memory_id, text = _strings(memory, place, "id", "memory")
    created = _instant(memory.get("created_at"), f"{place}.created_at")
    updated = _instant(memory.get("updated_at"), f"{place}.updated_at")
    user = memory.get("user_id")
    source = f"mem0:{user}:{memory_id}" if isinstance(user, str) else f"mem0:{memory_id}"
    content = json.dumps(memory, sort_keys=True, ensure_ascii=False)
    item = _item(
        place, source, content, [("memory", "context", text)], type_ref="mem0:memory",
        purpose=purpose, valid_from_ms=created if created is not None else now_ms,
        observed_ms=updated if updated is not None else created,
    )  # fmt: skip
    return item if principals is None else replace(item, principal=principals.of(memory, place))


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


_HEADING: Final = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*")
_FENCE: Final = re.compile(r" {0,3}(```|~~~)")


def _note_text(title: str | None, stem: str, prose: Sequence[str]) -> tuple[str, str]:
    """A note's title (the front matter's, else its first heading's when the note opens with
    one, else its file name's) and its prose under the title heading the import gives it:
    without that first heading when it is the title, without headings left empty (their
    observations became components of their own), and without runs of blank lines."""
    lines = list(prose)
    while lines and not lines[0].strip():
        lines.pop(0)
    first = _HEADING.fullmatch(lines[0]) if lines else None
    opening = (first[2] or "").strip() if first is not None and len(first[1]) == 1 else ""
    if opening and (title is None or opening.casefold() == title.casefold()):
        title = title or opening
        lines.pop(0)
    marks = _headings(lines)
    kept: list[str] = []
    for index, line in enumerate(lines):
        blank_again = not line.strip() and not (kept and kept[-1].strip())
        if not blank_again and not _empty_heading(lines, marks, index):
            kept.append(line)
    return title or stem, "\n".join(kept).strip()


def _empty_heading(lines: Sequence[str], marks: Mapping[int, int], index: int) -> bool:
    """Whether ``lines[index]`` is a heading (``marks``: the headings' levels by line) whose
    section, up to the next heading of its level or above, holds only blanks and headings."""
    heading = marks.get(index)
    if heading is None:
        return False
    for later in range(index + 1, len(lines)):
        level = marks.get(later)
        if level is not None and level <= heading:
            return True
        if level is None and lines[later].strip():
            return False
    return True


def _headings(lines: Sequence[str]) -> dict[int, int]:
    """The ATX headings of ``lines`` outside fenced code: {line index: level}."""
    found: dict[int, int] = {}
    fence: str | None = None
    for index, line in enumerate(lines):
        opened = _FENCE.match(line)
        if opened is not None and fence in (None, opened[1]):
            fence = opened[1] if fence is None else None
        elif fence is None and (heading := _HEADING.fullmatch(line)) is not None:
            found[index] = len(heading[1])
    return found


def _markdown(root: Path, purpose: str, now_ms: int) -> Iterator[ImportItem]:
    files = sorted(root.rglob("*.md")) if root.is_dir() else [root]
    if not files:
        raise UsageError(f"{root}: no .md notes in this folder")
    base = root if root.is_dir() else root.parent
    for path in files:
        name = path.relative_to(base).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{name}: not UTF-8 text") from None
        meta, body, _first = _front_matter(text, name)
        named = meta.get("title")
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
        title, text_of_note = _note_text(str(named) if named else None, path.stem, prose)
        for part, chunk in enumerate(parts or [[]], 1):
            heading = f"# {title}" if part == 1 else f"# {title} (part {part} of {len(parts)})"
            components = [("note", "context", f"{heading}\n{text_of_note}".strip())]
            components += [
                (f"obs-{i}", "decision" if cat == "decision" else "evidence", f"[{cat}] {o}")
                for i, (cat, o) in enumerate(chunk, (part - 1) * per_part + 1)
            ]
            yield _item(
                f"{name}:1", source if part == 1 else f"{source}#part-{part}", text, components,
                type_ref=f"note:{meta.get('type') or 'note'}", purpose=purpose,
                valid_from_ms=when if when is not None else now_ms,
            )  # fmt: skip


def _engram(path: Path, purpose: str, now_ms: int) -> Iterator[ImportItem]:
    """Our export: each line's record captured again, citing the record it came from."""
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
        yield _item(
            place, f"engram:{record_id}", line, components,
            type_ref=str(event.get("type_ref") or "engram:record"), purpose=purpose,
            valid_from_ms=int(valid.get("t", now_ms)),
        )  # fmt: skip


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
    """Capture ``item`` (or find an interrupted run's capture) and request its admission, as
    the agent would: (outcome, code)."""
    engine = _full_engine(engine)
    key = item.arguments["idempotency_key"]
    captured = _imported(engine, ctx, item) or engine.handle(
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
        return "failed", _code(admitted)
    return str(admitted["output"]["value"]["outcome"]["status"]), ""


def _earlier(engine: Kernel, ctx: TrustedContext, item: ImportItem) -> tuple[str, str] | None:
    """What became of ``item`` since an earlier run captured it, read from its candidate now
    (an operator may have decided a hold since): (outcome, reason, "" when the policy's rule
    says it); None when no run captured it or its admission was never asked (interrupted)."""
    captured = _imported(engine, ctx, item)
    if captured is None:
        return None
    row = canonical.candidate(engine, ctx.scope, captured["output"]["value"]["candidate_id"])
    if row is None or (row.state == "pending" and row.held is None):
        return None
    return {
        "admitted": ("already_imported", ""),
        "rejected": ("rejected", ""),
        "withdrawn": ("rejected", "withdrawn"),
    }.get(row.state, ("pending_adjudication", ""))


def _outcome(
    engine: Kernel, ctx: TrustedContext, item: ImportItem, now_ms: int, dry_run: bool
) -> tuple[str, str, bool]:
    """(outcome, reason, whether an earlier run decided it) of one item: an earlier run's
    outcome as it stands now, else the policy's answer (``dry_run``) or admission's."""
    expected, rule = _verdict(engine, ctx, item, now_ms)
    earlier = _earlier(engine, ctx, item)
    if earlier is not None:
        outcome, reason = earlier
        return outcome, reason or (rule if outcome == expected else "decided earlier"), True
    if dry_run:
        return expected, rule, False
    outcome, code = _admit(engine, ctx, item)
    # The policy's rule when admission answered what it foresaw (it names no rule to the
    # caller), else the error code (or nothing: the store moved in between).
    return outcome, rule if outcome == expected else code, False


def import_items(
    engine: Kernel,
    scope: Scope,
    operator: str,
    items: ImportSource,
    *,
    principal: str | None,
    purpose: str,
    dry_run: bool,
) -> dict[str, Any]:
    """Run ``items`` through capture and admission under ``purpose``, each as its own principal
    or ``principal`` (or, with ``dry_run``, ask the policy only): counts by outcome (an earlier
    run's items as they stand: already imported, rejected or held), the place and rule or code
    of each item not accepted, and the place of each part left out (never any content).
    Audited as ``admin.import``."""
    from engram_memory.operator_plane.auditing import audited

    if items.first_unnamed is not None and principal is None:
        raise UsageError(
            f"{items.first_unnamed}: names no principal; add --principal for such items"
        )
    contexts: dict[str, TrustedContext] = {}
    counts = dict.fromkeys(
        ("accepted", "already_imported", "rejected", "pending_adjudication", "failed"), 0
    )
    details: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    captured_as: dict[str, int] = {}

    def run(call: Call) -> dict[str, Any]:
        for done, item in enumerate(items, 1):
            who = str(item.principal or principal)
            ctx = contexts.setdefault(who, _context(scope, who, purpose))
            outcome, reason, earlier = _outcome(engine, ctx, item, call.now_ms, dry_run)
            counts[outcome] += 1
            captured_as[who] = captured_as.get(who, 0) + 1
            if outcome not in ("accepted", "already_imported"):
                details.append(
                    {"place": item.place, "outcome": outcome, "reason": reason, "earlier": earlier}
                )
            dropped.extend(item.dropped)
            progress(done, len(items), "items")
        call.digests["imported_items"] = str(len(items))
        call.digests["dropped_parts"] = str(len(dropped))
        return {
            "dry_run": dry_run, "items": len(items), **counts, "not_accepted": details,
            "dropped": dropped, "captured_as": dict(sorted(captured_as.items())),
        }  # fmt: skip

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
