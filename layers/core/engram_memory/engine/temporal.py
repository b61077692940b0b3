"""Time-aware ranking: the query's explicit temporal expressions against the records' ``valid_time``.

A question often says when ("what did we decide on 7 July, 2023", "the setback in October 2023",
"what happened last week"), and every governed record says when it holds (``valid_time``, the
contract's own field, kept on the record row). The ranking uses that:

1. **Spans.** The query's temporal expressions are found by a conservative grammar
   (``_SPAN``): a month name with a day and/or a year; a bare month name, except the modal
   ``may`` (unless a preposition says it is a month: "in May") and the three-letter forms, which
   are ordinary words as often as months; an ISO date; a four-digit year; ``yesterday`` and
   ``today``; ``last|this|next|past`` + a calendar unit; ``N units ago``. Nothing else is read
   as a time, so ordinary words ("we", "second", "now") cannot move a ranking (``dateparser``'s
   own ``search_dates`` reads all three as dates).
2. **Parsing.** Each span is parsed by ``dateparser`` (English, dates preferred from the past,
   relative to the search's ``valid_as_of`` day, UTC), which also says the span's granularity;
   the span becomes the interval of that day, week, month or year. A month without a year is the
   latest such month before the search, as a person means it.
3. **Feature.** A candidate's *closeness* is 1 when its ``valid_time`` (``t``, or ``[t, t_end]``)
   overlaps one of the query's intervals, and falls linearly to 0 at one interval's length away
   (a triangular kernel whose width is the expression's own granularity: a record from 28
   January is close to "in February", one from 7 April is not close to "on April 10"). It is
   soft because ``valid_time`` says when a memory was stated or holds, and people ask by when
   the thing happened, which is often a few days or weeks off. The closeness is a further channel
   with the text channels' weight: ``score = (n · text + closeness) / (n + 1)`` where ``text`` is
   the min-max normalized lexical score (``n`` = 1) or the fused hybrid score (the mean of two
   normalized channels, ``n`` = 2); under RRF fusion the near candidates, nearest first, form a
   third ranked list. Equal weights, no constant fitted. A query without a temporal expression,
   or whose times no candidate is near, is ranked exactly as before.

The feature only reorders the candidates the channels returned; it adds no candidates.
Everything here (grammar version, parser and its major version, weighting) is in the ranking
profile's configuration, so in every rank receipt's ``profile_config_digest``.
"""

from __future__ import annotations

import calendar
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from engram_memory.engine.ports import IndexHit, RecordRow

GRAMMAR_VERSION: Final = "temporal-spans/1"
PARSER: Final = "dateparser>=1.2,<2:en:prefer-past:utc"
WEIGHTING: Final = "equal-channel:(n*text+closeness)/(n+1);rrf:third-list"
CLOSENESS: Final = "triangular:1-gap/interval-length"
MAX_SPANS: Final = 4

_MONTH_FULL = (
    "january|february|march|april|may|june|july|august|september|october|november|december"
)
_MONTH_SHORT = "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
_MONTH = rf"(?:{_MONTH_FULL}|(?:{_MONTH_SHORT})\.?)"
_DAY = r"(?:[012]?\d|3[01])(?:st|nd|rd|th)?"
_YEAR = r"(?:1[89]|2\d)\d\d"
_UNIT = r"(?:day|week|weekend|month|year)"
_COUNT = r"(?:\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_SPAN: Final = re.compile(
    rf"""
    \b(?:
        {_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?            # 7 July, 2023 / 3rd of June
      | {_MONTH}\s+{_DAY}(?:,?\s+{_YEAR})?(?![\d:])             # October 13, 2023 / May 8
      | {_MONTH},?\s+{_YEAR}                                    # May 2023
      | (?:in|during|since|until|by|early|late|mid)[\s-]+may(?:,?\s+{_YEAR})?  # in May (2023)
      | (?:{_MONTH_FULL})(?<!may)                                # June (not the modal "may")
      | {_YEAR}-[01]\d(?:-[0-3]\d)?                             # 2023-05 / 2023-05-08
      | {_YEAR}                                                 # 2023
      | yesterday | today
      | (?:last|this|next|past)\s+{_UNIT}
      | {_COUNT}\s+{_UNIT}s?\s+ago
    )\b
    """,
    re.IGNORECASE | re.VERBOSE,
)

_PERIODS: Final = ("day", "week", "month", "year")


@dataclass(frozen=True, slots=True)
class Interval:
    """``[start_ms, end_ms)`` in epoch milliseconds (UTC)."""

    start_ms: int
    end_ms: int


def profile_config() -> dict[str, Any]:
    return {
        "feature": "query-time-overlaps-valid-time",
        "grammar": GRAMMAR_VERSION,
        "parser": PARSER,
        "closeness": CLOSENESS,
        "weighting": WEIGHTING,
        "max_spans": MAX_SPANS,
    }


def spans(query: str) -> list[str]:
    """The temporal expressions of ``query``, at most ``MAX_SPANS``, in order."""
    return [match.group(0) for match in _SPAN.finditer(query)][:MAX_SPANS]


class _Parsers(threading.local):
    # A DateDataParser takes ~2 ms to build and holds its relative base: one per thread and day.
    day: str | None = None
    parser: Any = None


_parsers: Final = _Parsers()


def _parser(base: datetime) -> Any:
    day = base.date().isoformat()
    if _parsers.day != day:
        # Imported on first use: dateparser loads its language data (~0.15 s), which a host
        # that is never asked "when" should not pay at start.
        from dateparser.date import DateDataParser

        _parsers.parser = DateDataParser(
            languages=["en"],
            settings={
                "RELATIVE_BASE": base.replace(hour=12, minute=0, second=0, microsecond=0),
                "PREFER_DATES_FROM": "past",
                "RETURN_TIME_AS_PERIOD": True,
            },
        )
        _parsers.day = day
    return _parsers.parser


def _ms(moment: datetime) -> int:
    return int(moment.replace(tzinfo=UTC).timestamp() * 1000)


def _interval(moment: datetime, period: str) -> Interval:
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
    if period == "year":
        start = day.replace(month=1, day=1)
        end = start.replace(year=start.year + 1)
    elif period == "month":
        start = day.replace(day=1)
        end = start + timedelta(days=calendar.monthrange(start.year, start.month)[1])
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start, end = day, day + timedelta(days=1)
    return Interval(_ms(start), _ms(end))


class _Parsed:
    """The interval each span named on a day, as ``dateparser`` read it (None: no interval).

    Parsing one span takes ``dateparser`` 0.4-1 ms, and the same few spans come back ("2023",
    "last week", month names). Its answer depends on the span and on the day it is relative to
    (``_parser``) only, so it is kept per (day, span); the day is in the key, so a new day never
    reads an answer of the last. Bounded: emptied when full.
    """

    LIMIT: Final = 4096

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], Interval | None] = {}
        self._lock = threading.Lock()

    def interval(self, base: datetime, span: str) -> Interval | None:
        key = (base.date().isoformat(), span)
        with self._lock:
            if key in self._known:
                return self._known[key]
        parsed = _parser(base).get_date_data(span)
        found = (
            None
            if parsed.date_obj is None or parsed.period not in _PERIODS
            else _interval(parsed.date_obj, parsed.period)
        )
        with self._lock:
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            self._known[key] = found
        return found


_parsed: Final = _Parsed()


def query_intervals(query: str, now_ms: int) -> list[Interval]:
    """The intervals the query's temporal expressions name, relative to ``now_ms``'s day."""
    found = spans(query)
    if not found:
        return []
    base = datetime.fromtimestamp(now_ms / 1000, UTC).replace(tzinfo=None)
    intervals: list[Interval] = []
    for span in found:
        interval = _parsed.interval(base, span)
        if interval is not None and interval not in intervals:
            intervals.append(interval)
    return intervals


def closeness(row: RecordRow, intervals: Sequence[Interval]) -> float:
    """How near the record's ``valid_time`` is to the nearest of ``intervals``: 1 when they
    overlap, falling linearly to 0 at one interval's length away (module docstring)."""
    start = row.valid_from_ms
    end = row.valid_to_ms if row.valid_to_ms is not None else start
    best = 0.0
    for interval in intervals:
        if start < interval.end_ms and end >= interval.start_ms:
            return 1.0
        gap = interval.start_ms - end if end < interval.start_ms else start - interval.end_ms + 1
        best = max(best, 1.0 - gap / (interval.end_ms - interval.start_ms))
    return best


def rerank(
    ranked: Sequence[IndexHit],
    rows: Mapping[str, RecordRow],
    intervals: Sequence[Interval],
    *,
    text_channels: int,
    normalized: bool,
    rrf_k: int | None = None,
) -> list[IndexHit]:
    """``ranked`` (eligible, best first) with the time match as a further channel (module
    docstring). ``normalized`` says the scores are already in [0, 1] (fused); else they are
    min-max normalized first. With ``rrf_k`` the near records form a third RRF list instead."""
    if not intervals or not ranked:
        return list(ranked)
    near = {hit.record_id: closeness(rows[hit.record_id], intervals) for hit in ranked}
    if not any(near.values()):
        return list(ranked)  # no candidate is near a time the query names: nothing to weigh
    if rrf_k is not None:
        by_time = sorted(
            (position, record_id)
            for position, record_id in enumerate(h.record_id for h in ranked)
            if near[record_id] > 0
        )
        by_time.sort(key=lambda item: -near[item[1]])  # stable: the fused order among equals
        bonus = {record_id: 1.0 / (rrf_k + rank) for rank, (_, record_id) in enumerate(by_time, 1)}
        scored = [IndexHit(h.record_id, h.score + bonus.get(h.record_id, 0.0)) for h in ranked]
    else:
        scores = [hit.score for hit in ranked]
        low, high = (0.0, 1.0) if normalized else (min(scores), max(scores))
        span = high - low
        scored = []
        for hit in ranked:
            text = (hit.score - low) / span if span > 0 else 1.0
            scored.append(
                IndexHit(
                    hit.record_id,
                    (text_channels * text + near[hit.record_id]) / (text_channels + 1),
                )
            )
    scored.sort(key=lambda hit: (-hit.score, hit.record_id))
    return scored
