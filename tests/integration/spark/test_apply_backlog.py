"""A backlog of batches applied as one (``apply_batches``) gives, on every column of silver and the
tombstones, what applying them one by one gives: random change sequences (snapshot rows, inserts,
updates, unsent TOAST values, deletes, re-inserts, key changes, a truncate) cut into batches, with
batches applied out of order first, a crash between a stretch's write and its marks, and a second
run; SCD type 2 history (applied batch by batch inside the backlog) still matches its model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from airflow_cdc.apply.applied import missing_tables
from airflow_cdc.core.batch import Batch
from spark_jobs.cdc_apply import job
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch, apply_batches
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.spark import support
from tests.integration.spark.history_model import Model, random_events
from tests.integration.spark.test_history import (
    CONNECTOR,
    SETTINGS,
    TABLE,
    _diff,
    history_rows,
    write_batches,
)
from tests.integration.spark.test_history import silver_rows as model_view

pytestmark = pytest.mark.spark


def every_row(spark, target: str, layer: str) -> list[tuple]:
    """Every row of a layer's table, every column (sorted; a duplicate row counts)."""
    return support.every_row(spark, table_path(target, layer, CONNECTOR, TABLE))


def _marks_missing(target: str, staged: list[Path], settings: ApplySettings) -> list[str]:
    missing = []
    for path in staged:
        missing += missing_tables(Batch(path), target, settings.bronze, settings.history)
    return missing


def _crash_before_marks(spark, monkeypatch, staged: list[Path], target: str, settings) -> None:
    """Apply the backlog up to its first stretch's silver write and stop there (as a SIGKILL
    would): the other batches of that stretch are left unmarked."""
    with support.crash_at(monkeypatch, job, "apply_before_stretch_marks"):
        apply_batches(spark, [str(p) for p in staged], target, settings)


def assert_same_effect(spark, got_target: str, want: dict[str, list[tuple]]) -> None:
    """Silver equal on every column; tombstones with the same effect.  A tombstone stops an older
    upsert of its key arriving later: one left by a delete that a newer action of the key followed
    is only written when the two land in different writes, and is void while silver holds the key
    at a newer position (batch by batch, a delete and a re-insert in one batch leave none either)."""
    got = every_row(spark, got_target, "silver")
    assert got == want["silver"], f"silver: {_diff(want['silver'], got)}"
    stones = every_row(spark, got_target, "tombstones")  # (__position, __truncate, id)
    assert set(stones) <= set(want["tombstones"]), _diff(want["tombstones"], stones)
    newest = {r[0]: r[1] for r in _silver_positions(spark, got_target)}
    for position, truncate, key in set(want["tombstones"]) - set(stones):
        assert not truncate and key in newest and newest[key] > position, (key, position)


def _assert_created_by_one_commit(target: str, report: dict, settings: ApplySettings) -> None:
    """The first stretch into the new silver table is one commit: the table's metadata (with the
    job's properties), its rows and the marks of every batch of the stretch."""
    stretches = report["tables"][TABLE].get("stretches", [report["tables"][TABLE]])
    log = Path(table_path(target, "silver", CONNECTOR, TABLE)) / "_delta_log"
    actions = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    kinds = {next(iter(a)) for a in actions}
    assert {"metaData", "protocol", "add", "txn", "commitInfo"} <= kinds, kinds
    configuration = next(a["metaData"]["configuration"] for a in actions if "metaData" in a)
    assert configuration["delta.columnMapping.mode"] == "name"
    assert configuration["delta.enableTypeWidening"] == "true"
    assert configuration.get("delta.enableDeletionVectors", "false") == str(settings.deletion_vectors).lower()
    assert sum("txn" in a for a in actions) == stretches[0].get("batches", 1), actions
    assert next(a["commitInfo"] for a in actions if "commitInfo" in a)["operation"] == "WRITE"


def _silver_positions(spark, target: str) -> list[tuple]:
    frame = spark.read.format("delta").load(table_path(target, "silver", CONNECTOR, TABLE))
    return [(r["id"], bytes(r["__position"])) for r in frame.select("id", "__position").collect()]


@pytest.mark.parametrize(
    ("seed", "settings"),
    [
        (11, ApplySettings()),
        (12, ApplySettings(rewrite_ratio=0, deletion_vectors=True, bronze=False)),
    ],
    ids=["default", "merge-vectors"],
)
def test_backlog_applies_as_batch_by_batch(spark, tmp_path, monkeypatch, seed, settings):
    rng = random.Random(seed)
    events = random_events(seed, n=300, keys=40)
    staged = write_batches(tmp_path / "staging", events, 5, rng)
    one_by_one = str(tmp_path / "one-by-one")
    for path in staged:
        apply_batch(spark, str(path), one_by_one, settings)
    want = {layer: every_row(spark, one_by_one, layer) for layer in ("silver", "tombstones")}
    assert len(want["silver"]) > 5 and len(want["tombstones"]) > 1
    assert model_view(spark, one_by_one) == Model().apply(events).current_rows()  # the independent model
    batch_ids = {json.loads((p / "manifest.json").read_text())["batch_id"] for p in staged}
    silver = spark.read.format("delta").load(table_path(one_by_one, "silver", CONNECTOR, TABLE))
    assert {r[0] for r in silver.select("__batch_id").collect()} <= batch_ids

    # all at once, then once more (nothing to do)
    at_once = str(tmp_path / "at-once")
    report = apply_batches(spark, [str(p) for p in staged], at_once, settings)
    assert report["tables"][TABLE]["batches"] == len(staged), report
    assert_same_effect(spark, at_once, want)
    assert not _marks_missing(at_once, staged, settings)
    _assert_created_by_one_commit(at_once, report, settings)
    again = apply_batches(spark, [str(p) for p in staged], at_once, settings)
    assert {t.get("silver") for t in again["tables"][TABLE]["stretches"]} == {"already applied"}, again
    if settings.rewrite_ratio == 0:
        # older batches replayed one by one, newest first: no deleted key comes back
        for path in (staged[1], staged[0]):
            apply_batch(spark, str(path), at_once, settings)
        assert_same_effect(spark, at_once, want)
        return

    # a middle batch applied alone first, then the backlog with a crash before a stretch's marks
    # (the batches it wrote stay unmarked), then the backlog again
    mixed = str(tmp_path / "mixed")
    apply_batch(spark, str(staged[2]), mixed, settings)
    _crash_before_marks(spark, monkeypatch, staged, mixed, settings)
    assert _marks_missing(mixed, staged[:1], settings) and not _marks_missing(mixed, staged[1:3], settings)
    report = apply_batches(spark, [str(p) for p in staged], mixed, settings)
    ways = [t.get("batches", 1) for t in report["tables"][TABLE]["stretches"]]
    # [0: its mark did not land] [1: marked by the crashed stretch's write] [2: applied alone] [3 4]
    assert ways == [1, 1, 1, 2], report
    assert not _marks_missing(mixed, staged, settings)
    assert_same_effect(spark, mixed, want)


def test_history_tables_in_a_backlog_match_the_model(spark, tmp_path):
    """History tables are applied batch by batch inside the backlog: still the model's history."""
    events = random_events(5, n=160)
    staged = write_batches(tmp_path / "staging", events, 3, random.Random(5))
    target = str(tmp_path / "lake")
    report = apply_batches(spark, [str(p) for p in staged], target, SETTINGS)
    assert len(report["tables"][TABLE]["stretches"]) == len(staged)
    model = Model().apply(events)
    got = history_rows(spark, target)
    assert got == model.rows(), _diff(model.rows(), got)
    assert model_view(spark, target) == model.current_rows()
    assert not _marks_missing(target, staged, SETTINGS)
