"""Deletion vectors by default (``delta.deletion.vectors.enabled``): new silver and tombstone
tables get them and their MERGEs write vectors instead of copying files; ``false`` creates tables
without them; a table keeps what it was created with whatever the setting says later.  Rows are
checked against the independent model in every case (random inserts, updates, unsent TOAST values,
deletes, re-inserts, key changes and a truncate, in 4 batches)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.spark import support
from tests.integration.spark.history_model import Model, random_events
from tests.integration.spark.test_history import CONNECTOR, TABLE, write_batches
from tests.integration.spark.test_history import silver_rows as model_view

pytestmark = pytest.mark.spark

VECTORS = "delta.enableDeletionVectors"
#: always MERGE (no rewrite of small tables), no bronze: the writes whose protocol is checked
DEFAULT = ApplySettings(rewrite_ratio=0, bronze=False)
OPT_OUT = ApplySettings(rewrite_ratio=0, bronze=False, deletion_vectors=False)
#: Delta's operation metrics of vectors written: MERGE's, then DELETE's and UPDATE's
WRITTEN = (
    "numTargetDeletionVectorsAdded",
    "numTargetDeletionVectorsUpdated",
    "numDeletionVectorsAdded",
    "numDeletionVectorsUpdated",
)


def _has_vectors(path: str) -> bool:
    """Whether the table at ``path`` has deletion vectors on: the property, and the protocol's
    reader and writer feature (reader version 3, writer version 7)."""
    state = delta_log.replay(path)
    protocol = state.protocol
    readable = "deletionVectors" in (protocol.get("readerFeatures") or [])
    writable = "deletionVectors" in (protocol.get("writerFeatures") or [])
    enabled = state.configuration.get(VECTORS, "false") == "true"
    assert readable == writable == enabled, (protocol, state.configuration)
    assert (protocol["minReaderVersion"], protocol["minWriterVersion"]) == (3, 7), protocol
    return enabled


def _commit_infos(path: str) -> list[dict]:
    fs, local = delta_log.filesystem(path)
    versions = range(delta_log.replay(path).version + 1)
    actions = [delta_log._actions(fs, f"{local}/_delta_log/{v:020d}.json") for v in versions]
    return [a["commitInfo"] for commit in actions for a in commit if "commitInfo" in a]


def _vectors_written(path: str) -> int:
    """Deletion vectors the table's MERGE, DELETE and UPDATE commits added or updated."""
    total = 0
    for info in _commit_infos(path):
        metrics = info.get("operationMetrics") or {}
        total += sum(int(metrics.get(name, 0)) for name in WRITTEN)
    return total


def _rows_copied(path: str) -> int:
    """Unchanged rows the table's MERGEs copied into new files."""
    infos = _commit_infos(path)
    return sum(int((i.get("operationMetrics") or {}).get("numTargetRowsCopied", 0)) for i in infos)


def _apply(
    spark,
    tmp_path,
    seed: int,
    settings: list[ApplySettings],
    after_first: Callable[[str], None] | None = None,
    stones_first: bool = True,
) -> tuple[str, str]:
    """Apply a random change sequence in ``len(settings)`` batches, each with its settings (and
    ``after_first`` on the silver path after the first); check silver against the model; return
    the silver and tombstone paths.  ``stones_first``: the first batch has deletes, so it creates
    the tombstone table too, with its settings."""
    rng = random.Random(seed)
    events = random_events(seed, n=300, keys=40)
    staged = write_batches(tmp_path / "staging", events, len(settings), rng)
    target = str(tmp_path / "lake")
    silver = table_path(target, "silver", CONNECTOR, TABLE)
    stones = table_path(target, "tombstones", CONNECTOR, TABLE)
    for batch, these in zip(staged, settings, strict=True):
        apply_batch(spark, str(batch), target, these)
        assert delta_log.table_exists(silver) and delta_log.table_exists(stones) >= stones_first
        if after_first is not None and batch == staged[0]:
            after_first(silver)
    assert model_view(spark, target) == Model().apply(events).current_rows()
    return silver, stones


def test_new_silver_and_tombstone_tables_have_deletion_vectors_by_default(spark, tmp_path):
    assert ApplySettings().deletion_vectors
    silver, stones = _apply(spark, tmp_path, 21, [DEFAULT] * 4)
    assert _has_vectors(silver) and _has_vectors(stones)
    operations = [i["operation"] for i in _commit_infos(silver)]
    assert operations.count("MERGE") >= 2, operations
    # the MERGEs (the one-scan one and Delta's, for the batches with unsent TOAST values) mark
    # superseded rows in vectors instead of copying the rest of their files
    assert _vectors_written(silver) > 0 and _rows_copied(silver) == 0
    assert _vectors_written(stones) > 0 and _rows_copied(stones) == 0  # a newer delete of a key


@pytest.fixture(scope="module")
def opted_out(spark, tmp_path_factory) -> tuple[str, str]:
    """Tables the opt-out created (the first batch has deletes: both tables), then 3 batches with
    the default setting.  One table set for two tests: the opt-out's (the setting only picks a new
    table's properties, so these MERGEs are the ones an all-opt-out run makes) and the
    created-without case of ``test_a_table_keeps_what_it_was_created_with``."""
    return _apply(spark, tmp_path_factory.mktemp("opted_out"), 21, [OPT_OUT] + [DEFAULT] * 3)


def test_opt_out_creates_tables_without_deletion_vectors(opted_out):
    silver, stones = opted_out
    assert not _has_vectors(silver) and not _has_vectors(stones)
    assert _vectors_written(silver) == 0 and _rows_copied(silver) > 0  # files copied instead
    assert _vectors_written(stones) == 0 and _rows_copied(stones) > 0
    assert not any(delta_log.replay(silver).deleted.values())


@pytest.mark.parametrize(
    ("created", "later"),
    [(OPT_OUT, DEFAULT), (DEFAULT, OPT_OUT)],
    ids=["created-without-stays-without", "created-with-stays-with"],
)
def test_a_table_keeps_what_it_was_created_with(request, spark, tmp_path, created, later):
    """The setting applies to tables the job creates: an existing table's protocol is never
    upgraded (older readers keep reading it) nor its vectors turned off."""
    if created is OPT_OUT:  # the opt-out's tables: created without, then 3 default batches
        silver, stones = request.getfixturevalue("opted_out")
    else:
        silver, stones = _apply(spark, tmp_path, 22, [created, later, later])
    assert _has_vectors(silver) is created.deletion_vectors
    assert _has_vectors(stones) is created.deletion_vectors


def test_vectors_turned_on_for_an_existing_table_then_purged(spark, tmp_path):
    """What the docs tell an operator to run: ``SET TBLPROPERTIES`` on a table created without
    vectors makes the next batches write them (the setting still says no); ``REORG TABLE ...
    APPLY (PURGE)`` rewrites every file that has one (here after a DELETE), rows unchanged."""

    def turn_on(path: str) -> None:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{VECTORS}' = true)")

    silver, stones = _apply(spark, tmp_path, 22, [OPT_OUT] * 4, turn_on, stones_first=False)
    assert _has_vectors(silver) and not _has_vectors(stones)
    assert _vectors_written(silver) > 0 and _rows_copied(silver) == 0
    spark.sql(f"DELETE FROM delta.`{silver}` WHERE id % 2 = 0")  # the batches' truncate left one file
    rows = support.every_row(spark, silver)
    assert any(delta_log.replay(silver).deleted.values()), "nothing to purge"
    spark.sql(f"REORG TABLE delta.`{silver}` APPLY (PURGE)")
    assert not any(delta_log.replay(silver).deleted.values())
    assert support.every_row(spark, silver) == rows
