"""Silver-versus-source comparison used by ``airflow-cdc verify`` (Spark side).

Source rows arrive as Arrow chunks in the staged (Debezium) encoding; they go through the same
conversions as the apply job, are cast to the silver column types and hashed; silver rows with
the same keys are hashed the same way.  A chunk reaches Spark as a scratch Parquet file with row
groups of :data:`ROW_GROUP_BYTES`, so wide rows never sit in the driver's heap all at once (a
DataFrame made from an in-memory Arrow table would hold the whole chunk there).  Keys seen are
appended to a scratch Parquet folder so the final "extra rows in silver" check is an anti-join,
not a set held in memory.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from . import delta_log
from .frames import DELETED, quoted
from .session import size_reads
from .types import natural

SAMPLE = 20
ROW_GROUP_BYTES = 8 << 20


@dataclass
class ChunkResult:
    """Counts of every difference in the chunk; ``missing``/``different`` are samples of them."""

    matched: int = 0
    missing: list[Any] = field(default_factory=list)
    different: list[Any] = field(default_factory=list)
    missing_count: int = 0
    different_count: int = 0


def load_silver(spark: SparkSession, path: str) -> DataFrame | None:
    """The live rows of the silver table at ``path`` (None: no table); sizes the session's
    Parquet reads to its widest rows."""
    if not delta_log.table_exists(path):
        return None
    size_reads(spark, delta_log.row_bytes(path, delta_log.replay(path)))
    silver = spark.read.format("delta").load(path)
    if DELETED in silver.columns:
        silver = silver.where(~F.coalesce(F.col(DELETED), F.lit(False)))
    return silver


def load_history_current(spark: SparkSession, path: str) -> DataFrame | None:
    """The current versions of the SCD type 2 history table at ``path`` (None: no table); they
    must equal the live source rows just as silver's."""
    if not delta_log.table_exists(path):
        return None
    size_reads(spark, delta_log.row_bytes(path, delta_log.replay(path)))
    return spark.read.format("delta").load(path).where(F.col("__is_current"))


def row_hash(columns: list[str]) -> Column:
    """SHA-256 of a row's ``columns`` as JSON (a NULL column is left out: NULLs hash equal)."""
    return F.sha2(F.to_json(F.struct(*(F.col(quoted(c)) for c in columns))), 256)


def row_group_rows(rows: pa.Table, limit: int = ROW_GROUP_BYTES) -> int:
    """Rows per Parquet row group so that one holds about ``limit`` bytes of ``rows``."""
    width = max(1, rows.nbytes // max(1, rows.num_rows))
    return max(1, min(rows.num_rows, limit // width))


def positional(rows: pa.Table) -> pa.Table:
    """``rows`` with its columns named ``c0, c1, ...`` (any source column name survives Parquet)."""
    return rows.rename_columns([f"c{i}" for i in range(rows.num_columns)])


def natural_frame(spark: SparkSession, rows: pa.Table, silver: DataFrame | None, scratch: str) -> DataFrame:
    """The chunk in silver's natural types (see :func:`natural_columns`), read from the scratch
    Parquet file ``scratch`` it is written to."""
    renamed = positional(rows)
    fs, where = delta_log.filesystem(scratch)
    pq.write_table(
        renamed, where, row_group_size=row_group_rows(renamed), compression="snappy", filesystem=fs
    )
    return natural_columns(spark.read.parquet(delta_log.hadoop_url(scratch)), rows.schema, silver)


def natural_columns(raw: DataFrame, schema: pa.Schema, silver: DataFrame | None) -> DataFrame:
    """``raw``'s columns ``c0, c1, ...`` (staged encoding, the fields of ``schema``) converted with
    the apply job's conversions and cast to silver's column types where silver has the column."""
    types = {f.name: f.dataType for f in silver.schema.fields} if silver is not None else {}
    cols = []
    for i, f in enumerate(schema):
        value = natural(f).convert(F.col(f"c{i}"))
        cols.append((value.cast(types[f.name]) if f.name in types else value).alias(f.name))
    return raw.select(*cols)


def compare_chunk(
    spark: SparkSession,
    silver: DataFrame | None,
    rows: pa.Table,
    keys: list[str],
    seen_keys: str,
    scratch: str,
) -> ChunkResult:
    """Compare one source chunk with silver; append its keys to the ``seen_keys`` folder.

    :param scratch: a file path or object-store URL the session can read, for the chunk's Parquet
        copy (removed when done).
    """
    try:
        return _compare(spark, silver, rows, keys, seen_keys, scratch)
    finally:
        fs, where = delta_log.filesystem(scratch)
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.delete_file(where)


def _compare(
    spark: SparkSession,
    silver: DataFrame | None,
    rows: pa.Table,
    keys: list[str],
    seen_keys: str,
    scratch: str,
) -> ChunkResult:
    src = natural_frame(spark, rows, silver, scratch)
    columns = src.columns
    src = src.select(*(F.col(quoted(k)) for k in keys), row_hash(columns).alias("__src_hash"))
    src.select(*(F.col(quoted(k)) for k in keys)).write.mode("append").parquet(
        delta_log.hadoop_url(seen_keys)
    )
    if silver is None:
        sample = [list(r) for r in src.select(*keys).limit(SAMPLE).collect()]
        return ChunkResult(0, sample, [], missing_count=rows.num_rows)
    dst = silver.select(*(F.col(quoted(k)) for k in keys), row_hash(columns).alias("__dst_hash"))
    joined = src.join(dst, on=keys, how="left")
    stats = joined.agg(
        F.sum(F.when(F.col("__dst_hash").isNull(), 1).otherwise(0)).alias("missing"),
        F.sum(
            F.when(
                F.col("__dst_hash").isNotNull() & (F.col("__dst_hash") != F.col("__src_hash")), 1
            ).otherwise(0)
        ).alias("different"),
        F.count(F.col("__dst_hash")).alias("matched"),
    ).collect()[0]
    result = ChunkResult(
        int(stats["matched"] or 0),
        missing_count=int(stats["missing"] or 0),
        different_count=int(stats["different"] or 0),
    )
    if stats["missing"]:
        result.missing = [
            list(r) for r in joined.where("__dst_hash IS NULL").select(*keys).limit(SAMPLE).collect()
        ]
    if stats["different"]:
        result.different = [
            list(r) for r in joined.where("__dst_hash != __src_hash").select(*keys).limit(SAMPLE).collect()
        ]
    return result


def extra_keys(
    spark: SparkSession, silver: DataFrame | None, keys: list[str], seen_keys: str, any_seen: bool
) -> tuple[int, list[Any], int]:
    """``(count, sample, silver_rows)`` of silver keys the source no longer has."""
    if silver is None:
        return 0, [], 0
    total = silver.count()
    if not any_seen:
        return total, [list(r) for r in silver.select(*keys).limit(SAMPLE).collect()], total
    seen = spark.read.parquet(delta_log.hadoop_url(seen_keys))
    extra = silver.select(*keys).join(seen, on=keys, how="left_anti")
    count = extra.count()
    return count, [list(r) for r in extra.limit(SAMPLE).collect()] if count else [], total
