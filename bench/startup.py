"""Start-up time of the embedded host: what a person and an MCP host wait for.

    python -m bench.startup [--runs N] [--json PATH]

Measured side by side, each in a fresh process, ``--runs`` times (median, min, max):

- ``python -c pass``: the interpreter alone, the floor every other figure stands on;
- ``engram-memory --help``: the command line's start (the console script, as a user runs it);
- ``stdio initialize``: the official ``mcp`` client launches ``engram-memory serve --stdio`` over
  an initialised data directory and completes the ``initialize`` round trip (spawn to result);
  the client's own imports are paid once, before the first run, and not counted.

Targets on an idle 2-core machine: ``--help`` <= 0.5 s, stdio ``initialize`` <= 1.5 s. Times
depend on the machine and its load: compare figures within one run, never assert them in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.harness import engram_cli, stdio_session

TARGETS_S = {"engram-memory --help": 0.5, "stdio initialize": 1.5}


@dataclass
class Figure:
    name: str
    runs: int
    median_s: float
    min_s: float
    max_s: float
    target_s: float | None


def _timed_process(argv: Sequence[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    return time.perf_counter() - started


def _stdio_initialize(data_dir: Path, token: str) -> float:
    import anyio
    from mcp import StdioServerParameters

    params = StdioServerParameters(
        command=engram_cli(),
        args=["serve", "--stdio", "--data-dir", str(data_dir)],
        env={"ENGRAM_TOKEN": token, "PATH": os.environ.get("PATH", "")},
    )

    async def round_trip() -> float:
        with open(os.devnull, "w", encoding="utf-8") as errlog:
            started = time.perf_counter()
            async with stdio_session(params, errlog) as client:
                elapsed = time.perf_counter() - started
                assert client.server_info is not None and client.server_info.name == "engram-memory"
        return elapsed

    result: float = anyio.run(round_trip)
    return result


def _figure(name: str, sample: Callable[[], float], runs: int) -> Figure:
    sample()  # warm the page cache and the bytecode cache; not counted
    times = [sample() for _ in range(runs)]
    return Figure(
        name=name,
        runs=runs,
        median_s=round(statistics.median(times), 3),
        min_s=round(min(times), 3),
        max_s=round(max(times), 3),
        target_s=TARGETS_S.get(name),
    )


def _token(data_dir: Path) -> str:
    done = subprocess.run(  # noqa: S603 - our own console script
        [
            engram_cli(),
            "token",
            "--data-dir",
            str(data_dir),
            "--principal",
            "bench-startup",
            "--workspace",
            "default",
            "--purpose",
            "general",
            "--tools",
            "search,get",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def measure(runs: int) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="engram-startup-") as tmp:
        data_dir = Path(tmp) / "data"
        subprocess.run(  # noqa: S603 - our own console script
            [engram_cli(), "init", "--data-dir", str(data_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        token = _token(data_dir)
        return [
            _figure("python -c pass", lambda: _timed_process([sys.executable, "-c", "pass"]), runs),
            _figure("engram-memory --help", lambda: _timed_process([engram_cli(), "--help"]), runs),
            _figure("stdio initialize", lambda: _stdio_initialize(data_dir, token), runs),
        ]


def table(figures: Sequence[Figure]) -> str:
    rows = ["| what | median s | min s | max s | target s |", "|---|---:|---:|---:|---:|"]
    for figure in figures:
        target = "—" if figure.target_s is None else f"≤ {figure.target_s}"
        rows.append(
            f"| {figure.name} | {figure.median_s:.3f} | {figure.min_s:.3f} | {figure.max_s:.3f}"
            f" | {target} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per figure")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    figures = measure(args.runs)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.2f}, {args.runs} runs each\n"
    )
    print(table(figures))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"runs": args.runs, "figures": [asdict(f) for f in figures]}, indent=2)
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
