"""The human-readable table of a hot-path report."""

from __future__ import annotations

from typing import Any

from .runner import PEER_SINGLE_WRITE, SPLIT_METRICS, SPLIT_PARTS
from .sessions import ENGINE, FLOOR_OF, PEER

ROWS = (  # (label, metric, ratio metric or None)
    ("capture+admission pairs/s", "pairs_per_s", "pairs_per_s"),
    ("  peer single writes/s", "single_writes_per_s", PEER_SINGLE_WRITE),
    ("search p50 ms", "search_p50_ms", "search_p50_ms"),
    ("search p99 ms", "search_p99_ms", "search_p99_ms"),
    ("get p50 ms", "get_p50_ms", "get_p50_ms"),
    ("get p99 ms", "get_p99_ms", "get_p99_ms"),
    ("start + connect s", "start_connect_s", "start_connect_s"),
    ("  server CPU by then, ms", "start_cpu_ms", None),
    ("search CPU per call, ms", "search_cpu_ms", None),
    ("get CPU per call, ms", "get_cpu_ms", None),
    ("pair CPU per pair, ms", "pair_cpu_ms", None),
    ("ping (empty round trip) ms", "ping_p50_ms", "ping_p50_ms"),
    ("search results (mean)", "search_mean_results", None),
)


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _spread(cell: dict[str, Any]) -> str:
    return f"{_num(cell['median'])} [{_num(cell['min'])}–{_num(cell['max'])}]"


def _metric_rows(found: dict[str, Any], servers: list[str], ours: list[str]) -> list[str]:
    """One size's table rows: each metric's median per server, then each of ours over the
    peer (median [range])."""
    lines: list[str] = []
    for label, metric, ratio_metric in ROWS:
        if metric == "single_writes_per_s" and PEER not in servers:
            continue
        row = f"{label:<28}"
        for name in servers:
            cell = found["summary"][name][metric]
            shown = "" if metric == "single_writes_per_s" and name != PEER else _num(cell["median"])
            row += f"{shown:>22}"
        if PEER in servers and ratio_metric is not None:
            for name in ours:
                row += f"{_spread(found['ratios'][name][ratio_metric]):>22}"
        lines.append(row)
    return lines


def _split_rows(found: dict[str, Any], servers: list[str]) -> list[str]:
    """Each of our servers' p50 and CPU per call, per tool, as SDK floor + engine in process +
    surface (the medians' split, each part's range over the repetitions), beside the peer's."""
    lines: list[str] = []
    for ours, tools in found.get("split", {}).items():
        lines.append(
            f"where {ours}'s time goes, ms: {FLOOR_OF[ours]} (SDK floor) + {ENGINE} (in"
            " process) + surface (the rest) [range over repetitions]; CPU: the server process's"
            " per call"
        )
        head = f"  {'':<28}{'ours':>9}" + "".join(f"{part:>21}" for part in SPLIT_PARTS)
        lines.append(head + (f"{'peer':>9}" if PEER in servers else ""))
        for label, metric in SPLIT_METRICS.items():
            cell = tools[label]
            row = f"  {label:<28}{_num(cell['ours']):>9}"
            for part in SPLIT_PARTS:
                low, high = cell["ranges"][part]
                row += f"{_num(cell[part]) + f' [{_num(low)}–{_num(high)}]':>21}"
            if PEER in servers:
                row += f"{_num(found['summary'][PEER][metric]['median']):>9}"
            lines.append(row)
    return lines


def _size_notes(found: dict[str, Any], servers: list[str], size: str) -> list[str]:
    """Below one size's table: disk per record, the 10-record response, the time-aware cost
    and the seeding rate."""
    lines: list[str] = []
    disk = found["disk"]
    lines.append(
        f"disk per record (text {disk['text_bytes_per_record']:.0f} B): engram "
        f"{disk['engram']['per_record']:.0f} B ({disk['engram']['beyond_text_per_record']:.0f} "
        f"beyond text); server-memory {disk[PEER]['per_record']:.0f} B "
        f"({disk[PEER]['beyond_text_per_record']:.0f} beyond text)"
    )
    envelopes = []
    for name in servers:
        envelope = found["repetitions"][0]["servers"][name].get("envelope")
        if envelope:
            envelopes.append(
                f"{name} {envelope['response_bytes']} B = {envelope['bytes_per_result']:.0f} "
                f"B/result, {envelope['times_text']}× its text"
            )
    if envelopes:
        lines.append("10-record response: " + "; ".join(envelopes))
    cost = found.get("time_aware_over_notime")
    if cost:
        lines.append(
            "time-aware over notime (engram-stdio / engram-stdio-notime, per repetition): "
            f"search p50 {_spread(cost['search_p50_ms'])}, p99 {_spread(cost['search_p99_ms'])}"
        )
    seed = found["seed"]
    lines.append(
        f"seeded in process: {seed['engine_pairs_per_s']} pairs/s "
        f"(records {seed['grown_from']}..{size}, when the cached store was made)"
    )
    return lines


def table(report: dict[str, Any]) -> str:
    servers = report["servers"]
    calibration = report["calibration"]
    lines = [
        "calibration: python -c pass "
        f"{calibration['python_c_pass_ms']} ms"
        + (f", node -e 0 {calibration['node_e_0_ms']} ms" if "node_e_0_ms" in calibration else "")
        + f"; load average before {tuple(round(x, 1) for x in report['machine']['load_average_before'])}",
    ]
    ours = [name for name in servers if name in FLOOR_OF]
    head = f"{'':<28}" + "".join(f"{name:>22}" for name in servers)
    if PEER in servers:
        head += "".join(f"{name.removeprefix('engram-') + '/peer':>22}" for name in ours)
    for size, found in report["sizes"].items():
        reps = len(found["repetitions"])
        lines += [
            "",
            f"{size} records, one workspace, {report['profile']} search — median [range] of "
            f"{reps} interleaved repetitions",
            head,
        ]
        lines += _metric_rows(found, servers, ours)
        lines += _split_rows(found, servers)
        lines += _size_notes(found, servers, size)
    for server, grown in report.get("growth", {}).items():
        for size, cell in grown["sizes"].items():
            lines.append(
                f"{server}: search p50 at {size} / at {grown['over']} records "
                f"{_spread(cell['search_p50_ms'])}, p99 {_spread(cell['search_p99_ms'])}"
                + (
                    f", write pair server CPU {_spread(cell['pair_cpu_ms'])}"
                    if "pair_cpu_ms" in cell
                    else ""
                )
                + " (per repetition)"
            )
    return "\n".join(lines)
