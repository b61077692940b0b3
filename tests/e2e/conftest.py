"""Fixtures of the end-to-end suite (helpers live in ``e2e_support``).

Both servers are per session, so under xdist each worker gets its own data directories and its own
free port; tests keep apart from each other by using a fresh workspace.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e_support import HttpService, StdioHome, prepare_stdio_home, serve_http


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def http_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpService]:
    with serve_http(tmp_path_factory.mktemp("engram-http")) as service:
        yield service


@pytest.fixture(scope="session")
def stdio_home(tmp_path_factory: pytest.TempPathFactory) -> StdioHome:
    return prepare_stdio_home(
        tmp_path_factory.mktemp("engram-stdio"), tmp_path_factory.mktemp("stdio-logs")
    )
