"""The operator's shell in the gate: ``engram-memory admin --stack STACK --region REGION ...`` run
as a subprocess whose only credentials are the operator's access key, every output kept for the
token scan. The operator's commands (``operator_cli``) and the smoke command (``operator_smoke``)
both run through it.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import Harness
from .settings import OPERATOR, REGION, ROOT, STACK_NAME, WORKSPACE, access_key

CLI_TIMEOUT_S = 180


@dataclass(frozen=True)
class Done:
    """One CLI run: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    @property
    def document(self) -> Any:
        """The ``--json`` document (None when stdout is not one)."""
        try:
            return json.loads(self.out)
        except ValueError:
            return None

    @property
    def lines(self) -> list[Any]:
        """stdout as JSON Lines (export)."""
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def said(self) -> str:
        """stderr's first line, for a gate line."""
        return (self.err.strip().splitlines() or [""])[0][:200]


def operator_env(h: Harness) -> dict[str, str]:
    """The operator's shell: its own access key and no other credentials; the AWS endpoints are
    moto's and the harness's Lambda service (``invoke`` of the drainer); the harness's CA for the
    HTTP API's stand-in (the smoke)."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(h.work),
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "AWS_ACCESS_KEY_ID": access_key(OPERATOR),
        "AWS_SECRET_ACCESS_KEY": "cloud-check",
        "AWS_ENDPOINT_URL": h.moto_url,
        "AWS_ENDPOINT_URL_LAMBDA": h.lambdas.url,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
        "SSL_CERT_FILE": str(h.cert),
    }


class Cli:
    """``engram-memory admin --stack STACK --region REGION ...`` in the operator's shell; every
    output kept (``transcript``) for the token scan."""

    def __init__(self, h: Harness, program: Path) -> None:
        self.h = h
        self.program = program
        self.env = operator_env(h)
        self.transcript: list[str] = []
        self.took: list[tuple[float, str]] = []  # (seconds, command) of every run

    def argv(self, *args: str) -> list[str]:
        return [str(self.program), "admin", "--stack", STACK_NAME, "--region", REGION, *args]

    def admin(self, *args: str, as_json: bool = True, signer: str = OPERATOR) -> Done:
        """``admin ...`` signed as the operator, or as ``signer`` (the key admin rotates)."""
        argv = self.argv(*args, *(["--json"] if as_json else []))
        env = {**self.env, "AWS_ACCESS_KEY_ID": access_key(signer)}
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=env,
                cwd=self.h.work,
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Done(124, "", f"timed out after {CLI_TIMEOUT_S}s: admin {' '.join(args)}")
        self.took.append((time.monotonic() - started, " ".join(args[:2])))
        self.transcript += [done.stdout, done.stderr]
        return Done(done.returncode, done.stdout, done.stderr)

    def workspace(self, *args: str) -> Done:
        """A command in the flow's workspace."""
        return self.admin(*args, "--workspace", WORKSPACE)


def open_cli(h: Harness) -> Cli | None:
    """The project venv's ``engram-memory`` (installed with the package when missing)."""
    from ..devenv import ensure_venv, venv_bin

    program = venv_bin("engram-memory")
    fresh = not program.exists()
    try:
        ensure_venv()
    except (OSError, subprocess.CalledProcessError, SystemExit) as exc:
        h.report.check(False, f"operator: the project venv (.venv) cannot be made: {exc}")
        return None
    shown = program.relative_to(ROOT)
    h.report.check(
        program.exists(),
        f"operator: the CLI is the project venv's {shown} ({'installed now' if fresh else 'reused'})",
    )
    return Cli(h, program) if program.exists() else None
