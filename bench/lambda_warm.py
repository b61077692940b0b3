"""The Lambda tool handlers' warm path, profiled once: where a warm invocation's CPU goes.

    python -m bench.lambda_warm [--records N] [--calls N] [--json PATH]

Each ``functions/<tool>/app.py`` is imported by path and its ``handler`` called the way Lambda
calls a warm container: same process, engine already built, a sample event from ``events/`` with
fresh arguments. DynamoDB, S3, KMS and Secrets Manager are a moto **server in another thread**
(the clients build, sign, send and parse real HTTP requests, as in AWS) and the OpenSearch
projection is the tests' in-memory BM25F index (``tests/aws_testing.py``). cProfile and
``time.thread_time`` see only the handlers' thread, so moto's work is not in the figures.

Per tool, after ``--records`` records are seeded and one warm-up call per tool: wall time per
call (moto's answers and the GIL included), the handler thread's CPU per call, and cProfile's own
CPU time (``time.thread_time`` as its timer: waiting on a socket costs nothing) by package, the
standard library's time charged to the package that called it; the in-memory index (``aws_testing``) is reported apart and left out of ``service_ms``. The calls per
invocation are counted in ``tests/integration/test_cloud_round_trips.py``: in AWS each is a
network round trip (single-digit milliseconds in one region) in place of moto's answer.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import hashlib
import importlib.util
import json
import logging
import os
import pstats
import socket
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
EVENTS = ROOT / "events"
TOOLS = ("capture", "request_admission", "search", "get")
# The in-memory index, and moto: it answers in another thread, but the botocore hook it installs
# when imported runs in the caller's thread; both are the stand-in cloud, reported apart.
FAKE_CLOUD = {"aws_testing", "moto"}
TOPICS = ("decision", "deploy", "storage", "review", "budget", "travel", "meeting", "incident")


@dataclass(frozen=True)
class ToolProfile:
    tool: str
    calls: int
    wall_ms: float  # per call, moto's answers included
    cpu_ms: float  # per call, the handler thread's CPU
    service_ms: float  # per call, cProfile own time outside the in-memory index
    fake_cloud_ms: float  # per call, cProfile own time in the in-memory index
    by_package_ms: dict[str, float]  # per call, own time by package (top entries)


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _event(tool: str, **arguments: Any) -> dict[str, Any]:
    from engram_memory.engine.service import new_audit_id

    loaded: dict[str, Any] = json.loads((EVENTS / f"{tool}.json").read_text(encoding="utf-8"))
    loaded["audit_id"] = new_audit_id()
    loaded["arguments"].update(arguments)
    return loaded


def _capture_event(text: str, key: str) -> dict[str, Any]:
    sample = _event("capture")
    payload = copy.deepcopy(sample["arguments"]["payload"])
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = _sha(text)
    evidence = {**sample["arguments"]["evidence"], "evidence_digest": _sha("evidence:" + text)}
    return _event("capture", idempotency_key=key, payload=payload, evidence=evidence)


def _text(n: int) -> str:
    topic = TOPICS[n % len(TOPICS)]
    return (
        f"Note {n} on the {topic}: the team agreed on option {n % 13} after comparing "
        f"{n % 7 + 2} alternatives; follow up with owner-{n % 29} before the next {topic} review."
    )


def _load_app(tool: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"warm_{tool}", FUNCTIONS / tool / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _tenant_on_moto() -> Iterator[dict[str, Any]]:
    """The tenant's resources on a moto server in a thread of this process.

    cProfile and ``time.thread_time`` see only the thread that runs the handlers, so what moto
    does to answer is left out of the service's figures, while the clients' side of every call
    (building, signing, sending and parsing an HTTP request) is in them, as in AWS.
    """
    import boto3
    from aws_testing import REGION, MemoryLexicalIndex, tenant_resources
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    fake_credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    try:
        with mock.patch.dict(os.environ, fake_credentials):
            session = boto3.session.Session(region_name=REGION)
            clients, env = tenant_resources(session, endpoint_url=f"http://127.0.0.1:{port}")
            os.environ.update(env)  # restored when mock.patch.dict exits
            yield {"env": env, "clients": clients, "index": MemoryLexicalIndex()}
    finally:
        server.stop()
        # The process's Powertools logger was made at WARNING for the bench: give it back the
        # level the environment asks for (a later user of this process logs at its own level).
        from engram_memory.cloud.observability import get_logger

        get_logger().setLevel(os.environ.get("POWERTOOLS_LOG_LEVEL", "INFO"))


def _package_of(filename: str) -> str:
    path = filename.replace("\\", "/")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/engram_memory/" in path:
        rest = path.split("/engram_memory/", 1)[1]
        return "engram_memory." + rest.split("/", 1)[0].removesuffix(".py")
    if path.endswith("aws_testing.py"):
        return "aws_testing"
    if "/functions/" in path:
        return "functions"
    if path.startswith("~") or "/lib/python3" in path:
        return "stdlib"
    return "other"


def _group(stats: pstats.Stats, calls: int) -> dict[str, float]:
    """Own time by package; the standard library's and builtins' own time goes to their callers.

    ``copy.deepcopy`` called by moto is moto's cost, ``json.dumps`` called by botocore is
    botocore's: a standard-library function's own time is split over its callers in proportion to
    the time each caller's calls took (cProfile's per-caller figures), up the stack until a
    caller outside the standard library owns it.
    """
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    shares: dict[Any, dict[str, float]] = {}

    def owners(func: Any, seen: frozenset[Any]) -> dict[str, float]:
        """Who owns ``func``'s time, as shares; empty when every path back is a cycle."""
        package = _package_of(func[0])
        if package != "stdlib":
            return {package: 1.0}
        if func in shares:
            return shares[func]
        weighted: list[tuple[dict[str, float], float]] = []
        for caller, row in (table[func][4] if func in table else {}).items():
            if caller in seen or caller == func:  # recursion: the outer call's owner owns it
                continue
            found = owners(caller, seen | {func})
            if found:
                weighted.append((found, row[2]))
        total = sum(seconds for _, seconds in weighted)
        if total <= 0:
            return {} if seen else {"stdlib": 1.0}
        split: dict[str, float] = defaultdict(float)
        for found, seconds in weighted:
            for owner, share in found.items():
                split[owner] += share * seconds / total
        if not seen:  # a share computed under a cycle guard depends on the path: not cached
            shares[func] = dict(split)
        return dict(split)

    own: dict[str, float] = defaultdict(float)
    for func, row in table.items():
        for owner, share in (owners(func, frozenset()) or {"stdlib": 1.0}).items():
            own[owner] += row[2] * share
    return {package: seconds * 1000 / calls for package, seconds in own.items()}


class _WarmTools:
    """The built handlers over one engine, and what their calls need: record ids to get,
    captured candidates to admit, a serial number for idempotency keys."""

    def __init__(self, engine: Any, context_class: Any) -> None:
        self.apps = {tool: _load_app(tool) for tool in TOOLS}
        for app in self.apps.values():
            app.handler.engine = engine
        self.context_class = context_class
        self.record_ids: list[str] = []
        self.pending: list[tuple[str, int]] = []
        self.serial = iter(range(10**9))

    def call(self, tool: str, event: dict[str, Any]) -> dict[str, Any]:
        context = self.context_class(function_name=f"engram-memory-dev-{tool}")
        answer: dict[str, Any] = self.apps[tool].handler(event, context)
        if not answer.get("ok"):
            raise RuntimeError(f"{tool} answered {answer.get('error')}")
        return answer

    def remember(self) -> str:
        self.capture_once()
        admitted = self.admit_once()
        return str(admitted["output"]["value"]["outcome"]["record_id"])

    def capture_once(self) -> dict[str, Any]:
        n = next(self.serial)
        answer = self.call("capture", _capture_event(_text(n), f"warm-capture-{n:08d}"))
        self.pending.append((answer["output"]["value"]["candidate_id"], n))
        return answer

    def admit_once(self) -> dict[str, Any]:
        candidate, n = self.pending.pop(0)
        return self.call(
            "request_admission",
            _event(
                "request_admission",
                candidate_id=candidate,
                idempotency_key=f"warm-admit-{n:08d}",
            ),
        )

    def search_once(self, i: int) -> dict[str, Any]:
        query = f"what did the team agree on the {TOPICS[i % len(TOPICS)]} option {i % 13}"
        return self.call("search", _event("search", query=query, limit=10))

    def get_once(self, i: int) -> dict[str, Any]:
        return self.call("get", _event("get", record_id=self.record_ids[i % len(self.record_ids)]))

    def steps(self) -> dict[str, Callable[[int], Any]]:
        return {
            "capture": lambda _i: self.capture_once(),
            "request_admission": lambda _i: self.admit_once(),
            "search": self.search_once,
            "get": self.get_once,
        }


def _profile_tool(tool: str, step: Callable[[int], Any], calls: int) -> ToolProfile:
    """``calls`` warm calls of ``tool`` under cProfile on this thread's CPU time."""
    profiler = cProfile.Profile(time.thread_time)  # CPU: waiting on moto is not cost
    wall, cpu = time.perf_counter(), time.thread_time()
    profiler.enable()
    for i in range(calls):
        step(i + 1)
    profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    grouped = _group(pstats.Stats(profiler), calls)
    fake = sum(ms for package, ms in grouped.items() if package in FAKE_CLOUD)
    service = {k: v for k, v in grouped.items() if k not in FAKE_CLOUD}
    top = dict(sorted(service.items(), key=lambda item: -item[1])[:12])
    return ToolProfile(
        tool=tool,
        calls=calls,
        wall_ms=round(wall * 1000 / calls, 2),
        cpu_ms=round(cpu * 1000 / calls, 2),
        service_ms=round(sum(grouped.values()) - fake, 2),
        fake_cloud_ms=round(fake, 2),
        by_package_ms={k: round(v, 2) for k, v in top.items()},  # the service's own
    )


def profile(records: int, calls: int) -> list[ToolProfile]:
    if str(ROOT / "tests") not in sys.path:  # the tests' moto helpers and in-memory index
        sys.path.insert(0, str(ROOT / "tests"))
    from aws_testing import FakeLambdaContext

    from engram_memory.cloud.composition import build_engine

    with _tenant_on_moto() as tenant:
        clients = tenant["clients"]
        engine = build_engine(
            tenant["env"],
            dynamodb_client=clients["dynamodb"],
            s3_client=clients["s3"],
            kms_client=clients["kms"],
            secrets_client=clients["secretsmanager"],
            lexical_index=tenant["index"],
        )
        tools = _WarmTools(engine, FakeLambdaContext)
        for _ in range(records):
            tools.record_ids.append(tools.remember())
        steps = tools.steps()
        for tool in TOOLS:  # one warm-up call each: lazily built clients and caches
            steps[tool](0)
        return [_profile_tool(tool, steps[tool], calls) for tool in TOOLS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=200, help="records seeded first")
    parser.add_argument("--calls", type=int, default=100, help="profiled calls per tool")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the EMF metric lines
        results = profile(args.records, args.calls)
    print(f"warm handlers on in-process moto, {args.records} records, {args.calls} calls per tool")
    print(
        f"{'tool':<18} {'wall ms':>8} {'cpu ms':>8} {'service':>8} {'fake cloud':>10}  own time by package (ms/call)"
    )
    for row in results:
        packages = ", ".join(
            f"{name} {ms}" for name, ms in row.by_package_ms.items() if name not in FAKE_CLOUD
        )
        print(
            f"{row.tool:<18} {row.wall_ms:>8} {row.cpu_ms:>8} {row.service_ms:>8} "
            f"{row.fake_cloud_ms:>10}  {packages}"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
