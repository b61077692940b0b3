"""Time-aware ranking (engine/temporal.py): which spans are times, their intervals, the rerank."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_memory.engine import temporal
from engram_memory.engine.ports import IndexHit, RecordRow

NOW_MS = int(datetime(2026, 12, 4, 15, 30, tzinfo=UTC).timestamp() * 1000)


def _day(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, tzinfo=UTC).timestamp() * 1000)


def _row(record_id: str, valid_from_ms: int, valid_to_ms: int | None = None) -> RecordRow:
    return RecordRow(
        record_id=record_id,
        state="accepted_current",
        record_digest="sha256:" + "0" * 64,
        payload_digest="sha256:" + "0" * 64,
        candidate_id="cand",
        valid_from_ms=valid_from_ms,
        valid_to_ms=valid_to_ms,
        expires_at_ms=None,
        accepted_cursor=1,
        body=None,
    )


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("What did we decide on 7 July, 2023?", ["7 July, 2023"]),
        ("the painting shown on October 13, 2023", ["October 13, 2023"]),
        ("the 3rd of June 2023 and 2023-05-08", ["3rd of June 2023", "2023-05-08"]),
        ("What setback came in October 2023?", ["October 2023"]),
        ("beach trips in 2023", ["2023"]),
        ("camping in May?", ["in May"]),
        ("camping in May 2023?", ["in May 2023"]),
        ("camping in June?", ["June"]),
        ("what did we ship last week", ["last week"]),
        ("the outage two days ago and yesterday", ["two days ago", "yesterday"]),
        # never times: the modal "may", words dateparser alone would read as dates
        ("What may Caroline do with her second kid now?", []),
        ("we sat with the team", []),
        ("What did Caroline research?", []),
        ("the 300 meter race", []),
    ],
)
def test_only_temporal_expressions_are_spans(query: str, found: list[str]) -> None:
    assert temporal.spans(query) == found


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("on 7 July, 2023", (2023, 7, 7), (2023, 7, 8)),
        ("in October 2023", (2023, 10, 1), (2023, 11, 1)),
        ("during 2023", (2023, 1, 1), (2024, 1, 1)),
        ("on 2024-02-29", (2024, 2, 29), (2024, 3, 1)),
        ("in June", (2026, 6, 1), (2026, 7, 1)),  # the latest June before the search
        ("in December", (2026, 12, 1), (2027, 1, 1)),  # the month the search is in
        ("in March", (2026, 3, 1), (2026, 4, 1)),
        ("yesterday", (2026, 12, 3), (2026, 12, 4)),
        ("last week", (2026, 11, 23), (2026, 11, 30)),  # Monday to Monday
    ],
)
def test_a_span_is_the_interval_of_its_granularity(
    query: str, start: tuple[int, int, int], end: tuple[int, int, int]
) -> None:
    assert temporal.query_intervals(query, NOW_MS) == [temporal.Interval(_day(*start), _day(*end))]


def test_a_query_without_a_time_has_no_interval_and_keeps_its_order() -> None:
    assert temporal.query_intervals("kestrel migration notes", NOW_MS) == []
    hits = [IndexHit("b", 3.0), IndexHit("a", 1.0)]
    rows = {"a": _row("a", _day(2023, 7, 7)), "b": _row("b", _day(2023, 1, 1))}
    assert temporal.rerank(hits, rows, [], text_channels=1, normalized=False) == hits


def test_closeness_is_one_inside_and_falls_to_zero_one_interval_away() -> None:
    july = [temporal.Interval(_day(2023, 7, 1), _day(2023, 8, 1))]  # 31 days
    assert temporal.closeness(_row("a", _day(2023, 7, 31) + 1), july) == 1.0
    assert temporal.closeness(_row("a", _day(2023, 1, 1), _day(2023, 7, 1)), july) == 1.0
    assert temporal.closeness(_row("a", _day(2023, 6, 30)), july) == pytest.approx(1 - 1 / 31)
    assert temporal.closeness(_row("a", _day(2023, 8, 1)), july) == pytest.approx(1.0, abs=1e-9)
    assert temporal.closeness(_row("a", _day(2023, 8, 16)), july) == pytest.approx(1 - 15 / 31)
    assert temporal.closeness(_row("a", _day(2023, 9, 1)), july) == 0.0
    assert temporal.closeness(_row("a", _day(2019, 1, 1), _day(2023, 5, 1)), july) == 0.0
    # the nearest of several intervals counts
    day = temporal.Interval(_day(2023, 4, 10), _day(2023, 4, 11))
    assert temporal.closeness(_row("a", _day(2023, 4, 7)), [day]) == 0.0
    assert temporal.closeness(_row("a", _day(2023, 4, 7)), [day, *july]) == 0.0
    assert temporal.closeness(_row("a", _day(2023, 6, 24)), [day, *july]) == pytest.approx(
        1 - 7 / 31
    )


def test_far_times_change_nothing() -> None:
    hits = [IndexHit("b", 3.0), IndexHit("a", 1.0)]
    rows = {"a": _row("a", _day(2023, 7, 7)), "b": _row("b", _day(2023, 1, 1))}
    far = [temporal.Interval(_day(2019, 1, 1), _day(2020, 1, 1))]
    assert temporal.rerank(hits, rows, far, text_channels=1, normalized=False) == hits


def test_the_match_is_a_further_channel_of_equal_weight() -> None:
    interval = [temporal.Interval(_day(2023, 7, 7), _day(2023, 7, 8))]
    rows = {
        "best-text": _row("best-text", _day(2023, 1, 1)),
        "dated": _row("dated", _day(2023, 7, 7) + 3_600_000),
        "weakest": _row("weakest", _day(2023, 7, 7)),
    }
    lexical = [IndexHit("best-text", 9.0), IndexHit("dated", 6.0), IndexHit("weakest", 3.0)]
    ranked = temporal.rerank(lexical, rows, interval, text_channels=1, normalized=False)
    # min-max text scores 1, 0.5, 0; with the match: 0.5, 0.75, 0.5 (ties by record id)
    assert [(h.record_id, h.score) for h in ranked] == [
        ("dated", 0.75),
        ("best-text", 0.5),
        ("weakest", 0.5),
    ]
    fused = [IndexHit("best-text", 1.0), IndexHit("dated", 0.4), IndexHit("weakest", 0.0)]
    ranked = temporal.rerank(fused, rows, interval, text_channels=2, normalized=True)
    assert [h.record_id for h in ranked] == ["best-text", "dated", "weakest"]  # 2/3 > 0.6 > 1/3
    assert ranked[1].score == pytest.approx((2 * 0.4 + 1) / 3)
    rrf = temporal.rerank(fused, rows, interval, text_channels=2, normalized=True, rrf_k=60)
    assert {h.record_id: h.score for h in rrf} == pytest.approx(
        {"best-text": 1.0, "dated": 0.4 + 1 / 61, "weakest": 1 / 62}
    )


def test_the_profile_names_every_choice() -> None:
    config = temporal.profile_config()
    assert config["grammar"] == temporal.GRAMMAR_VERSION and "dateparser" in config["parser"]


def test_a_span_is_parsed_once_a_day_and_read_again_for_its_own_day_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []
    real = temporal._parser

    class Counting:
        def __init__(self, inner: object) -> None:
            self._inner = inner

        def get_date_data(self, span: str) -> object:
            parsed.append(span)
            return self._inner.get_date_data(span)  # type: ignore[attr-defined]

    monkeypatch.setattr(temporal, "_parser", lambda base: Counting(real(base)))
    monkeypatch.setattr(temporal, "_parsed", temporal._Parsed())
    today = temporal.query_intervals("what happened yesterday", NOW_MS)
    assert temporal.query_intervals("and yesterday again?", NOW_MS) == today
    assert parsed == ["yesterday"]  # the second query's span was not parsed again
    next_day = temporal.query_intervals("what happened yesterday", NOW_MS + 86_400_000)
    assert parsed == ["yesterday", "yesterday"]  # another day: parsed against that day
    assert next_day == [temporal.Interval(_day(2026, 12, 4), _day(2026, 12, 5))]
    assert today == [temporal.Interval(_day(2026, 12, 3), _day(2026, 12, 4))]


def test_the_parsed_spans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(temporal._Parsed, "LIMIT", 3)
    kept = temporal._Parsed()
    base = datetime(2026, 12, 4, 15, 30)
    for year in range(2000, 2010):
        assert kept.interval(base, str(year)) == temporal.Interval(
            _day(year, 1, 1), _day(year + 1, 1, 1)
        )
        assert len(kept._known) <= 3
