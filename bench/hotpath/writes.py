"""``python -m bench.hotpath.writes``: CPU and syncs per capture + admission pair, before vs after.

The write half of the hot path, in process: ``capture`` then ``request_admission`` through
``Engine.handle`` of the embedded host (``open_server``, as the MCP tools call it: the real store,
key vault and audit log on disk), LoCoMo memories as in ``bench.hotpath``. Two trees run side by
side in one run, interleaved: this checkout ("after") and another checkout of the product
("before", by default ``main``; ``--after REF`` replaces this checkout by another ref), each
extracted with ``git archive``, each in its own child process with the tree's ``layers/core``
first on ``PYTHONPATH`` (the benchmark's own code is this checkout's).

Per repetition and tree:

- **CPU per pair**: ``time.process_time()`` (every thread of the child) over the timed pairs,
  after warm-up pairs that pay for imports and first-use costs;
- **syncs per pair**: a second child under ``strace -f -y -e trace=fsync,fdatasync``; the timed
  pairs are bracketed by two marker syscalls (a ``readlink`` of a path that does not exist), and
  the syncs in between are counted by the file they flushed (key file, store, audit log, other).
  Wrapping ``os.fsync`` would miss SQLite's own syncs, hence strace.

``--through stdio`` (or ``http``): the same pairs through the real MCP server instead
(``engram-memory serve --stdio`` of each tree, or ``serve --port`` and Streamable HTTP, the
official ``mcp`` client, as ``bench.hotpath`` calls it); the CPU is
then the server process's (user and system, from ``/proc``), and the client's own CPU is printed
beside it. ``--store DIR``: start each child from a copy of this data directory (e.g. a seeded
store of ``bench.hotpath``) instead of an empty one.

Wall-clock pairs/s is printed too (the plain child, data directory on disk), but on a shared
machine only the CPU and the sync counts are comparable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.in_process import DEFAULT_LOCOMO

REPO = Path(__file__).resolve().parents[2]
WORKSPACE = "ws-hotpath-writes"
_MARK_START = "/nonexistent/engram-bench-writes-start"
_MARK_STOP = "/nonexistent/engram-bench-writes-stop"
_SYNC_LINE = re.compile(r"\b(fsync|fdatasync)\((\d+)(?:<([^>]*)>)?")


# ------------------------------------------------------------------------------------------------
# The child: one tree, one fresh data directory
# ------------------------------------------------------------------------------------------------


def _mark(path: str) -> None:
    with contextlib.suppress(OSError):
        os.readlink(path)


def child(
    data_dir: Path, locomo: Path, warmup: range, pairs: int, run: str, through: str = "engine"
) -> dict[str, Any]:
    """Capture and admit the memories of ``warmup`` then ``pairs`` more; the timed pairs' CPU
    and wall time."""
    if through in ("stdio", "http"):
        return asyncio.run(_served_child(data_dir, locomo, warmup, pairs, run, through))
    import engram_memory
    from bench.hotpath.corpus import Corpus
    from bench.locomo.calls import value
    from bench.locomo.clients import EngineClient
    from engram_memory.embedded.serve import open_server

    corpus = Corpus.load(locomo)
    server = open_server(data_dir)
    client = EngineClient(server.host.engine, tenant=server.surface.runtime.host.tenant_id)

    def pair(index: int) -> None:
        memory = corpus.memory(index)
        captured = value(
            client.call(WORKSPACE, "capture", memory.capture_arguments(run)), "capture"
        )
        admitted = value(
            client.call(
                WORKSPACE,
                "request_admission",
                memory.admission_arguments(captured["candidate_id"], run),
            ),
            "request_admission",
        )
        if admitted["outcome"]["status"] != "accepted":
            raise RuntimeError(f"memory {index} was {admitted['outcome']['status']}")

    try:
        for index in warmup:
            pair(index)
        _mark(_MARK_START)
        cpu = time.process_time()
        wall = time.perf_counter()
        for index in range(warmup.stop, warmup.stop + pairs):
            pair(index)
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
        _mark(_MARK_STOP)
    finally:
        server.close()
    return {
        "package": str(Path(engram_memory.__file__).parent),
        "cpu_ms_per_pair": 1000 * cpu / pairs,
        "pairs_per_s": pairs / wall,
    }


def _served(data_dir: Path, through: str) -> contextlib.AbstractAsyncContextManager[Any]:
    """This tree's server on ``data_dir`` (``engram-memory serve``, over ``through``: stdio or
    Streamable HTTP on a free loopback port), connected with the official client."""
    from mcp import StdioServerParameters

    from bench import harness
    from bench.hotpath.sessions import engram_over_http, mint_token

    if through == "http":
        port = harness.free_port()
        token = mint_token(data_dir, port)
        return engram_over_http(harness.engram_cli(), data_dir, port, token, data_dir.parent)
    params = StdioServerParameters(
        command=harness.engram_cli(),
        args=["serve", "--stdio", "--data-dir", str(data_dir)],
        # The SDK starts the server with a few variables only: this tree's package is named.
        env={"ENGRAM_TOKEN": mint_token(data_dir), "PYTHONPATH": os.environ["PYTHONPATH"]},
    )
    return harness.stdio_session(params, data_dir.parent / "server.log")


async def _served_child(
    data_dir: Path, locomo: Path, warmup: range, pairs: int, run: str, through: str
) -> dict[str, Any]:
    """``child`` through this tree's server (``_served``) and the official client."""
    import engram_memory
    from bench.hotpath.corpus import Corpus
    from bench.hotpath.sessions import ProcessCpu, _ok_value
    from engram_memory.embedded.serve import open_server
    from engram_memory.mcp_surface.catalog import TOOL_NAMES

    corpus = Corpus.load(locomo)
    open_server(data_dir).close()  # a new store made (or an old one opened) as the server would
    async with _served(data_dir, through) as client:

        async def pair(index: int) -> None:
            memory = corpus.memory(index)
            captured = _ok_value(
                await client.call_tool(TOOL_NAMES["capture"], memory.capture_arguments(run)),
                "capture",
            )
            arguments = memory.admission_arguments(captured["candidate_id"], run)
            admitted = _ok_value(
                await client.call_tool(TOOL_NAMES["request_admission"], arguments), "admission"
            )
            if admitted["outcome"]["status"] != "accepted":
                raise RuntimeError(f"memory {index} was {admitted['outcome']['status']}")

        for index in warmup:
            await pair(index)
        server = ProcessCpu.of_child()
        if server is None:
            raise RuntimeError("the server's CPU cannot be read (no /proc, or no one child)")
        _mark(_MARK_START)
        user, system = server.user_system_ms()
        cpu, wall = time.process_time(), time.perf_counter()
        for index in range(warmup.stop, warmup.stop + pairs):
            await pair(index)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        user_after, system_after = server.user_system_ms()
        _mark(_MARK_STOP)
    return {
        "package": str(Path(engram_memory.__file__).parent),
        "cpu_ms_per_pair": (user_after - user + system_after - system) / pairs,
        "server_user_ms_per_pair": (user_after - user) / pairs,
        "server_system_ms_per_pair": (system_after - system) / pairs,
        "client_cpu_ms_per_pair": 1000 * cpu / pairs,
        "pairs_per_s": pairs / wall,
    }


# ------------------------------------------------------------------------------------------------
# The parent: trees, repetitions, strace
# ------------------------------------------------------------------------------------------------


def _classify(path: str | None) -> str:
    if path is None:
        return "other"
    name = Path(path).name
    if "candidate-keys" in name or "/keys/" in path:
        return "key file"
    if name.startswith("engram.db"):
        return "store"
    if "audit" in path:
        return "audit"
    return "other (" + name + ")"


def count_syncs(trace: str) -> Counter[str]:
    """Syncs between the two markers of an ``strace -f -y`` output, by the file they flushed."""
    counts: Counter[str] = Counter()
    inside = False
    for line in trace.splitlines():
        if _MARK_START in line:
            inside = True
        elif _MARK_STOP in line:
            inside = False
        elif inside and "resumed>" not in line:
            match = _SYNC_LINE.search(line)
            if match:
                counts[_classify(match.group(3))] += 1
    return counts


def _run_child(tree: Path, args: argparse.Namespace, strace: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "layers" / "core"), str(REPO)])
    with tempfile.TemporaryDirectory(prefix="writes-", dir=args.scratch) as tmp:
        command = [
            sys.executable,
            "-m",
            "bench.hotpath.writes",
            "--child",
            str(Path(tmp) / "data"),
            "--locomo",
            str(args.locomo),
            "--warmup",
            str(args.warmup),
            "--pairs",
            str(args.pairs),
            "--through",
            args.through,
            "--first",
            str(args.first),
        ]
        if args.store is not None:
            shutil.copytree(args.store, Path(tmp) / "data")
        trace_file = Path(tmp) / "strace.txt"
        if strace is not None:
            command = [
                str(strace),
                "-f",
                "-y",
                "-qq",
                "-o",
                str(trace_file),
                "-e",
                "trace=fsync,fdatasync,readlink,readlinkat",
                *command,
            ]
        done = subprocess.run(  # noqa: S603 - our interpreter (under strace) on our own module
            command, env=env, cwd=REPO, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"the child failed:\n{done.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        if strace is not None:
            counts = count_syncs(trace_file.read_text(encoding="utf-8", errors="replace"))
            result["syncs_per_pair"] = {k: v / args.pairs for k, v in sorted(counts.items())}
            result["syncs_total_per_pair"] = sum(counts.values()) / args.pairs
    return result


def _extract(ref: str, into: Path) -> Path:
    git = shutil.which("git") or "git"
    archive = subprocess.run(  # noqa: S603 - git archive of a ref given by the operator
        [git, "-C", str(REPO), "archive", "--format=tar", ref, "layers/core"],
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    return into


def _summary(runs: list[dict[str, Any]], key: str) -> str:
    values = [run[key] for run in runs if key in run]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath.writes", description=__doc__)
    parser.add_argument("--before", default="main", help="git ref of the 'before' tree (main)")
    parser.add_argument(
        "--after", help="git ref of the 'after' tree (default: this checkout, as it is)"
    )
    parser.add_argument("--pairs", type=int, default=40, help="timed pairs per child (40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed pairs first (5)")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved repetitions (3)")
    parser.add_argument("--no-strace", action="store_true", help="CPU only")
    parser.add_argument(
        "--through",
        choices=("engine", "stdio", "http"),
        default="engine",
        help="Engine.handle in process (default), or the MCP server over stdio or Streamable HTTP"
        " and the official client",
    )
    parser.add_argument(
        "--store", type=Path, help="start from a copy of this data directory (default: empty)"
    )
    parser.add_argument(
        "--first",
        type=int,
        default=0,
        help="the corpus index of the first memory (0; a seeded store of N records: N, as"
        " bench.hotpath's writes take the memories after the seeded ones)",
    )
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO, help="LoCoMo folder")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=REPO / "bench" / "results",
        help="where the data directories live (on disk: tmpfs makes fsync free)",
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the report here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return parser


def _print_table(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    print(f"capture + admission pairs, {args.pairs} per child (median [range]):")
    after = "this tree" if args.after is None else args.after
    print(f"{'':24} {'before (' + args.before + ')':>26} {'after (' + after + ')':>26}")
    server = "server " if args.through != "engine" else ""
    for label, key in (
        (f"{server}CPU ms per pair", "cpu_ms_per_pair"),
        ("  of it user", "server_user_ms_per_pair"),
        ("  of it system", "server_system_ms_per_pair"),
        ("client CPU ms per pair", "client_cpu_ms_per_pair"),
        ("syncs per pair", "syncs_total_per_pair"),
        ("pairs/s (wall, shared)", "pairs_per_s"),
    ):
        if any(key in run for run in runs["after"] + runs["before"]):
            print(
                f"{label:24} {_summary(runs['before'], key):>26} {_summary(runs['after'], key):>26}"
            )
    for name, name_runs in runs.items():
        if name_runs and "syncs_per_pair" in name_runs[0]:
            print(f"syncs per pair by file, {name}: {name_runs[0]['syncs_per_pair']}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child is not None:
        result = child(
            args.child,
            args.locomo,
            range(args.first, args.first + args.warmup),
            args.pairs,
            run="writes",
            through=args.through,
        )
        print(json.dumps(result))
        return 0

    strace = None if args.no_strace else shutil.which("strace")
    if strace is None and not args.no_strace:
        print("strace not found: syncs are not counted (apt-get install strace)", file=sys.stderr)
    args.scratch.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "before": args.before,
        "after": args.after or "this checkout",
        "pairs": args.pairs,
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="writes-trees-", dir=args.scratch) as tmp:
        trees = {
            "before": _extract(args.before, Path(tmp) / "before"),
            "after": REPO if args.after is None else _extract(args.after, Path(tmp) / "after"),
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for repetition in range(args.repetitions):
            order = list(trees) if repetition % 2 == 0 else list(reversed(trees))
            for name in order:
                result = _run_child(trees[name], args, None)
                if strace is not None:
                    traced = _run_child(trees[name], args, Path(strace))
                    result["syncs_per_pair"] = traced["syncs_per_pair"]
                    result["syncs_total_per_pair"] = traced["syncs_total_per_pair"]
                runs[name].append(result)
                print(
                    f"rep {repetition + 1} {name}: {result['cpu_ms_per_pair']:.2f} ms CPU/pair,"
                    f" {result['pairs_per_s']:.1f} pairs/s,"
                    f" syncs/pair {result.get('syncs_per_pair', '-')}",
                    file=sys.stderr,
                    flush=True,
                )
    report["runs"] = runs
    report["load_average"] = os.getloadavg()
    _print_table(args, runs)
    print("load average: " + " ".join(f"{x:.2f}" for x in report["load_average"]))
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
