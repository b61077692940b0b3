"""Canary memories and the byte scan that looks for them (the forgetting, isolation and peer runs).

A canary is a short sentence around three invented words (``words``): consonant-vowel syllables
that no dictionary holds, each its own Snowball stem (so the lexical index keeps exactly those
bytes), drawn from a hash of the canary's number and distinct across canaries. Finding any of a
canary's words in a file, an index or an answer finds the canary. Written for this benchmark:
no conversational-memory data set is used.
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
ENDINGS = "kx"  # endings no English suffix rule strips
TEMPLATES = (
    "The {0} relay in hangar {1} is inspected by the {2} crew every Tuesday.",
    "Invoices for {0} go to the {1} office once {2} signs them off.",
    "Our {0} deployment reads its settings from the {1} vault under {2}.",
    "When the {0} alarm sounds, page the {1} rota and open a {2} ticket.",
    "Project {0} replaced the {1} queue with a {2} stream last quarter.",
    "The {0} cluster keeps nightly snapshots in the {1} bucket for {2}.",
    "Customer {0} prefers calls before noon and writes to {1} about {2}.",
    "The {0} build breaks unless the {1} cache is warmed by {2} first.",
)


@dataclass(frozen=True)
class Canary:
    key: str  # a short stable name: idempotency keys, note titles, entity names
    words: tuple[str, str, str]

    @property
    def text(self) -> str:
        template = TEMPLATES[
            int(hashlib.sha256(self.key.encode()).hexdigest(), 16) % len(TEMPLATES)
        ]
        return template.format(*self.words)


def _word(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    letters = [
        (CONSONANTS if i % 2 == 0 else VOWELS)[b % (14 if i % 2 == 0 else 5)]
        for i, b in enumerate(digest[:6])
    ]
    return "".join(letters) + ENDINGS[digest[6] % 2]


def canaries(count: int, run: str) -> list[Canary]:
    """``count`` canaries for ``run`` (a name that keeps one run's canaries apart from another's)."""
    from engram_memory.engine import lexical

    made: list[Canary] = []
    seen: set[str] = set()
    salt = 0
    while len(made) < count:
        number = len(made)
        words = tuple(_word(f"{run}:{number}:{slot}:{salt}") for slot in range(3))
        if seen.intersection(words) or any(lexical.analyze(w) != [w] for w in words):
            salt += 1  # a clash or a word the stemmer would cut: draw again
            continue
        seen.update(words)
        made.append(Canary(f"{run}-{number:04d}", (words[0], words[1], words[2])))
    return made


def found_in_text(text: str, among: Sequence[Canary]) -> set[str]:
    """The keys of the canaries any of whose words ``text`` holds (case-insensitive)."""
    lowered = text.lower()
    return {c.key for c in among if any(word in lowered for word in c.words)}


def file_bytes(path: Path) -> bytes:
    """A file's bytes; a gzip file's (a sealed audit segment) uncompressed too.

    Read by a child process (``cat``): POSIX record locks belong to a process, and closing any
    descriptor of a file drops all of that process's locks on it, so reading a live SQLite file
    in the process that serves it would take its locks away (SQLite would then see no reader
    and delete ``-shm`` under the server)."""
    raw = subprocess.run(  # noqa: S603 - cat of a file this run made
        ["/bin/cat", str(path)], capture_output=True, check=True
    ).stdout
    if path.suffix == ".gz":
        try:
            return raw + gzip.decompress(raw)
        except (OSError, EOFError):
            return raw
    return raw


def scan(paths: Iterable[Path], among: Sequence[Canary]) -> dict[str, list[str]]:
    """For each file under ``paths`` (files or folders) that holds a canary's word in its raw
    bytes (every byte: SQLite free pages, WAL and journal included): the canaries' keys."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()))
        elif path.is_file():
            files.append(path)
    held: dict[str, list[str]] = {}
    for file in files:
        content = file_bytes(file).lower()
        keys = sorted(c.key for c in among if any(w.encode() in content for w in c.words))
        if keys:
            held[str(file)] = keys
    return held


def keys_in(held: dict[str, list[str]]) -> set[str]:
    """Every canary key a scan found, whatever the file."""
    return {key for keys in held.values() for key in keys}
