"""The operators where Airflow and Spark share only an object store: S3 credentials from an
Airflow ``aws`` Connection (``aws_conn_id``), and apply as a Spark Connect client chosen by the
pipeline's ``spark.remote`` or by a ``spark_connect`` Connection."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_cdc.airflow.operators.apply import CdcApplyOperator
from airflow_cdc.airflow.operators.capture import CdcCaptureOperator
from airflow_cdc.core.batch import Batch
from airflow_cdc.testing.s3proxy import S3ProxyServer, s3proxy_jar
from tests.airflow.support import direct_props, load_shop, write_pipeline


@pytest.fixture(scope="module")
def s3() -> Iterator[S3ProxyServer]:
    if s3proxy_jar() is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    with S3ProxyServer() as server:
        yield server


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)


def _context() -> dict[str, Any]:
    return {"dag_run": type("Run", (), {"conf": {}})(), "params": {}}


def test_aws_connection_is_the_only_source_of_s3_credentials(pg_db, tmp_path, s3, no_aws_env, monkeypatch):
    load_shop(pg_db)
    bucket = s3.make_bucket()
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_TEST_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3.access_key,
                "password": s3.secret_key,
                "extra": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
            }
        ),
    )
    props = direct_props(
        pg_db,
        tmp_path / "unused",
        **{"staging.path": f"s3a://{bucket}/staging", "state.store": str(tmp_path / "state")},
    )
    path = write_pipeline(tmp_path / "p.yaml", props, {"aws_conn_id": "cdc_test_s3"})
    masked: list[str] = []
    monkeypatch.setattr("airflow_cdc.airflow.storage.mask_secret", masked.append)
    captured = CdcCaptureOperator(task_id="capture", pipeline=str(path)).execute(_context())
    assert captured["batch_path"].startswith("s3://") and Batch(captured["batch_path"]).manifest["counts"]
    assert s3.secret_key in masked and s3.access_key in masked
    # the apply job (spark-submit or a Connect client) inherits them with the task's environment
    seen: dict[str, Any] = {}
    monkeypatch.setattr(
        "airflow_cdc.airflow.operators.apply.run_apply_job", lambda job, **kw: seen.update(job=job)
    )
    CdcApplyOperator(
        task_id="apply",
        pipeline=str(path),
        batch_path=captured["batch_path"],
        target=f"s3a://{bucket}/delta",
        spark_remote="sc://127.0.0.1:15002",
    ).execute({})
    job = seen["job"]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == s3.secret_key
    assert s3.secret_key not in " ".join(job.command()) and s3.secret_key not in json.dumps(job.conf)


def test_missing_aws_connection_names_it(pg_db, tmp_path, no_aws_env):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    path = write_pipeline(tmp_path / "p.yaml", props, {"aws_conn_id": "no_such_conn"})
    with pytest.raises(Exception, match="aws_conn_id 'no_such_conn'"):
        CdcCaptureOperator(task_id="capture", pipeline=str(path)).execute(_context())


def test_apply_through_spark_connect_from_connection_or_pipeline(pg_db, tmp_path, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    batch = CdcCaptureOperator(task_id="capture", pipeline=props).execute(_context())["batch_path"]
    jobs: list[Any] = []
    monkeypatch.setattr(
        "airflow_cdc.airflow.operators.apply.run_apply_job", lambda job, **kw: jobs.append(job)
    )
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, ctx: jobs.append("spark-submit"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_CONNECT",
        json.dumps(
            {"conn_type": "spark_connect", "host": "spark.internal", "port": 15002, "password": "tok-123"}
        ),
    )
    target = str(tmp_path / "delta")
    CdcApplyOperator(task_id="a1", batch_path=batch, target=target, conn_id="cdc_connect").execute({})
    assert jobs[-1].remote == "sc://spark.internal:15002/;token=tok-123"
    assert "tok-123" not in " ".join(jobs[-1].command()) and jobs[-1].env["SPARK_REMOTE"] == jobs[-1].remote
    assert jobs[-1].jars is None and jobs[-1].packages is None  # nothing for a JVM on the worker
    # the pipeline's spark.remote, with the lease held
    CdcApplyOperator(
        task_id="a2", batch_path=batch, target=target, pipeline={**props, "spark.remote": "sc://other:15002"}
    ).execute({})
    assert jobs[-1].remote == "sc://other:15002" and "--fence" in jobs[-1].application_args
    # a Spark master Connection: spark-submit as before
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    CdcApplyOperator(task_id="a3", batch_path=batch, target=target, conn_id="spark_local").execute({})
    assert jobs[-1] == "spark-submit"
