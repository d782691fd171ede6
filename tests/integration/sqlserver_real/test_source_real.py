"""SQL Server specifics against a real server: capture-instance switch mid-stream with a schema
change event, transaction metadata, and an LSN purged by the cleanup job."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import OffsetUnavailable
from tests.integration.sqlserver_real.harness_real import RealDb, RealSqlServerHarness
from tests.support.pipeline import replay, run_capture

pytestmark = pytest.mark.integration


def test_second_capture_instance_mid_stream(real_db: RealDb, tmp_path: Path) -> None:
    h = RealSqlServerHarness(real_db, tmp_path / "staging")
    server, db = real_db.server, real_db.name
    h.create_items("items", 5)
    config = h.config(**{"provide.transaction.metadata": True})
    while True:
        result = run_capture(config)
        if not result.snapshot_rows:
            break
    h.execute("UPDATE [items] SET v = 'old instance' WHERE id = 1")
    server.execute(db, "ALTER TABLE dbo.items ADD note nvarchar(20) NULL")
    server.execute(db, "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'items',"
                       " @role_name = NULL, @capture_instance = N'dbo_items_v2'")  # fmt: skip
    h.execute("UPDATE [items] SET v = 'new instance', note = 'n' WHERE id = 2")
    run_capture(config)
    rows = replay(config).rows(h.staged("dbo.items"))
    assert rows[(1,)]["v"] == "old instance" and "note" not in rows[(1,)]
    assert (rows[(2,)]["v"], rows[(2,)]["note"]) == ("new instance", "n")
    changes = [
        c
        for b in list_batches(config["staging.path"], config["name"])
        for c in b.manifest.get("schema_changes", [])
    ]
    assert [c["tableChanges"][0]["type"] for c in changes] == ["ALTER"]
    assert [col["name"] for col in changes[0]["tableChanges"][0]["table"]["columns"]] == [
        "id",
        "v",
        "n",
        "big",
        "note",
    ]


def test_purged_lsn_is_an_error_unless_when_needed(real_db: RealDb, tmp_path: Path) -> None:
    h = RealSqlServerHarness(real_db, tmp_path / "staging")
    h.create_items("items", 5)
    config = h.config()
    run_capture(config)
    h.execute("UPDATE [items] SET n = 99 WHERE id = 1")
    h.make_offset_unreadable(config)
    with pytest.raises(OffsetUnavailable):
        run_capture(config)
    config = dict(config, **{"snapshot.mode": "when_needed"})
    for _ in range(3):
        run_capture(config)
    h.assert_converged(config, ["dbo.items"])
