"""``database.initial.statements`` on PostgreSQL: run on every query connection (the catalog's,
the snapshot readers', the peek window reader's), not on the replication connection; a failing
statement, or one that changes a setting the decoders rely on, is a clear error before anything
is staged."""

from __future__ import annotations

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.postgres import client
from tests.integration.postgres.support import assert_converged, pipeline, run_capture

STATEMENTS = "SET statement_timeout = 98765; SET application_name = 'cdc;;initial'; SET work_mem = '7MB';"


def _setup(db):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, at timestamptz)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g, '2026-12-04 10:00+01' FROM generate_series(1, 50) g")


def test_statements_set_each_query_connection(pg_db, tmp_path):
    config = pipeline(pg_db, tmp_path / "staging", database__initial__statements=STATEMENTS)
    conn = client.connect(build_config(config))
    try:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # noqa: S608 - fixed names
            for name in ("statement_timeout", "application_name", "work_mem", "TimeZone")
        }
    finally:
        conn.close()
    assert settings == {
        "statement_timeout": "98765ms",
        "application_name": "cdc;initial",
        "work_mem": "7MB",
        "TimeZone": "UTC",
    }
    # a non-autocommit connection keeps them after a rollback (they were committed)
    conn = client.connect(build_config(config), autocommit=False)
    try:
        conn.rollback()
        assert conn.execute("SHOW work_mem").fetchone()[0] == "7MB"
    finally:
        conn.close()


@pytest.mark.parametrize("reader", ["peek", "stream"])
def test_capture_with_statements_converges(pg_db, tmp_path, reader):
    """Each connection records itself (a test-only INSERT: Debezium advises session settings)."""
    _setup(pg_db)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE conn_log (pid int, kind text, app text)")
    record = (
        "INSERT INTO conn_log SELECT pid, backend_type, current_setting('application_name') "
        "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    )
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        database__initial__statements=f"SET application_name = 'cdc;;initial'; {record}",
        table__include__list="public.t",
        window__reader=reader,
        snapshot__max__threads=2,
        incremental__snapshot__chunk__size=10,
    )
    run_capture(config)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE t SET v = 'changed' WHERE id <= 10")
        conn.execute("DELETE FROM t WHERE id > 45")
    run_capture(config)
    assert list_batches(config["staging.path"], config["name"])
    assert_converged(config, ["public.t"])
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        logged = conn.execute("SELECT pid, kind, app FROM conn_log").fetchall()
    assert {app for _, _, app in logged} == {"cdc;initial"}
    assert {kind for _, kind, _ in logged} == {"client backend"}  # never the walsender
    assert len({pid for pid, _, _ in logged}) >= 3  # catalog and snapshot readers, two runs


def test_failing_statement_is_named(pg_db, tmp_path):
    config = pipeline(
        pg_db, tmp_path / "staging", database__initial__statements="SET work_mem = '7MB'; SET no_such.x TO"
    )
    with pytest.raises(ConfigError, match=r"database.initial.statements: statement 2 .*SET no_such.x TO"):
        client.connect(build_config(config))
    with pytest.raises(ConfigError, match="statement 2"):
        run_capture(config)
    assert not list_batches(config["staging.path"], config["name"])


@pytest.mark.parametrize(
    ("statement", "setting"),
    [
        ("SET TimeZone = 'Europe/Paris'", "TimeZone"),
        ("SET DateStyle = 'German'", "DateStyle"),
        ("SET bytea_output = 'escape'", "bytea_output"),
    ],
)
def test_statement_changing_a_decoding_setting_is_refused(pg_db, tmp_path, statement, setting):
    config = pipeline(pg_db, tmp_path / "staging", database__initial__statements=statement)
    with pytest.raises(ConfigError, match=f"sets {setting} to .*remove that statement"):
        client.connect(build_config(config))
