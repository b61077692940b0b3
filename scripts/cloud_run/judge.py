"""The IAM step of the gate: every call the run recorded, judged as AWS would; every probe denied.

``judge`` (the flow's last step) translates template.yaml as CloudFormation receives it, resolves
it against the harness's resources, turns the recording into authorization requests (``iam``)
and the negative probes (``probes``), runs the simulator over both, and reports:

- one line per denied call (function, action, resource, the condition keys), or none;
- one line per allowed probe (what the principal must not be able to do, and why);
- the self-test: a request allowed and the same one denied only by its encryption context
  (the simulator decides on the conditions that keep candidates sealed);
- whether the generated permissions section of docs/deploying-aws.md matches the recording
  (``python -m scripts.cloud_run.judge --write-docs WORK`` rewrites it from a run's WORK folder).

Offline: ``python -m scripts.cloud_run.judge WORK`` judges a run's ``calls.jsonl`` and
``refs.json`` again (after a template edit, without running the functions).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..cloud_template import Report, translate
from .iam import (
    Authorization,
    SimulatorUnavailable,
    Verdict,
    World,
    all_authorizations,
    simulate,
    simulator_ready,
)
from .permissions import DOCS, render_section, section_of
from .probes import Probe, all_probes
from .recorder import Call
from .settings import ROOT, TENANT

SHOWN: Final = 40  # denied calls / allowed probes listed, at most


@dataclass
class Judgement:
    calls: int
    verdicts: list[Verdict]
    probes: list[tuple[Probe, Verdict]]
    unmodelled: list[str]
    self_test: list[Verdict]

    @property
    def denied(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.allowed]

    @property
    def leaks(self) -> list[tuple[Probe, Verdict]]:
        return [(p, v) for p, v in self.probes if not v.denied]


def service_actions(services: Iterable[str]) -> dict[str, dict[str, bool]]:
    """Every action of each service, and whether AWS grants it only on "*"."""
    script = simulator_ready()
    node = shutil.which("node") or "node"
    run = subprocess.run(
        [node, str(script), "--actions", *sorted(set(services))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    actions: dict[str, dict[str, bool]] = json.loads(run.stdout)
    return actions


def _services(world: World, authorizations: list[Authorization]) -> set[str]:
    found = {a.action.split(":", 1)[0] for a in authorizations}
    for policy in world.policies.values():
        statements = policy.get("Statement", [])
        for statement in statements if isinstance(statements, list) else [statements]:
            actions = statement.get("Action", [])
            for action in actions if isinstance(actions, list) else [actions]:
                found.add(str(action).split(":", 1)[0])
    return {s for s in found if s and s != "*"}


def self_test(world: World) -> list[Authorization]:
    """Two requests that differ only in their encryption context: the first must be allowed,
    the second denied (request_admission opening a candidate of this tenant, of another)."""
    data_key = world.stack.refs["EngramDataKey.Arn"]
    context = {
        "aws:PrincipalArn": world.role_arns["RequestAdmissionFunction"],
        "kms:CallerAccount": world.stack.refs["AWS::AccountId"],
        "kms:EncryptionContext:engram:tenant": TENANT,
        "kms:EncryptionContextKeys": ["engram:tenant"],
    }
    mine = Authorization.of("RequestAdmissionFunction", "kms:Decrypt", str(data_key), context)
    other = Authorization.of(
        "RequestAdmissionFunction",
        "kms:Decrypt",
        str(data_key),
        {**context, "kms:EncryptionContext:engram:tenant": "other"},
    )
    return [mine, other]


def run_judgement(calls: list[Call], world: World) -> Judgement:
    authorizations, unmodelled = all_authorizations(calls, world)
    actions = service_actions(_services(world, authorizations))
    # built from what the run did, allowed or not: the probes do not depend on today's policies
    probes = all_probes(world, authorizations, actions)
    tests = self_test(world)
    verdicts = simulate([*authorizations, *(p.authorization for p in probes), *tests], world)
    made = verdicts[: len(authorizations)]
    probed = verdicts[len(authorizations) : len(authorizations) + len(probes)]
    tested = verdicts[len(authorizations) + len(probes) :]
    return Judgement(len(calls), made, list(zip(probes, probed, strict=True)), unmodelled, tested)


def report_judgement(judgement: Judgement, world: World, report: Report) -> None:
    for problem in world.problems:
        report.check(False, f"iam: the template's policies: {problem}")
    for call in judgement.unmodelled[:SHOWN]:
        report.check(False, f"iam: a recorded call no translation models: {call}")
    errors = [v for v in judgement.verdicts if v.result == "Error"]
    denied = [v for v in judgement.denied if v.result != "Error"]
    for verdict in errors[:SHOWN]:
        report.check(
            False,
            f"iam: the simulator refused {verdict.authorization.described()}: {verdict.detail}",
        )
    for verdict in denied[:SHOWN]:
        report.check(False, f"iam: DENIED {verdict.authorization.described()} -> {verdict.result}")
    report.check(
        not judgement.denied and not judgement.unmodelled,
        f"iam: {judgement.calls} recorded calls -> {len(judgement.verdicts)} distinct authorization "
        f"requests, {len(judgement.denied)} denied by the translated template's policies",
    )
    probe_errors = [(p, v) for p, v in judgement.probes if v.result == "Error"]
    leaks = [(p, v) for p, v in judgement.leaks if v.result != "Error"]
    for probe, verdict in probe_errors[:SHOWN]:
        report.check(
            False,
            f"iam probe: the simulator refused {probe.authorization.described()}: {verdict.detail}",
        )
    for probe, _ in leaks[:SHOWN]:
        report.check(False, f"iam probe: ALLOWED {probe.authorization.described()} ({probe.why})")
    kinds: dict[str, int] = {}
    for probe, _ in judgement.probes:
        kind = probe.why.split(" (", 1)[0].split(" and it", 1)[0]
        kind = "what another principal did" if kind.startswith("what ") else kind
        kind = "a grant never used" if kind.startswith("granted by") else kind
        kinds[kind] = kinds.get(kind, 0) + 1
    report.check(
        not judgement.leaks,
        f"iam: {len(judgement.probes)} negative probes, {len(judgement.probes) - len(judgement.leaks)} "
        f"denied ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})",
    )
    tested = judgement.self_test
    report.check(
        [v.result for v in tested] == ["Allowed", "ImplicitlyDenied"],
        "iam: self-test: the simulator decides on the encryption context (this tenant's candidate "
        f"opened: {tested[0].result}; another tenant's: {tested[1].result})",
    )


def check_docs(judgement: Judgement, world: World, report: Report, *, write: bool = False) -> None:
    """docs/deploying-aws.md's generated permissions section against this recording."""
    generated = render_section(judgement.verdicts, world)
    text = DOCS.read_text("utf-8")
    current = section_of(text)
    if write:
        DOCS.write_text(text.replace(current, generated) if current else text, "utf-8")
        current = generated
    report.check(
        current == generated,
        "iam: docs/deploying-aws.md's permission tables are the recording's"
        + (
            ""
            if current == generated
            else " (stale: python -m scripts.cloud_run.judge --write-docs WORK)"
        ),
    )


def judge(
    calls: list[Call],
    refs: dict[str, Any],
    report: Report,
    *,
    write_docs: bool = False,
    template: Path = ROOT / "template.yaml",
) -> Judgement | None:
    translated = translate(template)
    world = World.of(translated, refs)
    try:
        judgement = run_judgement(calls, world)
    except SimulatorUnavailable as exc:
        report.check(False, f"iam: {exc}")
        return None
    report_judgement(judgement, world, report)
    check_docs(judgement, world, report, write=write_docs)
    return judgement


def load_calls(work: Path) -> list[Call]:
    calls = []
    for line in (work / "calls.jsonl").read_text("utf-8").splitlines():
        data = json.loads(line)
        calls.append(
            Call(
                data["principal"],
                data["service"],
                data["operation"],
                data["params"],
                data["answer"],
                data["status"],
            )
        )
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.cloud_run.judge", description=__doc__)
    parser.add_argument("work", type=Path, help="a run's folder (scripts/cloud_run --logs WORK)")
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the docs' generated tables"
    )
    parser.add_argument(
        "--template", type=Path, default=ROOT / "template.yaml", help="judge another template"
    )
    args = parser.parse_args(argv)
    report = Report()
    refs = json.loads((args.work / "refs.json").read_text("utf-8"))
    judge(load_calls(args.work), refs, report, write_docs=args.write_docs, template=args.template)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
