"""Cold-import time of every Lambda handler module (what a cold start pays before the handler runs).

    python -m bench.cold_imports [--runs N] [--json PATH] [FUNCTION ...]
    python -m bench.cold_imports --built .aws-sam/build [--python312 PATH] [--runs N] [--json PATH]

Each run imports ``functions/<function>/app.py`` in a fresh interpreter under ``python -X importtime``
(as Lambda's init phase does), and reports per function:

- ``wall_ms``: median wall time of the module's import, measured inside the child;
- ``importtime_ms``: median of the sum of the top-level cumulative times ``-X importtime`` printed;
- ``heaviest``: the top-level imports that cost most (cumulative, from the median run);
- ``heavy_at_init``: which of the known heavy packages (boto3, botocore, the AWS Encryption SDK,
  opensearch-py, the MCP SDK, Starlette, cryptography, pydantic, the engine) the import loaded.
  The tool functions import all of them only on their first invocation (the engine and the
  contract's pydantic models with it, then boto3, the ESDK and opensearch-py in
  ``build_engine``), so none should appear there; the MCP adapter needs the MCP SDK to serve at
  all.

``--built DIR`` measures Lambda's **init** on the artifacts instead: each function of the template
from its ``sam build`` folder with the built CoreLayer, on python3.12 (``python3.12 -I -S
scripts/lambda_worker.py``, the function's environment from the template, resolved against the
harness of ``scripts/cloud_run``), in a fresh interpreter per run; init = the handler module's
import and whatever it runs, wall and CPU (``process_time``) measured by the worker. Beside each,
the **anchor**: ``bench/lambda_bare/app.py``, a bare handler creating Powertools' Logger, Tracer
and Metrics as the stack's handlers do, from the same built layer; every round runs the anchor
and every function once (interleaved), and the figures are medians, with each function's ratio to
the anchor's median. Beside the MCP adapter, the **bare MCP SDK** (``anchor + MCP SDK``:
``bench/lambda_bare/mcp_sdk.py``, the anchor plus the SDK's server modules, on the adapter's
build folder): what of the adapter's init is the SDK, and what is ours. For the six tool
functions, the four whose module is deferred (``deferred_handler``: workflow, drainer, approval,
Cognito claims) and the adapter, the same fresh worker then answers an ``events/`` sample
(``FIRST_EVENTS``), and that first invocation's CPU is reported too: what init does not import,
the first call does.

Times depend on the machine and its load: compare functions within one run, not across machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.output import markdown_table

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
BARE = ROOT / "bench" / "lambda_bare"
ANCHOR = "anchor"
SDK_ANCHOR = "anchor + MCP SDK"
# The function whose build folder holds the MCP SDK (the bare SDK runs on it, see mcp_sdk.py).
SDK_HOST = "McpAdapterFunction"
# The function whose environment and layer the anchor runs with (any function of the CoreLayer).
ANCHOR_HOST = "SearchFunction"
HEAVY = {
    "boto3": "boto3",
    "botocore": "botocore",
    "aws_encryption_sdk": "aws-encryption-sdk",
    "opensearchpy": "opensearch-py",
    "mcp": "mcp",
    "starlette": "starlette",
    "cryptography": "cryptography",
    "pydantic": "pydantic",
    "engram_memory.engine": "the engine",
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
print(json.dumps({"wall_ms": elapsed, "modules": sorted(sys.modules)}))
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
        heavy_at_init=sorted(
            label
            for module, label in HEAVY.items()
            if any(name == module or name.startswith(module + ".") for name in loaded)
        ),
    )


@dataclass(frozen=True)
class InitReport:
    """One function's Lambda init on the build: medians of fresh interpreters, the ratio of each
    to the anchor's (the anchor's own row has 1.0), and for a tool function its first
    invocation's CPU (its ``events/`` sample: what init no longer imports is imported there)."""

    function: str
    wall_ms: float
    cpu_ms: float
    cpu_x_anchor: float
    wall_x_anchor: float
    first_call_cpu_ms: float | None


TOOL_FOLDERS = ("capture", "forget", "get", "request_admission", "search", "withdraw")
# The events/ sample a fresh worker answers after its init (what init does not import, the first
# call does): each tool function's own, and those of the functions whose module is deferred.
FIRST_EVENTS = {
    **{folder: f"{folder}.json" for folder in TOOL_FOLDERS},
    "workflow": "workflow_await_approval.json",
    "outbox_drainer": "outbox_drainer.json",
    "cognito_claims": "cognito_claims.json",
    "approval": "approval_get.json",
    "mcp_adapter": "mcp_adapter_initialize.json",
}


def _init_once(harness: Any, name: str, code: Path | None = None) -> tuple[float, ...]:
    """(wall ms, CPU ms[, first call CPU ms]) of one cold start of ``name`` (on ``code`` in its
    place: the anchor, whose first call is a bare invocation)."""
    from scripts.cloud_run.settings import sample

    folder = Path(harness.stack.functions()[name]["CodeUri"]).name
    worker = harness.launch(name, code=code)
    try:
        answer = worker.request({"init": True})
        first = None
        if code is not None or folder in FIRST_EVENTS:
            first = worker.invoke({} if code is not None else sample(FIRST_EVENTS[folder]))
    finally:
        worker.stop()
    if "error" in answer:
        raise RuntimeError(f"{name} did not import from the build: {answer['error']}")
    if first is not None and "error" in first:
        raise RuntimeError(f"{name}'s first call failed on the build: {first['error']}")
    took = (float(answer["result"]["wall_ms"]), float(answer["result"]["cpu_ms"]))
    return took if first is None else (*took, float(first["took"]["cpu_ms"]))


def _median(samples: list[tuple[float, ...]], column: int) -> float | None:
    values = [sample[column] for sample in samples if len(sample) > column]
    return statistics.median(values) if values else None


def bare_sdk_code(build: Path, work: Path) -> Path:
    """A code folder for the bare MCP SDK: the adapter's build folder (linked) with
    ``bench/lambda_bare/mcp_sdk.py`` as its ``app.py`` and the anchor beside it."""
    folder = work / "bare-mcp-sdk"
    folder.mkdir()
    for entry in (build / SDK_HOST).iterdir():
        if entry.name != "app.py":
            (folder / entry.name).symlink_to(entry.resolve())
    (folder / "app.py").symlink_to(BARE / "mcp_sdk.py")
    (folder / "anchor.py").symlink_to(BARE / "app.py")
    return folder


def measure_built(
    build: Path, python312: str, runtime: Path, runs: int, names: Sequence[str] = ()
) -> list[InitReport]:
    """Lambda init of every function of the build (or ``names``) beside the anchor's."""
    from scripts.cloud_run.harness import harness_on

    with harness_on(build, python312, runtime) as harness, tempfile.TemporaryDirectory() as work:
        chosen = list(names) or sorted(harness.stack.functions())
        sdk = bare_sdk_code(build, Path(work)) if SDK_HOST in chosen else None
        samples: dict[str, list[tuple[float, ...]]] = {ANCHOR: []}
        for _ in range(runs):  # interleaved, so a load change hits every function alike
            samples[ANCHOR].append(_init_once(harness, ANCHOR_HOST, BARE))
            if sdk is not None:
                samples.setdefault(SDK_ANCHOR, []).append(_init_once(harness, SDK_HOST, sdk))
            for name in chosen:
                samples.setdefault(name, []).append(_init_once(harness, name))
    anchor_wall, anchor_cpu = _median(samples[ANCHOR], 0) or 1.0, _median(samples[ANCHOR], 1) or 1.0
    reports: list[InitReport] = []
    for name, runs_ in samples.items():
        wall, cpu, first = _median(runs_, 0) or 0.0, _median(runs_, 1) or 0.0, _median(runs_, 2)
        reports.append(
            InitReport(
                function=name,
                wall_ms=round(wall, 1),
                cpu_ms=round(cpu, 1),
                cpu_x_anchor=round(cpu / anchor_cpu, 2),
                wall_x_anchor=round(wall / anchor_wall, 2),
                first_call_cpu_ms=None if first is None else round(first, 1),
            )
        )
    return reports


def built_table(reports: Sequence[InitReport]) -> str:
    columns = [("function", "l"), ("init CPU ms", "r"), ("× anchor (CPU)", "r")]
    columns += [("init wall ms", "r"), ("× anchor (wall)", "r"), ("first call CPU ms", "r")]
    return markdown_table(
        columns,
        (
            (
                r.function,
                r.cpu_ms,
                r.cpu_x_anchor,
                r.wall_ms,
                r.wall_x_anchor,
                "—" if r.first_call_cpu_ms is None else r.first_call_cpu_ms,
            )
            for r in reports
        ),
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


def _built_main(args: argparse.Namespace) -> int:
    if not args.python312:
        raise SystemExit("cold_imports: --built needs python3.12: pass --python312 PATH")
    reports = measure_built(args.built, args.python312, args.runtime_dir, args.runs, args.functions)
    print(f"Lambda init on {args.built}, python3.12 -I -S, median of {args.runs} per function\n")
    print(built_table(reports))
    if args.json is not None:
        payload = {
            "built": str(args.built),
            "runs": args.runs,
            "init": [asdict(r) for r in reports],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from scripts.cloud_run.harness import add_build_arguments

    parser = argparse.ArgumentParser(prog="python -m bench.cold_imports", description=__doc__)
    parser.add_argument("functions", nargs="*", help="function folders (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per function")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    add_build_arguments(parser)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.built is not None:
        return _built_main(args)
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
