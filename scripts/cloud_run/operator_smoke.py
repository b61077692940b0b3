"""The smoke command in the gate: ``engram-memory admin --stack engram-memory-dev smoke``, as an
operator runs it but for ``--endpoint`` (the HTTP API's stand-in, ``Harness._start_api``: the gate
has no API Gateway), in the operator's shell (``operator_shell.Cli``), with an agent token of the
harness's issuer for a workspace of its own, in a file only its owner reads.

When the command prints an approval page's link, the harness is the test approver: it opens the
link as a browser does, through the stand-in (``approval.through_the_api``: the issuer's sign-in
as the approver the token names, the page's CSRF token, Approve). The command's whole output goes into
the gate's log, each line behind ``|`` (its lines are not the gate's).

Checked: exit code 0 with every step ok and both approvals answered; the functions' REPORT lines
printed (the Lambda service writes them to moto's CloudWatch Logs, where the command reads
them); nothing left behind (the smoke workspace's records and pending candidates, as the
operator's commands list them, and its OpenSearch documents); the command refusing in one line
without a token and for a stack that does not exist; last, no bearer token in anything the
operator's commands printed or the functions logged (``scan_outputs``).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading

from .approval import approve_on_the_page, through_the_api
from .harness import Harness
from .operator_shell import Cli
from .settings import OPERATOR, REFUSAL_SUFFIX, REGION, TENANT, access_key

SMOKE_WORKSPACE = "ws-smoke-0001"
SMOKE_TIMEOUT_S = 420  # the command's own bounds: 300 s per approval at most, in practice seconds
LINK = re.compile(r"https://\S+/approvals/(apr_[A-Za-z0-9_-]+)")
STEPS = (
    "connect",
    "capture",
    "request_admission",
    "search",
    "get",
    "capture",
    "withdraw",
    "forget",
    "drained",
)
# the functions a smoke invokes (the adapter, the six tools, the state machines' steps)
FUNCTIONS = ("mcp-adapter", "capture", "request-admission", "search", "get", "withdraw", "forget")


def operator_smoke(h: Harness, cli: Cli) -> None:
    refusals(h, cli)
    token_file = h.work / "smoke-agent.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(h.issuer.token(workspace=SMOKE_WORKSPACE))
    argv = cli.argv("smoke", "--endpoint", f"{h.api_url}/mcp", "--token-file", str(token_file))
    code, lines = run_with_an_approver(h, cli, argv)
    print(
        "  the smoke command's output (engram-memory admin --stack engram-memory-dev --region"
        f" {REGION} smoke --endpoint <the HTTP API's stand-in>/mcp --token-file <0600 file>):"
    )
    for line in lines:
        print(f"       | {line}")
    marks = [(line[:6], line[7:].split(" ", 1)[0]) for line in lines if line.startswith("[")]
    steps = tuple(name for mark, name in marks if mark == "[ok]  ")
    waits = [name for mark, name in marks if mark == "[wait]"]
    h.report.check(
        code == 0 and steps == STEPS and waits == ["withdraw", "forget"],
        f"smoke: exit {code}, {len(steps)} step(s) ok ({', '.join(steps)}), the approval page's"
        f" link printed for {', '.join(waits) or 'nothing'}",
    )
    reported(h, lines)
    left_nothing(h, cli)


def run_with_an_approver(h: Harness, cli: Cli, argv: list[str]) -> tuple[int, list[str]]:
    """Run the command, reading its output as it comes; each new approval link is approved on
    the page through the API, as the test approver's browser would. Exit code and lines."""
    lines: list[str] = []
    approved: list[str] = []
    process = subprocess.Popen(
        argv,
        env=cli.env,
        cwd=h.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    deadline = threading.Timer(SMOKE_TIMEOUT_S, process.kill)
    deadline.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            link = LINK.search(line)
            if link is None or link.group(1) in approved:
                continue
            approved.append(link.group(1))
            answered = approve_on_the_page(h, link.group(1), send=through_the_api, who="smoke")
            result = answered.get("result", {})
            h.report.check(
                result.get("statusCode") == 200
                and 'data-decision="approve"' in str(result.get("body")),
                f"smoke: the test approver approved {link.group(1)[:16]}… on the page, through the"
                f" API (HTTP {result.get('statusCode')})",
            )
    finally:
        deadline.cancel()
    code = process.wait()
    cli.transcript += lines
    return code, lines


def reported(h: Harness, lines: list[str]) -> None:
    """The REPORT table the command printed names every function the smoke invoked."""
    start = next((i for i, line in enumerate(lines) if line.startswith("REPORT lines")), None)
    rows = lines[start + 2 : -2] if start is not None else []
    functions = {row.split()[1] for row in rows if len(row.split()) > 6}
    wanted = {f"engram-{TENANT}-{name}" for name in FUNCTIONS}
    h.report.check(
        wanted <= functions,
        f"smoke: the functions' REPORT lines read from CloudWatch Logs: {len(rows)} invocation(s)"
        f" of {len(functions)} function(s)"
        + (f"; missing {sorted(wanted - functions)}" if wanted - functions else ""),
    )


def left_nothing(h: Harness, cli: Cli) -> None:
    records = cli.admin("records", "list", "--workspace", SMOKE_WORKSPACE)
    pending = cli.admin("pending", "list", "--workspace", SMOKE_WORKSPACE)
    states = sorted(str(r.get("state")) for r in records.document or [] if isinstance(r, dict))
    documents = h.search.record_ids(SMOKE_WORKSPACE)
    h.report.check(
        records.code == pending.code == 0
        and states == ["tombstoned"]
        and pending.document == []
        and not documents,
        f"smoke: it left nothing behind: its record {', '.join(states) or 'missing'}, no pending"
        f" candidate ({len(pending.document or [])}), {len(documents)} OpenSearch document(s)",
    )


def refusals(h: Harness, cli: Cli) -> None:
    """Misconfigured, the command refuses in one line: no token, no such stack."""
    endpoint = ("--endpoint", f"{h.api_url}/mcp")
    no_token = cli.admin("smoke", *endpoint, as_json=False)
    h.report.check(
        no_token.code == 2 and "--token-file" in no_token.err and one_line(no_token.err),
        f"smoke: without a token, one line and exit 2: {no_token.said()[:100]}",
    )
    token_file = h.work / "no-stack.token"
    token_file.write_text("not-a-token-the-command-never-gets-that-far", "utf-8")
    argv = [str(cli.program), "admin", "--stack", "no-such-stack", "--region", REGION, "smoke"]
    done = subprocess.run(
        [*argv, *endpoint, "--token-file", str(token_file)],
        # a refusal check: AWS may refuse its DescribeStacks or answer "does not exist", the
        # command's line is the same; the IAM judge leaves these calls out
        env={**cli.env, "AWS_ACCESS_KEY_ID": access_key(OPERATOR) + REFUSAL_SUFFIX},
        cwd=h.work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    h.report.check(
        done.returncode == 1 and "no-such-stack" in done.stderr and one_line(done.stderr),
        f"smoke: a stack CloudFormation does not know, one line and exit 1: "
        f"{done.stderr.strip()[:100]}",
    )


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


def scan_outputs(h: Harness, cli: Cli) -> None:
    """No bearer token the issuer minted in anything the operator's commands printed (the
    smoke's output too) or the functions logged."""
    minted = h.issuer.minted
    secrets_seen = [*minted] + [t.rsplit(".", 1)[-1] for t in minted]
    places = [*cli.transcript, *(p.read_text("utf-8", "replace") for p in h.work.glob("*.log"))]
    hits = sum(1 for text in places for token in secrets_seen if token in text)
    h.report.check(
        hits == 0,
        f"operator: {len(minted)} bearer token(s) in {len(cli.transcript)} operator output(s) and"
        f" the function logs: {hits} hit(s)",
    )
