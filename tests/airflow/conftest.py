"""Airflow test environment: a private AIRFLOW_HOME (never ~/airflow) with a SQLite metadata DB.

The environment variables are set when this module is imported, i.e. before any test module of
this directory imports Airflow.  ``airflow_home`` migrates the DB once per session; ``AirflowCli``
runs ``airflow dags test`` in subprocesses with Connections given as environment variables.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_HOME = Path(tempfile.mkdtemp(prefix="airflow-cdc-test-home-"))
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(_HOME / "dags"),
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    "SPARK_LOCAL_IP": "127.0.0.1",  # Spark binds to loopback only
}
os.environ.update(AIRFLOW_ENV)
(_HOME / "dags").mkdir()
AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))


def pg_connection_env(db: Any, conn_id: str = "cdc_postgres_default") -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` for the test database ``db`` (the ``pg_db`` fixture)."""
    server = db.server
    conn = {
        "conn_type": "cdcpostgres",
        "host": server.host,
        "port": server.port,
        "login": server.superuser,
        "password": server.password,
        "schema": db.name,
    }
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn)}


class AirflowCli:
    """Runs the ``airflow`` CLI against the session's AIRFLOW_HOME with extra environment."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, **AIRFLOW_ENV, **(env or {})}
        full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env.get('PATH', '')}"
        return subprocess.run(
            [AIRFLOW_BIN, *args],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
        )

    def popen_dags_test(
        self, dag_id: str, *, env: dict[str, str], dags_folder: Path
    ) -> subprocess.Popen[str]:
        """Start ``airflow dags test`` in the background (stdout and stderr merged)."""
        full_env = {**os.environ, **AIRFLOW_ENV, **env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder)}
        full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env.get('PATH', '')}"
        return subprocess.Popen(
            [AIRFLOW_BIN, "dags", "test", dag_id],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.home,
            stdin=subprocess.DEVNULL,
        )

    def dags_test(
        self,
        dag_id: str,
        conf: dict[str, Any] | None = None,
        *,
        env: dict[str, str] | None = None,
        dags_folder: Path | None = None,
        expect: str = "success",
    ) -> str:
        """Run ``airflow dags test`` and assert the run ends in state ``expect``; returns the output."""
        args = ["dags", "test", dag_id]
        if conf is not None:
            args += ["-c", json.dumps(conf)]
        extra = dict(env or {})
        if dags_folder is not None:
            extra["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
        proc = self.run(*args, env=extra)
        out = proc.stdout + proc.stderr
        state = run_state(out)
        assert state == expect, (
            f"dag run ended {state!r} (exit {proc.returncode}), expected {expect!r}:\n{out[-6000:]}"
        )
        return out


def run_state(output: str) -> str | None:
    """The final DagRun state printed by ``airflow dags test``."""
    for line in reversed(output.splitlines()):
        if "DagRun Finished" in line and "state=" in line:
            return line.split("state=", 1)[1].split(",", 1)[0].strip()
    return None


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[Path]:
    """The migrated private AIRFLOW_HOME (SQLite metadata DB)."""
    proc = AirflowCli(_HOME).run("db", "migrate", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield _HOME
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture
def airflow_cli(airflow_home: Path) -> AirflowCli:
    return AirflowCli(airflow_home)


def write_dag(folder: Path, pipeline: Path, **options: Any) -> Path:
    """A DAG file in ``folder`` building the factory DAG for ``pipeline`` (options as keyword arguments)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"dag_{pipeline.stem}.py"
    path.write_text(
        "from airflow_cdc.airflow.dag_factory import cdc_dag\n"
        f"dag = cdc_dag({str(pipeline)!r}, **{options!r})\n"
    )
    return path
