"""bench.soak: a few seconds of a few clients against the real server, and the report's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.soak import __main__ as soak_cli
from bench.soak.runner import MIX, Tally, report

SAMPLE_KEYS = {"t_s", "fds", "database_fds", "rss_mb", "threads"}


def test_a_short_soak_stops_by_itself_and_reports_consistent_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "soak.json"
    assert soak_cli.main(["--seconds", "4", "--clients", "3", "--json", str(path)]) == 0
    assert "calls/s" in capsys.readouterr().out
    result = json.loads(path.read_text(encoding="utf-8"))

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
    samples = [
        {"t_s": 0.0, "fds": 10, "database_fds": 3, "rss_mb": 100.0, "threads": 2},
        {"t_s": 5.0, "fds": 12, "database_fds": 5, "rss_mb": 110.0, "threads": 6},
        {"t_s": 10.0, "fds": 12, "database_fds": 5, "rss_mb": 111.0, "threads": 6},
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
