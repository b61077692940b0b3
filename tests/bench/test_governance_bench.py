"""The governance benchmark on a quick slice: forgetting, isolation, the report, and a peer."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from bench.governance import __main__ as governance
from bench.governance import forgetting, peers
from bench.governance.canaries import canaries, scan

from engram_testing import tool_missing

# What a forget cannot reach, by design (docs/operating.md "Forgetting that reaches backups"):
# an export is a plaintext copy the operator holds, and a copy of keys/ kept from before the
# forget still opens the sealed bodies of a backup taken before it.
BY_DESIGN = {"backup_with_old_keys", "export_before"}


def test_canaries_are_distinct_invented_stems() -> None:
    from engram_memory.engine import lexical

    made = canaries(40, "test")
    words = [word for canary in made for word in canary.words]
    assert len(set(words)) == len(words)
    assert all(lexical.analyze(word) == [word] for word in words)
    assert all(all(word in canary.text for word in canary.words) for canary in made)


def test_the_index_check_sees_terms_of_a_row_only_marked_deleted(tmp_path: Path) -> None:
    # Without the 'optimize' merge a deleted FTS5 row's terms stay in its segment: the check
    # must find them, or a forget that skipped the merge would pass unseen.
    canary = canaries(1, "fts")[0]
    database = tmp_path / "engram.db"
    conn = sqlite3.connect(database)
    conn.execute("CREATE TABLE lexical_tables (table_name TEXT)")
    conn.execute("INSERT INTO lexical_tables VALUES ('lex_test')")
    conn.execute("CREATE VIRTUAL TABLE lex_test USING fts5(record_id UNINDEXED, body)")
    conn.execute("INSERT INTO lex_test VALUES ('mem_x', ?)", (canary.text,))
    conn.execute("INSERT INTO lex_test VALUES ('mem_y', 'another row entirely')")
    conn.execute("DELETE FROM lex_test WHERE record_id = 'mem_x'")
    conn.commit()
    conn.close()

    held = forgetting.index_holds(database, [canary], ["mem_x"])

    assert held["fts_index"] == {canary.key}


def test_the_quick_run_reports_every_part_and_ours_leaves_nothing(tmp_path: Path) -> None:
    report_file = tmp_path / "governance.json"
    assert governance.main(["--quick", "--no-peers", "--json", str(report_file)]) == 0
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert set(report) == {"count", "admission", "forgetting", "cloud", "isolation", "peers"}

    ours = report["forgetting"]
    assert (ours["forgotten"], ours["withdrawn"], ours["approvals_asked"]) == (5, 5, 10)
    # The scans do see the canaries while they are remembered ...
    controls = ours["controls_before_forget"]
    assert controls["search"] == controls["fts_index"] == 5
    assert controls["data_dir"] > 0
    # ... and after forget and withdraw no channel gives one up, except by design.
    for name, channel in ours["channels"].items():
        expected = channel["of"] if name in BY_DESIGN else 0
        assert channel["found"] == expected, (name, channel)
    assert ours["answers"]["projection_invalidation:complete"] == 5
    assert ours["polls_after_last_forget"] == 0

    cloud = report["cloud"]  # the AWS adapters on moto, the OpenSearch stand-in
    assert cloud["controls_before_forget"] == {"search": 5, "projection": 5, "key_table": 5}
    assert {name: row["found"] for name, row in cloud["channels"].items()} == dict.fromkeys(
        cloud["channels"], 0
    )

    isolation = report["isolation"]
    assert isolation["found"] == 0
    assert isolation["owner_records_intact"] == "5/5"
    assert isolation["callers"]["cross_tenant"]["codes"] == {
        "mcp:-32603": isolation["callers"]["cross_tenant"]["probes"]
    }
    assert all(caller["approvals_asked"] == 0 for caller in isolation["callers"].values())
    assert report["admission"]["genuine_not_accepted"] == 0


def test_server_memory_deletes_with_its_own_tools_and_the_copy_keeps_them(tmp_path: Path) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        tool_missing("node and npm are needed for @modelcontextprotocol/server-memory")
    among = canaries(4, "peer")
    result = peers.run(among, tmp_path, names=["server-memory"])["server-memory"]
    if "unavailable" in result:
        tool_missing(result["unavailable"])
    channels = {name: row["found"] for name, row in result["channels"].items()}
    assert channels["control_search"] == 4
    assert channels["copy_before_delete"] == 4
    assert set(channels) == {
        "control_search",
        "search",
        "get",
        "files_live",
        "files_stopped",
        "copy_before_delete",
    }
    assert scan([tmp_path / "server-memory-copy-before-delete"], among)
