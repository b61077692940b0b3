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
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

from engram_memory.cloud.proofs import FixedMacKey, KmsMacKey, MacKey, signed_event

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


# Tagged into each note so that no two look alike to the quality gate's near-duplicate rule
# (a template varying by a few numbers would be held for adjudication, not admitted).
TAGS = tuple(
    [
        "amber",
        "basil",
        "cedar",
        "delta",
        "ember",
        "fjord",
        "garnet",
        "harbor",
        "indigo",
        "juniper",
        "kestrel",
        "lagoon",
        "maple",
        "nectar",
        "onyx",
        "pepper",
        "quartz",
        "raven",
        "saffron",
        "tundra",
        "umber",
        "violet",
        "willow",
        "yarrow",
        "zephyr",
    ]
)


def _signed(key: MacKey, event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as the adapter sends it, signed under ``key`` (outside the handler's timing)."""
    from engram_memory.cloud.tool_invocation import ToolInvocation

    return signed_event(key, ToolInvocation.model_validate(event).to_event())


def _text(n: int) -> str:
    topic = TOPICS[n % len(TOPICS)]
    tag = [f"{TAGS[b % len(TAGS)]}{b % 10}" for b in hashlib.sha256(str(n).encode()).digest()[:8]]
    return (
        f"Note {n} on the {topic} {tag[0]} {tag[1]}: the team agreed on option {n % 13} {tag[2]}"
        f" {tag[3]} after comparing {n % 7 + 2} alternatives {tag[4]} {tag[5]}; follow up with"
        f" owner-{n % 29} {tag[6]} before the next {topic} review {tag[7]}."
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
    """The tool handlers behind ``invoke`` (in this process, or the built functions' workers),
    and what their calls need: record ids to get, captured candidates to admit, a serial number
    for idempotency keys."""

    def __init__(
        self,
        invoke: Callable[[str, dict[str, Any]], dict[str, Any]],
        sign: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        self.invoke = invoke
        self.sign = sign  # the adapter's MAC of each event (cloud/proofs.py): the tools check it
        self.record_ids: list[str] = []
        self.pending: list[tuple[str, int]] = []
        self.serial = iter(range(10**9))

    def call(self, tool: str, event: dict[str, Any]) -> dict[str, Any]:
        answer = self.invoke(tool, self.sign(event))
        if not answer.get("ok") and "confirmation_required" not in answer:
            raise RuntimeError(f"{tool} answered {answer.get('error')}")
        return answer

    def seed(self, records: int) -> None:
        """``records`` captures admitted; the ones the quality gate holds (alike notes) are left
        pending, and ``record_ids`` lists those it accepted."""
        for _ in range(records):
            self.capture_once()
            outcome = self.admit_once()["output"]["value"]["outcome"]
            if "record_id" in outcome:
                self.record_ids.append(str(outcome["record_id"]))

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

    def withdraw_once(self, _i: int) -> dict[str, Any]:
        """A candidate captured for it, then withdrawn (up to the confirmation it asks for)."""
        self.capture_once()
        candidate, n = self.pending.pop()
        return self.call(
            "withdraw",
            _event("withdraw", candidate_id=candidate, idempotency_key=f"warm-withdraw-{n:08d}"),
        )

    def forget_once(self, _i: int) -> dict[str, Any]:
        """A seeded record forgotten (up to the confirmation it asks for); the last tool run,
        as it takes records from the ones ``get`` reads."""
        record_id = self.record_ids.pop()
        n = next(self.serial)
        return self.call(
            "forget", _event("forget", record_id=record_id, idempotency_key=f"warm-forget-{n:08d}")
        )

    def steps(self) -> dict[str, Callable[[int], Any]]:
        return {
            "capture": lambda _i: self.capture_once(),
            "request_admission": lambda _i: self.admit_once(),
            "search": self.search_once,
            "get": self.get_once,
            "withdraw": self.withdraw_once,
            "forget": self.forget_once,
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
        apps = {tool: _load_app(tool) for tool in TOOLS}
        # the adapter's signature with a key held here: what is profiled is the tools' work
        # (the built bench, --built, checks it with KMS as deployed)
        key = FixedMacKey(b"lambda-warm-invocation-key-0123456789abcdef")
        for app in apps.values():
            app.handler.engine = engine
            app.handler.invocation_key = key

        def invoke(tool: str, event: dict[str, Any]) -> dict[str, Any]:
            answer: dict[str, Any] = apps[tool].handler(
                event, FakeLambdaContext(function_name=f"engram-memory-dev-{tool}")
            )
            return answer

        tools = _WarmTools(invoke, partial(_signed, key))
        tools.seed(records)
        steps = tools.steps()
        for tool in TOOLS:  # one warm-up call each: lazily built clients and caches
            steps[tool](0)
        return [_profile_tool(tool, steps[tool], calls) for tool in TOOLS]


# -- the built functions (``--built``) ------------------------------------------------------------

BUILT_TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")
BARE = ROOT / "bench" / "lambda_bare"
BARE_HOST = "SearchFunction"  # the function whose environment and layer the bare handler runs with
CALIBRATION_TRIPS = 10


@dataclass(frozen=True)
class BuiltToolTime:
    """One tool's warm invocations from its build, per call (means)."""

    tool: str
    calls: int
    wall_ms: float  # the handler's wall time, in its worker
    cpu_ms: float  # the worker's CPU during the handler
    requests: dict[str, float]  # AWS (moto) and OpenSearch (fake) requests by kind
    round_trips: float  # all of them
    moto_ms: float  # the stand-in cloud's own time answering them, measured where it runs
    wall_minus_moto_ms: float  # wall - moto_ms
    wall_minus_bare_ms: float  # wall - round_trips x a bare GetItem round trip's wall
    cpu_minus_bare_ms: float  # cpu - round_trips x a bare GetItem round trip's CPU


@dataclass(frozen=True)
class _Invocation:
    label: str
    wall_ms: float
    cpu_ms: float
    requests: tuple[tuple[str, float], ...]


class _BuiltFunctions:
    """The built tool functions' workers on the harness; every invocation's cost logged: the
    worker's wall and CPU during the handler, and the requests the stand-in cloud answered
    meanwhile, with the time it took to answer each."""

    def __init__(self, harness: Any) -> None:
        self.harness = harness
        self.workers = {
            Path(props["CodeUri"]).name: harness.lambdas.workers[harness.stack.refs[name]]
            for name, props in harness.stack.functions().items()
            if Path(props["CodeUri"]).name in BUILT_TOOLS
        }
        self.log: list[_Invocation] = []

    def invoke(self, tool: str, event: dict[str, Any]) -> dict[str, Any]:
        return self.timed(tool, self.workers[tool], event)

    def timed(self, label: str, worker: Any, event: dict[str, Any]) -> dict[str, Any]:
        tally = self.harness.tally
        with tally.lock:
            mark = len(tally.requests)
        answer: dict[str, Any] = worker.invoke(event)
        with tally.lock:
            requests = tuple(tally.requests[mark:])
        if "error" in answer:
            raise RuntimeError(f"{label} failed in its worker: {answer['error']}")
        took = answer["took"]
        self.log.append(_Invocation(label, took["wall_ms"], took["cpu_ms"], requests))
        result: dict[str, Any] = answer["result"]
        return result


def _means(calls: list[_Invocation]) -> tuple[float, float, dict[str, float], float]:
    """Per call: wall ms, CPU ms, requests by kind, the stand-in cloud's ms."""
    n = len(calls)
    kinds: dict[str, float] = defaultdict(float)
    for call in calls:
        for kind, _ in call.requests:
            kinds[kind] += 1 / n
    return (
        sum(c.wall_ms for c in calls) / n,
        sum(c.cpu_ms for c in calls) / n,
        dict(sorted(kinds.items())),
        sum(s for c in calls for _, s in c.requests) * 1000 / n,
    )


def _calibrate(functions: _BuiltFunctions, calls: int) -> tuple[float, float, float]:
    """A bare GetItem round trip to the same moto server, from the built layer's boto3 in a
    worker like the functions': (wall ms, CPU ms, moto's ms), the bare handler's own cost
    (the same invocation without a request) taken out."""
    worker = functions.harness.launch(BARE_HOST, code=BARE)
    try:
        for trips in (0, CALIBRATION_TRIPS):  # warm-up: the client is built on first use
            functions.timed("warm-up", worker, {"round_trips": trips})
        for _ in range(calls):
            functions.timed("bare-0", worker, {"round_trips": 0})
            functions.timed("bare-n", worker, {"round_trips": CALIBRATION_TRIPS})
    finally:
        worker.stop()
    empty = _means([c for c in functions.log if c.label == "bare-0"])
    full = _means([c for c in functions.log if c.label == "bare-n"])
    return (
        (full[0] - empty[0]) / CALIBRATION_TRIPS,
        (full[1] - empty[1]) / CALIBRATION_TRIPS,
        (full[3] - empty[3]) / CALIBRATION_TRIPS,
    )


def _built_row(
    tool: str, calls: list[_Invocation], bare: tuple[float, float, float]
) -> BuiltToolTime:
    wall, cpu, kinds, moto = _means(calls)
    trips = sum(kinds.values())
    return BuiltToolTime(
        tool=tool,
        calls=len(calls),
        wall_ms=round(wall, 2),
        cpu_ms=round(cpu, 2),
        requests={k: round(v, 2) for k, v in kinds.items()},
        round_trips=round(trips, 2),
        moto_ms=round(moto, 2),
        wall_minus_moto_ms=round(wall - moto, 2),
        wall_minus_bare_ms=round(wall - trips * bare[0], 2),
        cpu_minus_bare_ms=round(cpu - trips * bare[1], 2),
    )


def profile_built(
    build: Path, python312: str, runtime: Path, records: int, calls: int
) -> tuple[list[BuiltToolTime], tuple[float, float, float], int]:
    """Warm calls of every tool function from the build (and the calibration), per call, and
    how many of the seeded captures were admitted as records."""
    from scripts.cloud_run.harness import harness_on

    with harness_on(build, python312, runtime) as harness:
        harness.tally.hook_requests(harness.search)
        if not harness.start_workers():
            raise RuntimeError(f"the functions of {build} do not start on {python312}")
        functions = _BuiltFunctions(harness)
        kms = harness.session.client("kms", endpoint_url=harness.moto_url)
        key = KmsMacKey(kms, harness.stack.refs["InvocationKey.Arn"])  # as the adapter signs
        tools = _WarmTools(functions.invoke, partial(_signed, key))
        tools.seed(records)
        admitted = len(tools.record_ids)
        steps = tools.steps()
        for tool in BUILT_TOOLS:  # one warm-up call each: lazily built clients and caches
            steps[tool](0)
        measured: dict[str, list[_Invocation]] = {}
        for tool in BUILT_TOOLS:
            start = len(functions.log)
            for i in range(calls):
                steps[tool](i + 1)
            measured[tool] = [c for c in functions.log[start:] if c.label == tool]
        bare = _calibrate(functions, calls)
    return [_built_row(tool, measured[tool], bare) for tool in BUILT_TOOLS], bare, admitted


def _built_main(args: argparse.Namespace) -> int:
    if not args.python312:
        raise SystemExit("lambda_warm: --built needs python3.12: pass --python312 PATH")
    rows, bare, admitted = profile_built(
        args.built, args.python312, args.runtime_dir, args.records, args.calls
    )
    print(
        f"warm handlers from {args.built} (python3.12 workers) on moto, {admitted} records"
        f" ({args.records} captures seeded),"
        f" {args.calls} calls per tool; a bare GetItem round trip: wall {bare[0]:.2f} ms,"
        f" CPU {bare[1]:.2f} ms, moto {bare[2]:.2f} ms\n"
    )
    print(
        "| tool | wall ms | CPU ms | round trips | moto ms | wall − moto | wall − bare trips"
        " | CPU − bare trips | requests |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        kinds = ", ".join(f"{k} {v:g}" for k, v in r.requests.items())
        print(
            f"| {r.tool} | {r.wall_ms} | {r.cpu_ms} | {r.round_trips:g} | {r.moto_ms} |"
            f" {r.wall_minus_moto_ms} | {r.wall_minus_bare_ms} | {r.cpu_minus_bare_ms} | {kinds} |"
        )
    if args.json:
        payload = {
            "records": admitted,
            "bare_round_trip": dict(zip(("wall_ms", "cpu_ms", "moto_ms"), bare, strict=True)),
            "tools": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=200, help="records seeded first")
    parser.add_argument("--calls", type=int, default=100, help="profiled calls per tool")
    parser.add_argument("--json", type=Path, help="write the figures here")
    from scripts.cloud_run.harness import add_build_arguments

    add_build_arguments(parser)
    args = parser.parse_args(argv)
    if args.built is not None:
        return _built_main(args)
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
