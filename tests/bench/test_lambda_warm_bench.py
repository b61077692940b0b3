"""bench.lambda_warm: the warm handlers answer on a moto server, and the grouping owns time."""

from __future__ import annotations

import copy
import cProfile
import json
import pstats
from pathlib import Path
from typing import Any

import pytest

from bench import lambda_warm

FAKE_PACKAGE_FILE = "/opt/venv/lib/python3.12/site-packages/fakepkg/work.py"


def _profile_of_fake_package() -> pstats.Stats:
    """A function whose file is a site-packages module, calling ``copy.deepcopy`` many times."""
    namespace: dict[str, Any] = {"copy": copy}
    source = "def work(value):\n    for _ in range(200):\n        copy.deepcopy(value)\n"
    exec(compile(source, FAKE_PACKAGE_FILE, "exec"), namespace)  # noqa: S102 - test-made code
    profiler = cProfile.Profile()
    profiler.enable()
    namespace["work"]({"a": [list(range(50)) for _ in range(20)]})
    profiler.disable()
    return pstats.Stats(profiler)


def test_the_standard_librarys_own_time_belongs_to_the_package_that_called_it() -> None:
    grouped = lambda_warm._group(_profile_of_fake_package(), calls=1)

    assert grouped["fakepkg"] > 0
    # deepcopy's recursion is all standard library: every bit of it is owned by the caller
    assert grouped.get("stdlib", 0.0) < 0.05 * grouped["fakepkg"]


@pytest.mark.parametrize(
    ("path", "package"),
    [
        ("/v/lib/python3.12/site-packages/botocore/client.py", "botocore"),
        ("/v/lib/python3.12/site-packages/moto/dynamodb/models/table.py", "moto"),
        ("/w/layers/core/engram_memory/engine/kernel.py", "engram_memory.engine"),
        ("/w/layers/core/engram_memory/cloud/observability.py", "engram_memory.cloud"),
        ("/w/layers/core/engram_memory/entry.py", "engram_memory.entry"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/copy.py", "stdlib"),
        ("~", "stdlib"),
    ],
)
def test_a_file_is_named_by_its_package(path: str, package: str) -> None:
    assert lambda_warm._package_of(path) == package


def test_warm_handlers_answer_and_the_fake_cloud_is_reported_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "warm.json"
    assert lambda_warm.main(["--records", "3", "--calls", "2", "--json", str(path)]) == 0
    assert "own time by package" in capsys.readouterr().out
    rows = {row["tool"]: row for row in json.loads(path.read_text(encoding="utf-8"))}

    assert set(rows) == set(lambda_warm.TOOLS)
    for row in rows.values():
        assert row["calls"] == 2
        assert row["cpu_ms"] > 0 and row["service_ms"] > 0
        assert "moto" not in row["by_package_ms"]  # the stand-in cloud is reported apart
        assert row["wall_ms"] >= row["cpu_ms"]  # the handler thread waited for moto's answers
    assert rows["search"]["fake_cloud_ms"] > 0  # the in-memory index ranked, reported apart
    # the Encryption SDK seals a capture's candidate in the function, not in the fake cloud
    assert any(name.startswith("aws_") for name in rows["capture"]["by_package_ms"])
