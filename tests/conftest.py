from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_testing import HARNESS_FACTORIES, Harness


@pytest.fixture(params=sorted(HARNESS_FACTORIES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """The engine over each adapter set: the behavioural suite must pass on every one."""
    built = HARNESS_FACTORIES[request.param](tmp_path)
    try:
        yield built
    finally:
        built.close()
