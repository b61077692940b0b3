"""Step 1, smoke: every function's ``events/`` samples from the build, custom resources answered
through CloudFormation's ``ResponseURL``, and every module a function loads from the build."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ..cloud_template import tools
from .harness import Harness
from .lambdas import Worker
from .settings import BROKEN_BUILD_ERRORS, EVENTS

SECURITY_API = "/_plugins/_security/api"


def samples_of(code_uri: str) -> list[tuple[str, dict[str, Any]]]:
    """The function's samples, each (what it is, the event): ``events/<folder>[_*].json``; a
    tool function without one gets its invocation from the registry (see ``registry_sample``)."""
    folder = Path(code_uri.rstrip("/")).name
    files = sorted({*EVENTS.glob(f"{folder}.json"), *EVENTS.glob(f"{folder}_*.json")})
    found = [(f"events/{path.name}", json.loads(path.read_text("utf-8"))) for path in files]
    if not found and folder in tools():
        found = [(f"the registry's {folder} invocation", registry_sample(folder))]
    return found


def registry_sample(tool: str) -> dict[str, Any]:
    """What the adapter would send ``tool``'s function, from the registry alone: the shared
    context of the tool samples (``events/search.json``'s) and no arguments, which the built
    handler must answer (a schema refusal, or the refusal of an unsigned invocation) rather than
    fail to load or run."""
    event: dict[str, Any] = json.loads((EVENTS / "search.json").read_text("utf-8"))
    return event | {"tool": tool, "arguments": {}}


def outcome(answer: dict[str, Any]) -> str:
    """A function's answer in a few words."""
    if "error" in answer:
        error = answer["error"]
        return f"function error {error.get('errorType')}: {str(error.get('errorMessage'))[:160]}"
    result = answer["result"]
    if isinstance(result, dict) and "statusCode" in result:
        return f"HTTP {result['statusCode']}"
    if isinstance(result, dict) and "ok" in result:
        code = (result.get("error") or {}).get("code")
        return "ok envelope" if result["ok"] else f"error envelope {code}"
    if isinstance(result, dict) and "protocol_error" in result:
        return f"protocol error {result['protocol_error'].get('code')}"
    return "answered"


def adapter_event(h: Harness, sample: dict[str, Any]) -> dict[str, Any]:
    """A sample event, its placeholder bearer token replaced by one the issuer signed."""
    event = copy.deepcopy(sample)
    headers = event.get("headers") or {}
    if headers.get("authorization") == "Bearer REPLACED_BY_TEST":
        headers["authorization"] = f"Bearer {h.issuer.token()}"
    return event


def smoke(h: Harness) -> None:
    for name, props in h.stack.functions().items():
        worker = h.lambdas.workers.get(h.stack.refs[name])
        if worker is None:
            continue
        samples = samples_of(props["CodeUri"])
        if not h.report.check(
            bool(samples),
            f"{name}: has a sample event (events/{Path(props['CodeUri']).name}[_*].json)",
        ):
            continue
        served = custom_resources_of(h, name)
        for label, sample in samples:
            invoke_sample(h, name, worker, label, sample, served)
        for resource in served:
            if h.stack.resource(resource)["Type"] == "Custom::OpenSearchSecurityConfig":
                check_security_config(h, resource)
        check_modules(h, name, worker)


def invoke_sample(
    h: Harness, name: str, worker: Worker, label: str, sample: dict[str, Any], served: list[str]
) -> None:
    """One sample through the built function (as CloudFormation's event when it serves a custom
    resource and the sample has a ``ResponseURL``)."""
    event = adapter_event(h, sample)
    answer_id = None
    if served and "ResponseURL" in event:
        answer_id = as_custom_resource_event(h, served[0], event)
    answer = worker.invoke(event)
    error_type = answer.get("error", {}).get("errorType")
    h.report.check(
        error_type not in BROKEN_BUILD_ERRORS,
        f"{name} from the build: {label} -> {outcome(answer)}",
    )
    if answer_id is None:
        return
    got = h.cloudformation.answers.get(answer_id, {})
    h.report.check(
        got.get("Status") == "SUCCESS" and got.get("RequestId") == event["RequestId"],
        f"{name}: {label} answered CloudFormation's ResponseURL: "
        f"{got.get('Status') or 'nothing'}"
        + (f" ({got.get('Reason')})" if got.get("Status") == "FAILED" else ""),
    )


def check_modules(h: Harness, name: str, worker: Worker) -> None:
    """Every non-stdlib module the function loaded comes from its folder, the layer or the
    runtime directory."""
    modules = worker.request({"modules": True}).get("result", {})
    counts = {origin: 0 for origin in ("function", "layer", "runtime")}
    foreign: list[str] = []
    for module, origin in sorted(modules.items()):
        if origin in counts:
            counts[origin] += 1
        else:
            foreign.append(f"{module} ({origin})")
    h.report.check(
        bool(modules) and not foreign,
        f"{name}: its {len(modules)} non-stdlib modules all come from the build "
        f"({counts['function']} from its folder, {counts['layer']} from the layer, "
        f"{counts['runtime']} from the runtime directory)"
        + (f"; from elsewhere: {', '.join(foreign[:5])}" if foreign else ""),
    )


# -- custom resources ----------------------------------------------------------------------------


def custom_resources_of(h: Harness, function: str) -> list[str]:
    """The ``Custom::*`` resources of the template whose ServiceToken is ``function``."""
    served = []
    for name, resource in h.stack.template["Resources"].items():
        if not str(resource.get("Type", "")).startswith("Custom::"):
            continue
        token = resource.get("Properties", {}).get("ServiceToken", {})
        target = token.get("Fn::GetAtt") if isinstance(token, dict) else None
        if isinstance(target, str):
            target = target.split(".")
        if target and target[0] == function:
            served.append(name)
    return served


def as_custom_resource_event(h: Harness, resource: str, event: dict[str, Any]) -> str:
    """The sample as CloudFormation would send it for ``resource``: the template's properties
    resolved against this stack, and a ResponseURL served here. Returns the answer's id."""
    properties = h.stack.resolve(h.stack.resource(resource)["Properties"])
    event["ResourceProperties"] = properties
    if "OldResourceProperties" in event:
        event["OldResourceProperties"] = properties
    event["LogicalResourceId"] = resource
    event["ResourceType"] = h.stack.resource(resource)["Type"]
    answer_id, event["ResponseURL"] = h.cloudformation.url(h.https_url)
    return answer_id


def check_security_config(h: Harness, resource: str) -> None:
    properties = h.stack.resolve(h.stack.resource(resource)["Properties"])
    applied = h.search.security
    unsigned = h.search.security_unsigned
    # named after the stack's index: stacks that share a domain keep their own roles
    reader_role, writer_role = f"{properties['Index']}_reader", f"{properties['Index']}_writer"
    reader = applied.get(f"{SECURITY_API}/rolesmapping/{reader_role}", {}).get("backend_roles")
    writer = applied.get(f"{SECURITY_API}/rolesmapping/{writer_role}", {}).get("backend_roles")
    audit = applied.get(f"{SECURITY_API}/audit/config", {})
    roles = {f"{SECURITY_API}/roles/{reader_role}", f"{SECURITY_API}/roles/{writer_role}"}
    h.report.check(
        not unsigned
        and roles <= set(applied)
        and reader == properties["ReaderRoleArns"]
        and writer == properties["WriterRoleArns"]
        and audit.get("enabled") is True
        and audit.get("audit", {}).get("log_request_body") is False,
        f"{resource}: the domain got both roles, {len(reader or [])} reader and "
        f"{len(writer or [])} writer role(s) mapped, the audit config (no request bodies), "
        f"every request SigV4-signed for es" + (f"; unsigned: {unsigned}" if unsigned else ""),
    )
