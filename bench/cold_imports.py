"""Cold-import time of every Lambda handler module (what a cold start pays before the handler runs).

    python -m bench.cold_imports [--runs N] [--json PATH] [FUNCTION ...]

Each run imports ``functions/<function>/app.py`` in a fresh interpreter under ``python -X importtime``
(as Lambda's init phase does), and reports per function:

- ``wall_ms``: median wall time of the module's import, measured inside the child;
- ``importtime_ms``: median of the sum of the top-level cumulative times ``-X importtime`` printed;
- ``heaviest``: the top-level imports that cost most (cumulative, from the median run);
- ``heavy_at_init``: which of the known heavy packages (boto3, botocore, the AWS Encryption SDK,
  opensearch-py, the MCP SDK, Starlette, cryptography) the import loaded. The tool functions
  import boto3, the ESDK and opensearch-py only on their first invocation (``build_engine``), so
  they should not appear there; the MCP adapter needs the MCP SDK to serve at all.

Times depend on the machine and its load: compare functions within one run, not across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
HEAVY = {
    "boto3": "boto3",
    "botocore": "botocore",
    "aws_encryption_sdk": "aws-encryption-sdk",
    "opensearchpy": "opensearch-py",
    "mcp": "mcp",
    "starlette": "starlette",
    "cryptography": "cryptography",
}

# The child: import the handler module by path, print the wall time and the heavy packages loaded.
_CHILD = """
import importlib.util, json, sys, time
path = sys.argv[1]
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("handler_under_bench", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
elapsed = (time.perf_counter() - started) * 1000
assert callable(module.handler)
print(json.dumps({"wall_ms": elapsed, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


@dataclass(frozen=True)
class ImportLine:
    self_us: int
    cumulative_us: int
    depth: int
    module: str


@dataclass
class FunctionReport:
    function: str
    wall_ms: float
    importtime_ms: float
    heaviest: list[tuple[str, float]]
    heavy_at_init: list[str]


def parse_importtime(stderr: str) -> list[ImportLine]:
    """The ``import time: self [us] | cumulative | imported package`` lines of ``-X importtime``.

    The depth is the indentation of the package name (two spaces per level; 0 = top level).
    """
    lines: list[ImportLine] = []
    for raw in stderr.splitlines():
        if not raw.startswith("import time:") or "self [us]" in raw:
            continue
        try:
            self_part, cumulative_part, name_part = raw[len("import time:") :].split("|", 2)
            self_us, cumulative_us = int(self_part), int(cumulative_part)
        except ValueError:
            continue
        stripped = name_part.lstrip(" ")
        indent = len(name_part) - len(stripped) - 1  # one space always follows the bar
        lines.append(ImportLine(self_us, cumulative_us, max(0, indent) // 2, stripped.strip()))
    return lines


def top_level(lines: Sequence[ImportLine]) -> list[ImportLine]:
    return [line for line in lines if line.depth == 0]


def measure_once(app: Path) -> tuple[float, float, list[ImportLine], list[str]]:
    done = subprocess.run(  # noqa: S603 - our own interpreter on our own file
        [sys.executable, "-X", "importtime", "-c", _CHILD, str(app)],
        capture_output=True,
        text=True,
        check=True,
        cwd=app.parent,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    roots = top_level(parse_importtime(done.stderr))
    total_ms = sum(line.cumulative_us for line in roots) / 1000
    return float(result["wall_ms"]), total_ms, roots, list(result["modules"])


def measure(function: str, runs: int) -> FunctionReport:
    app = FUNCTIONS / function / "app.py"
    samples = [measure_once(app) for _ in range(runs)]
    walls = [sample[0] for sample in samples]
    median_run = sorted(samples, key=lambda sample: sample[0])[len(samples) // 2]
    heaviest = sorted(median_run[2], key=lambda line: line.cumulative_us, reverse=True)[:5]
    loaded = set(median_run[3])
    return FunctionReport(
        function=function,
        wall_ms=round(statistics.median(walls), 1),
        importtime_ms=round(statistics.median(sample[1] for sample in samples), 1),
        heaviest=[(line.module, round(line.cumulative_us / 1000, 1)) for line in heaviest],
        heavy_at_init=sorted(label for module, label in HEAVY.items() if module in loaded),
    )


def functions() -> list[str]:
    return sorted(path.parent.name for path in FUNCTIONS.glob("*/app.py"))


def table(reports: Sequence[FunctionReport]) -> str:
    rows = [
        "| function | wall ms (median) | -X importtime ms | heaviest top-level imports (ms) | heavy packages at init |",
        "|---|---:|---:|---|---|",
    ]
    for report in reports:
        heaviest = ", ".join(f"{name} {ms}" for name, ms in report.heaviest[:3])
        heavy = ", ".join(report.heavy_at_init) or "none"
        rows.append(
            f"| {report.function} | {report.wall_ms} | {report.importtime_ms} | {heaviest} | {heavy} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_imports", description=__doc__)
    parser.add_argument("functions", nargs="*", help="function folders (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per function")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    names = args.functions or functions()
    unknown = sorted(set(names) - set(functions()))
    if unknown:
        parser.error(f"no such function: {', '.join(unknown)}")
    reports = [measure(name, args.runs) for name in names]
    print(f"python {sys.version.split()[0]}, {args.runs} runs per function\n")
    print(table(reports))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "python": sys.version.split()[0],
                    "runs": args.runs,
                    "functions": [asdict(r) for r in reports],
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
