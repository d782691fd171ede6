"""The provider's SQL Server pieces: the ``cdcsqlserver`` Connection type (form fields -> Debezium
properties, secrets kept), its hook capturing from the CDC emulator through pyodbc, and the example
DAG + pipeline file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.contract.harness import HARNESSES  # noqa: F401  (first: it registers the SQL Server harness)
from tests.contract.harness_sqlserver import MssqlDb, contract_sqlserver_emulator, mssql_contract_db  # noqa: F401


def _connection(**overrides):
    from airflow.sdk import Connection

    fields = dict(
        conn_id="s",
        conn_type="cdcsqlserver",
        host="db",
        port=1433,
        login="cdc",
        password="s3cr3t",
        schema="shop",
        extra=json.dumps(
            {
                "encrypt": False,
                "trust_server_certificate": True,
                "application_intent": "ReadOnly",
                "odbc_driver": "FreeTDS",
            }
        ),
    )
    fields.update(overrides)
    return Connection(**fields)


def test_connection_fields_become_sqlserver_properties():
    from airflow_cdc.airflow.hooks.cdc import CdcSqlServerHook, connection_properties
    from airflow_cdc.core.pipeline import build_config

    props = connection_properties(_connection(), "sqlserver")
    config = build_config({**props, "name": "s", "staging.path": "/tmp/x"})
    assert config["connector"] == "sqlserver" and config["database.names"] == ("shop",)
    assert (config["database.hostname"], config["database.port"]) == ("db", 1433)
    assert config["database.encrypt"] is False and config["database.trustServerCertificate"] is True
    assert config["database.applicationIntent"] == "readonly" and config["database.odbc.driver"] == "FreeTDS"
    assert config.secret("database.password") == "s3cr3t" and "s3cr3t" not in repr(props) + repr(config)
    assert CdcSqlServerHook.get_ui_field_behaviour()["placeholders"]["port"] == "1433"


def test_several_databases_are_a_config_error_naming_the_setting():
    from airflow_cdc.core.errors import ConfigError
    from airflow_cdc.core.pipeline import build_config
    from airflow_cdc.sources.sqlserver.source import SqlServerSource

    config = build_config(
        {
            "name": "s",
            "connector": "sqlserver",
            "staging.path": "/tmp/x",
            "database.hostname": "db",
            "database.names": "shop,sales",
        }
    )
    with pytest.raises(ConfigError, match="database.names lists 2 databases"):
        SqlServerSource(config)


def test_hook_captures_from_the_emulator_through_the_connection(monkeypatch, tmp_path, request):
    from airflow_cdc.airflow.hooks.cdc import CdcSqlServerHook
    from tests.support.pipeline import replay

    db: MssqlDb = request.getfixturevalue("mssql_contract_db")
    emu = db.emulator
    emu.create_table(db.name, "dbo.customers", [("id", "int"), ("name", "nvarchar(50)")], primary_key=["id"])
    emu.enable_table(db.name, "dbo.customers")
    with emu.pg_connect(db.name) as pg:
        pg.execute("INSERT INTO dbo.customers SELECT g, 'c' || g FROM generate_series(1, 5) g")
    emu.run_capture_job(db.name)
    conn = {
        "conn_type": "cdcsqlserver",
        "host": emu.host,
        "port": emu.port,
        "login": emu.user,
        "password": emu.password,
        "schema": db.name,
        "extra": {"encrypt": False},
    }
    monkeypatch.setenv("AIRFLOW_CONN_CDC_SQLSERVER_TEST", json.dumps(conn))
    pipeline = {
        "name": "hooked",
        "table.include.list": "dbo.customers",
        "staging.path": str(tmp_path),
        "snapshot.isolation.mode": "snapshot",
    }
    hook = CdcSqlServerHook(pipeline=pipeline, cdc_conn_id="cdc_sqlserver_test")
    assert hook.get_conn()["connector"] == "sqlserver"
    result = hook.get_capture().run(commit=True)
    assert result.snapshot_rows == 5
    offset = hook.get_store().load("hooked").data["offset"]
    assert not hook.changes_after(offset)  # the sensor's check: fn_cdc_get_max_lsn() vs the offset
    with emu.pg_connect(db.name) as pg:
        pg.execute("UPDATE dbo.customers SET name = 'changed' WHERE id = 2")
    emu.run_capture_job(db.name)
    assert hook.changes_after(offset)
    hook.get_capture().run(commit=True)
    rows = replay({"staging.path": str(tmp_path), "name": "hooked"}).rows(f"{db.name}.dbo.customers")
    assert rows[(2,)] == {"id": 2, "name": "changed"} and len(rows) == 5


def test_example_sqlserver_dag_parses(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CDC_DATA", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CDC_STATE_STORE", "airflow-variable://")
    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags" / "cdc_sqlserver.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["cdc_sqlserver_shop"]
    assert dag.max_active_runs == 1 and {t.task_id for t in dag.tasks} == {
        "sense",
        "capture",
        "apply",
        "commit",
    }
    assert [a.name for a in dag.get_task("commit").outlets] == [
        "cdc.shop_sqlserver.shop.dbo.customers",
        "cdc.shop_sqlserver.shop.dbo.orders",
    ]
