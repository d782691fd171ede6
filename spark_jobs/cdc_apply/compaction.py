"""File compaction of silver and tombstone tables every N batches (``delta.optimize.interval.batches``).

Each batch's MERGE adds a few small files (and, with deletion vectors, replaces the vector of
each file it touched): left alone, a table applied every few minutes ends up with thousands of
small files and reads slow down.  Every ``interval`` batches the job runs Delta's ``OPTIMIZE`` on
the table: it bin-packs the small files and rewrites the files whose deletion vectors hide more
than ``spark.databricks.delta.optimize.maxDeletedRowsRatio`` (5 %) of their rows, purging the
vectors.  The rows and their values are unchanged; readers of older versions keep theirs.

The schedule lives in the table's own log, not in a counter of ours: the distinct batches
(``userMetadata`` of airflow-cdc commits) since the table's newest ``OPTIMIZE``.  So a batch run
again after a crash -- before or after its compaction -- compacts at most once: an ``OPTIMIZE``
that landed resets the count, one that did not is still due.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from .crash import crash_point
from .delta_log import _COMMIT, LogState, _actions, _listing, filesystem, replay, table_exists
from .session import user_set
from .writes import Commit

log = logging.getLogger("airflow_cdc.apply")
OPTIMIZE = "OPTIMIZE"
#: Files below this size are compacted (Delta's default, 1 GiB, rewrites every file of a table
#: under some GiB at each compaction: the whole table, not what the batches since added)
MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
SMALL_FILE = 64 << 20
#: ``spark.databricks.delta.optimize.maxDeletedRowsRatio``'s default: files hiding more are rewritten
DELETED_RATIO = 0.05


def batches_since_optimize(table_path: str, limit: int) -> int:
    """The distinct airflow-cdc batches that wrote ``table_path`` since its newest ``OPTIMIZE``,
    counted newest first up to ``limit`` (commits older than the log's retention are not seen)."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    names = _listing(fs, log_dir)
    versions = sorted((int(m.group(1)) for n in names if (m := _COMMIT.match(n))), reverse=True)
    batches: set[str] = set()
    for version in versions:
        info = _commit_info(_actions(fs, f"{log_dir}/{version:020d}.json"))
        if info.get("operation") == OPTIMIZE:
            break
        batches.update(_batch_ids(info))
        if len(batches) >= limit:
            break
    return len(batches)


def _commit_info(actions: list[dict[str, Any]]) -> dict[str, Any]:
    for action in actions:
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    return {}


def _batch_ids(info: dict[str, Any]) -> list[str]:
    """The batches an airflow-cdc commit wrote (several for a stretch of a backlog)."""
    try:
        ours = json.loads(info.get("userMetadata") or "{}").get("airflow_cdc") or {}
    except (ValueError, AttributeError):
        return []
    if ours.get("batches"):
        return [str(b) for b in ours["batches"]]
    return [] if ours.get("batch_id") is None else [str(ours["batch_id"])]


def compact_all(spark: SparkSession, tables: dict[str, str], interval: int, commit: Commit) -> list[str]:
    """:func:`compact_if_due` for each existing table of ``tables`` (name -> path); returns the
    names of those compacted."""
    if interval <= 0:
        return []
    return [
        name
        for name, path in tables.items()
        if table_exists(path) and compact_if_due(spark, path, interval, commit, name)
    ]


def worthwhile(state: LogState) -> bool:
    """Whether ``OPTIMIZE`` has work: two small files to bin-pack, or a file whose deletion vector
    hides more than Delta's threshold of its rows (it skips bins of one clean file)."""
    small = sum(1 for size in state.sizes.values() if size < SMALL_FILE)
    return small >= 2 or any(
        hidden > DELETED_RATIO * (hidden + (state.files.get(path) or 0))
        for path, hidden in state.deleted.items()
    )


def compact_if_due(
    spark: SparkSession, table_path: str, interval: int, commit: Commit, layer: str = "silver"
) -> bool:
    """``OPTIMIZE`` ``table_path`` when ``interval`` (> 0) batches wrote it since the last one and
    it has work; returns whether it ran.  The commit carries the batch's ``userMetadata`` (and
    lease token).  A due table without work stays due until a batch gives it some."""
    if interval <= 0 or batches_since_optimize(table_path, interval) < interval:
        return False
    if not worthwhile(replay(table_path)):
        return False
    crash_point(f"apply_before_optimize_{layer}")
    target = f"delta.`{table_path.replace('`', '``')}`"
    with _small_files(spark), commit.conf(spark, txn=False):
        metrics = spark.sql(f"OPTIMIZE {target}").collect()[0]["metrics"]
    log.info(
        "compacted %s after %d batches: %s files removed, %s added",
        table_path,
        interval,
        metrics["numFilesRemoved"],
        metrics["numFilesAdded"],
    )
    return bool(metrics["numFilesRemoved"])


@contextmanager
def _small_files(spark: SparkSession) -> Iterator[None]:
    """Compact only files under :data:`SMALL_FILE`, unless the user set Delta's threshold."""
    if user_set(spark, MIN_FILE_SIZE):
        yield
        return
    previous = spark.conf.get(MIN_FILE_SIZE, None)
    spark.conf.set(MIN_FILE_SIZE, str(SMALL_FILE))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(MIN_FILE_SIZE)
        else:
            spark.conf.set(MIN_FILE_SIZE, previous)
