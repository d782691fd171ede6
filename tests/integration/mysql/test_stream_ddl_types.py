"""Tables and columns born in the captured log (issue 35): a table whose CREATE TABLE the stream
read is complete from the stream (no snapshot), one that existed before it matched the filters is
snapshotted; a column a captured DDL declares BOOLEAN streams true/false; latin1 ENUM/SET labels
stream as the snapshot reads them."""

from __future__ import annotations

from airflow_cdc.core.batch import Batch
from tests.integration.mysql.support import execute, pipeline, run_capture


def _events(result, table):
    batch = Batch(result.batch_path)
    if table not in batch.tables():
        return []
    return [row for rb in batch.iter_events(table) for row in rb.to_pylist()]


def test_table_created_in_the_log_gets_no_snapshot(mariadb_db, tmp_path):
    """Debezium streams a table created while it runs and sends no snapshot of it; a table renamed
    into table.include.list existed before, so its rows are only reachable by a snapshot."""
    db = mariadb_db.name
    execute(mariadb_db, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE hidden (id int PRIMARY KEY)",
            "INSERT INTO hidden VALUES (7)")
    config = pipeline(mariadb_db, tmp_path / "st", **{"table.include.list": rf"{db}\.(t|born|moved)"})
    run_capture(config)
    execute(mariadb_db, "CREATE TABLE born (id int PRIMARY KEY, v int)", "INSERT INTO born VALUES (1, 1), (2, 2)",
            "UPDATE born SET v = 10 WHERE id = 1", "RENAME TABLE hidden TO moved")
    first = run_capture(config)
    execute(mariadb_db, "INSERT INTO born VALUES (3, 3)")
    later = [run_capture(config) for _ in range(2)]
    born = [e["op"] for r in (first, *later) for e in _events(r, f"{db}.born")]
    assert born == ["c", "c", "u", "c"]  # no op=r: the stream holds every row of it
    moved = [(e["op"], e["after"]["id"]) for r in (first, *later) for e in _events(r, f"{db}.moved")]
    assert moved == [("r", 7)]


def test_boolean_declared_by_online_ddl_streams_true_false(mariadb_db, tmp_path):
    """Debezium parses the DDL: BOOLEAN is a JDBC BOOLEAN (information_schema says tinyint(1))."""
    db = mariadb_db.name
    execute(mariadb_db, "CREATE TABLE t (id int PRIMARY KEY, old_flag boolean)", "INSERT INTO t VALUES (1, 1)")
    config = pipeline(mariadb_db, tmp_path / "st")
    snap = _events(run_capture(config), f"{db}.t")
    execute(
        mariadb_db,
        "ALTER TABLE t ADD COLUMN flag BOOLEAN NOT NULL DEFAULT FALSE, ADD COLUMN n tinyint(1)",
        "INSERT INTO t VALUES (2, 1, 1, 1)",
        "CREATE TABLE u (id int PRIMARY KEY, b BOOL)",
        "INSERT INTO u VALUES (1, 0)",
        "ALTER TABLE t RENAME COLUMN flag TO flag2",
        "INSERT INTO t VALUES (3, 0, 1, 0)",
        "ALTER TABLE t MODIFY flag2 tinyint(1) NOT NULL",  # declared again, as a TINYINT(1)
        "INSERT INTO t VALUES (4, 0, 1, 0)",
    )
    result = run_capture(config)
    # the table existed before the capture: its snapshot structure is tinyint(1), an INT16
    assert snap[0]["after"] == {"id": 1, "old_flag": 1}
    rows = [e["after"] for e in _events(result, f"{db}.t")]
    assert rows == [
        {"id": 2, "old_flag": 1, "flag": True, "n": 1},
        {"id": 3, "old_flag": 0, "flag2": True, "n": 0},
        {"id": 4, "old_flag": 0, "flag2": 1, "n": 0},
    ]
    assert [e["after"] for e in _events(result, f"{db}.u")] == [{"id": 1, "b": False}]


def test_latin1_enum_and_set_stream_like_the_snapshot(mariadb_db, tmp_path):
    """ENUM/SET labels in a table map are bytes in the column's character set (latin1 '€' is 0x80)."""
    db = mariadb_db.name
    execute(
        mariadb_db,
        "CREATE TABLE t (id int PRIMARY KEY, e enum('€uro', 'Ünïcode') CHARACTER SET latin1, "
        "s set('€', 'ß') CHARACTER SET latin1)",
        "INSERT INTO t VALUES (1, '€uro', '€,ß')",
    )
    config = pipeline(mariadb_db, tmp_path / "st")
    snap = _events(run_capture(config), f"{db}.t")
    execute(mariadb_db, "INSERT INTO t VALUES (2, 'Ünïcode', '€')")
    stream = _events(run_capture(config), f"{db}.t")
    assert snap[0]["after"] == {"id": 1, "e": "€uro", "s": "€,ß"}
    assert stream[0]["after"] == {"id": 2, "e": "Ünïcode", "s": "€"}
