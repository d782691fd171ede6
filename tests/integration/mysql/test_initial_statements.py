"""``database.initial.statements`` on MariaDB: Debezium's splitting (``;;`` is a ``;``), run on
every query connection and not on the binlog dump's (the server's general log tells which
connection dumped the binlog)."""

from __future__ import annotations

import pytest

from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.mysql.client import connect
from tests.integration.mysql.support import assert_converged, pipeline, run_capture


def _exec(db, *statements):
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in statements:
                cur.execute(s)
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture
def general_log(mariadb_db):
    """The server's general log in mysql.general_log for the test (emptied first)."""
    _exec(
        mariadb_db,
        "SET GLOBAL log_output = 'TABLE'",
        "TRUNCATE mysql.general_log",
        "SET GLOBAL general_log = 1",
    )
    try:
        yield
    finally:
        _exec(mariadb_db, "SET GLOBAL general_log = 0", "TRUNCATE mysql.general_log")


def test_statements_on_query_connections_not_on_the_binlog_dump(mariadb_db, tmp_path, general_log):
    db = mariadb_db.name
    _exec(
        mariadb_db,
        "CREATE TABLE t (id int PRIMARY KEY, v varchar(20))",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "CREATE TABLE conn_log (id bigint, note varchar(40))",
    )
    record = f"INSERT INTO `{db}`.conn_log VALUES (CONNECTION_ID(), @note)"
    config = pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{"database.initial.statements": f"SET @note = 'x;;y'; {record};", "table.include.list": f"{db}.t"},
    )
    conn = connect(build_config(config))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @note")
            assert cur.fetchone()[0] == "x;y"
    finally:
        conn.close()
    run_capture(config)
    _exec(mariadb_db, "UPDATE t SET v = 'changed' WHERE id = 1", "DELETE FROM t WHERE id = 3")
    run_capture(config)
    assert_converged(config, [f"{db}.t"])
    logged = _exec(mariadb_db, "SELECT id, note FROM conn_log")
    assert logged and {note for _, note in logged} == {"x;y"}
    dumps = _exec(
        mariadb_db, "SELECT DISTINCT thread_id FROM mysql.general_log WHERE command_type = 'Binlog Dump'"
    )
    assert dumps, "no binlog dump in the general log"
    assert not {d for (d,) in dumps} & {i for i, _ in logged}, "initial statements ran on the binlog dump"
