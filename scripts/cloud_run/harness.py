"""The harness's state: moto, the Lambda service and its workers, the HTTPS server (issuer,
CloudFormation answers, fake OpenSearch), the HTTP API's stand-in, the stack; started and
stopped in one place."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..cloud_template import Report, load_template
from .api_gateway import Route, serve_api
from .endpoints import CloudFormationAnswers, https_server
from .identity import Issuer, self_signed
from .lambdas import FunctionLog, LambdaService, Worker, function_env
from .moto_server import route_lambda_tasks, start_moto
from .opensearch import FakeOpenSearch
from .recorder import CallRecorder
from .settings import (
    ACCOUNT,
    API_ID,
    APPROVAL_AUDIENCE,
    AUDIENCE,
    KEY_ADMIN_ROLE_ARN,
    OPERATOR_ROLE_ARN,
    REGION,
    ROOT,
    TENANT,
    WORKER,
    access_key,
)
from .stack import MotoSession, Stack, Unresolvable
from .tally import Tally


def template_parameters(https_url: str) -> dict[str, str]:
    """The stack's parameters: the harness's issuer, a domain created with the stack."""
    return {
        "TenantId": TENANT,
        "IssuerUrl": https_url,
        "Audience": AUDIENCE,
        "ApprovalAudience": APPROVAL_AUDIENCE,
        "OpenSearchMode": "create",
        "KeyAdminRoleArn": KEY_ADMIN_ROLE_ARN,
        "DeployRoleArn": f"arn:aws:iam::{ACCOUNT}:role/engram-deployer",
        "OperatorRoleArn": OPERATOR_ROLE_ARN,
    }


class Harness:
    moto_url: str
    lambdas: LambdaService
    cert: Path
    tls_key: Path
    search: FakeOpenSearch
    issuer: Issuer
    cloudformation: CloudFormationAnswers
    https_url: str
    api_url: str  # the HTTP API's stand-in (its routes: the template's HttpApi events)
    session: Any
    sfn: Any
    stack: Stack

    def __init__(self, args: argparse.Namespace, work: Path, report: Report) -> None:
        self.args = args
        self.work = work
        self.report = report
        self.build = Path(args.build_dir).resolve()
        self.stopping: list[Callable[[], None]] = []
        self.tally = Tally()
        self.recorder = CallRecorder(work / "calls.jsonl")
        # executions a declined form confirmation failed to end (the function ends its run with
        # ApprovalDeclined; a run left waiting is a failed check, and the flow skips it)
        self.abandoned: set[str] = set()

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> None:
        import boto3

        self.tally.hook_moto()
        self.stopping.append(self.recorder.hook_moto())
        self.moto_url, stop_moto = start_moto()
        self.stopping.append(stop_moto)
        self.lambdas = LambdaService(self.recorder)
        self.stopping.append(self.lambdas.server.shutdown)
        route_lambda_tasks(self.lambdas.url)
        self._start_https()
        self.session = boto3.session.Session(
            region_name=REGION, aws_access_key_id="cloud-check", aws_secret_access_key="x"
        )
        self.sfn = self.session.client("stepfunctions", endpoint_url=self.moto_url)
        template = load_template(ROOT / "template.yaml")
        parameters = template_parameters(self.https_url)
        self.stack = Stack(template, parameters, MotoSession(self.session, self.moto_url))
        self.stack.provision(self.https_url)
        self.lambdas.aliases = self.stack.aliases()
        (self.work / "refs.json").write_text(json.dumps(self.stack.refs, default=str), "utf-8")
        self._start_api()

    def _start_https(self) -> None:
        self.cert, self.tls_key = self_signed(self.work)
        self.search = FakeOpenSearch()
        self.search.handle = self.recorder.wrap_opensearch(self.search.handle)  # type: ignore[assignment, method-assign]
        self.issuer = Issuer("")
        self.cloudformation = CloudFormationAnswers()
        https = https_server(self.cert, self.tls_key, self.search, self.issuer, self.cloudformation)
        self.stopping.append(https.shutdown)
        self.https_url = f"https://127.0.0.1:{https.server_port}"
        self.issuer.url = self.https_url

    def _start_api(self) -> None:
        """The HTTP API over HTTPS: every ``HttpApi`` event of the template's functions is a
        route to the function's worker; the API's domains are its execute-api host (the
        ``McpUrl`` output's) and the custom domain of ``Audience``."""
        routes = []
        for name, props in self.stack.functions().items():
            for event in (props.get("Events") or {}).values():
                if event.get("Type") == "HttpApi":
                    spec = event["Properties"]
                    routes.append(Route(spec["Method"].upper(), spec["Path"], self._invoker(name)))
        serving = serve_api(
            routes,
            cert=self.cert,
            key=self.tls_key,
            domain=f"{API_ID}.execute-api.{REGION}.amazonaws.com",
            aliases=[AUDIENCE.split("/")[2]],
            api_id=API_ID,
        )
        running = contextlib.ExitStack()
        self.api_url = running.enter_context(serving)
        self.stopping.append(running.close)

    def _invoker(self, logical_id: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
        def invoke(event: dict[str, Any]) -> dict[str, Any] | None:
            worker = self.lambdas.worker(self.stack.refs[logical_id])
            answer = worker.invoke(event) if worker is not None else {}
            result = answer.get("result")
            return result if isinstance(result, dict) else None

        return invoke

    def stop(self) -> None:
        for worker in self.lambdas.workers.values() if hasattr(self, "lambdas") else []:
            worker.stop()
        for stop in reversed(self.stopping):
            with contextlib.suppress(Exception):
                stop()

    # -- the workers ---------------------------------------------------------------------------

    def start_workers(self) -> bool:
        if not self._python312_runs():
            return False
        ok = True
        for name in self.stack.functions():
            try:
                worker = self.launch(name)
            except Unresolvable as exc:
                ok = self.report.check(False, f"{name}: environment: {exc}")
                continue
            worker.on_invoke = self.recorder.runner(name, worker.name)
            worker.cloudwatch = self.function_log(name)
            self.lambdas.workers[worker.name] = worker
        return ok

    def function_log(self, name: str) -> FunctionLog | None:
        """Where Lambda writes the function's invocation lines: its ``LoggingConfig`` group (the
        template gives each function its own), with its role's key; None for a function whose
        group the stack does not create (a condition leaves both out of a deployed stack)."""
        props = self.stack.functions()[name]
        try:
            group = self.stack.resolve((props.get("LoggingConfig") or {}).get("LogGroup"))
        except Unresolvable:
            return None
        logs = self.session.client(
            "logs",
            endpoint_url=self.moto_url,
            aws_access_key_id=access_key(name),
            aws_secret_access_key="cloud-check",
        )
        group = str(group or f"/aws/lambda/{self.stack.refs[name]}")
        return FunctionLog(logs, group, int(props.get("MemorySize", 128)))

    def _python312_runs(self) -> bool:
        version = subprocess.run(
            [self.args.python312, "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return self.report.check(
            version.startswith("3.12."), f"the workers run Python {version or '?'} (-I -S)"
        )

    def launch(self, name: str, *, code: Path | None = None) -> Worker:
        """A new worker (a cold start) of the template's function ``name``: its environment, on
        its build folder, or on ``code`` in its place (the benchmark's bare handler), and the
        built layer. Not yet the one the Lambda service invokes (``start_workers`` makes it so).
        ``Unresolvable`` when its environment names something the harness does not have."""
        props = self.stack.functions()[name]
        variables = {
            key: str(self.stack.resolve(value))
            for key, value in props["Environment"]["Variables"].items()
        }
        code = code or self.build / name
        function_name = self.stack.refs[name]
        env = function_env(
            variables,
            principal=name,
            function_name=function_name,
            memory=str(props.get("MemorySize", 128)),
            code=code,
            moto_url=self.moto_url,
            lambda_url=self.lambdas.url,
            cert=self.cert,
        )
        layers = [ref["Ref"] for ref in props.get("Layers", []) if isinstance(ref, dict)]
        built_layers = self.stack.of_type("AWS::Serverless::LayerVersion")
        layer = self.work / "no-layer"
        if layers and layers[0] in built_layers:
            layer = self.build / layers[0] / "python"
        argv = [
            self.args.python312,
            "-I",
            "-S",
            str(WORKER),
            str(code),
            str(layer),
            str(Path(self.args.runtime_dir).resolve()),
            str(props.get("Handler", "app.handler")),
        ]
        timeout_ms = int(props.get("Timeout", 3)) * 1000
        return Worker(function_name, argv, env, timeout_ms, self.work / f"{name}.log")

    def restart(self, logical_id: str) -> None:
        """A new container of the function (a cold start): what it cached is gone."""
        old = self.worker(logical_id)
        fresh = self.launch(logical_id)
        fresh.on_invoke = self.recorder.runner(logical_id, fresh.name)
        fresh.cloudwatch = self.function_log(logical_id)
        self.lambdas.workers[fresh.name] = fresh
        old.stop()

    def worker(self, logical_id: str) -> Worker:
        """The worker of the template's function ``logical_id``."""
        found = self.lambdas.worker(self.stack.refs[logical_id])
        assert found is not None, logical_id
        return found


@contextlib.contextmanager
def harness_on(build_dir: Path, python312: str, runtime_dir: Path) -> Iterator[Harness]:
    """A started harness on a ``sam build`` folder (moto, the stack, the HTTPS server; no worker
    yet: ``Harness.launch`` makes them), torn down on exit: the benchmarks' set-up
    (``bench.cold_imports --built``, ``bench.lambda_warm --built``)."""
    args = argparse.Namespace(
        build_dir=str(build_dir), python312=python312, runtime_dir=str(runtime_dir), logs=None
    )
    with tempfile.TemporaryDirectory(prefix="cloud-bench-") as scratch:
        harness = Harness(args, Path(scratch), Report())
        try:
            harness.start()
            yield harness
        finally:
            if hasattr(harness, "moto_url"):  # moto's state is the process's: the next one is new
                with contextlib.suppress(OSError):
                    reset = urllib.request.Request(  # noqa: S310 - the local moto server
                        f"{harness.moto_url}/moto-api/reset", method="POST"
                    )
                    urllib.request.urlopen(reset, timeout=10).close()  # noqa: S310 - local moto
            harness.stop()


def python312() -> str | None:
    """The interpreter of the functions' runtime, as scripts/python312.sh finds it: the one behind
    ``python3.12`` on PATH (resolved: a worker's PATH has no pyenv shim), else the newest pyenv
    3.12.x; None when none runs."""
    candidates = [shutil.which("python3.12")]
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        versions = Path(root.stdout.strip() or "/nonexistent") / "versions"
        candidates += [str(p) for p in sorted(versions.glob("3.12.*/bin/python3.12"), reverse=True)]
    for found in filter(None, candidates):
        done = subprocess.run(
            [found, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return None


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs the functions from a ``sam build`` folder."""
    parser.add_argument(
        "--built",
        type=Path,
        metavar="DIR",
        help="a sam build folder (e.g. .aws-sam/build): run the functions from it, on python3.12,"
        " against moto",
    )
    parser.add_argument(
        "--python312",
        default=python312(),
        help="the functions' runtime (default: python3.12 on PATH; with pyenv, PYENV_VERSION=3.12.1)",
    )
    parser.add_argument(
        "--runtime-dir",
        type=Path,
        default=ROOT / ".venv-cloud" / "lambda-runtime",
        help="the runtime's boto3, last on the functions' sys.path (scripts/cloud_check.sh makes it)",
    )
