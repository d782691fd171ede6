"""Turn a staged table's events into key actions in natural Spark types.

Every event becomes one or two *actions* on a key: ``upsert`` (c, u, r: the after image),
``delete`` (d: the before key; and u whose key changed: the old key).  Truncates are returned
separately (their positions); ``m`` messages never reach a table.  Schema versions inside one
batch are read group by group and unified by name onto the widest types, so a batch that spans an
``ALTER TABLE`` reads as one frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .staged import SchemaGroup, StagedTable
from .types import Natural, natural, wider

POSITION = "__position"
ACTION = "__action"
OP = "__op"
TS_MS = "__ts_ms"
UNAVAILABLE = "__unavailable"
BATCH = "__batch_id"
DELETED = "__deleted"
META = (POSITION, OP, TS_MS, BATCH)


def quoted(name: str) -> str:
    """A column reference Spark never splits on dots: backticks, inner backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


class SchemaChangeError(RuntimeError):
    """A column changed type in a way Delta cannot take (checked before anything is written)."""


@dataclass
class TableFrame:
    """The actions of one table in one batch, and the silver columns they carry."""

    actions: DataFrame
    columns: dict[str, T.DataType]
    keys: list[str]
    truncate_at: bytes | None
    toast: bool = True
    events: int = 0  # staged events of the table in this batch


def silver_columns(table: StagedTable) -> tuple[dict[str, T.DataType], dict[int, dict[str, Natural]]]:
    """Column -> widest natural type over the batch's schema versions, plus per-group conversions."""
    columns: dict[str, T.DataType] = {}
    per_group: dict[int, dict[str, Natural]] = {}
    for i, field in table.after_fields():
        nat = natural(field)
        per_group.setdefault(i, {})[field.name] = nat
        columns[field.name] = (
            wider(columns[field.name], nat.spark_type) if field.name in columns else nat.spark_type
        )
    return columns, per_group


def _image(group: dict[str, Natural], columns: dict[str, T.DataType], side: str) -> list[Column]:
    out = []
    for name, spark_type in columns.items():
        if name in group:
            value = group[name].convert(F.col(side).getField(name))
        else:
            value = F.lit(None)
        out.append(value.cast(spark_type).alias(name))
    return out


def _group_actions(
    spark: SparkSession,
    group: SchemaGroup,
    conv: dict[str, Natural],
    columns: dict[str, T.DataType],
    keys: list[str],
    removes: bool,
) -> DataFrame:
    events = spark.read.parquet(*group.files).where(F.col("op").isin("c", "u", "r", "d"))
    meta = [F.col("__position").alias(POSITION), F.col("op").alias(OP), F.col("ts_ms").alias(TS_MS)]
    unavailable = (
        F.coalesce(F.col("__unavailable"), F.array().cast("array<string>"))
        if "__unavailable" in group.schema.names
        else F.array().cast("array<string>")
    )
    after = events.where(F.col("op") != "d").select(
        F.lit("upsert").alias(ACTION), *meta, unavailable.alias(UNAVAILABLE), *_image(conv, columns, "after")
    )
    if not removes:
        return after
    removed = events.where(
        (F.col("op") == "d") | ((F.col("op") == "u") & F.col("before").isNotNull() & _key_changed(conv, keys))
    ).select(
        F.lit("delete").alias(ACTION),
        *meta,
        F.array().cast("array<string>").alias(UNAVAILABLE),
        *_image(conv, columns, "before"),
    )
    return after.unionByName(removed.select(*after.columns))


def _key_changed(conv: dict[str, Natural], keys: list[str]) -> Column:
    if not keys:
        return F.lit(False)
    changed = [
        ~conv[k].convert(F.col("before").getField(k)).eqNullSafe(conv[k].convert(F.col("after").getField(k)))
        for k in keys
        if k in conv
    ]
    out = changed[0]
    for c in changed[1:]:
        out = out | c
    return out


def table_frame(spark: SparkSession, table: StagedTable, truncates: list[bytes]) -> TableFrame:
    """All key actions of ``table`` in this batch, unified to one schema, later than any truncate."""
    columns, per_group = silver_columns(table)
    frames = [
        _group_actions(spark, group, per_group.get(i, {}), columns, table.key_columns, table.may_remove)
        for i, group in enumerate(table.groups)
    ]
    actions = frames[0]
    for frame in frames[1:]:
        actions = actions.unionByName(frame)
    truncate_at = max(truncates) if truncates else None
    if truncate_at is not None:
        actions = actions.where(F.col(POSITION) > F.lit(truncate_at))
    return TableFrame(actions, columns, table.key_columns, truncate_at, table.toast, table.rows)


def truncate_positions(spark: SparkSession, table: StagedTable) -> list[bytes]:
    """Positions of the table's truncate events in this batch (read only when the manifest has some)."""
    if not table.ops.get("t"):
        return []
    files = [f for g in table.groups for f in g.files]
    rows = spark.read.parquet(*files).where(F.col("op") == "t").select("__position").collect()
    return [bytes(r[0]) for r in rows]


def has_deletes(frame: TableFrame) -> bool:
    """Whether any action removes a key (a scan that stops at the first one; no shuffle)."""
    return frame.actions.where(F.col(ACTION) == "delete").limit(1).count() > 0


def fill_unavailable(frame: TableFrame) -> DataFrame:
    """Fill unchanged-TOAST columns from the key's previous action in the same batch.

    A column listed in ``__unavailable`` takes the newest earlier value of that key in this batch;
    where the batch has none, it stays listed, and the MERGE keeps the value already stored.
    """
    actions = frame.actions
    if not frame.toast or actions.where(F.size(UNAVAILABLE) > 0).limit(1).count() == 0:
        return actions
    from pyspark.sql.window import Window  # only needed when a batch has TOAST placeholders

    window = (
        Window.partitionBy(*(F.col(quoted(k)) for k in frame.keys))
        .orderBy(POSITION)
        .rowsBetween(Window.unboundedPreceding, 0)
    )
    still: list[Column] = []
    for name in frame.columns:
        if name in frame.keys:
            continue
        missing = F.array_contains(UNAVAILABLE, name)
        known = F.last(F.when(~missing, F.struct(F.col(quoted(name)).alias("v"))), ignorenulls=True).over(
            window
        )
        slot = f"__known_{len(still)}"
        actions = actions.withColumn(slot, known)
        still.append(F.when(missing & F.col(slot).isNull(), F.lit(name)))
        actions = actions.withColumn(
            name, F.when(missing, F.col(slot).getField("v")).otherwise(F.col(quoted(name)))
        )
    actions = actions.withColumn(UNAVAILABLE, F.filter(F.array(*still), lambda x: x.isNotNull()))
    return actions.drop(*[c for c in actions.columns if c.startswith("__known_")])


def latest_per_key(actions: DataFrame, keys: list[str]) -> DataFrame:
    """Only the newest action per key counts (MERGE needs one source row per target row)."""
    others = [c for c in actions.columns if c not in keys]
    struct = F.struct(*(F.col(quoted(c)) for c in others))
    picked = actions.groupBy(*(F.col(quoted(k)) for k in keys)).agg(
        F.max_by(struct, F.col(POSITION)).alias("__last")
    )
    return picked.select(
        *(F.col(quoted(k)) for k in keys), *[F.col("__last").getField(c).alias(c) for c in others]
    )
