"""The hot-path benchmark: its arithmetic, and one tiny real run beside server-memory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_locomo_bench import locomo_folder

from bench.hotpath.__main__ import main
from bench.hotpath.corpus import Corpus
from bench.hotpath.runner import (
    PEER_SINGLE_WRITE,
    RATIO_METRICS,
    SPLIT_METRICS,
    SPLIT_PARTS,
    pinned_peer_version,
    repetition_ratios,
    split,
    spread,
)
from bench.hotpath.sessions import (
    ENGINE,
    ENGRAM_HTTP,
    ENGRAM_STDIO,
    ENGRAM_STDIO_GATE,
    ENGRAM_STDIO_NOTIME,
    FLOOR_HTTP,
    FLOOR_STDIO,
    PEER,
)
from bench.hotpath.stores import StoreMissing, fingerprint, seeded_store
from bench.locomo.dataset import load

NODE_AND_NPM = shutil.which("node") is not None and shutil.which("npm") is not None


def conversation(turns: int) -> dict[str, Any]:
    """Every turn mentions the kitten, so a kitten question finds 10 records."""
    return {
        "speaker_a": "Ana",
        "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {
                "speaker": "Ana" if i % 2 else "Bo",
                "dia_id": f"D1:{i}",
                "text": f"The kitten did thing number {i} today.",
            }
            for i in range(1, turns + 1)
        ],
        "qa": [
            {
                "question": "What did the kitten do?",
                "answer": "x",
                "evidence": ["D1:1"],
                "category": 4,
            },
            {
                "question": "Which thing did the kitten do?",
                "answer": "x",
                "evidence": ["D1:2"],
                "category": 1,
            },
        ],
    }


@pytest.fixture
def locomo(tmp_path: Path) -> Path:
    return locomo_folder(tmp_path, conversation(8))


def test_memories_cycle_the_turns_under_their_own_keys(locomo: Path) -> None:
    corpus = Corpus([load(locomo / "conv-1.json")])
    first, again = corpus.memory(0), corpus.memory(8)
    assert corpus.distinct_turns == 8
    assert first.turn == again.turn
    assert first.key != again.key
    assert (
        first.capture_arguments()["idempotency_key"] != again.capture_arguments()["idempotency_key"]
    )
    assert (
        first.capture_arguments("r0")["idempotency_key"]
        != first.capture_arguments("r1")["idempotency_key"]
    )
    assert first.peer_entity()["observations"] == [first.turn.primary]
    assert first.peer_observation()["contents"] == [first.turn.context]
    assert first.text_bytes == len(first.turn.primary.encode()) + len(first.turn.context.encode())
    assert corpus.query(2) == corpus.query(0)


def test_ratios_are_ours_over_the_peer_per_repetition() -> None:
    def server(scale: float) -> dict[str, float]:
        return {name: scale * (i + 1) for i, name in enumerate(RATIO_METRICS)} | {
            "single_writes_per_s": scale * 40
        }

    ratios = repetition_ratios(
        {ENGRAM_STDIO: server(6.0), ENGRAM_HTTP: server(3.0), PEER: server(2.0)}
    )
    assert ratios[ENGRAM_STDIO]["search_p50_ms"] == 3.0
    assert ratios[ENGRAM_HTTP]["get_p99_ms"] == 1.5
    # pairs/s of ours against the peer's single writes/s: 6 * 7 / (2 * 40)
    assert ratios[ENGRAM_STDIO][PEER_SINGLE_WRITE] == pytest.approx(42 / 80)
    summary = spread([0.5, 3.0, 1.0])
    assert (summary["median"], summary["min"], summary["max"]) == (1.0, 0.5, 3.0)
    assert summary["per_repetition"] == [0.5, 3.0, 1.0]


@pytest.mark.skipif(not NODE_AND_NPM, reason="server-memory needs node and npm on PATH")
def test_a_tiny_run_beside_server_memory(locomo: Path, tmp_path: Path, capsys: Any) -> None:
    (locomo / "conv-2.json").write_text(json.dumps(conversation(6)))  # 14 distinct turns
    out = tmp_path / "hotpath.json"
    arguments = ["--sizes", "12", "--repetitions", "1", "--queries", "2", "--gets", "2"]
    arguments += ["--writes", "1", "--locomo", str(locomo), "--store-cache", str(tmp_path / "c")]
    assert main([*arguments, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["servers"] == [ENGRAM_STDIO, ENGRAM_HTTP, FLOOR_STDIO, FLOOR_HTTP, ENGINE, PEER]
    assert report["calibration"]["python_c_pass_ms"] > 0
    found = report["sizes"]["12"]
    (repetition,) = found["repetitions"]
    measured = repetition["servers"]
    for name in report["servers"]:
        metrics = measured[name]
        assert (metrics["searches"], metrics["gets"], metrics["writes"]) == (2, 2, 1)
        assert metrics["start_connect_s"] > 0
        assert metrics["pairs_per_s"] > 0
        if name != ENGINE:  # in process: no response on a wire
            assert metrics["envelope"]["response_bytes"] > metrics["envelope"]["text_bytes"] > 0
    assert measured[ENGRAM_STDIO]["search_mean_results"] == 10
    # Both transports are split against their own floor.
    assert sorted(repetition["split"]) == sorted([ENGRAM_STDIO, ENGRAM_HTTP])
    assert measured[ENGRAM_HTTP]["rank_profiles"] == ["offline_lexical_v1@2.1.0"]
    assert report["peer"]["version"] == pinned_peer_version()
    # The ratios are the report's own figures divided, ours over the peer.
    for ours in (ENGRAM_STDIO, ENGRAM_HTTP):
        for metric in RATIO_METRICS:
            expected = measured[ours][metric] / measured[PEER][metric]
            # The report rounds a ratio to 4 decimals (runner.ratio), so the expectation is too:
            # a ratio of 0.0156 is off its unrounded value by more than 0.1 %.
            close = pytest.approx(round(expected, 4), rel=1e-3)
            assert repetition["ratios"][ours][metric] == close
            assert found["ratios"][ours][metric]["median"] == close
    disk = found["disk"]
    assert disk["records"] == 12
    assert disk["engram"]["per_record"] * 12 == pytest.approx(disk["engram"]["bytes"], abs=1)
    assert disk[PEER]["beyond_text_per_record"] < disk[PEER]["per_record"]
    table = capsys.readouterr().out
    assert "search p50 ms" in table
    assert "stdio/peer" in table


def _run_without_peer(
    locomo: Path,
    tmp_path: Path,
    *,
    sizes: str,
    transports: str,
    queries: int,
    floor: bool = False,
    writes: int = 1,
) -> dict[str, Any]:
    """A tiny run of two repetitions of our servers alone (``floor``: and the SDK floor and
    the engine in process); its JSON report."""
    out = tmp_path / "hotpath.json"
    arguments = ["--sizes", sizes, "--repetitions", "2", "--queries", str(queries)]
    arguments += [] if floor else ["--without-floor"]
    arguments += ["--gets", "2", "--writes", str(writes), "--locomo", str(locomo)]
    arguments += ["--store-cache", str(tmp_path / "c"), "--without-peer"]
    assert main([*arguments, "--transports", transports, "--json", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_sizes_interleave_and_growth_is_per_repetition(
    locomo: Path, tmp_path: Path, capsys: Any
) -> None:
    report = _run_without_peer(locomo, tmp_path, sizes="10,16", transports="stdio", queries=2)
    assert report["servers"] == [ENGRAM_STDIO]
    small, big = report["sizes"]["10"]["repetitions"], report["sizes"]["16"]["repetitions"]
    assert len(small) == len(big) == 2
    grown = report["growth"][ENGRAM_STDIO]
    assert grown["over"] == 10
    cell = grown["sizes"]["16"]["search_p50_ms"]
    expected = [
        b["servers"][ENGRAM_STDIO]["search_p50_ms"] / s["servers"][ENGRAM_STDIO]["search_p50_ms"]
        for s, b in zip(small, big, strict=True)
    ]
    assert cell["per_repetition"] == pytest.approx(expected, rel=1e-3)
    assert "search p50 at 16 / at 10 records" in capsys.readouterr().out


def test_time_aware_search_is_measured_beside_the_ranking_without_it(
    locomo: Path, tmp_path: Path, capsys: Any
) -> None:
    report = _run_without_peer(
        locomo, tmp_path, sizes="12", transports="stdio,stdio-notime", queries=3
    )
    assert report["servers"] == [ENGRAM_STDIO, ENGRAM_STDIO_NOTIME]
    found = report["sizes"]["12"]
    first = found["repetitions"][0]["servers"]
    # the same store and queries, two rankings: the receipts say which ran
    assert first[ENGRAM_STDIO]["rank_profiles"] == ["offline_lexical_v1@2.1.0"]
    assert first[ENGRAM_STDIO_NOTIME]["rank_profiles"] == ["offline_lexical_v1@2.0.0"]
    expected = [
        r["servers"][ENGRAM_STDIO]["search_p50_ms"]
        / r["servers"][ENGRAM_STDIO_NOTIME]["search_p50_ms"]
        for r in found["repetitions"]
    ]
    cell = found["time_aware_over_notime"]["search_p50_ms"]
    assert cell["per_repetition"] == pytest.approx(expected, rel=1e-3)
    assert "time-aware over notime" in capsys.readouterr().out


def test_seed_only_caches_the_stores_and_measures_nothing(
    locomo: Path, tmp_path: Path, capsys: Any
) -> None:
    cache = tmp_path / "c"
    arguments = ["--sizes", "14,10", "--locomo", str(locomo), "--store-cache", str(cache)]
    assert main([*arguments, "--seed-only"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2
    assert "n=10" in printed[0] and "grown from 0" in printed[0]
    assert "n=14" in printed[1] and "grown from 10" in printed[1]  # grown, not seeded again
    (family,) = cache.iterdir()
    manifests = {p.name: json.loads((p / "manifest.json").read_text()) for p in family.iterdir()}
    assert sorted(manifests) == ["n10", "n14"]
    assert manifests["n14"]["record_ids"][:10] == manifests["n10"]["record_ids"]
    assert not (tmp_path / "hotpath.json").exists()
    # Stores of another product source are used only when named, and never seeded.
    corpus = Corpus.load(locomo)
    seeded_with = family.name.removeprefix("lexical-")
    assert seeded_with == fingerprint(corpus)
    named = seeded_store(cache, corpus, 14, seeded_with=seeded_with)
    assert list(named.record_ids) == manifests["n14"]["record_ids"]
    for size, source in ((20, seeded_with), (14, "0123456789abcdef")):
        with pytest.raises(StoreMissing):
            seeded_store(cache, corpus, size, seeded_with=source)
    assert sorted(p.name for p in cache.iterdir()) == [family.name]


def test_a_split_takes_the_floor_then_the_engine_and_leaves_the_surface() -> None:
    assert split(10.0, 2.0, 3.0) == {
        "ours": 10.0,
        "floor": 2.0,
        "engine": 3.0,
        "surface": 5.0,
        "measured_floor": 2.0,
        "measured_engine": 3.0,
    }
    # Noise: floor + engine measured above ours leave no negative surface, and still sum.
    noisy = split(4.0, 1.5, 3.0)
    assert (noisy["floor"], noisy["engine"], noisy["surface"]) == (1.5, 2.5, 0.0)
    assert split(1.0, 2.0, 3.0)["floor"] == 1.0


def test_the_sdk_floor_and_the_engine_split_our_time(
    locomo: Path, tmp_path: Path, capsys: Any
) -> None:
    report = _run_without_peer(
        locomo, tmp_path, sizes="12", transports="stdio", queries=3, floor=True, writes=2
    )
    assert report["servers"] == [ENGRAM_STDIO, FLOOR_STDIO, ENGINE]
    found = report["sizes"]["12"]
    for repetition in found["repetitions"]:
        measured = repetition["servers"]
        # The floor answers our tools with our payloads: the same client code reads them.
        assert measured[FLOOR_STDIO]["search_mean_results"] == 10
        assert measured[FLOOR_STDIO]["rank_profiles"] == ["offline_lexical_v1@2.1.0"]
        assert measured[FLOOR_STDIO]["envelope"]["text_bytes"] > 0
        # The servers' own CPU is read (/proc): starting a Python server takes many ticks.
        assert measured[ENGRAM_STDIO]["start_cpu_ms"] > 0
        assert measured[FLOOR_STDIO]["start_cpu_ms"] > 0
        assert (
            measured[ENGINE]["search_mean_results"] == measured[ENGRAM_STDIO]["search_mean_results"]
        )
        for label, metric in SPLIT_METRICS.items():
            cell = repetition["split"][ENGRAM_STDIO][label]
            # CPU is counted in clock ticks: a phase of a few calls may read 0.
            least = 0 if metric.endswith("_cpu_ms") else 1e-9
            assert cell["ours"] == measured[ENGRAM_STDIO][metric] >= least
            assert cell["measured_floor"] == measured[FLOOR_STDIO][metric] >= least
            assert cell["measured_engine"] == measured[ENGINE][metric] >= least
            assert all(cell[part] >= 0 for part in SPLIT_PARTS)
            assert sum(cell[part] for part in SPLIT_PARTS) == pytest.approx(cell["ours"])
    for label, metric in SPLIT_METRICS.items():
        cell = found["split"][ENGRAM_STDIO][label]
        assert cell["ours"] == pytest.approx(found["summary"][ENGRAM_STDIO][metric]["median"])
        assert all(cell[part] >= 0 for part in SPLIT_PARTS)
        assert sum(cell[part] for part in SPLIT_PARTS) == pytest.approx(cell["ours"])
        for part in SPLIT_PARTS:
            low, high = cell["ranges"][part]
            assert 0 <= low <= high
    table = capsys.readouterr().out
    assert "where engram-stdio's time goes" in table
    assert "capture+admission pair CPU" in table


def test_the_write_pair_is_measured_with_the_quality_gate_on_beside(
    locomo: Path, tmp_path: Path, capsys: Any
) -> None:
    # Enough pairs for the server's CPU to show in /proc's 10 ms ticks: a pair costs ~6 ms now,
    # so two could read as 0 (a hold, cheaper still).
    report = _run_without_peer(
        locomo, tmp_path, sizes="10,16", transports="stdio,stdio-gate", queries=2, writes=8
    )
    assert report["servers"] == [ENGRAM_STDIO, ENGRAM_STDIO_GATE]
    for size in ("10", "16"):
        for repetition in report["sizes"][size]["repetitions"]:
            assert repetition["servers"][ENGRAM_STDIO_GATE]["pair_cpu_ms"] > 0
    grown = report["growth"][ENGRAM_STDIO_GATE]["sizes"]["16"]["pair_cpu_ms"]
    assert len(grown["per_repetition"]) == 2
    assert "write pair server CPU" in capsys.readouterr().out


def test_the_gated_server_runs_the_hosts_default_admission_policy(tmp_path: Path) -> None:
    from bench.hotpath.sessions import EngramStdioGated
    from bench.hotpath.stores import DATA, _prepare_host
    from engram_memory.embedded.data_dir import host_config_path
    from engram_memory.embedded.host_file import load_host_config

    _prepare_host(tmp_path / DATA, "lexical")
    assert load_host_config(tmp_path / DATA).admission.near_duplicates == "off"
    EngramStdioGated().prepare(tmp_path)
    assert "admission" not in json.loads(host_config_path(tmp_path / DATA).read_text())
    assert load_host_config(tmp_path / DATA).admission.near_duplicates != "off"
