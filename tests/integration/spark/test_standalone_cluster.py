"""The apply job on a real Spark standalone cluster: a master and a worker started on loopback from
the installed PySpark (``spark-class ...Master`` / ``...Worker``), the batch applied by
``airflow-cdc apply --master spark://...`` with its tasks on the worker's executor, then
``airflow-cdc verify`` compares silver with the source.  The staging directory and the Delta root
are shared paths (the same machine), as they would be on shared storage.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.cdc_apply.layout import JARS_ENV
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.test_apply_basic import _exec

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _state(web: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web}/json/", timeout=5) as r:
        return dict(json.load(r))


def _daemon(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A standalone master and one worker (1 core, 1 GiB); yields (master URL, master web port)."""
    port, web = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _daemon(
        [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(web)],
        tmp_path / "master.log",
    )  # fmt: skip
    worker = _daemon(
        [_spark_class(), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
         "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(tmp_path / "work")],
        tmp_path / "worker.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if [w for w in _state(web).get("workers", []) if w.get("state") == "ALIVE"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or master.poll() is not None or worker.poll() is not None:
                logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
                raise AssertionError(f"the standalone cluster did not come up: {logs}")
            time.sleep(0.5)
        yield url, web
    finally:
        for proc in (worker, master):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (worker, master):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(tmp_path / "work", ignore_errors=True)


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {JARS_ENV: str(REPO / ".jars"), **os.environ}
    return subprocess.run(
        [sys.executable, "-m", "airflow_cdc.cli", *args], capture_output=True, timeout=900, env=env
    )


def test_apply_runs_on_a_standalone_cluster(cluster: tuple[str, int], pg_db: Any, tmp_path: Path) -> None:
    """One batch of inserts, updates, deletes and key changes (no snapshot: one spark-submit)."""
    url, web = cluster
    _exec(
        pg_db,
        "CREATE TABLE c (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, tags text[])",
    )
    config = pipeline(
        pg_db, tmp_path / "staging", **{"delta.root": str(tmp_path / "lake"), "snapshot.mode": "no_data"}
    )
    run_capture(config)  # stores the start: the changes below are the batch
    _exec(
        pg_db,
        "INSERT INTO c SELECT g, 'n' || g, g * 1.25, timestamptz '2024-01-01' + g * interval '1 minute',"
        " ARRAY['a' || g, NULL] FROM generate_series(1, 3000) g",
        "UPDATE c SET amount = amount + 1, tags = NULL WHERE id % 7 = 0",
        "DELETE FROM c WHERE id % 11 = 0",
        "UPDATE c SET id = id + 10000 WHERE id % 13 = 0",  # key changes
    )
    run_capture(config, commit=False)
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    executor = ["--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=1"]
    done = _cli("apply", "--config", str(path), "--commit", "--master", url, *executor)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    text = done.stdout.decode()
    out = json.loads(text[text.rindex("\n{") + 1 :])  # our summary follows the job's own output
    assert len(out["applied"]) == 2 and len(out["without_spark"]) == 1, out  # the start's empty batch
    apps = [
        a
        for a in _state(web).get("completedapps", [])
        if str(a.get("name", "")).startswith("airflow-cdc-apply")
    ]
    assert len(apps) == 1 and apps[0].get("cores", 0) >= 1, apps  # its tasks ran on the worker's executor
    check = _cli("verify", "--config", str(path))
    assert check.returncode == 0, check.stderr.decode()[-4000:]
    report = json.loads(check.stdout)
    assert report["ok"] and report["tables"]["public.c"]["source_rows"] == 3000 - 3000 // 11, report
