"""bench.soak: a few seconds of a few clients against the real server, and the report's arithmetic."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from test_soak_flatness import series as synthetic_series  # the synthetic flat and leaking series

from bench.soak import __main__ as soak_cli
from bench.soak.runner import MIX, READ_ONLY_TOOLS, Agent, Tally, report

SAMPLE_KEYS = {"t_s", "fds", "database_fds", "rss_mb", "threads", "calls", "records"}


def test_a_short_soak_stops_by_itself_and_reports_consistent_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "soak.json"
    assert soak_cli.main(["--seconds", "4", "--clients", "3", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "calls/s" in out
    result = json.loads(path.read_text(encoding="utf-8"))

    # The last 30 % is the read-only phase, and the report judges flatness (a few seconds
    # cannot warm up: the verdict is there, not its outcome).
    assert result["read_only_from_s"] == pytest.approx(2.8)
    assert f"read-only phase (search and get only): from t={result['read_only_from_s']} s" in out
    flatness = result["flatness"]
    assert [check["name"][:3] for check in flatness["checks"]] == ["(a)", "(b)", "(c)"]
    assert flatness["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert f"VERDICT {flatness['verdict']}" in out
    for check in flatness["checks"]:
        assert f"{check['status']:<12} {check['name']}" in out
    series = result["series"]
    assert [row["minute"] for row in series] == [1] and series[0]["phase"] == "both"
    assert series[0]["calls"] <= result["calls"] == series[0]["calls_in_minute"]
    assert series[0]["tools"].keys() == result["tools"].keys()

    assert result["clients"] == 3
    assert result["duration_s"] >= 4
    assert set(result["tools"]) <= set(MIX)
    assert result["calls"] == sum(t["calls"] for t in result["tools"].values()) > 0
    assert result["ok"] == sum(t["ok"] for t in result["tools"].values())
    assert result["throughput_per_s"] == pytest.approx(
        result["calls"] / result["duration_s"], rel=0.05
    )
    for entry in result["tools"].values():
        assert 0 <= entry["ok"] <= entry["calls"]
        assert 0 < entry["p50_ms"] <= entry["p99_ms"]
    tool_errors = sum(n for code, n in result["errors_by_code"].items())
    assert tool_errors >= result["calls"] - result["ok"]

    server = result["server"]
    samples = server["samples"]
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    assert (server["start"], server["end"]) == (samples[0], samples[-1])
    assert server["middle"] in samples
    for sample in samples:
        assert set(sample) == SAMPLE_KEYS
        assert sample["fds"] >= sample["database_fds"] >= 0
        assert sample["rss_mb"] > 0 and sample["threads"] >= 1
    assert [s["calls"] for s in samples] == sorted(s["calls"] for s in samples)
    assert samples[-1]["records"] <= result["tools"].get("request_admission", {}).get("ok", 0)
    # The clock starts once the server answers HTTP, which it does after opening its host.
    assert server["start"]["database_fds"] >= 1 and server["end"]["database_fds"] >= 1


def test_the_report_counts_latencies_outcomes_and_broken_sessions() -> None:
    tally = Tally()
    for took in range(1, 101):  # 1..100 ms
        tally.add("search", "OK", float(took))
    tally.add("forget", "OK", 7.0)
    tally.add("forget", "GATE_FAILED", 9.0)
    tally.add("capture", "jsonrpc:-32603", 3.0)
    tally.add("session", "ConnectError", 0.0)
    resources = {"database_fds": 5, "threads": 6, "records": 0}
    samples = [
        {"t_s": 0.0, "fds": 10, "rss_mb": 100.0, "calls": 0, **resources},
        {"t_s": 5.0, "fds": 12, "rss_mb": 110.0, "calls": 50, **resources},
        {"t_s": 10.0, "fds": 12, "rss_mb": 111.0, "calls": 103, **resources},
    ]
    result = report(tally, samples, 10.0, clients=2)

    assert result["calls"] == 103 and result["ok"] == 101
    assert result["throughput_per_s"] == 10.3
    assert result["tools"]["search"] == {"calls": 100, "ok": 100, "p50_ms": 50.0, "p99_ms": 99.0}
    assert result["tools"]["forget"] == {"calls": 2, "ok": 1, "p50_ms": 7.0, "p99_ms": 9.0}
    assert "session" not in result["tools"]
    assert result["errors_by_code"] == {
        "ConnectError": 1,
        "GATE_FAILED": 1,
        "jsonrpc:-32603": 1,
    }
    assert result["server"]["middle"] == samples[1]
    assert (result["server"]["start"], result["server"]["end"]) == (samples[0], samples[2])


def test_the_series_has_a_row_per_minute_with_its_calls_latencies_and_resources() -> None:
    tally = Tally()
    for minute, took in ((0, 10.0), (0, 30.0), (1, 50.0), (2, 70.0), (2, 90.0)):
        tally.add("get", "OK", took, minute)
    tally.add("session", "ConnectError", 0.0, 1)
    resources = {"database_fds": 5, "threads": 6}
    samples = [
        {"t_s": t, "fds": fds, "rss_mb": rss, "calls": calls, "records": records, **resources}
        for t, fds, rss, calls, records in (
            (0.0, 10, 100.0, 0, 0),
            (50.0, 20, 120.0, 2, 1),
            (110.0, 21, 121.0, 3, 2),
            (150.0, 21, 121.5, 5, 2),
        )
    ]
    result = report(tally, samples, 150.0, clients=1, read_only_from_s=100.0)

    assert result["read_only_from_s"] == 100.0
    rows = result["series"]
    assert [(r["minute"], r["phase"], r["t_s"]) for r in rows] == [
        (1, "mixed", 50.0),
        (2, "both", 110.0),
        (3, "read-only", 150.0),
    ]
    assert [(r["calls"], r["calls_in_minute"], r["records"]) for r in rows] == [
        (2, 2, 1),
        (3, 1, 2),
        (5, 2, 2),
    ]
    assert [(r["rss_mb"], r["fds"]) for r in rows] == [(120.0, 20), (121.0, 21), (121.5, 21)]
    assert rows[2]["tools"] == {"get": {"calls": 2, "p50_ms": 70.0, "p99_ms": 90.0}}
    # 5 calls cannot warm up: the verdict says so rather than passing.
    assert result["flatness"]["verdict"] == "INCONCLUSIVE"


def test_in_the_read_only_phase_an_agent_only_searches_and_gets() -> None:
    def agent(read_only_at: float) -> Agent:
        records = [f"record:{n}" for n in range(50)]
        pending = [f"candidate:{n}" for n in range(50)]
        return Agent(
            0, random.Random(1), records=records, pending=pending, read_only_at=read_only_at
        )

    mixed = agent(float("inf"))
    assert {mixed.next_call()[0] for _ in range(40)} == set(MIX)
    read_only = agent(time.monotonic())
    assert {read_only.next_call()[0] for _ in range(200)} == set(READ_ONLY_TOOLS)


@pytest.mark.parametrize(("leak_kib_per_call", "verdict"), [(0.0, "PASS"), (0.3, "FAIL")])
def test_the_exit_status_follows_the_verdict_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    leak_kib_per_call: float,
    verdict: str,
) -> None:
    samples = [
        {**sample, "database_fds": 17, "threads": 34}
        for sample in synthetic_series(leak_kib_per_call=leak_kib_per_call)
    ]
    result = report(Tally(), samples, 600.0, clients=32, read_only_from_s=420.0)
    monkeypatch.setattr(soak_cli, "run_soak", lambda **_: result)

    assert soak_cli.main(["--seconds", "600"]) == 0
    assert f"VERDICT {verdict}" in capsys.readouterr().out
    assert soak_cli.main(["--seconds", "600", "--require-flat"]) == (verdict != "PASS")
