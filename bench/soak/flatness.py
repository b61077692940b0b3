"""Are the server's RSS and descriptors flat after warm-up? The soak's verdict (pure functions).

``python -m bench.soak.flatness soak.json`` judges a saved report again (say, with other limits).

The input is the soak's resource samples, in time order, each with ``t_s`` (seconds since the
start), ``rss_mb``, ``fds``, and the running counts ``calls`` (tool calls answered so far) and
``records`` (records added so far), and the moment the read-only phase began (the last 30 % of
the run sends only search and get, so the store stops growing there).

- **Warm-up**: the first 35 % of the run, and at least ``warmup_calls`` (5,000) calls. Until then RSS
  climbs for reasons that stop by themselves: the worker threads start, each of the 8 pooled
  SQLite connections fills its 512 KiB page cache (4 MiB in all) and its cache of prepared
  statements, the stem cache learns the vocabulary, malloc's arenas reach their working size.
  Measured (32 clients, load 10, 2026-12-04): RSS 118.3 MB idle, 147.9 MB after 5,069 calls
  (80 s), then +6.3 MB over the next 18,000 mixed calls, at the pace of the records added.
- **(a) read-only phase**: RSS growth over it at most ``read_only_rss_mb``. Nothing is added to
  the store there, so every cache keyed by data is as full as it will get: what still grows is
  a leak. Growth is measured from ``read_only_settle_calls`` calls after the switch (the new mix
  steps the working set up once, ``switch_step_mb``) to the end, over at least
  ``min_read_only_calls`` calls, so that a leak of 1 KiB per call would show as 2 MB.
- **(b) mixed traffic after warm-up**: RSS growth from the warm-up's end to the read-only phase
  at most ``mixed_rss_mb`` plus ``per_record_kib`` per record added meanwhile (the store's own,
  legitimate growth; ``Limits.per_record_kib`` explains the figure).
- **(c) descriptors**: after warm-up, the peak over the last third at most the peak over the
  first third plus ``fd_slack`` (a few sockets of clients reconnecting at that moment).

Each check is PASS, FAIL or INCONCLUSIVE (the run too short or too slow to have warmed up, or too
few samples), always with its figures when they can be computed; the verdict is FAIL if any
check fails, PASS if all pass, otherwise INCONCLUSIVE.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

PASS: Final = "PASS"  # noqa: S105 - a verdict, not a password
FAIL: Final = "FAIL"
INCONCLUSIVE: Final = "INCONCLUSIVE"

Sample = Mapping[str, Any]


@dataclass(frozen=True)
class Limits:
    """The verdict's thresholds (module docstring)."""

    warmup_fraction: float = 0.35
    warmup_calls: int = 5_000
    read_only_rss_mb: float = 2.0
    min_read_only_calls: int = 2_000
    # The switch to search and get changes the working set once: 32 clients searching at once
    # hold more result sets than the mix did, and malloc's arenas grow to that, a step within
    # the first ~1,200 calls (+2.7 MB in 20 s on 2026-12-04, then flat). A step is not a leak;
    # growth is measured from the first sample this many calls after the switch.
    read_only_settle_calls: int = 2_000
    mixed_rss_mb: float = 2.0
    # What the store legitimately adds to RSS per record while it grows: the captured texts
    # bring new words into the stem cache (the soak's each carry a unique note id: about 1.5
    # new words a capture, 1.8 captures a record added, 136 bytes an entry; engine/lexical.py,
    # bounded at 65,536 entries), about 0.35 KiB; the new pages of the tables and the FTS index
    # fill the 8 connections' page caches up to their cap (SQLite's bytes 5.8 -> 8.8 MiB while
    # the store went from 450 to 870 records, then flat); malloc keeps what it freed in between.
    # Measured over mixed traffic after warm-up: +3.0 MB over 22,000 calls, about 3,300 records
    # at this mix (idle, README), and +2.3 MB for 1,453 records (load 10): 2 MB fixed plus
    # 1 KiB a record covers both.
    per_record_kib: float = 1.0
    fd_slack: int = 2


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def line(self) -> str:
        shown = ", ".join(f"{key} {value}" for key, value in self.figures.items())
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.status:<12} {self.name}: {shown or 'no figures'}{why}"


def warmup_end(samples: Sequence[Sample], duration_s: float, limits: Limits) -> float | None:
    """When the warm-up ends: the first sample at or after ``warmup_fraction`` of the run with at
    least ``warmup_calls`` calls answered; None if the run never got there."""
    earliest = duration_s * limits.warmup_fraction
    for sample in samples:
        if sample["t_s"] >= earliest and sample["calls"] >= limits.warmup_calls:
            return float(sample["t_s"])
    return None


def between(samples: Sequence[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples with ``start_s <= t_s <= end_s``."""
    return [sample for sample in samples if start_s <= sample["t_s"] <= end_s]


def _growth(window: Sequence[Sample], key: str) -> float:
    return round(float(window[-1][key] - window[0][key]), 1)


def read_only_check(
    samples: Sequence[Sample],
    read_only_from_s: float | None,
    warmed_s: float | None,
    limits: Limits,
) -> Check:
    name = "(a) RSS over the read-only phase"
    if read_only_from_s is None or not samples:
        return Check(name, INCONCLUSIVE, reason="the run had no read-only phase")
    phase = between(samples, read_only_from_s, samples[-1]["t_s"])
    switch = phase[0]["calls"] if phase else 0
    window = [s for s in phase if s["calls"] - switch >= limits.read_only_settle_calls]
    if len(window) < 2:
        window = phase  # too few calls to settle: the figures of the whole phase, inconclusive
    if len(window) < 2:
        return Check(name, INCONCLUSIVE, reason="fewer than 2 samples in the phase")
    calls = window[-1]["calls"] - window[0]["calls"]
    growth = _growth(window, "rss_mb")
    figures = {
        "switch_step_mb": round(window[0]["rss_mb"] - phase[0]["rss_mb"], 1),
        "from_s": window[0]["t_s"],
        "to_s": window[-1]["t_s"],
        "calls": calls,
        "records_added": window[-1]["records"] - window[0]["records"],
        "rss_mb": f"{window[0]['rss_mb']} -> {window[-1]['rss_mb']}",
        "growth_mb": growth,
        "limit_mb": limits.read_only_rss_mb,
    }
    if warmed_s is None or warmed_s > read_only_from_s:
        reason = "the warm-up had not ended when the phase began"
        return Check(name, INCONCLUSIVE, figures, reason)
    if window is phase or calls < limits.min_read_only_calls:
        reason = (
            f"fewer than {limits.read_only_settle_calls} + {limits.min_read_only_calls}"
            " calls in the phase"
        )
        return Check(name, INCONCLUSIVE, figures, reason)
    return Check(name, PASS if growth <= limits.read_only_rss_mb else FAIL, figures)


def mixed_check(
    samples: Sequence[Sample],
    read_only_from_s: float | None,
    warmed_s: float | None,
    limits: Limits,
) -> Check:
    name = "(b) RSS over the mixed traffic after warm-up"
    if warmed_s is None:
        return Check(name, INCONCLUSIVE, reason="the run never warmed up")
    end_s = samples[-1]["t_s"] if read_only_from_s is None else read_only_from_s
    window = between(samples, warmed_s, end_s)
    if len(window) < 2:
        return Check(name, INCONCLUSIVE, reason="no mixed traffic after the warm-up")
    records = window[-1]["records"] - window[0]["records"]
    growth = _growth(window, "rss_mb")
    allowed = round(limits.mixed_rss_mb + records * limits.per_record_kib / 1024, 1)
    figures = {
        "from_s": window[0]["t_s"],
        "to_s": window[-1]["t_s"],
        "calls": window[-1]["calls"] - window[0]["calls"],
        "records_added": records,
        "rss_mb": f"{window[0]['rss_mb']} -> {window[-1]['rss_mb']}",
        "growth_mb": growth,
        "limit_mb": allowed,
    }
    return Check(name, PASS if growth <= allowed else FAIL, figures)


def fd_check(samples: Sequence[Sample], warmed_s: float | None, limits: Limits) -> Check:
    name = "(c) descriptors after warm-up"
    if warmed_s is None:
        return Check(name, INCONCLUSIVE, reason="the run never warmed up")
    window = between(samples, warmed_s, samples[-1]["t_s"])
    span = window[-1]["t_s"] - window[0]["t_s"] if window else 0.0
    first = [s["fds"] for s in window if s["t_s"] <= window[0]["t_s"] + span / 3] if span else []
    last = [s["fds"] for s in window if s["t_s"] >= window[-1]["t_s"] - span / 3] if span else []
    if len(window) < 3 or not first or not last:
        return Check(name, INCONCLUSIVE, reason="fewer than 3 samples after the warm-up")
    figures = {
        "first_third_peak": max(first),
        "last_third_peak": max(last),
        "limit": max(first) + limits.fd_slack,
    }
    return Check(name, PASS if max(last) <= max(first) + limits.fd_slack else FAIL, figures)


def judge(
    samples: Sequence[Sample],
    duration_s: float,
    read_only_from_s: float | None,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """The three checks and the verdict, as the report's ``flatness`` entry."""
    limits = limits or Limits()
    warmed_s = warmup_end(samples, duration_s, limits)
    checks = [
        read_only_check(samples, read_only_from_s, warmed_s, limits),
        mixed_check(samples, read_only_from_s, warmed_s, limits),
        fd_check(samples, warmed_s, limits),
    ]
    statuses = {check.status for check in checks}
    verdict = FAIL if FAIL in statuses else PASS if statuses == {PASS} else INCONCLUSIVE
    return {
        "verdict": verdict,
        "warmup_end_s": warmed_s,
        "limits": asdict(limits),
        "checks": [
            {"name": c.name, "status": c.status, "figures": c.figures, "reason": c.reason}
            for c in checks
        ],
        "lines": [check.line() for check in checks] + [f"VERDICT {verdict}"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.flatness", description=__doc__)
    parser.add_argument("report", type=Path, help="a soak's --json report")
    parser.add_argument("--warmup-calls", type=int, default=Limits.warmup_calls)
    args = parser.parse_args(argv)
    result = json.loads(args.report.read_text(encoding="utf-8"))
    judged = judge(
        result["server"]["samples"],
        result["duration_s"],
        result.get("read_only_from_s"),
        Limits(warmup_calls=args.warmup_calls),
    )
    print("\n".join(judged["lines"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
