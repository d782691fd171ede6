"""Silver-versus-source comparison of a table without key columns mirrored as a multiset
(``keyless: multiset``), for ``airflow-cdc verify`` (Spark side).

Without a key, a row is known only by its whole image (every column; NULLs equal NULLs), and the
source and silver must hold every image the same number of times.  The source's rows stream into
one scratch Parquet file (:func:`stage_rows`: row groups of about
:data:`~spark_jobs.cdc_apply.compare.ROW_GROUP_BYTES`, never the whole table in memory); they
go through the apply job's conversions like a keyed table's chunks do.  Spark then counts the rows
per image hash on each side -- a hash aggregation, shuffled and spilled like any other, so memory
does not grow with the table -- and joins the two counts on the hash: an image the source holds
more often than silver is *missing* from silver, one silver holds more often is *extra*.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import delta_log
from .compare import ROW_GROUP_BYTES, SAMPLE, natural_columns, positional, row_hash
from .frames import quoted

_HASH, _SOURCE, _SILVER = "__image_hash", "__source_copies", "__silver_copies"


@dataclass
class MultisetResult:
    """Counts over every image; ``missing``/``extra`` are samples of the differing images, each
    ``{"row": {column: value}, "source": copies, "silver": copies}``."""

    source_rows: int = 0
    silver_rows: int = 0
    missing_count: int = 0  # copies the source holds beyond silver's, summed over the images
    extra_count: int = 0  # copies silver holds beyond the source's
    missing: list[dict[str, Any]] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)


def stage_rows(chunks: Iterable[pa.Table], path: str) -> pa.Schema | None:
    """Write the source's rows ``chunks`` (staged encoding) to the Parquet file ``path``, columns
    named by position; returns their schema (None: no rows, nothing written).

    Pieces are held until about ``ROW_GROUP_BYTES`` of them make a row group, so memory stays at
    one row group plus the source's piece.
    """
    fs, where = delta_log.filesystem(path)
    writer: pq.ParquetWriter | None = None
    schema, held, size = None, [], 0
    try:
        for rows in chunks:
            if not rows.num_rows:
                continue
            if writer is None:
                schema = rows.schema
                writer = pq.ParquetWriter(where, positional(rows).schema, filesystem=fs, compression="snappy")
            held.append(positional(rows))
            size += rows.nbytes
            if size >= ROW_GROUP_BYTES:
                writer.write_table(pa.concat_tables(held))
                held, size = [], 0
        if writer is not None and held:
            writer.write_table(pa.concat_tables(held))
    finally:
        if writer is not None:
            writer.close()
    return schema


def compare_multiset(
    spark: SparkSession, silver: DataFrame | None, schema: pa.Schema | None, path: str
) -> MultisetResult:
    """Compare the source rows staged at ``path`` (by :func:`stage_rows`, whose ``schema`` they
    have; None: the source has no rows) with silver as multisets of row images.

    Compares the source's columns (silver's own columns, not starting with ``__``, when the source
    is empty); reads both sides again, only for the sampled images, when they differ.
    """
    source = None
    if schema is not None:
        source = natural_columns(spark.read.parquet(delta_log.hadoop_url(path)), schema, silver)
    if source is not None:
        columns = source.columns
    elif silver is not None:
        columns = [c for c in silver.columns if not c.startswith("__")]
    else:
        return MultisetResult()
    hashed = {side: _hashed(frame, columns) for side, frame in ((_SOURCE, source), (_SILVER, silver))}
    both = _counts(spark, hashed[_SOURCE], _SOURCE).join(
        _counts(spark, hashed[_SILVER], _SILVER), on=_HASH, how="full_outer"
    )
    both = both.select(_HASH, *(F.coalesce(F.col(c), F.lit(0)).alias(c) for c in (_SOURCE, _SILVER)))
    surplus = F.col(_SOURCE) - F.col(_SILVER)
    stats = both.agg(
        F.sum(_SOURCE).alias("source"),
        F.sum(_SILVER).alias("silver"),
        F.sum(F.greatest(surplus, F.lit(0))).alias("missing"),
        F.sum(F.greatest(-surplus, F.lit(0))).alias("extra"),
    ).collect()[0]
    source_rows, silver_rows, missing, extra = (
        int(stats[k] or 0) for k in ("source", "silver", "missing", "extra")
    )
    result = MultisetResult(source_rows, silver_rows, missing, extra)
    if result.missing_count:
        result.missing = _sample(both.where(surplus > 0), hashed[_SOURCE], columns)
    if result.extra_count:
        result.extra = _sample(both.where(surplus < 0), hashed[_SILVER], columns)
    return result


def _hashed(frame: DataFrame | None, columns: list[str]) -> DataFrame | None:
    if frame is None:
        return None
    return frame.select(*(F.col(quoted(c)) for c in columns), row_hash(columns).alias(_HASH))


def _counts(spark: SparkSession, hashed: DataFrame | None, name: str) -> DataFrame:
    """Copies per image hash (no rows when the side has no table or no rows)."""
    if hashed is None:
        return spark.createDataFrame([], f"{_HASH} string, {name} long")
    return hashed.groupBy(_HASH).agg(F.count(F.lit(1)).alias(name))


def _sample(differing: DataFrame, hashed: DataFrame | None, columns: list[str]) -> list[dict[str, Any]]:
    """Up to :data:`SAMPLE` of the ``differing`` images: their values (from ``hashed``, the side
    holding more copies) and both sides' copies."""
    copies = {r[_HASH]: (int(r[_SOURCE]), int(r[_SILVER])) for r in differing.limit(SAMPLE).collect()}
    assert hashed is not None  # the side with more copies has rows
    images = hashed.where(F.col(_HASH).isin(list(copies))).dropDuplicates([_HASH]).collect()
    out = []
    for image in images:
        source, silver = copies[image[_HASH]]
        values = image.asDict(recursive=True)
        out.append({"row": {c: values[c] for c in columns}, "source": source, "silver": silver})
    return sorted(out, key=repr)
