"""The Lambda service: ``Invoke`` over HTTP, each function a python3.12 worker on its build folder.

A worker is ``python3.12 -I -S scripts/lambda_worker.py`` whose ``sys.path`` is only the
function's build folder, the built layer's ``python/`` and a runtime boto3 directory. Around each
invocation the service writes the function's ``START``, ``END`` and ``REPORT`` lines to its log
group in moto's CloudWatch Logs, as Lambda does (``FunctionLog``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from .endpoints import send_json
from .recorder import CallRecorder
from .settings import REGION, access_key


class FunctionLog:
    """What Lambda writes to a function's log group around each invocation: ``START``, ``END``
    and ``REPORT`` (duration, billed duration, memory size, max memory used, and the init
    duration on an execution environment's first invocation), in one log stream per execution
    environment (a worker). Lambda writes them with the function's execution role, so ``logs``
    signs with the function's key (the recorder sees ``CreateLogStream``/``PutLogEvents`` as the
    role's). The billed duration is the duration rounded up to the millisecond plus, on a cold
    start, the init duration (Lambda bills the init phase of managed runtimes since August
    2025)."""

    def __init__(self, logs: Any, group: str, memory_mb: int) -> None:
        self.logs = logs
        self.group = group
        self.memory_mb = memory_mb
        self.stream = ""
        self.lock = threading.Lock()

    def write(self, answer: dict[str, Any]) -> None:
        if answer.get("request_id"):
            with self.lock:
                self._write(answer)

    def _write(self, answer: dict[str, Any]) -> None:
        request_id = answer["request_id"]
        if not self.stream:
            day = time.strftime("%Y/%m/%d", time.gmtime())
            self.stream = f"{day}/[$LATEST]{secrets.token_hex(16)}"
            self.logs.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
        duration = float((answer.get("took") or {}).get("wall_ms", 0.0))
        init = (answer.get("init") or {}).get("wall_ms")
        billed = math.ceil(duration + float(init or 0.0))
        report = (
            f"REPORT RequestId: {request_id}\tDuration: {duration:.2f} ms\t"
            f"Billed Duration: {billed} ms\tMemory Size: {self.memory_mb} MB\t"
            f"Max Memory Used: {int(answer.get('max_memory_mb') or 0)} MB"
        )
        if init is not None:
            report += f"\tInit Duration: {float(init):.2f} ms"
        end_ms = int(time.time() * 1000)
        start_ms = end_ms - math.ceil(duration)
        lines = [
            (start_ms, f"START RequestId: {request_id} Version: $LATEST"),
            (end_ms, f"END RequestId: {request_id}"),
            (end_ms, report),
        ]
        self.logs.put_log_events(
            logGroupName=self.group,
            logStreamName=self.stream,
            logEvents=[{"timestamp": at, "message": message} for at, message in lines],
        )


class Worker:
    """One built function in its own ``python3.12 -I -S`` process (see lambda_worker.py)."""

    cloudwatch: FunctionLog | None = None  # set by the gate's run (not by the benchmarks)

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], timeout_ms: int, log: Path
    ) -> None:
        self.name = name
        self.timeout_ms = timeout_ms
        self.on_invoke: Callable[[], None] | None = None  # Lambda runs the function (recorder)
        self.lock = threading.Lock()
        self.log = log
        self._stderr = log.open("ab")
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            bufsize=1,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(json.dumps(payload) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            return {"error": {"errorType": "Runtime.ExitError", "errorMessage": "worker exited"}}
        answer: dict[str, Any] = json.loads(line)
        return answer

    def invoke(self, event: Any) -> dict[str, Any]:
        if self.on_invoke is not None:
            self.on_invoke()
        answer = self.request(
            {"event": event, "function_name": self.name, "timeout_ms": self.timeout_ms}
        )
        if self.cloudwatch is not None:
            self.cloudwatch.write(answer)
        return answer

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._stderr.close()


class LambdaService:
    """``POST /2015-03-31/functions/<name>/invocations`` → the function's worker."""

    def __init__(self, recorder: CallRecorder | None = None) -> None:
        self.recorder = recorder
        self.workers: dict[str, Worker] = {}
        # function name -> {alias: version} (``Stack.aliases``): an Invoke naming another
        # qualifier finds no function, as on Lambda
        self.aliases: dict[str, dict[str, str]] = {}
        self.invocations: list[tuple[str, str]] = []
        self.payloads: list[bytes] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def worker(self, function: str) -> Worker | None:
        name = function.rsplit(":function:", 1)[-1].split(":", 1)[0]
        return self.workers.get(name)

    def executed_version(self, function: str) -> str | None:
        """The version an Invoke of ``function`` (a name or ARN, qualified or not) runs: the
        unqualified function and ``$LATEST`` run ``$LATEST``, an alias its version, a published
        version itself; None when the qualifier names none of them."""
        name, _, qualifier = function.rsplit(":function:", 1)[-1].partition(":")
        if qualifier in ("", "$LATEST"):
            return "$LATEST"
        published = self.aliases.get(name, {})
        if qualifier in published:
            return published[qualifier]
        return qualifier if qualifier in published.values() else None

    def answer(
        self, path: str, body: bytes, authorization: str = ""
    ) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and the Lambda headers of one ``Invoke`` request."""
        path, _, query = path.partition("?")
        match = re.fullmatch(r"/2015-03-31/functions/([^/]+)/invocations", path)
        function = unquote(match.group(1)) if match else ""
        qualifier = parse_qs(query).get("Qualifier", [""])[0]
        function += f":{qualifier}" if qualifier else ""
        worker = self.worker(function) if match else None
        version = self.executed_version(function)
        if worker is None or version is None:
            missing = {"Type": "User", "message": f"Function not found: {function}"}
            return (
                404,
                json.dumps(missing).encode(),
                {"x-amzn-errortype": "ResourceNotFoundException"},
            )
        event = json.loads(body or b"{}")
        if self.recorder is not None:
            self.recorder.lambda_invoke(authorization, function, event)
        step = event.get("step") or event.get("tool") or "-"
        self.invocations.append((worker.name, str(step)))
        self.payloads.append(body)
        answer = worker.invoke(event)
        headers: dict[str, str] = {}
        if "error" in answer:
            headers["x-amz-function-error"] = "Unhandled"
            data = json.dumps(answer["error"]).encode()
        else:
            data = json.dumps(answer["result"]).encode()
        headers["x-amz-executed-version"] = version
        return 200, data, headers

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b"{}"
                authorization = self.headers.get("authorization") or ""
                status, data, headers = service.answer(self.path, body, authorization)
                send_json(self, status, data, **headers)

        return Handler


def function_env(
    variables: dict[str, str],
    *,
    principal: str,
    function_name: str,
    memory: str,
    code: Path,
    moto_url: str,
    lambda_url: str,
    cert: Path,
) -> dict[str, str]:
    """The template's variables plus what the Lambda runtime sets, pointed at the harness."""
    return {
        **variables,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": access_key(principal),
        "AWS_SECRET_ACCESS_KEY": "cloud-check",
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ENDPOINT_URL_LAMBDA": lambda_url,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_LAMBDA_FUNCTION_NAME": function_name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory,
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "LAMBDA_TASK_ROOT": str(code),
        # no X-Ray daemon here; Lambda runs one next to each function
        "POWERTOOLS_TRACE_DISABLED": "true",
        "SSL_CERT_FILE": str(cert),
        "REQUESTS_CA_BUNDLE": str(cert),
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
    }
