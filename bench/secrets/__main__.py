"""``python -m bench.secrets [--holdout] [--repeats N] [--show] [--json PATH]``.

Runs the built-in admission policy's ``SecretScanner`` over the labelled corpus
``tests/data/secrets/corpus.jsonl`` (and, with ``--holdout``, over ``holdout.jsonl``, the cases
generated with another seed and with kinds and forms the corpus never shows) and prints the
detection rate, the false-positive rate, the misses and false positives per kind and per form, and
the microseconds per scan.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from bench.output import write_json
from engram_memory.policy.secrets import SecretScanner

from .evaluate import evaluate, load_cases, measure_cost, report

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "secrets"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.secrets", description=__doc__)
    parser.add_argument("--holdout", action="store_true", help="also evaluate holdout.jsonl")
    parser.add_argument("--repeats", type=int, default=5, help="timing passes over the corpus")
    parser.add_argument("--show", action="store_true", help="print each missed / flagged case")
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the figures here")
    parser.add_argument("--data", type=Path, default=DATA, help="folder holding the .jsonl files")
    args = parser.parse_args(argv)
    scanner = SecretScanner()

    def flags(text: str) -> bool:
        return scanner.first([text]) is not None

    names = ["corpus", "holdout"] if args.holdout else ["corpus"]
    figures: dict[str, object] = {"scanner": scanner.fingerprint}
    print(f"scanner {scanner.fingerprint}")
    # Timings are wall-clock on a shared machine: the load average says how much to trust them.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.2f}")
    figures["load_average"] = load
    for name in names:
        cases = load_cases(args.data / f"{name}.jsonl")
        outcome = evaluate(flags, cases)
        cost = measure_cost(flags, [case.text for case in cases], args.repeats)
        print(report(name, outcome, cost, args.show))
        figures[name] = {
            "secrets": outcome.secrets,
            "detected": outcome.detected,
            "harmless": outcome.harmless,
            "false_positives": outcome.false_positives,
            "detection_rate": outcome.detection_rate,
            "false_positive_rate": outcome.false_positive_rate,
            "misses_by_kind": outcome.misses_by("kind"),
            "misses_by_form": outcome.misses_by("form"),
            "false_positives_by_kind": outcome.false_positives_by("kind"),
            "missed_ids": [case.id for case in outcome.missed],
            "false_positive_ids": [case.id for case in outcome.flagged_harmless],
            "cost": asdict(cost),
        }
    write_json(args.json_path, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
