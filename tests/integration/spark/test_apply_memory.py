"""Bounded memory: a batch of wide rows larger than the driver's whole heap applies and verifies.

The apply and the verify run as ``airflow-cdc`` subprocesses (spark-submit for apply) with a
deliberately small driver heap (512 MiB, about Spark's minimum) and otherwise default settings,
so the test is quick yet proves that neither holds the batch, a staged part or a verify chunk in
memory at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply.layout import JARS_ENV
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.test_apply_basic import _exec

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HEAP = "spark.driver.memory=512m"
BLOB_KB = 100
#: a 100 KB text value per row: 16 random hex characters per row repeated (Parquet and TOAST
#: compress it, so the disk stays small; in memory every value is its full 100 KB)
BLOB = f"repeat(md5(g::text || '{{v}}') || md5(g::text), {BLOB_KB * 1024 // 64})"


REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "airflow_cdc.cli", *args]
    env = {JARS_ENV: str(REPO / ".jars"), **os.environ}
    return subprocess.run(cmd, capture_output=True, timeout=900, env=env)


def test_wide_rows_beyond_the_driver_heap_apply_and_verify(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE w (id int PRIMARY KEY, n int, blob text, raw bytea)",
        "ALTER TABLE w ALTER COLUMN blob SET STORAGE EXTERNAL",  # TOASTed uncompressed: quick to decode
        f"INSERT INTO w SELECT g, g, {BLOB.format(v='a')}, decode(md5(g::text), 'hex') "
        "FROM generate_series(1, 1500) g",
    )
    config = pipeline(pg_db, tmp_path / "staging", **{"delta.root": str(tmp_path / "lake")})
    run_capture(config)  # committed before it is applied (as after a lost apply): re-applied below
    _exec(
        pg_db,
        f"UPDATE w SET blob = {BLOB.format(v='b')}, n = -g FROM generate_series(1, 1500) g WHERE id = g",
        f"INSERT INTO w SELECT g, g, {BLOB.format(v='c')}, NULL FROM generate_series(1501, 5200) g",
        "DELETE FROM w WHERE id % 97 = 0",
    )
    run_capture(config, commit=False)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) == 2
    big = batches[1].manifest["tables"]["public.w"]["rows"]
    assert big * BLOB_KB * 1024 > 512 << 20, "the second batch must be larger than the driver heap"
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    done = _cli("apply", "--config", str(path), "--commit", "--conf", HEAP)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    check = _cli("verify", "--config", str(path), "--conf", HEAP)
    (tmp_path / "verify.log").write_bytes(check.stderr)
    assert check.returncode == 0, check.stderr.decode()[-4000:]
    report = json.loads(check.stdout)
    assert report["ok"] and report["tables"]["public.w"]["source_rows"] == 5200 - 5200 // 97, report
