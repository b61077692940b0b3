"""``python scripts/cloud_run --build-dir DIR --python312 PATH --runtime-dir DIR [--logs DIR]``."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..cloud_template import Report
from .flow import flow
from .harness import Harness
from .judge import judge
from .operator_cli import operator
from .smoke import smoke

DESCRIPTION = (
    "Every function of the template, run from the ``sam build`` output, against moto out of "
    "process."
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/cloud_run", description=DESCRIPTION)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--python312", required=True)
    parser.add_argument("--runtime-dir", required=True)
    parser.add_argument("--logs", default=None, help="keep the workers' stderr here")
    return parser.parse_args(argv)


def run(harness: Harness, report: Report) -> None:
    """Set up, smoke, flow, the operator; a broken harness is one FAIL with its cause; always
    torn down."""
    try:
        harness.start()
        if harness.start_workers():
            smoke(harness)
            flow(harness)
            operator(harness)
            judge(harness.recorder.since(0), harness.stack.refs, report)
    except Exception as exc:  # the harness itself broke: one FAIL with the cause
        report.check(False, f"harness: {type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        harness.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="cloud-run-") as scratch:
        work = Path(args.logs).resolve() if args.logs else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        run(Harness(args, work, report), report)
        if report.failed:
            print(f"  (workers' stderr: {work})" if args.logs else "  (rerun with --logs DIR)")
    return 1 if report.failed else 0
