"""Seeded stores: this project's data directory and server-memory's file at a given size.

Seeding goes through ``Engine.handle`` in process (``capture`` then ``request_admission`` per
memory, the calls the MCP tools make), not through MCP: only the measured writes go through MCP.
The engine seeds on a tmpfs scratch folder when the machine has one (its ``fsync``s are then
free; what is stored is the same), and the finished directory is moved to the cache on disk.

The hybrid profile's seeding engine embeds through ``RepeatedTexts``: the local embedder, with
the vectors of every text list it was given kept for the next call with the same list. A store
larger than the corpus holds each turn many times (memory ``i`` is turn ``i mod T``), and the
embedder is deterministic (one ONNX thread: the same list of texts, the same vectors, bit for
bit), so a repeated record gets the vector the product would compute for it, without the 25-30 ms
of inference: a 100k store embeds 2,760 records, not 100,000. Batching the records of a chunk
into one inference was measured instead and gains ~20 % (padding to the longest text eats the
rest), and only on records that are not repeats.

Seeded stores are cached under ``cache_root/<profile>-<fingerprint>/n<size>/``; the fingerprint
covers the product's source and the data, so a changed store format or mapping reseeds. A larger store is
grown from the largest smaller one already cached (1k is the first 1,000 records of 10k).
Every measured session works on a fresh copy of the cached store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.locomo.calls import value

from .corpus import Corpus

WORKSPACE = "ws-hotpath"
SEED_FORMAT = "hotpath-seed-1"
PEER_FILE = "memory.jsonl"
MANIFEST = "manifest.json"
DATA = "data"
LEXICAL = "lexical"  # the host's default: no embedder, profile offline_lexical_v1
HYBRID = "hybrid"  # host.json search.semantic = "local": profile semantic_v1, hybrid fusion
PROFILES = (LEXICAL, HYBRID)
_SCRATCH = Path("/dev/shm")  # noqa: S108 - only as the parent of a private TemporaryDirectory


@dataclass(frozen=True)
class SeededStore:
    size: int
    root: Path
    record_ids: tuple[str, ...]  # by memory index
    seed_seconds: float  # engine time spent seeding the records this entry added
    seeded_from: int  # the size of the cached store it was grown from (0: from empty)

    @property
    def data_dir(self) -> Path:
        return self.root / DATA

    @property
    def peer_file(self) -> Path:
        return self.root / PEER_FILE


class RepeatedTexts:
    """An ``Embedder``: ``inner``'s vectors, each distinct list of texts embedded once (module
    docstring). ``calls`` counts the calls, ``computed`` those that reached ``inner``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._known: dict[tuple[str, ...], list[tuple[float, ...]]] = {}
        self.calls = 0
        self.computed = 0

    @property
    def model_id(self) -> str:
        model_id: str = self._inner.model_id
        return model_id

    @property
    def dimensions(self) -> int:
        dimensions: int = self._inner.dimensions
        return dimensions

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        self.calls += 1
        key = tuple(texts)
        vectors = self._known.get(key)
        if vectors is None:
            vectors = self._inner.embed(texts)
            self.computed += 1
            self._known[key] = vectors
        return list(vectors)


def fingerprint(corpus: Corpus) -> str:
    """Digest of the product's source, the data and the seeding mapping."""
    import engram_memory

    digest = hashlib.sha256(SEED_FORMAT.encode())
    package = Path(engram_memory.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps([corpus.names, corpus.distinct_turns]).encode())
    return digest.hexdigest()[:16]


def directory_bytes(path: Path) -> int:
    """Sum of the sizes of the files under ``path`` (or of ``path`` itself)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class StoreMissing(LookupError):
    """No cached store of that size was seeded by the product source named (``seeded_with``)."""


def seeded_store(
    cache_root: Path,
    corpus: Corpus,
    size: int,
    profile: str = LEXICAL,
    log: Any = sys.stderr,
    seeded_with: str | None = None,
) -> SeededStore:
    """The cached store of ``size`` records, seeding (or growing a smaller one) when missing.

    ``seeded_with``: the fingerprint of the product source whose cached stores to use instead of
    the current source's (for a change of the read path only, which cannot change what is
    stored: the report names it); such a store is never seeded, ``StoreMissing`` when absent."""
    family = cache_root / f"{profile}-{seeded_with or fingerprint(corpus)}"
    target = family / f"n{size}"
    if (target / MANIFEST).exists():
        return _load(target)
    if seeded_with is not None:
        raise StoreMissing(f"no cached store at {target}")
    family.mkdir(parents=True, exist_ok=True)
    smaller = sorted(
        (s for s in (_cached_size(p) for p in family.iterdir()) if s is not None and s < size),
        reverse=True,
    )
    scratch_parent = _SCRATCH if _SCRATCH.is_dir() and os.access(_SCRATCH, os.W_OK) else family
    with tempfile.TemporaryDirectory(prefix="hotpath-seed-", dir=scratch_parent) as tmp:
        work = Path(tmp) / "store"
        record_ids: list[str] = []
        start = 0
        if smaller:
            base = _load(family / f"n{smaller[0]}")
            shutil.copytree(base.root, work)
            record_ids = list(base.record_ids)
            start = base.size
        else:
            work.mkdir()
        started = time.perf_counter()
        record_ids += _seed_engine(work / DATA, corpus, start, size, profile, log)
        seconds = time.perf_counter() - started
        _write_peer_file(work / PEER_FILE, corpus, size)
        manifest = {
            "size": size,
            "record_ids": record_ids,
            "seed_seconds": round(seconds, 3),
            "seeded_from": start,
        }
        (work / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        staging = family / f".n{size}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(work, staging)
        staging.rename(target)
    return _load(target)


def _cached_size(path: Path) -> int | None:
    if not (path.name.startswith("n") and (path / MANIFEST).exists()):
        return None
    return int(path.name[1:])


def _load(root: Path) -> SeededStore:
    manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    return SeededStore(
        size=manifest["size"],
        root=root,
        record_ids=tuple(manifest["record_ids"]),
        seed_seconds=manifest["seed_seconds"],
        seeded_from=manifest["seeded_from"],
    )


def _seed_engine(
    data_dir: Path,
    corpus: Corpus,
    start: int,
    stop: int,
    profile: str,
    log: Any,
    *,
    remember_vectors: bool = True,
) -> list[str]:
    """Capture and admit memories ``start .. stop-1`` through ``Engine.handle``; their record ids.
    ``remember_vectors=False``: the hybrid engine embeds every record (the host's own embedder,
    as a served host does); the test that compares the two seedings uses it."""
    from bench.locomo.clients import EngineClient  # imports the engine: only when seeding
    from engram_memory.embedded.serve import open_server

    options: dict[str, Any] = {}
    _prepare_host(data_dir, profile)
    if profile == HYBRID:
        from engram_memory.adapters.embedder import load_local_embedder

        if remember_vectors:  # the same local model, a repeated record not embedded again
            options["embedder"] = RepeatedTexts(load_local_embedder())
    server = open_server(data_dir, **options)
    # The host's tenant: the one the served copies' tokens carry.
    client = EngineClient(server.host.engine, tenant=server.surface.runtime.host.tenant_id)

    def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return value(client.call(WORKSPACE, tool, arguments), tool)

    record_ids: list[str] = []
    started = time.perf_counter()
    try:
        for memory in corpus.memories(start, stop):
            captured = call("capture", memory.capture_arguments())
            admitted = call(
                "request_admission", memory.admission_arguments(captured["candidate_id"])
            )
            outcome = admitted["outcome"]
            if outcome["status"] != "accepted":
                raise RuntimeError(f"seeding: memory {memory.index} was {outcome['status']}")
            record_ids.append(outcome["record_id"])
            done = len(record_ids)
            if done % 500 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"  seeded {start + done}/{stop} ({rate:.1f} pairs/s)", file=log, flush=True)
        while server.host.engine.drain_outbox():  # queued key destructions, as the server would
            pass
    finally:
        server.close()
    return record_ids


def _prepare_host(data_dir: Path, profile: str) -> None:
    """A new data directory with the host's own switches, for every server on the copies and
    the seeding engine: the corpus cycles its turns (repeated and short texts on purpose), so
    the quality gate is off (bench.governance.admission measures it); hybrid embeds with the
    local model. A directory that has its host.json already (a grown store) is left as it is."""
    from engram_memory.binding.host_config import HostConfig
    from engram_memory.embedded.composition import prepare_data_dir
    from engram_memory.embedded.data_dir import host_config_path
    from engram_memory.embedded.host_file import save_host_config

    if host_config_path(data_dir).exists():
        return
    prepare_data_dir(data_dir)
    settings: dict[str, Any] = {"admission": {"near_duplicates": "off", "min_text_chars": 0}}
    if profile == HYBRID:
        settings["search"] = {"semantic": "local"}
    save_host_config(data_dir, HostConfig.model_validate(settings))


def _write_peer_file(path: Path, corpus: Corpus, size: int) -> None:
    """server-memory's JSONL graph with one entity per memory (its own file format)."""
    lines = []
    for memory in corpus.memories(0, size):
        entity = memory.peer_entity()
        entity["observations"] = [*entity["observations"], memory.turn.context]
        lines.append(json.dumps({"type": "entity", **entity}, ensure_ascii=False))
    path.write_text("\n".join(lines), encoding="utf-8")
