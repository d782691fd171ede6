"""Ad hoc snapshot conditions on MariaDB: the safe language snapshots exactly the matching rows,
raw SQL is refused (nothing stored) unless the pipeline opts in."""

from __future__ import annotations

import pytest

from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from tests.integration.mysql.support import execute, pipeline, run_capture
from tests.support.conditions import (
    ODD,
    ROWS,
    check_conditions_snapshot_matching_rows,
    check_raw_sql_refused_unless_opted_in,
)


def test_conditions_snapshot_exactly_the_matching_rows_and_raw_sql_needs_the_opt_in(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        f"CREATE TABLE t (id int PRIMARY KEY, status varchar(20) CHARACTER SET utf8mb4, "
        f"amount decimal(10, 2), `{ODD}` int)",
    )
    conn = mariadb_db.connect(autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s)", ROWS)
    finally:
        conn.close()
    config = pipeline(mariadb_db, tmp_path / "staging", **{"snapshot.mode": "no_data",
                                                            "incremental.snapshot.chunk.size": 3,
                                                            "snapshot.max.rows.per.run": 7})
    assert run_capture(config).snapshot_rows == 0
    table = f"{mariadb_db.name}.t"
    check_conditions_snapshot_matching_rows(config, table)
    check_raw_sql_refused_unless_opted_in(config, {**config, RAW_SQL_PROPERTY: True}, table, "id % 10 = 0")


def test_opted_in_raw_sql_still_cannot_write(mariadb_db, tmp_path):
    """Chunks are read in READ ONLY transactions: a raw condition calling a writing function fails."""
    execute(
        mariadb_db,
        "CREATE TABLE t (id int PRIMARY KEY)",
        "CREATE TABLE log (n int PRIMARY KEY)",
        "INSERT INTO t VALUES (1), (2)",
        "CREATE FUNCTION w() RETURNS int DETERMINISTIC MODIFIES SQL DATA BEGIN INSERT INTO log VALUES (1); RETURN 1; END",
    )
    config = pipeline(mariadb_db, tmp_path / "staging", **{"snapshot.mode": "no_data", RAW_SQL_PROPERTY: True})
    run_capture(config)
    sig = {"execute-snapshot": {"data-collections": [f"{mariadb_db.name}.t"],
                                "additional-conditions": [{"data-collection": f"{mariadb_db.name}.t",
                                                           "filter": f"`{mariadb_db.name}`.w() = 1"}]}}
    with pytest.raises(Exception, match="READ ONLY"):
        run_capture(config, signals=[sig])
    conn = mariadb_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM log")
            assert cur.fetchone()[0] == 0
    finally:
        conn.close()
