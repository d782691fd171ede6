"""What a failed apply says: interrupted (re-run apply) vs damaged batch vs job error vs fenced."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.apply.submit import SparkApplyJob, apply_exit_error, run_apply_job
from airflow_cdc.core.errors import (
    ApplyFailed,
    ApplyInterrupted,
    BatchError,
    LeaseLost,
    SchemaError,
)
from spark_jobs.cdc_apply.staged import StagedBatch, StagedBatchError
from tests.unit.core.test_batch import _write

BATCH = "20261123T000000000000Z-abcdef"


@pytest.mark.parametrize(
    ("code", "kind", "says"),
    [
        (-signal.SIGKILL, ApplyInterrupted, "killed by SIGKILL (out of memory or killed by an operator)"),
        (128 + signal.SIGKILL, ApplyInterrupted, "killed by SIGKILL"),
        (-signal.SIGTERM, ApplyInterrupted, "killed by SIGTERM"),
        (143, ApplyInterrupted, "killed by SIGTERM"),
        (3, BatchError, "is damaged"),
        (4, SchemaError, "changes a column type"),
        (5, LeaseLost, "newer run"),
        (1, ApplyFailed, "exited with code 1"),
    ],
)
def test_exit_codes_say_what_happened(code, kind, says):
    err = apply_exit_error(code, BATCH)
    assert type(err) is kind and says in str(err) and BATCH in str(err)
    if kind is ApplyInterrupted:
        assert err.retryable and f"re-run apply for batch {BATCH}" in err.hint and "idempotent" in err.hint
        assert "damaged" not in str(err) and "capture" not in str(err)


def _fake_spark(tmp_path: Path, monkeypatch, body: str) -> SparkApplyJob:
    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    script = home / "bin" / "spark-submit"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    return SparkApplyJob(
        "apply_changes.py", ["--batch", f"/staging/c/batches/{BATCH}", "--target", "/d"], {}, "n"
    )


def test_sigkilled_spark_submit_is_interrupted_not_damaged(tmp_path, monkeypatch):
    job = _fake_spark(tmp_path, monkeypatch, "kill -9 $$")
    with pytest.raises(ApplyInterrupted) as err:
        run_apply_job(job)
    assert "interrupted" in str(err.value) and f"re-run apply for batch {BATCH}" in str(err.value)
    assert "damaged" not in str(err.value)


def test_job_exit_codes_reach_the_caller(tmp_path, monkeypatch):
    with pytest.raises(BatchError, match="is damaged"):
        run_apply_job(_fake_spark(tmp_path, monkeypatch, "exit 3"))
    with pytest.raises(ApplyFailed, match="exited with code 1"):
        run_apply_job(_fake_spark(tmp_path / "x", monkeypatch, "exit 1"))


class _Lease:
    lost: LeaseLost | None = None


def test_lost_lease_stops_the_job(tmp_path, monkeypatch):
    job = _fake_spark(tmp_path, monkeypatch, "exec sleep 60")
    lease = _Lease()
    threading.Timer(0.3, lambda: setattr(lease, "lost", LeaseLost("taken over"))).start()
    started = time.monotonic()
    with pytest.raises(LeaseLost, match="taken over"):
        run_apply_job(job, lease=lease)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10


def test_unreadable_part_is_damaged_before_any_write(tmp_path):
    path = _write(tmp_path).finish({})
    StagedBatch(str(path)).verify_parts()
    part = next(Path(path).rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-20])  # truncated: the footer is gone
    with pytest.raises(StagedBatchError, match="missing or unreadable"):
        StagedBatch(str(path)).verify_parts()
    pq.write_table(pa.table({"x": [1]}), part)  # readable, but not the rows the manifest lists
    with pytest.raises(StagedBatchError, match="has 1 rows"):
        StagedBatch(str(path)).verify_parts()
