"""The connection form's *Test* button: Airflow's ``Connection.test_connection()`` instantiates our
hook from the Connection alone (no pipeline) and reports what capture would find missing, against
real servers (PostgreSQL, MariaDB) and the SQL Server CDC emulator through pyodbc."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.contract.harness import HARNESSES  # noqa: F401  (first: it registers the SQL Server harness)
from tests.contract.harness_sqlserver import contract_sqlserver_emulator  # noqa: F401


def _test(monkeypatch, conn_type: str, **fields) -> tuple[bool, str]:
    from airflow.models.connection import Connection

    conn_id = f"t_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": conn_type, **fields}))
    return Connection(conn_id=conn_id, conn_type=conn_type, **fields).test_connection()


def _role(suffix: str) -> str:
    return f"t_{uuid.uuid4().hex[:8]}_{suffix}"


def test_postgres_connection_checks_replication_prerequisites(monkeypatch, pg_db, pg_server):
    base = {"host": pg_server.host, "port": pg_server.port, "schema": pg_db.name}
    ok, message = _test(monkeypatch, "cdcpostgres", login="postgres", password=pg_server.password, **base)
    assert ok, message
    assert "wal_level=logical" in message and pg_db.name in message
    plain = _role("plain")
    pg_server.execute(f"CREATE ROLE \"{plain}\" LOGIN PASSWORD 'pw-{plain}'")
    ok, message = _test(monkeypatch, "cdcpostgres", login=plain, password=f"pw-{plain}", **base)
    assert not ok and "lacks the REPLICATION attribute" in message and f"ALTER ROLE \"{plain}\" REPLICATION" in message
    ok, message = _test(monkeypatch, "cdcpostgres", login="postgres", password="wrong-secret", **base)
    assert not ok and "wrong-secret" not in message and "postgres" in message


def test_mariadb_connection_checks_binlog_privileges(monkeypatch, mariadb_server):
    base = {"host": mariadb_server.host, "port": mariadb_server.port}
    ok, message = _test(monkeypatch, "cdcmysql", login="root", password=mariadb_server.password, **base)
    assert ok, message
    assert "MariaDB" in message and "binlog ROW/FULL" in message
    user = _role("noreplica")
    mariadb_server.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    mariadb_server.execute(f"GRANT SELECT ON *.* TO '{user}'@'%'")
    ok, message = _test(monkeypatch, "cdcmysql", login=user, password="pw", **base)
    assert not ok and "REPLICATION SLAVE" in message and user in message


def test_sqlserver_connection_checks_cdc_on_every_database(monkeypatch, contract_sqlserver_emulator):  # noqa: F811
    emu = contract_sqlserver_emulator
    names = [f"c_{uuid.uuid4().hex[:8]}_{side}" for side in "ab"]
    for db in names:
        emu.create_database(db)
    base = {"host": emu.host, "port": emu.port, "login": emu.user, "password": emu.password,
            "extra": json.dumps({"encrypt": False})}  # fmt: skip
    try:
        ok, message = _test(monkeypatch, "cdcsqlserver", schema=",".join(names), **base)
        assert ok, message
        assert all(db in message for db in names)
        with emu.pg_connect(names[1]) as pg:  # sys.sp_cdc_disable_db
            pg.execute("UPDATE sys.databases SET is_cdc_enabled = 0")
        ok, message = _test(monkeypatch, "cdcsqlserver", schema=",".join(names), **base)
        assert not ok and f"change data capture is not enabled on database {names[1]!r}" in message
        assert "sp_cdc_enable_db" in message
        ok, message = _test(monkeypatch, "cdcsqlserver", schema="no_such_db", **base)
        assert not ok and "'no_such_db'" in message
    finally:
        for db in names:
            emu.drop_database(db)


@pytest.mark.parametrize("hook", ["CdcHook", "CdcMySqlHook", "CdcSqlServerHook"])
def test_every_hook_builds_from_the_connection_alone(hook):
    from airflow_cdc.airflow.hooks import cdc

    cls = getattr(cdc, hook)
    instance = cls(cdc_conn_id="anything")  # how Airflow builds a hook for Test Connection
    assert instance.spec.properties["connector"] == cls.connector
