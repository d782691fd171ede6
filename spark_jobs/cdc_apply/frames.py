"""Turn a staged table's events into key actions in natural Spark types.

Every event becomes one or two *actions* on a key: ``upsert`` (c, u, r: the after image),
``delete`` (d: the before key; and, in batches staged before key changes became d + c pairs, u
whose key changed: the old key).  A key change's ``c`` keeps its old key in ``__old_key``.
Truncates are returned separately (their positions); ``m`` messages never reach a table.
Schema versions inside one batch are read group by group and unified by name onto the widest
types, so a batch that spans an ``ALTER TABLE`` reads as one frame.
"""

from __future__ import annotations

from collections.abc import Callable
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
SOURCE_TS = "__source_ts_ms"  # when the change happened in the database (source.ts_ms)
UNAVAILABLE = "__unavailable"
OLD_KEY = "__old_key"  # on the c of a key change: the old key (natural types); see toast.py
BATCH = "__batch_id"
DELETED = "__deleted"
META = (POSITION, OP, TS_MS, BATCH)
MERGED = (ACTION, *META)  # what the silver MERGE reads of an action besides its values


def quoted(name: str) -> str:
    """A column reference Spark never splits on dots: backticks, inner backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


class SchemaChangeError(RuntimeError):
    """A column changed type in a way Delta cannot take (checked before anything is written)."""


@dataclass(frozen=True)
class StagedValues:
    """A frame's actions with the values of non-key columns still as staged, for the fold per
    key: keys, positions, kinds and the columns the MERGE reads (``MERGED``) as in
    :attr:`TableFrame.actions`, no ``__unavailable`` (only for batches without unchanged-TOAST
    values), and the conversion to silver's types.

    Converting is a pure function of each value, so folding these per key and converting only
    the newest actions (:meth:`convert`) gives the same rows as folding converted actions, without
    converting every event of the batch (a backlog of updates holds several per key; ZonedTimestamp
    text and decimals cost most).  Only for batches of one staged schema (one value type per column).
    """

    actions: DataFrame
    conversions: dict[str, Callable[[Column], Column]]
    columns: dict[str, T.DataType]
    #: ``__batch_id`` of :attr:`actions` is an index into these (a 4-byte int, not a batch id per
    #: event, through the fold's sort and shuffle)
    batches: tuple[str, ...] = ()
    #: every action is an upsert: the fold leaves ``__action`` out and :meth:`convert` adds it
    upserts_only: bool = False

    def convert(self, frame: DataFrame) -> DataFrame:
        """``frame`` (derived from :attr:`actions`, same column names; ``__action`` may be left
        out where :attr:`upserts_only`) in silver's types, with the empty ``__unavailable`` of
        every action."""
        out = self._decoded(frame)
        if ACTION not in frame.columns:
            assert self.upserts_only, "the fold left out __action of a frame that removes keys"
            out.append(F.lit("upsert").alias(ACTION))
        return frame.select(*out, F.array().cast("array<string>").alias(UNAVAILABLE))

    def decode(self, frame: DataFrame) -> DataFrame:
        """``frame`` (actions read as :attr:`actions` were, before narrowing to the columns the
        fold carries) with its staged values in silver's types and its batch indexes as batch
        ids: the same rows and columns as reading the actions converted."""
        return frame.select(*self._decoded(frame))

    def _decoded(self, frame: DataFrame) -> list[Column]:
        out = []
        for name in frame.columns:
            value = F.col(quoted(name))
            if name in self.conversions:
                value = self.conversions[name](value).cast(self.columns[name])
            elif name == BATCH and self.batches:
                value = F.element_at(F.array(*(F.lit(b) for b in self.batches)), value + 1)
            out.append(value.alias(name))
        return out


@dataclass
class TableFrame:
    """The actions of one table in one batch, and the silver columns they carry."""

    actions: DataFrame
    columns: dict[str, T.DataType]
    keys: list[str]
    truncate_at: bytes | None
    toast: bool = True
    events: int = 0  # staged events of the table in this batch
    every_action: DataFrame | None = None  # also those before the batch's truncate (history)
    truncates: tuple[tuple[bytes, int | None], ...] = ()  # every truncate: position, source.ts_ms
    staged: StagedValues | None = None  # ``actions`` with values as staged (keyed, one schema, no TOAST)


def all_of(conds: list[Column]) -> Column:
    """The conjunction of ``conds`` (at least one)."""
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


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


def _image(
    group: dict[str, Natural], columns: dict[str, T.DataType], side: str, staged: frozenset[str] = frozenset()
) -> list[Column]:
    """The row image ``side`` in silver's columns; those in ``staged`` keep their staged values."""
    out = []
    for name, spark_type in columns.items():
        if name in staged:
            out.append(F.col(side).getField(name).alias(name))
            continue
        if name in group:
            value = group[name].convert(F.col(side).getField(name))
        else:
            value = F.lit(None)
        out.append(value.cast(spark_type).alias(name))
    return out


def _group_actions(
    spark: SparkSession,
    groups: list[SchemaGroup],
    conv: dict[str, Natural],
    columns: dict[str, T.DataType],
    keys: list[str],
    removes: bool,
    images: bool = False,
    staged: frozenset[str] = frozenset(),
    coded: bool = False,
) -> DataFrame:
    """The actions of schema groups with one staged schema (of one batch, or of consecutive
    batches of a backlog: read as one, each part's rows tagged with its batch).  With ``images``
    (a keyless multiset table) every ``u`` that carries a before image also removes it; columns
    in ``staged`` keep their staged values (:class:`StagedValues`); with ``coded`` ``__batch_id``
    is the index of the part's batch in ``groups``."""
    group = groups[0]
    parts = [
        read_group(spark, g).select("*", (F.lit(i) if coded else F.lit(g.batch_id)).alias(_PART_BATCH))
        for i, g in enumerate(groups)
    ]
    events = parts[0]
    for part in parts[1:]:
        events = events.union(part)
    events = events.where(F.col("op").isin("c", "u", "r", "d"))
    meta = [
        F.col("__position").alias(POSITION),
        F.col("op").alias(OP),
        F.col("ts_ms").alias(TS_MS),
        _source_ts(group).alias(SOURCE_TS),
        F.col(_PART_BATCH).alias(BATCH),
    ]
    unavailable = (
        F.coalesce(F.col("__unavailable"), F.array().cast("array<string>"))
        if "__unavailable" in group.schema.names
        else F.array().cast("array<string>")
    )
    after = events.where(F.col("op") != "d").select(
        F.lit("upsert").alias(ACTION),
        *meta,
        unavailable.alias(UNAVAILABLE),
        *_image(conv, columns, "after", staged),
        _old_key(group, conv, columns, keys).alias(OLD_KEY),
    )
    if not removes:
        return after
    moved = F.lit(True) if images else _key_changed(conv, keys)
    removed = events.where(
        (F.col("op") == "d") | ((F.col("op") == "u") & F.col("before").isNotNull() & moved)
    ).select(
        F.lit("delete").alias(ACTION),
        *meta,
        F.array().cast("array<string>").alias(UNAVAILABLE),
        *_image(conv, columns, "before", staged),
        F.lit(None).cast(_old_key_type(columns, keys)).alias(OLD_KEY),
    )
    return after.unionByName(removed.select(*after.columns))


_PART_BATCH = "__airflow_cdc_part_batch"


def _schema_key(group: SchemaGroup) -> bytes:
    return bytes(group.schema.serialize().to_pybytes())


def read_group(spark: SparkSession, group: SchemaGroup) -> DataFrame:
    """A schema group's parts.  Spark infers a schema from the Parquet footers on every read
    (a job each); groups of the same staged schema (consecutive batches of a backlog) reuse the
    first inference."""
    key = _schema_key(group)
    known = _SCHEMAS.get(key)
    if known is not None:
        return spark.read.schema(known).parquet(*group.files)
    frame = spark.read.parquet(*group.files)
    if len(_SCHEMAS) > 256:
        _SCHEMAS.clear()
    _SCHEMAS[key] = frame.schema
    return frame


_SCHEMAS: dict[bytes, T.StructType] = {}


def _source_ts(group: SchemaGroup) -> Column:
    """``source.ts_ms`` (the database's commit time), else the capture time ``ts_ms``."""
    source = group.schema.field("source").type if "source" in group.schema.names else None
    if source is not None and source.get_field_index("ts_ms") >= 0:
        return F.coalesce(F.col("source.ts_ms").cast("bigint"), F.col("ts_ms"))
    return F.col("ts_ms")


def _old_key_type(columns: dict[str, T.DataType], keys: list[str]) -> T.DataType:
    if not keys:
        return T.BooleanType()  # keyless tables have no key changes: an always-null column
    return T.StructType([T.StructField(k, columns[k], True) for k in keys])


def _old_key(
    group: SchemaGroup, conv: dict[str, Natural], columns: dict[str, T.DataType], keys: list[str]
) -> Column:
    """The staged ``__old_key`` in natural types (null for parts staged without it)."""
    kind = _old_key_type(columns, keys)
    if not keys or "__old_key" not in group.schema.names:
        return F.lit(None).cast(kind)
    staged = F.col("__old_key")
    fields = [conv[k].convert(staged.getField(k)).cast(columns[k]).alias(k) for k in keys]
    return F.when(staged.isNotNull(), F.struct(*fields)).cast(kind)


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


def table_frame(
    spark: SparkSession, table: StagedTable, truncates: list[tuple[bytes, int | None]]
) -> TableFrame:
    """All key actions of ``table`` in this batch, unified to one schema, later than any truncate
    (``truncates``: :func:`truncate_events`)."""
    columns, per_group = silver_columns(table)
    runs: list[tuple[int, list[SchemaGroup]]] = []  # consecutive groups of one staged schema
    for i, group in enumerate(table.groups):
        if runs and _schema_key(table.groups[runs[-1][0]]) == _schema_key(group):
            runs[-1][1].append(group)
        else:
            runs.append((i, [group]))
    keys, images = table.key_columns, table.keyless == "multiset"
    # where the staged parts' op and key columns show no event removes a key (no Spark job), the
    # removing actions are left out: they would be a second scan of every part that finds nothing
    removes = table.may_remove and table.removes_keys() is not False
    truncate_at = max(p for p, _ in truncates) if truncates else None

    def later(actions: DataFrame) -> DataFrame:
        return actions if truncate_at is None else actions.where(F.col(POSITION) > F.lit(truncate_at))

    staged = None
    if len(runs) == 1 and keys and not table.toast:
        conv = per_group.get(runs[0][0], {})
        values = frozenset(n for n in columns if n not in keys and n in conv)
        raw = _group_actions(spark, runs[0][1], conv, columns, keys, removes, images, values, coded=True)
        batches = tuple(g.batch_id for g in runs[0][1])
        narrow = raw.select(*(F.col(quoted(n)) for n in columns), *MERGED)  # the others are not read
        conversions = {n: conv[n].convert for n in values}
        staged = StagedValues(later(narrow), conversions, columns, batches, not removes)
        # the converted actions (history, the has_deletes scan) decoded from the same reads, not
        # a second read and projection of every part (~60 ms of the driver's time per table)
        every = staged.decode(raw)
    else:
        frames = [
            _group_actions(spark, groups, per_group.get(i, {}), columns, keys, removes, images)
            for i, groups in runs
        ]
        every = frames[0]
        for frame in frames[1:]:
            every = every.unionByName(frame)
    return TableFrame(
        later(every), columns, keys, truncate_at, table.toast, table.rows, every, tuple(truncates), staged
    )


def truncate_events(spark: SparkSession, table: StagedTable) -> list[tuple[bytes, int | None]]:
    """Position and ``source.ts_ms`` of the table's truncate events in this batch (read only when
    the manifest has some)."""
    if not table.ops.get("t"):
        return []
    out: list[tuple[bytes, int | None]] = []
    for group in table.groups:
        truncates = read_group(spark, group).where(F.col("op") == "t")
        found = truncates.select("__position", _source_ts(group).alias("ts")).collect()
        out += [(bytes(r[0]), r[1]) for r in found]
    return out


def truncate_positions(spark: SparkSession, table: StagedTable) -> list[bytes]:
    """Positions of the table's truncate events in this batch."""
    return [p for p, _ in truncate_events(spark, table)]


def has_deletes(frame: TableFrame) -> bool:
    """Whether any action removes a key (a scan that stops at the first one; no shuffle)."""
    return frame.actions.where(F.col(ACTION) == "delete").limit(1).count() > 0


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


def key_actions(actions: DataFrame, keys: list[str]) -> DataFrame:
    """Only the key, position and kind of each action (what tombstones need)."""
    return actions.select(*(F.col(quoted(k)) for k in keys), POSITION, ACTION)
