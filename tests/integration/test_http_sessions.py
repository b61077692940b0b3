"""Idle MCP HTTP sessions expire (issue 38, item 8): their memory is reused instead of growing
with every session a client leaves open, and an expired session's id answers 404 (the MCP
spec's answer for an unknown session), so its client initializes anew."""

from __future__ import annotations

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory
import json
import subprocess
import time
from pathlib import Path

import httpx2
from test_serve_day_one import engram, free_port, serving, token

from engram_testing import initialize_request

IDLE_S = 2  # the test's expiry; the default is 600 s
WAVE = 300  # sessions opened and left idle per wave: ~40 KiB each while they live
WAVES = 3


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def test_idle_sessions_expire_their_memory_is_reused_and_their_id_answers_404(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", free_port()
    subprocess.run([engram(), "init", "--data-dir", str(data)], check=True, capture_output=True)
    config = json.loads((data / "host.json").read_text())
    (data / "host.json").write_text(json.dumps({**config, "http_session_idle_s": IDLE_S}))
    bearer = token(data, "--port", str(port))
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {bearer}"}
    url = f"http://127.0.0.1:{port}/mcp"
    argv = [engram(), "serve", "--data-dir", str(data), "--port", str(port)]
    with serving(argv, port) as server, httpx2.Client(timeout=60) as client:

        def wave(count: int) -> str:
            opened = [
                client.post(url, json=initialize_request("idle"), headers=headers)
                for _ in range(count)
            ]
            assert all(response.status_code == 200 for response in opened)
            time.sleep(IDLE_S + 3)  # every session of the wave idles past its expiry
            return opened[0].headers["mcp-session-id"]

        expired = wave(20)  # what the first sessions load (imports, caches) is not growth
        rss = [_rss_mib(server.pid)]
        for _ in range(WAVES):
            wave(WAVE)
            rss.append(_rss_mib(server.pid))
        follow_up = client.post(
            url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={**headers, "mcp-session-id": expired, "mcp-protocol-version": "2025-11-25"},
        )
    assert follow_up.status_code == 404, follow_up.text
    # Kept open, each wave would add ~12 MiB (three: ~36 MiB, measured 88 -> 137 MiB for 400 a
    # wave); expired, the later waves reuse the first one's memory.
    assert rss[-1] - rss[1] < 8, rss
