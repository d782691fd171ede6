"""Reduce a table's actions to the newest per key, the one source row per key MERGE needs.

The fold keeps one action of each key (a backlog of updates holds several per key), so it runs
on the staged values where it can and converts only the actions it keeps to silver's types
(``frames.StagedValues``): converting a value is a pure function of it, so converting after the
fold is the same as before it.  The TOAST fill compares values in silver's types and reads
silver's rows, so a batch that may list unchanged-TOAST columns is converted first (as is a
batch of several staged schemas: one column may hold values of several staged types).
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession

from . import frames, silver, toast
from .staged import StagedTable


def newest(
    spark: SparkSession, frame: frames.TableFrame, tombstones: str, stored: str | None
) -> tuple[DataFrame, DataFrame]:
    """The actions that count and the newest of them per key, in silver's types.

    The actions that count are the batch's actions not older than a stored delete of their key
    or a stored truncate (``tombstones``), with unchanged-TOAST values filled (``toast.py``;
    ``stored``: the silver table, ``None`` while it has no rows).  Those are in silver's types
    when the batch may list unchanged-TOAST columns, else with values as staged (keys, positions
    and kinds are always in silver's types: what the tombstones take from them).
    """
    keys = frame.keys
    if frame.staged is not None:  # no unchanged-TOAST values: nothing to fill
        actions = silver.drop_superseded(spark, frame.staged.actions, tombstones, keys)
        # where every action is an upsert, the fold need not carry the constant kind of each
        folded = actions.drop(frames.ACTION) if frame.staged.upserts_only else actions
        return actions, frame.staged.convert(frames.latest_per_key(folded, keys))
    actions = silver.drop_superseded(spark, frame.actions, tombstones, keys)
    rows = spark.read.format("delta").load(stored) if stored is not None else None
    actions = toast.fill_unavailable(replace(frame, actions=actions), rows)
    return actions, frames.latest_per_key(actions, keys)


def has_deletes(table: StagedTable, frame: frames.TableFrame) -> bool:
    """Whether an action of the batch removes a key: from the staged op counts and key columns
    where they tell (``StagedTable.removes_keys``: no Spark job), else by a scan of the actions."""
    known = table.removes_keys()
    return frames.has_deletes(frame) if known is None else known
