"""Common encodings of CONTRACT.md §3 as annotated pydantic types.

String bounds are UTF-8 *byte* bounds, which JSON Schema cannot state: the published schema carries
the sound character bounds (``maxLength`` = max bytes, ``minLength`` = ceil(min bytes / 4)) plus the
exact byte bounds as ``x-utf8-min-bytes`` / ``x-utf8-max-bytes``; the validators enforce the bytes.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, StrictInt, WithJsonSchema
from pydantic_core import PydanticCustomError

MAX_SAFE_INTEGER: Final = 2**53 - 1
MAX_ARGUMENT_BYTES: Final = 1_048_576

DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
RECORD_ID_PATTERN: Final = r"^mem_[a-z2-7]+$"
CANDIDATE_ID_PATTERN: Final = r"^candidate_[0-9a-f]{64}$"
INSTANT_PATTERN: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"

_DIGEST_RE: Final = re.compile(DIGEST_PATTERN)
_INSTANT_RE: Final = re.compile(INSTANT_PATTERN)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# Error type names the engine reads to choose between INVALID_DIGEST and INVALID_SCHEMA.
INVALID_DIGEST_ERROR: Final = "invalid_digest"


def _utf8_bounds(min_bytes: int, max_bytes: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        size = len(value.encode("utf-8"))
        if not min_bytes <= size <= max_bytes:
            raise PydanticCustomError(
                "utf8_length",
                "string must be {min_bytes}..{max_bytes} UTF-8 bytes",
                {"min_bytes": min_bytes, "max_bytes": max_bytes},
            )
        return value

    return check


def _nfc(value: str) -> str:
    if not unicodedata.is_normalized("NFC", value):
        raise PydanticCustomError("not_nfc", "string must be in Unicode NFC")
    return value


def bounded_string(min_bytes: int, max_bytes: int, *, pattern: str | None = None) -> Any:
    """An NFC string of ``min_bytes..max_bytes`` UTF-8 bytes (optionally matching ``pattern``)."""
    schema: dict[str, Any] = {
        "type": "string",
        "minLength": math.ceil(min_bytes / 4),
        "maxLength": max_bytes,
        "x-utf8-min-bytes": min_bytes,
        "x-utf8-max-bytes": max_bytes,
    }
    validators: list[Any] = [
        AfterValidator(_utf8_bounds(min_bytes, max_bytes)),
        AfterValidator(_nfc),
    ]
    if pattern is not None:
        schema["pattern"] = pattern
        compiled = re.compile(pattern)

        def match(value: str) -> str:
            if not compiled.fullmatch(value):
                raise PydanticCustomError("pattern", "string does not match the required pattern")
            return value

        validators.append(AfterValidator(match))
    return Annotated[str, Field(strict=True), *validators, WithJsonSchema(schema)]


def _digest(value: str) -> str:
    if not _DIGEST_RE.fullmatch(value):
        raise PydanticCustomError(INVALID_DIGEST_ERROR, "digest must be sha256: + 64 lowercase hex")
    return value


def format_instant(epoch_ms: int) -> str:
    """The canonical instant string (``YYYY-MM-DDTHH:mm:ss.sssZ``) of epoch milliseconds."""
    seconds, millis = divmod(epoch_ms, 1000)
    return _second(seconds) + f"{millis:03d}Z"


# A write formats the same instant eight times (its receipts, record, event, audit line).
@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    # Explicit zero padding: strftime("%Y") does not pad years before 1000 on every platform.
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.")


def parse_instant(value: str) -> int:
    """Epoch milliseconds of a canonical instant; ``ValueError`` when it is not canonical.

    Canonical means re-formatting the parsed instant gives the same string, so impossible dates
    (``2026-04-31T...``) and out-of-range fields are refused.
    """
    if not _INSTANT_RE.fullmatch(value):
        raise ValueError("not a canonical instant")
    parsed = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    epoch_ms = (parsed - _EPOCH) // timedelta(milliseconds=1)
    if format_instant(epoch_ms) != value:
        raise ValueError("not a canonical instant")
    return epoch_ms


def _instant(value: str) -> str:
    try:
        parse_instant(value)
    except ValueError:
        raise PydanticCustomError(
            "instant", "instant must be canonical UTC YYYY-MM-DDTHH:mm:ss.sssZ"
        ) from None
    return value


Ref = bounded_string(1, 512)
IdempotencyKey = bounded_string(16, 256)
ComponentText = bounded_string(1, 65_536)
QueryText = bounded_string(1, 8_192)
Attestation = bounded_string(1, 4_096)
RecordId = bounded_string(5, 512, pattern=RECORD_ID_PATTERN)
CandidateId = bounded_string(74, 74, pattern=CANDIDATE_ID_PATTERN)
PageCursor = bounded_string(1, 4_096)

Digest = Annotated[
    str,
    Field(strict=True),
    AfterValidator(_digest),
    WithJsonSchema({"type": "string", "pattern": DIGEST_PATTERN}),
]

Instant = Annotated[
    str,
    Field(strict=True),
    AfterValidator(_instant),
    WithJsonSchema({"type": "string", "pattern": INSTANT_PATTERN, "format": "date-time"}),
]

SafeInt = Annotated[StrictInt, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
