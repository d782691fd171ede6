"""docker-compose.yml cannot be run here (no Docker engine): parse it and check its wiring."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # resolves anchors and << merges
SERVICES = COMPOSE["services"]
AIRFLOW = [
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
]


def _mounts(service: dict) -> dict[str, str]:
    """source -> container path (mode suffixes such as ``:ro`` dropped)."""
    return {v.split(":")[0]: v.split(":")[1] for v in service.get("volumes", [])}


def _depends(service: dict) -> list[str]:
    dep = service.get("depends_on") or []
    return list(dep) if isinstance(dep, (list, dict)) else []


def test_services_present_and_references_resolve():
    expected = {
        "postgres",
        "mysql",
        "sqlserver",
        "sqlserver-init",
        "airflow-metadb",
        "spark-master",
        "spark-worker",
        *AIRFLOW,
    }
    assert expected <= set(SERVICES)
    declared = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        for dep in _depends(service):
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).exists()
    assert declared <= {v.split(":", 1)[0] for s in SERVICES.values() for v in s.get("volumes", [])}


def test_sources_are_configured_for_change_capture():
    pg = " ".join(SERVICES["postgres"]["command"])
    assert "wal_level=logical" in pg and "max_replication_slots" in pg
    mysql = SERVICES["mysql"]["command"]
    for flag in (
        "--binlog-format=ROW",
        "--gtid-mode=ON",
        "--enforce-gtid-consistency=ON",
        "--binlog-row-image=FULL",
    ):
        assert flag in mysql
    mssql = SERVICES["sqlserver"]["environment"]
    assert mssql["MSSQL_AGENT_ENABLED"] == "true" and mssql["ACCEPT_EULA"] == "Y"
    init_sql = (ROOT / "docker" / "sqlserver-init.sql").read_text()
    assert "sp_cdc_enable_db" in init_sql and "sp_cdc_enable_table" in init_sql
    assert mssql["MSSQL_SA_PASSWORD"] in SERVICES["sqlserver-init"]["command"]


def test_airflow_is_wired_to_sources_spark_and_example_dags():
    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        mounts = _mounts(SERVICES[name])
        assert mounts["./dags"] == env["AIRFLOW__CORE__DAGS_FOLDER"]
        assert "airflow-metadb" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        for key, value in env.items():
            if key.startswith("AIRFLOW_CONN_"):
                conn = json.loads(value)
                host = re.sub(r"^\w+://", "", conn["host"])
                assert host in SERVICES, f"{key} points at unknown service {host}"
        # what the example pipeline files need from the environment: variables and Connections
        for path in (ROOT / "dags" / "pipelines").glob("*.yaml"):
            pipeline = path.read_text()
            for var in set(re.findall(r"\$\{env:(\w+)\}", pipeline)):
                assert var in env, f"{name} lacks {var} used by {path.name}"
            for conn_id in re.findall(r"(?:cdc|spark)_conn_id: (\w+)", pipeline):
                assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, (
                    f"{name} lacks Connection {conn_id} ({path.name})"
                )
        assert mounts.get("cdc-data") == env["AIRFLOW_CDC_DATA"]
        assert {"airflow-metadb", "postgres"} <= set(_depends(SERVICES[name]))
    pg_conn = json.loads(SERVICES["airflow-scheduler"]["environment"]["AIRFLOW_CONN_CDC_POSTGRES_DEFAULT"])
    pg_env = SERVICES["postgres"]["environment"]
    assert (pg_conn["login"], pg_conn["password"], pg_conn["schema"]) == (
        pg_env["POSTGRES_USER"],
        pg_env["POSTGRES_PASSWORD"],
        pg_env["POSTGRES_DB"],
    )
    spark = json.loads(SERVICES["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark["host"] == "spark://spark-master" and spark["port"] == 7077
    assert "spark://spark-master:7077" in SERVICES["spark-worker"]["command"]
    assert (
        _mounts(SERVICES["spark-worker"])["cdc-data"] == "/data"
    )  # executors read the staged batches and write Delta
    assert SERVICES["airflow-triggerer"]["environment"]["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "True"
    for name in AIRFLOW[1:]:
        assert SERVICES[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
