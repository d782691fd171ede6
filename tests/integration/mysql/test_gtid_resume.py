"""GTID offsets on MariaDB: resume across binlog rotation, after the stored file was purged, and on
a "different server" (a failover, simulated by changing ``server_id``), skipping the transactions
already captured; ``gtid.source.excludes`` filters data changes, not DDL; the cheap
``changes_after`` check."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.mysql.source import MySqlSource
from tests.integration.mysql.support import (
    assert_converged,
    execute,
    pipeline,
    purge_binlogs,
    replay,
    run_capture,
    state,
)

EXCLUDED_DOMAIN = 7  # transactions written with this gtid_domain_id are not captured


def _in_excluded_domain(db, *statements: str) -> None:
    execute(db, f"SET SESSION gtid_domain_id = {EXCLUDED_DOMAIN}", *statements)


@pytest.fixture
def gtid_pipeline(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        "CREATE TABLE g (id int PRIMARY KEY, v varchar(20))",
        "CREATE TABLE other (id int PRIMARY KEY, v int)",
        "INSERT INTO g SELECT seq, 'a' FROM seq_1_to_50",
        "INSERT INTO other VALUES (1, 0)",
    )
    config = pipeline(mariadb_db, tmp_path / "staging", **{"gtid.source.excludes": f"{EXCLUDED_DOMAIN}-.*"})
    run_capture(config)  # the initial snapshot
    return config


def test_resumes_from_gtid_set_after_rotation_purge_and_server_change(mariadb_db, gtid_pipeline):
    config, db = gtid_pipeline, mariadb_db
    execute(db, "UPDATE g SET v = 'b' WHERE id <= 10")
    assert run_capture(config).events == 10
    # the offset is at the end of its file; the next changes are in a new one, then the old is purged
    files = purge_binlogs(db)
    execute(db, "INSERT INTO g VALUES (100, 'c'), (101, 'c')", "DELETE FROM g WHERE id = 1")
    _in_excluded_domain(db, "UPDATE other SET v = 1")
    stored = state(config).data["offset"]
    assert stored["file"] not in files and stored["gtids"]
    result = run_capture(config)
    assert result.events == 3, "resumed from the GTID set: the new file's three rows, nothing excluded"
    assert result.to_offset["file"] == files[-1]
    # plain rotation between runs: the stored file/position is still there
    execute(db, "FLUSH BINARY LOGS", "UPDATE g SET v = 'd' WHERE id BETWEEN 20 AND 24")
    assert run_capture(config).events == 5
    # another server_id (a promoted replica has the same GTIDs, other coordinates): the file start is
    # found by GTIDs and the transactions of that file already captured are skipped, not repeated
    execute(db, "INSERT INTO g VALUES (102, 'e')")
    run_capture(config)
    execute(db, "SET GLOBAL server_id = 2")
    try:
        execute(db, "UPDATE g SET v = 'f' WHERE id = 102", "INSERT INTO g VALUES (103, 'f')")
        _in_excluded_domain(db, "UPDATE other SET v = 2")
        result = run_capture(config)
        assert result.events == 2 and result.to_offset["server_id"] == 2
    finally:
        execute(db, "SET GLOBAL server_id = 1")
    execute(db, "UPDATE g SET v = 'g' WHERE id = 103")
    assert run_capture(config).events == 1
    # the DDL of an excluded source still changes the structure later rows are decoded with (only
    # its data changes are filtered); without full row metadata the schema history must know it
    execute(db, "SET GLOBAL binlog_row_metadata = 'MINIMAL'")
    try:
        _in_excluded_domain(db, "ALTER TABLE g ADD COLUMN w int NULL")
        execute(db, "INSERT INTO g VALUES (104, 'h', 4)")
        assert run_capture(config).events == 1
    finally:
        execute(db, "SET GLOBAL binlog_row_metadata = 'FULL'")
    assert_converged(config, [f"{db.name}.g"])
    assert replay(config).rows(f"{db.name}.other") == {(1,): {"id": 1, "v": 0}}, "excluded source captured"


def test_changes_after_reads_no_events(mariadb_db, gtid_pipeline):
    config, db = gtid_pipeline, mariadb_db
    offset = state(config).data["offset"]
    source = MySqlSource(build_config(config))
    assert source.changes_after(offset, "binlog") is False
    assert source.changes_after(offset, "gtid") is False
    _in_excluded_domain(db, "UPDATE other SET v = 5")
    assert source.changes_after(offset, "wal") is True, "any binlog event moves the position"
    assert source.changes_after(offset, "gtid") is False, "an excluded GTID source is not work"
    execute(db, "INSERT INTO g VALUES (300, 'n')")
    assert source.changes_after(offset, "gtid") is True
    run_capture(config)
    offset = state(config).data["offset"]
    assert source.changes_after(offset, "binlog") is False and source.changes_after(offset, "gtid") is False
    assert source.changes_after(None) is True
    with pytest.raises(ConfigError, match="'slot' is not supported for MySQL"):
        source.changes_after(offset, "slot")


def test_failover_to_lower_binlog_numbers_keeps_positions_growing(mariadb_db, gtid_pipeline):
    """A promoted replica has the captured GTIDs but its own, lower binlog numbers (simulated:
    RESET MASTER, then the GTID state restored): the new events open a new position epoch, so
    they sort after everything captured before, and the replay still equals the source."""
    config, db = gtid_pipeline, mariadb_db
    execute(db, "FLUSH BINARY LOGS", "FLUSH BINARY LOGS", "UPDATE g SET v = 'x' WHERE id <= 5")
    assert run_capture(config).events == 5
    before = state(config).data["offset"]
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_state")
            (gtid_state,) = cur.fetchone()
            cur.execute("RESET MASTER")
            cur.execute("SET GLOBAL gtid_binlog_state = %s", (gtid_state,))
    finally:
        conn.close()
    execute(db, "UPDATE g SET v = 'y' WHERE id <= 3", "DELETE FROM g WHERE id = 4")
    result = run_capture(config)
    assert result.events == 4
    after = state(config).data["offset"]
    assert after["file"] < before["file"], "the simulated server's binlog numbers must be lower"
    assert_converged(config, [f"{db.name}.g"])
    assert after["epoch"] == before.get("epoch", 0) + 1
