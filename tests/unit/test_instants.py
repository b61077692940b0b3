"""Canonical instants (``YYYY-MM-DDTHH:mm:ss.sssZ``): formatted alike for every millisecond, and a
write's many stamps of one instant formatted from one remembered second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from engram_memory.contract import types
from engram_memory.contract.types import format_instant, parse_instant

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# From 0001-01-01 to 9999-12-31: a year before 1000 is zero-padded to four digits too.
_MS = st.integers(min_value=-62_135_596_800_000, max_value=253_402_300_799_999)


@given(_MS)
def test_every_millisecond_formats_as_its_calendar_instant(epoch_ms: int) -> None:
    moment = _EPOCH + timedelta(milliseconds=epoch_ms)
    expected = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:"
        f"{moment.minute:02d}:{moment.second:02d}.{moment.microsecond // 1000:03d}Z"
    )
    assert format_instant(epoch_ms) == expected
    assert parse_instant(expected) == epoch_ms


def test_the_stamps_of_one_second_are_formatted_from_it_once() -> None:
    types._second.cache_clear()
    stamps = [format_instant(1_780_000_000_000 + ms) for ms in (0, 7, 7, 999)]
    assert stamps == [
        "2026-05-28T20:26:40.000Z",
        "2026-05-28T20:26:40.007Z",
        "2026-05-28T20:26:40.007Z",
        "2026-05-28T20:26:40.999Z",
    ]
    assert format_instant(1_780_000_001_000) == "2026-05-28T20:26:41.000Z"
    assert (types._second.cache_info().misses, types._second.cache_info().hits) == (2, 3)
