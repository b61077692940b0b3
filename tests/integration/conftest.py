from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from aws_testing import aws_harness

from engram_testing import Harness


@pytest.fixture
def aws(tmp_path: Path) -> Iterator[Harness]:
    """The engine over the AWS adapter set (DynamoDB, S3 and KMS on moto)."""
    harness = aws_harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()
