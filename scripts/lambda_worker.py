"""One Lambda function run from its built folder, as the python3.12 runtime would run it.

Started by ``scripts/cloud_run`` (its ``lambdas`` module) as ``python3.12 -I -S lambda_worker.py
CODE LAYER RUNTIME HANDLER``: isolated mode and no ``site`` module, so neither a virtualenv, nor ``PYTHONPATH``, nor
any site-packages of that interpreter is importable. ``sys.path`` is then what Lambda gives a
function: the function's folder (``/var/task``), the layer's ``python/`` (``/opt/python``) and,
last, the runtime's own boto3/botocore (``/var/runtime``).

The handler is imported once (a cold start); an import error is answered to every invocation as
``Runtime.ImportModuleError``, as Lambda does. Protocol: one JSON request per line on stdin
(``{"event", "function_name", "timeout_ms"}``), one JSON answer per line on the process's
original stdout (``{"result"}`` or ``{"error": {"errorType", "errorMessage"}}``, with ``"took"``:
the invocation's wall and CPU milliseconds in this process, ``"request_id"``: the context's
``aws_request_id``, ``"max_memory_mb"``: the process's peak resident memory so far, and on the
first invocation ``"init"``: what the init phase took — what Lambda's ``REPORT`` line says);
whatever the handler prints or logs goes to stderr. ``{"modules": true}`` answers the files of every imported module outside the
standard library, so the gate can check they all come from the build; ``{"init": true}`` answers
what the init phase took (the handler module's import and whatever it runs), so
``bench.cold_imports --built`` measures Lambda's init on the build.
"""

import importlib
import json
import os
import resource
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any


class LambdaContext:
    """The attributes and the one method of Lambda's context object that handlers use."""

    def __init__(self, function_name: str, timeout_ms: int) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = (
            f"arn:aws:lambda:{os.environ.get('AWS_REGION', 'us-east-1')}:123456789012"
            f":function:{function_name}"
        )
        self.memory_limit_in_mb = 1024
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "cloud-check"
        self._deadline = time.monotonic() + timeout_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


ORIGINS = ("function", "layer", "runtime")


def _outside_stdlib(roots: list[str]) -> dict[str, str]:
    """Module name -> "function" | "layer" | "runtime", or its file when it is from elsewhere."""
    stdlib = os.path.dirname(os.__file__)
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or name in ("__main__", "__mp_main__") or path.startswith(stdlib + os.sep):
            continue
        path = os.path.realpath(path)
        found[name] = next(
            (
                label
                for label, root in zip(ORIGINS, roots, strict=True)
                if path.startswith(root + os.sep)
            ),
            path,
        )
    return found


def _took(wall: float, cpu: float) -> dict[str, float]:
    """Milliseconds since ``wall`` (``perf_counter``) and ``cpu`` (``process_time``)."""
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000,
        "cpu_ms": (time.process_time() - cpu) * 1000,
    }


def _peak_memory_mb() -> int:
    """The process's peak resident memory, in MB (Lambda's "Max Memory Used"): ``VmHWM`` of
    /proc/self/status (Linux; ``ru_maxrss`` would keep the forking parent's peak across the
    exec), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main() -> None:
    code_dir, layer_dir, runtime_dir, handler_name = sys.argv[1:5]
    roots = [os.path.realpath(p) for p in (code_dir, layer_dir, runtime_dir)]
    sys.path[:0] = roots[:2]
    sys.path.append(roots[2])
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # the handler's prints and logs: stderr
    module_name, attribute = handler_name.rsplit(".", 1)
    handler: Callable[[Any, LambdaContext], Any] | None = None
    init_error: dict[str, str] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        handler = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:
        traceback.print_exc()
        init_error = {
            "errorType": "Runtime.ImportModuleError",
            "errorMessage": f"Unable to import module '{module_name}': {type(exc).__name__}: {exc}",
        }
    init = _took(wall, cpu)
    cold = True  # the next invocation is the first: its REPORT line carries the init duration
    for line in sys.stdin:
        request = json.loads(line)
        answer: dict[str, Any]
        if request.get("modules"):
            answer = {"result": _outside_stdlib(roots)}
        elif request.get("init"):
            answer = {"result": init} if handler is not None else {"error": init_error}
        elif handler is None:
            answer = {"error": init_error}
        else:
            context = LambdaContext(request["function_name"], int(request["timeout_ms"]))
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                answer = {"result": handler(request["event"], context)}
                json.dumps(answer)
            except Exception as exc:
                traceback.print_exc()
                answer = {"error": {"errorType": type(exc).__name__, "errorMessage": str(exc)}}
            answer["took"] = _took(wall, cpu)
            answer["request_id"] = context.aws_request_id
            answer["max_memory_mb"] = _peak_memory_mb()
            if cold:
                answer["init"], cold = init, False
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
