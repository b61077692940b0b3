"""The console's sign-in pieces without a browser: the one-time links in the data directory
(hashed, single use, short-lived, shared between two processes' connections), the sessions'
expiry, the CLI command that mints a link, the banner's line, and the console's refusals of a
client that is not on this machine or names another host."""

from __future__ import annotations

import contextlib
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from test_serve_day_one import engram, free_port, serving

from engram_memory.embedded.cli import main
from engram_memory.embedded.console.app import Console, console_routes
from engram_memory.embedded.console.links import LINK_TTL_MS, SignInLinks
from engram_memory.embedded.console.sessions import SESSION_TTL_MS, Sessions
from engram_memory.embedded.data_dir import CONSOLE_FILE
from engram_memory.embedded.serve import EmbeddedServer, open_server

T0 = 1_790_000_000_000


@pytest.fixture
def links(tmp_path: Path) -> Iterator[SignInLinks]:
    with contextlib.closing(SignInLinks(tmp_path)) as opened:
        yield opened


def test_a_link_is_stored_hashed_in_an_owner_only_file(links: SignInLinks, tmp_path: Path) -> None:
    secret = links.mint("ada", T0)
    assert len(secret) >= 43  # 32 random bytes, URL-safe
    path = tmp_path / CONSOLE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = b"".join(p.read_bytes() for p in tmp_path.glob(CONSOLE_FILE + "*"))
    assert secret.encode() not in stored


def test_a_link_is_redeemed_once_by_any_process_sharing_the_data_directory(
    links: SignInLinks, tmp_path: Path
) -> None:
    secret = links.mint("ada", T0)
    server_side = SignInLinks(tmp_path)  # the server's own connection, as another process has
    try:
        assert server_side.redeem(secret, T0 + 1_000) == "ada"
        assert server_side.redeem(secret, T0 + 2_000) is None
        assert links.redeem(secret, T0 + 3_000) is None
    finally:
        server_side.close()


def test_a_link_expires_and_an_unknown_secret_names_nobody(links: SignInLinks) -> None:
    secret = links.mint("ada", T0)
    assert links.redeem(secret, T0 + LINK_TTL_MS) is None
    assert links.redeem("not-a-secret", T0) is None
    with pytest.raises(ValueError, match="operator"):
        links.mint("  ", T0)


def test_a_session_expires_and_its_csrf_token_is_its_own() -> None:
    sessions = Sessions(b"k" * 32)
    cookie, session = sessions.open("ada", T0)
    other_cookie, other = sessions.open("ada", T0)
    assert sessions.find(cookie, T0 + SESSION_TTL_MS - 1) == session
    assert session.csrf != other.csrf and cookie != other_cookie
    assert sessions.find(cookie, T0 + SESSION_TTL_MS) is None
    assert sessions.find(cookie, T0) is None  # gone once expired
    assert sessions.find("", T0) is None


def test_the_console_command_prints_a_link_the_server_redeems_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    capsys.readouterr()
    assert main(["console", "--data-dir", str(data), "--operator", "ada", "--port", "9100"]) == 0
    out, err = capsys.readouterr()
    link = out.strip()
    assert link.startswith("http://127.0.0.1:9100/console/signin/")
    assert "'ada'" in err and "once" in err
    opened = SignInLinks(data)
    try:
        assert opened.redeem(link.rsplit("/", 1)[1], _now()) == "ada"
    finally:
        opened.close()


def test_the_console_command_on_no_data_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["console", "--data-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "init" in err


def _now() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    opened = open_server(tmp_path / "data")
    yield opened
    opened.close()


def _client(console: Console) -> TestClient:
    app = Starlette(routes=console_routes(console, ["127.0.0.1:*", "testserver"]))
    return TestClient(app, base_url="http://testserver")  # its client is "testclient", remote


def test_a_client_not_on_this_machine_is_refused_unless_configured(
    server: EmbeddedServer,
) -> None:
    secret = server.console.links.mint("ada", _now())
    refused = _client(server.console).get(f"/console/signin/{secret}", follow_redirects=False)
    assert refused.status_code == 403
    assert "console_remote" in refused.text
    assert refused.headers["cache-control"] == "no-store"
    server.console.remote = True
    signed_in = _client(server.console).get(f"/console/signin/{secret}", follow_redirects=False)
    assert signed_in.status_code == 303  # the link was not spent by the refused request
    cookie = signed_in.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie


def test_a_request_naming_another_host_is_refused(server: EmbeddedServer) -> None:
    server.console.remote = True
    refused = _client(server.console).get("/console/", headers={"Host": "evil.example"})
    assert refused.status_code == 421


def test_the_link_in_a_real_serve_banner_signs_in_once(tmp_path: Path) -> None:
    """What a person who ran ``./run`` does: open the banner's link."""
    port = free_port()
    argv = [engram(), "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    with serving(argv, port) as process:
        assert process.stdout is not None
        line = ""
        while "/console/signin/" not in line:
            line = process.stdout.readline()
            assert line, "the banner ended without a console link"
        link = line.split(": ", 1)[1].strip()
        assert link.startswith(f"http://127.0.0.1:{port}/console/signin/")
        with httpx2.Client() as http:
            first = http.get(link, follow_redirects=False)
            assert first.status_code == 303
            overview = http.get(f"http://127.0.0.1:{port}/console/")
            assert overview.status_code == 200 and "Signed in as" in overview.text
            assert http.get(link, follow_redirects=False).status_code == 403


def test_an_unknown_console_path_is_a_page_that_is_not_cached(server: EmbeddedServer) -> None:
    server.console.remote = True
    missing = _client(server.console).get("/console/nothing-here")
    assert missing.status_code == 404
    assert missing.headers["cache-control"] == "no-store"


def test_the_overview_chart_counts_audit_entries_per_hour_of_the_last_day() -> None:
    from engram_memory.contract.types import format_instant
    from engram_memory.embedded.console.pages import activity

    now = T0
    entries = [
        {"at": format_instant(now - 10_000)},  # this hour
        {"at": format_instant(now - 20_000)},
        {"at": format_instant(now - 3_600_000 - 5)},  # the hour before
        {"at": format_instant(now - 25 * 3_600_000)},  # older than a day: not counted
        {"at": format_instant(now + 60_000)},  # after now: not counted
    ]
    hours = activity(entries, now)
    assert len(hours) == 24
    assert [hour["calls"] for hour in hours[-2:]] == [1, 2]
    assert sum(hour["calls"] for hour in hours) == 3
