"""bench.soak.flatness: the soak's verdict on synthetic resource series."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.soak import flatness
from bench.soak.flatness import FAIL, INCONCLUSIVE, PASS, Limits, judge

DURATION_S = 600.0
READ_ONLY_FROM_S = 420.0  # the last 30 %
EVERY_S = 10.0


def series(
    *,
    duration_s: float = DURATION_S,
    calls_per_s: float = 70.0,
    records_per_call: float = 0.15,
    read_only_from_s: float | None = READ_ONLY_FROM_S,
    warm_rss_mb: float = 120.0,
    warm_climb_mb: float = 30.0,
    kib_per_record: float = 0.5,
    leak_kib_per_call: float = 0.0,
    switch_step_mb: float = 0.0,
    fds: int = 75,
    fd_leak_per_minute: float = 0.0,
    every_s: float = EVERY_S,
) -> list[dict[str, Any]]:
    """Samples every ``every_s`` (10 s): RSS climbs for the first 100 s (the warm-up), then grows by
    ``kib_per_record`` per record added and ``leak_kib_per_call`` per call; no record is added
    in the read-only phase, whose first 10 s step RSS up by ``switch_step_mb``."""
    samples = []
    records = 0.0
    rss = warm_rss_mb
    steps = int(duration_s // every_s)
    for step in range(steps + 1):
        t = step * every_s
        calls = int(calls_per_s * t)
        if step:
            new_calls = calls_per_s * every_s
            read_only = read_only_from_s is not None and t > read_only_from_s
            new_records = 0.0 if read_only else new_calls * records_per_call
            records += new_records
            rss += new_records * kib_per_record / 1024 + new_calls * leak_kib_per_call / 1024
            if t <= 100:
                rss += warm_climb_mb * every_s / 100
            if read_only_from_s is not None and read_only and t - every_s <= read_only_from_s:
                rss += switch_step_mb
        samples.append(
            {
                "t_s": t,
                "calls": calls,
                "records": int(records),
                "rss_mb": round(rss, 1),
                "fds": fds + int(fd_leak_per_minute * t / 60),
            }
        )
    return samples


def statuses(judged: dict[str, Any]) -> list[str]:
    return [check["status"] for check in judged["checks"]]


def figures(judged: dict[str, Any], index: int) -> dict[str, Any]:
    figures: dict[str, Any] = judged["checks"][index]["figures"]
    return figures


def test_a_flat_series_passes_every_check() -> None:
    judged = judge(series(), DURATION_S, READ_ONLY_FROM_S)

    assert statuses(judged) == [PASS, PASS, PASS]
    assert judged["verdict"] == PASS and judged["lines"][-1] == "VERDICT PASS"
    # The warm-up ends at 35 % of the run (210 s), when 14,700 calls were answered (> 5,000).
    assert judged["warmup_end_s"] == 210.0
    read_only = figures(judged, 0)
    # From 2,000 calls after the switch (420 s, 29,400 calls) to the end.
    assert (read_only["from_s"], read_only["to_s"]) == (450.0, 600.0)
    assert read_only["calls"] == 10500 and read_only["records_added"] == 0
    assert read_only["growth_mb"] == 0.0 and read_only["switch_step_mb"] == 0.0
    mixed = figures(judged, 1)
    assert (mixed["from_s"], mixed["to_s"]) == (210.0, 420.0)
    # 14,700 calls, 2,205 records at 0.5 KiB: +1.1 MB, under 2 MB + 1 KiB a record (4.2 MB).
    assert mixed["records_added"] == 2205 and mixed["growth_mb"] == pytest.approx(1.1, abs=0.1)
    assert mixed["limit_mb"] == pytest.approx(2.0 + 2205 / 1024, abs=0.1)
    assert all(line.startswith(PASS) for line in judged["lines"][:3])


def test_rss_growing_in_the_read_only_phase_is_a_leak() -> None:
    # 0.3 KiB per call: the 10,500 calls after the phase settled hold 3.1 MB more.
    judged = judge(series(leak_kib_per_call=0.3), DURATION_S, READ_ONLY_FROM_S)

    assert statuses(judged)[0] == FAIL and judged["verdict"] == FAIL
    assert figures(judged, 0)["growth_mb"] == pytest.approx(3.1, abs=0.1)
    assert judged["lines"][0].startswith("FAIL") and "growth_mb 3." in judged["lines"][0]
    assert judged["lines"][-1] == "VERDICT FAIL"


def test_a_step_when_the_mix_changes_is_not_a_leak_but_growth_after_it_is() -> None:
    step = judge(series(switch_step_mb=2.7), DURATION_S, READ_ONLY_FROM_S)
    assert statuses(step) == [PASS, PASS, PASS]
    assert figures(step, 0)["switch_step_mb"] == 2.7 and figures(step, 0)["growth_mb"] == 0.0

    leak = series(switch_step_mb=2.7, leak_kib_per_call=0.3)
    assert statuses(judge(leak, DURATION_S, READ_ONLY_FROM_S))[0] == FAIL


def test_mixed_traffic_may_grow_with_the_records_added_but_no_faster() -> None:
    within = judge(series(kib_per_record=1.5), DURATION_S, READ_ONLY_FROM_S)
    beyond = judge(series(kib_per_record=3.0), DURATION_S, READ_ONLY_FROM_S)

    # 2,205 records: 3.2 MB at 1.5 KiB each is within 2 MB + 2.2 MB; 6.5 MB at 3 KiB is not.
    assert statuses(within) == [PASS, PASS, PASS]
    assert statuses(beyond)[1] == FAIL and beyond["verdict"] == FAIL
    assert statuses(beyond)[0] == PASS  # the store stopped growing, and so did RSS


def test_descriptors_growing_after_warm_up_fail() -> None:
    leaking = judge(series(fd_leak_per_minute=1.0), DURATION_S, READ_ONLY_FROM_S)
    assert statuses(leaking)[2] == FAIL
    assert figures(leaking, 2)["last_third_peak"] > figures(leaking, 2)["limit"]

    steady = judge(series(fds=80), DURATION_S, READ_ONLY_FROM_S)
    assert statuses(steady)[2] == PASS and figures(steady, 2)["limit"] == 82


def test_a_short_run_is_inconclusive_yet_shows_its_read_only_figure() -> None:
    judged = judge(series(duration_s=20.0, read_only_from_s=14.0, every_s=1.0), 20.0, 14.0)

    assert statuses(judged) == [INCONCLUSIVE] * 3 and judged["verdict"] == INCONCLUSIVE
    assert judged["warmup_end_s"] is None
    assert "growth_mb" in figures(judged, 0)
    assert "warm-up" in judged["checks"][0]["reason"]
    # Even a leak does not make it FAIL: too short to tell a leak from the warm-up.
    short_leak = series(duration_s=20, read_only_from_s=14, leak_kib_per_call=50, every_s=1.0)
    leaking = judge(short_leak, 20.0, 14.0)
    assert leaking["verdict"] == INCONCLUSIVE


def test_a_slow_run_warms_up_on_calls_not_on_time() -> None:
    # 15,000 calls in 10 minutes: 5,250 at 35 % (210 s); the read-only phase settles at 500 s
    # (2,000 calls after the switch) and holds 2,500 calls more: conclusive.
    slow = judge(series(calls_per_s=25.0), DURATION_S, READ_ONLY_FROM_S)
    assert slow["warmup_end_s"] == 210.0 and slow["verdict"] == PASS
    assert figures(slow, 0)["from_s"] == 500.0 and figures(slow, 0)["calls"] == 2500

    # Loaded, 9,000 calls: warm at 340 s (5,100 calls), but the read-only phase's 2,700 calls
    # are too few to settle and then show a leak: (a) is inconclusive, with its figures.
    loaded = judge(series(calls_per_s=15.0), DURATION_S, READ_ONLY_FROM_S)
    assert loaded["warmup_end_s"] == 340.0 and loaded["verdict"] == INCONCLUSIVE
    assert statuses(loaded) == [INCONCLUSIVE, PASS, PASS]
    assert "calls in the phase" in loaded["checks"][0]["reason"]
    assert "growth_mb" in figures(loaded, 0)

    # 6,000 calls: 5,000 only at 500 s, inside the read-only phase.
    slower = judge(series(calls_per_s=10.0), DURATION_S, READ_ONLY_FROM_S)
    assert slower["warmup_end_s"] == 500.0
    assert statuses(slower)[:2] == [INCONCLUSIVE, INCONCLUSIVE]
    assert figures(slower, 0)["calls"] == 1800


def test_without_a_read_only_phase_the_leak_check_is_inconclusive() -> None:
    judged = judge(series(read_only_from_s=None), DURATION_S, None)
    assert statuses(judged) == [INCONCLUSIVE, PASS, PASS]
    assert figures(judged, 1)["to_s"] == DURATION_S
    assert judged["verdict"] == INCONCLUSIVE


def test_the_limits_can_be_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    strict = judge(series(), DURATION_S, READ_ONLY_FROM_S, Limits(warmup_calls=20_000))
    assert strict["warmup_end_s"] == 290.0  # 20,300 calls

    path = tmp_path / "soak.json"
    report = {
        "duration_s": DURATION_S,
        "read_only_from_s": READ_ONLY_FROM_S,
        "server": {"samples": series(leak_kib_per_call=0.3)},
    }
    path.write_text(json.dumps(report), encoding="utf-8")
    assert flatness.main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("FAIL") and out[-1] == "VERDICT FAIL"
