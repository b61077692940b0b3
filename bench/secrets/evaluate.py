"""Detection and false-positive rates of a secret scanner on a labelled corpus, and its cost.

A case is one JSON Lines row ``{"id", "text", "label", "kind", "form"}`` with ``label`` either
``secret`` (the gate must reject the text) or ``harmless`` (it must let it through). A case counts
as *flagged* when the scanner reports at least one finding for its text.

- detection rate = flagged secrets / secrets;
- false-positive rate = flagged harmless cases / harmless cases;
- misses and false positives are also counted per ``kind`` and per ``form``;
- cost: the scanner is timed on every text of the corpus, ``repeats`` times, and the report gives
  the mean and the median microseconds per scan (one call with one text), plus the microseconds
  for one ordinary 4 KiB memory text (the common case at admission) and the milliseconds of the
  slowest 64 KiB text built to make patterns backtrack (the worst case). Times are wall-clock.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

SECRET, HARMLESS = "secret", "harmless"

# Whether a text holds a secret, as the gate sees it (the scanner returned a finding).
Flags = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    text: str
    label: str
    kind: str
    form: str


@dataclass(frozen=True)
class Outcome:
    """How one scanner did on one corpus (no timing: see ``Cost``)."""

    secrets: int
    detected: int
    harmless: int
    false_positives: int
    missed: tuple[Case, ...] = field(repr=False)
    flagged_harmless: tuple[Case, ...] = field(repr=False)

    @property
    def detection_rate(self) -> float:
        return self.detected / self.secrets if self.secrets else 1.0

    @property
    def false_positive_rate(self) -> float:
        return self.false_positives / self.harmless if self.harmless else 0.0

    def misses_by(self, attribute: str) -> dict[str, int]:
        return dict(Counter(getattr(case, attribute) for case in self.missed).most_common())

    def false_positives_by(self, attribute: str) -> dict[str, int]:
        counts = Counter(getattr(case, attribute) for case in self.flagged_harmless)
        return dict(counts.most_common())


@dataclass(frozen=True)
class Cost:
    mean_us: float
    median_us: float
    ordinary_4kib_us: float
    worst_64kib_ms: float  # the slowest of the texts built to make patterns backtrack
    worst_64kib_unit: str


def load_cases(path: Path) -> list[Case]:
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if row["label"] not in (SECRET, HARMLESS):
                raise ValueError(f"{path}: case {row['id']} has label {row['label']!r}")
            cases.append(Case(row["id"], row["text"], row["label"], row["kind"], row["form"]))
    return cases


def evaluate(flags: Flags, cases: Iterable[Case]) -> Outcome:
    missed: list[Case] = []
    flagged_harmless: list[Case] = []
    secrets = harmless = 0
    for case in cases:
        flagged = flags(case.text)
        if case.label == SECRET:
            secrets += 1
            if not flagged:
                missed.append(case)
        else:
            harmless += 1
            if flagged:
                flagged_harmless.append(case)
    return Outcome(
        secrets=secrets,
        detected=secrets - len(missed),
        harmless=harmless,
        false_positives=len(flagged_harmless),
        missed=tuple(missed),
        flagged_harmless=tuple(flagged_harmless),
    )


ORDINARY_PARAGRAPH = (
    "D1:3 Caroline: I went to the park with my kids on Sunday and we talked about the school "
    "play, the new library card and the trip to Lisbon on 2026-08-16. Melanie painted a lake at "
    "sunrise; see https://example.com/gallery?id=42 and request 550e8400-e29b-41d4-a716-"
    "446655440000. "
)


# Repeated to 64 KiB, each of these makes some pattern retry from many places (see
# tests/unit/test_secret_scanner.py): the worst of them bounds what one admission can cost.
BACKTRACKING_UNITS = (
    "/",
    "eyJa.",
    "sk-T3BlbkFJ",
    "//a/:_authToken=/",
    "password: a b ",
    "-",
    "A ",
    "aGVsbG8gd29ybGQh",
)


def measure_cost(flags: Flags, texts: list[str], repeats: int) -> Cost:
    timings: list[float] = []
    for _ in range(repeats):
        for text in texts:
            started = time.perf_counter_ns()
            flags(text)
            timings.append((time.perf_counter_ns() - started) / 1000)
    ordinary = (ORDINARY_PARAGRAPH * (4096 // len(ORDINARY_PARAGRAPH) + 1))[:4096]
    ordinary_timings = []
    for _ in range(max(repeats, 5)):
        started = time.perf_counter_ns()
        flags(ordinary)
        ordinary_timings.append((time.perf_counter_ns() - started) / 1000)
    worst_ms, worst_unit = 0.0, ""
    for unit in BACKTRACKING_UNITS:
        text = (unit * (65536 // len(unit) + 1))[:65536]
        started = time.perf_counter_ns()
        flags(text)
        elapsed = (time.perf_counter_ns() - started) / 1e6
        if elapsed > worst_ms:
            worst_ms, worst_unit = elapsed, unit
    return Cost(
        mean_us=statistics.fmean(timings) if timings else 0.0,
        median_us=statistics.median(timings) if timings else 0.0,
        ordinary_4kib_us=statistics.median(ordinary_timings),
        worst_64kib_ms=worst_ms,
        worst_64kib_unit=worst_unit,
    )


def report(name: str, outcome: Outcome, cost: Cost | None, show_cases: bool) -> str:
    lines = [
        f"{name}: {outcome.secrets + outcome.harmless} cases",
        f"  detection      {outcome.detected}/{outcome.secrets} = {outcome.detection_rate:.2%}",
        f"  false positive {outcome.false_positives}/{outcome.harmless} = "
        f"{outcome.false_positive_rate:.2%}",
    ]
    if cost is not None:
        lines.append(
            f"  cost           mean {cost.mean_us:.0f} us/scan, median {cost.median_us:.0f} us/scan,"
            f" ordinary 4 KiB text {cost.ordinary_4kib_us:.0f} us,"
            f" worst 64 KiB text {cost.worst_64kib_ms:.0f} ms ({cost.worst_64kib_unit!r} repeated)"
        )
    for title, counts in (
        ("misses by kind", outcome.misses_by("kind")),
        ("misses by form", outcome.misses_by("form")),
        ("false positives by kind", outcome.false_positives_by("kind")),
        ("false positives by form", outcome.false_positives_by("form")),
    ):
        if counts:
            lines.append(f"  {title}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if show_cases:
        for case in (*outcome.missed, *outcome.flagged_harmless):
            verdict = "missed" if case.label == SECRET else "false positive"
            lines.append(f"    {verdict} {case.id} {case.kind}/{case.form}: {case.text[:100]!r}")
    return "\n".join(lines)
