"""De-obfuscated views of a text, for the secret scanner (CONTRACT.md §9).

A secret pasted into a memory is not always in its canonical form: it may be in full-width
characters, have zero-width characters between its letters, be spaced out, cut into hyphenated
groups, broken over lines, written backwards, or base64/hex encoded. Each view below undoes one
of these presentations so that format rules written for the canonical form find it:

``normalized``
    NFKC (full-width and other compatibility forms fold to ASCII; a no-break space becomes a
    space) with every format character (Unicode category ``Cf``: zero-width space/joiners, word
    joiner, BOM, soft hyphen, bidi controls) removed. A *full* view: every detector runs on it.
``joined``
    The runs of two or more "token-like" whitespace-separated chunks, each run glued back into one
    string (``A K I A ...``, a key broken over lines, a key in groups of four). Prose words are
    not token-like, so a sentence is not glued to the token next to it (short words between or
    just before token-like chunks are, as a group of a key may read as a word; see
    ``_joined_runs``). A *format* view.
``dehyphenated``
    Chunks (and joined runs) with hyphens between token characters removed (``AKIA-QCSZ-...``).
    A *format* view.
``reversed``
    The normalized text backwards. A *format* view.
``decoded``
    base64, base64url and hex blobs of 16+ characters that decode to printable UTF-8 text, one per
    line; decoded text may itself be obfuscated, so it gets the views above too (one level of
    nesting). A *full* view.

A *format* view is examined only by the detectors of token formats (a prefix, an alphabet, a
length); the detectors that read context (``password is ...``, ``Cookie:`` headers, ``.env``
lines) see only the full views, because gluing or reversing words makes context up.

Every view costs one linear pass over the text (plus the regex engines' own linear scans); a
view identical to one already produced is not produced again, so plain ASCII prose with no
token-like runs costs two extra views (dehyphenated, when it holds hyphens, and reversed).
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["View", "derived_views"]


@dataclass(frozen=True, slots=True)
class View:
    """One derived presentation of a text; ``full`` says whether context detectors apply."""

    name: str
    text: str
    full: bool


# Hyphens between token characters (or a JWT's dots), which the dehyphenated view removes.
_INNER_HYPHEN: Final = re.compile(r"(?<=[A-Za-z0-9_.+/=])-+(?=[A-Za-z0-9_.+/=])")
# A run that may be base64 (standard or URL-safe) or hex, long enough to hide a credential.
_ENCODED_BLOB: Final = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX: Final = re.compile(r"(?:[0-9A-Fa-f]{2})+")
_MIN_DECODED_CHARS: Final = 8
_NESTING: Final = 1


def _is_token_like(chunk: str) -> bool:
    """A chunk that could be part of a credential rather than a word of prose.

    Single characters (a spaced-out key), anything with a digit or one of ``+/=_`` (base64 and
    token alphabets), and anything with an upper-case letter after its first letter (``AKIAQ...``,
    ``eyJhbGci...``, ``ETAVIRP``). Ordinary words, capitalized or not, are not token-like.
    """
    if len(chunk) == 1:
        return True
    if chunk.isalpha() and (chunk.islower() or chunk.istitle()):
        return False  # the common case, decided by two C-speed checks
    if _TOKEN_CHARACTER.search(chunk):
        return True
    first_letter = _LETTER.search(chunk)
    return first_letter is not None and _UPPER.search(chunk, first_letter.end()) is not None


_TOKEN_CHARACTER: Final = re.compile(r"[0-9+/=_]")
_LETTER: Final = re.compile(r"[A-Za-z]")
_UPPER: Final = re.compile(r"[A-Z]")


def normalize(text: str) -> str:
    """NFKC with format characters (category ``Cf``) removed."""
    if text.isascii():
        return text
    stripped = "".join(char for char in text if unicodedata.category(char) != "Cf")
    return unicodedata.normalize("NFKC", stripped)


def _is_short_plain(chunk: str) -> bool:
    return len(chunk) <= _SHORT_CHUNK and all(char.isalnum() or char == "-" for char in chunk)


def _joined_runs(text: str) -> list[str]:
    """Runs of 2+ token-like chunks, glued, each also with the short chunk just before it.

    A token cut into groups (``glpa t-iA P7c- JfGB kkha pnfs 9qh9``) may have groups that read
    as plain words: its first group (a prefix such as ``glpa``, ``xoxb``, ``pypi``) and any group
    of lower-case letters. So up to two short plain chunks (8 characters at most) between
    token-like chunks belong to the run, and each run is given twice, without and with the short
    plain chunk before it (without it, so that a prose word before a token is not glued to it).
    """
    runs: list[str] = []
    current: list[str] = []
    pending: list[str] = []  # short plain chunks after the run, kept if a token-like follows
    before = ""  # the short plain chunk right before the run

    def close() -> None:
        if len(current) > 1 or (current and before):
            runs.append("".join(current))
            if before:
                runs.append(before + "".join(current))

    for chunk in text.split():
        if _is_token_like(chunk):
            if not current:
                before = pending[-1] if pending else ""
            current.extend(pending if current else ())
            pending = []
            current.append(chunk)
        elif _is_short_plain(chunk) and len(pending) < _BRIDGED_CHUNKS:
            pending.append(chunk)
        else:
            close()
            current, pending, before = [], [], ""
        if not current and len(pending) > 1:
            pending = pending[-1:]  # before a run, only the chunk right before it counts
    close()
    return runs


_SHORT_CHUNK: Final = 8
_BRIDGED_CHUNKS: Final = 2


def _printable_text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) < _MIN_DECODED_CHARS:
        return None
    # Format characters are allowed: decoded text may itself be zero-width-obfuscated.
    if all(char.isprintable() or char in "\t\n\r" for char in normalize(text)):
        return text
    return None


def _decode_blob(blob: str) -> str | None:
    """The printable text a base64/base64url/hex blob encodes, if it encodes any."""
    if _HEX.fullmatch(blob):
        decoded = _printable_text(bytes.fromhex(blob))
        if decoded is not None:
            return decoded
    body = blob.rstrip("=")
    if len(body) % 4 == 1:
        return None
    padded = body + "=" * (-len(body) % 4)
    url_safe = "-" in body or "_" in body
    if url_safe and ("+" in body or "/" in body):
        return None
    try:
        if url_safe:
            data = base64.urlsafe_b64decode(padded)
        else:
            data = base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return _printable_text(data)


def _decoded(texts: tuple[str, ...]) -> str:
    decoded: dict[str, None] = {}
    for text in texts:
        for match in _ENCODED_BLOB.finditer(text):
            plain = _decode_blob(match.group(0))
            if plain is not None:
                decoded[plain] = None
    return "\n".join(decoded)


def derived_views(text: str, nesting: int = _NESTING) -> Iterator[View]:
    """The views of ``text`` other than itself, lazily, cheapest and most telling first.

    A caller that stops at the first finding never pays for the later views.
    """
    produced = {text}

    def fresh(name: str, candidate: str, full: bool) -> Iterator[View]:
        if candidate and candidate not in produced:
            produced.add(candidate)
            yield View(name, candidate, full)

    normalized = normalize(text)
    yield from fresh("normalized", normalized, full=True)
    runs = _joined_runs(normalized)
    joined = "\n".join(runs)
    yield from fresh("joined", joined, full=False)
    hyphenated = [chunk for chunk in (*normalized.split(), *runs) if "-" in chunk]
    dehyphenated = "\n".join(_INNER_HYPHEN.sub("", chunk) for chunk in hyphenated)
    yield from fresh("dehyphenated", dehyphenated, full=False)
    yield from fresh("reversed", normalized[::-1], full=False)
    decoded = _decoded((normalized, joined))
    if decoded and decoded not in produced:
        produced.add(decoded)
        yield View("decoded", decoded, full=True)
        if nesting > 0:
            for view in derived_views(decoded, nesting - 1):
                if view.text not in produced:
                    produced.add(view.text)
                    yield view
