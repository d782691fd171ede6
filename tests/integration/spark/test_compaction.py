"""Silver with deletion vectors and compaction every N batches (``delta.optimize.interval.batches``):
a MERGE rewrites no file, OPTIMIZE runs on schedule, exactly once per due batch even when the
batch is run again after a crash before or after it, and never changes a row."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from spark_jobs.cdc_apply import compaction
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.spark.history_model import Model, random_events
from tests.integration.spark.test_history import CONNECTOR, TABLE, silver_rows, write_batches

pytestmark = pytest.mark.spark


class Killed(Exception):
    pass


def _log(path: str) -> list[list[dict]]:
    """Every commit of the table's log, oldest first."""
    files = sorted((Path(path) / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in f.read_text().splitlines() if line] for f in files]


def _operations(path: str) -> list[str]:
    return [next(a["commitInfo"]["operation"] for a in c if "commitInfo" in a) for c in _log(path)]


def _rows(spark, path: str, version: int | None = None) -> list[tuple]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return sorted(map(tuple, reader.load(path).collect()), key=repr)


def _check_optimize_kept_rows(spark, path: str) -> int:
    """Each OPTIMIZE commit left the rows of the version before it; returns how many ran."""
    ops = _operations(path)
    runs = [v for v, op in enumerate(ops) if op == "OPTIMIZE"]
    for v in runs:
        assert _rows(spark, path, v) == _rows(spark, path, v - 1), f"OPTIMIZE at version {v} changed rows"
    return len(runs)


def test_deletion_vectors_and_compaction_on_schedule(spark, tmp_path, monkeypatch):
    rng = random.Random(5)
    events = random_events(5)
    model = Model().apply(events)
    staged = write_batches(tmp_path / "staging", events, 4, rng)
    target = str(tmp_path / "lake")
    silver = table_path(target, "silver", CONNECTOR, TABLE)
    # always MERGE, with deletion vectors: vectors at work
    settings = ApplySettings(rewrite_ratio=0, optimize_interval=2, deletion_vectors=True)
    killed = []

    def crash_once(name: str) -> None:
        if name == "apply_before_optimize_silver" and not killed:
            killed.append(name)
            raise Killed(name)

    monkeypatch.setattr(compaction, "crash_point", crash_once)
    schedule = []
    for batch in staged:
        try:
            report = apply_batch(spark, str(batch), target, settings)
        except Killed:  # the first due compaction: killed before it, then the batch is run twice
            assert _check_optimize_kept_rows(spark, silver) == 0
            report = apply_batch(spark, str(batch), target, settings)
            assert report["tables"][TABLE]["silver"] == "already applied"
            assert "silver" in report["tables"][TABLE]["compacted"], "a due compaction is done by the re-run"
            schedule.append("re-run")
            report = apply_batch(spark, str(batch), target, settings)
        schedule.append("silver" in report["tables"][TABLE].get("compacted", []))
    # due from batch 2 on, but batches 2 and 3 each leave one file (2's truncate emptied batch 1's
    # file, 3 updated or deleted every row of 2's): batch 4 compacts -- killed, then on its re-run
    assert schedule == [False, False, False, "re-run", False], _operations(silver)
    assert _check_optimize_kept_rows(spark, silver) == 1
    assert silver_rows(spark, target) == model.current_rows()
    merges = [
        info for c in _log(silver) for a in c if (info := a.get("commitInfo", {})).get("operation") == "MERGE"
    ]
    assert len(merges) >= 2
    for info in merges:  # with deletion vectors a MERGE copies no unchanged row into a new file
        assert info["operationMetrics"]["numTargetRowsCopied"] == "0", info["operationMetrics"]
    assert sum(int(i["operationMetrics"]["numTargetDeletionVectorsAdded"]) for i in merges) > 0
    stones = table_path(target, "tombstones", CONNECTOR, TABLE)
    assert _check_optimize_kept_rows(spark, stones) >= 1
