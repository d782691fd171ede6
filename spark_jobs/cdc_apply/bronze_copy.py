"""Bronze at the cost of a file copy: the staged Parquet parts already are the bronze rows.

A bronze table this job creates is partitioned by ``__date`` and ``__batch_id``.  Both are
partition columns, so neither needs to be in the data files: a staged part whose events all
fall on one date (UTC, from the footer's ``ts_ms`` statistics) goes into the table unchanged.
The part is hard-linked (or copied across filesystems) into its partition directory, then one
Delta commit adds the files together with the batch's idempotent-transaction mark, the same mark
a DataFrame write carries.

The copy applies only when Delta reads the file exactly as Spark would read the part:

* the table has no column mapping (its physical column names are the staged names; a table
  whose source column names Delta refuses without mapping uses mapping and the re-encoding path);
* the table is partitioned by ``(__date, __batch_id)`` (tables created by earlier versions,
  partitioned by ``__date`` alone, keep the re-encoding path);
* every column of every part is in the table with the same type (a new or widened column goes
  through the re-encoding path once, which evolves the table);
* every part's events fall on one date.

Anything else falls back to :func:`bronze.append_bronze`'s DataFrame append for the whole table.
Part names in the table are derived from the batch id and part number, so a run killed after
copying and before committing leaves files the retry overwrites, not orphans that pile up.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote
from zoneinfo import ZoneInfo

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from . import delta_log
from .delta_log import filesystem
from .frames import read_group
from .staged import StagedTable
from .writes import Commit, commit_actions

log = logging.getLogger("airflow_cdc.apply")

PARTITIONS = ["__date", "__batch_id"]
#: characters Delta refuses in column names unless the table maps columns by name
_INVALID_NAME = set(" ,;{}()\n\t=")


@dataclass(frozen=True)
class Part:
    """One staged file and where it goes in the bronze table."""

    source: str
    date: str
    rows: int
    relative: str


def valid_without_mapping(schema: T.StructType) -> bool:
    """Whether Delta accepts every (nested) column name of ``schema`` without column mapping."""
    return all(not (_INVALID_NAME & set(name)) for name in _names(schema))


def _names(data_type: T.DataType) -> list[str]:
    out: list[str] = []
    if isinstance(data_type, T.StructType):
        for f in data_type.fields:
            out.append(f.name)
            out.extend(_names(f.dataType))
    elif isinstance(data_type, T.ArrayType):
        out.extend(_names(data_type.elementType))
    elif isinstance(data_type, T.MapType):
        out.extend(_names(data_type.keyType) + _names(data_type.valueType))
    return out


def fits(file_type: T.DataType, table_type: T.DataType) -> bool:
    """Whether a file column of ``file_type`` reads as ``table_type`` unchanged: same types, the
    file's struct fields a subset of the table's (a missing nested field reads as null)."""
    if isinstance(file_type, T.StructType) and isinstance(table_type, T.StructType):
        table_fields = {f.name: f.dataType for f in table_type.fields}
        return all(
            f.name in table_fields and fits(f.dataType, table_fields[f.name]) for f in file_type.fields
        )
    if isinstance(file_type, T.ArrayType) and isinstance(table_type, T.ArrayType):
        return fits(file_type.elementType, table_type.elementType)
    if isinstance(file_type, T.MapType) and isinstance(table_type, T.MapType):
        return fits(file_type.keyType, table_type.keyType) and fits(file_type.valueType, table_type.valueType)
    return bool(file_type == table_type)


def plan(
    spark: SparkSession, table: StagedTable, batch_id: str, table_schema: T.StructType
) -> list[Part] | None:
    """The parts to copy, or None when any part needs the re-encoding path (say why in the log)."""
    zone = ZoneInfo(spark.conf.get("spark.sql.session.timeZone") or "UTC")
    parts: list[Part] = []
    for group in table.groups:
        file_schema = read_group(spark, group).schema
        if not fits(file_schema, table_schema):
            log.info("bronze of %s: the batch brings new or changed columns; re-encoding it", table.name)
            return None
        for file in group.files:
            local, fs = _local(file)
            meta = pq.read_metadata(local, filesystem=fs)
            date = _one_date(meta, zone)
            if date is None:
                log.info("bronze of %s: a part spans dates; re-encoding the batch", table.name)
                return None
            n = len(parts)
            relative = (
                f"__date={date}/__batch_id={quote(batch_id, safe='')}/"
                f"part-{n:05d}-{quote(batch_id, safe='')}.c000.snappy.parquet"
            )
            parts.append(Part(file, date, meta.num_rows, relative))
    return parts


def _local(file: str) -> tuple[str, pafs.FileSystem]:
    fs, path = filesystem(file)
    return path, fs


def _one_date(meta: pq.FileMetaData, zone: ZoneInfo) -> str | None:
    """The single date of every event in the file (``ts_ms`` statistics), else None."""
    low = high = None
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        column = next(
            (group.column(j) for j in range(group.num_columns) if group.column(j).path_in_schema == "ts_ms"),
            None,
        )
        stats = column.statistics if column is not None else None
        if stats is None or not stats.has_min_max or stats.null_count:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    if low is None or high is None:
        return None
    first, last = (dt.datetime.fromtimestamp(v / 1000, zone).date() for v in (low, high))
    return first.isoformat() if first == last else None


def copy_parts(parts: list[Part], table_path: str) -> list[dict[str, Any]]:
    """Place every part in the table directory (hard link on one local filesystem, else a copy);
    returns the Delta ``add`` actions."""
    target_fs, target = filesystem(table_path)
    adds = []
    for part in parts:
        source, source_fs = _local(part.source)
        dest = f"{target}/{part.relative}"
        target_fs.create_dir(os.path.dirname(dest), recursive=True)
        if not _link(source_fs, source, target_fs, dest):
            pafs.copy_files(source, dest, source_filesystem=source_fs, destination_filesystem=target_fs)
        info = target_fs.get_file_info(dest)
        adds.append(
            {
                "add": {
                    "path": part.relative,
                    "partitionValues": {"__date": part.date, "__batch_id": _batch_of(part.relative)},
                    "size": info.size,
                    "modificationTime": int((info.mtime_ns or time.time_ns()) // 1_000_000),
                    "dataChange": True,
                    "stats": json.dumps({"numRecords": part.rows}),
                }
            }
        )
    return adds


def _batch_of(relative: str) -> str:
    return unquote(relative.split("/")[1].split("=", 1)[1])


def _link(source_fs: pafs.FileSystem, source: str, target_fs: pafs.FileSystem, dest: str) -> bool:
    if not (isinstance(source_fs, pafs.LocalFileSystem) and isinstance(target_fs, pafs.LocalFileSystem)):
        return False
    try:
        if os.path.exists(dest):
            os.unlink(dest)  # a killed run's copy of this part: replace it
        os.link(source, dest)
    except OSError:
        return False
    return True


def commit_files(
    spark: SparkSession, table_path: str, adds: list[dict[str, Any]], commit: Commit
) -> bool | None:
    """One Delta commit of ``adds`` plus the batch's idempotent-transaction mark; False when a
    concurrent run already committed the mark (nothing added); None over Spark Connect when this
    process may not commit to the table (``log_commit``: the caller re-encodes the rows)."""
    return commit_actions(spark, table_path, adds, [commit], commit)


def table_layout(
    spark: SparkSession, table_path: str, state: delta_log.LogState | None = None
) -> tuple[list[str], str, T.StructType] | None:
    """The bronze table's partition columns, column mapping mode and schema (None: no table),
    from its log (``state``: replayed by the caller already; DESCRIBE DETAIL would run a Spark
    job for file counts, and reading the schema through Spark costs a Connect client a round trip
    for what the log's ``schemaString`` says)."""
    if state is None:
        state = delta_log.replay(table_path)
    if state.schema_string is None:
        return None
    mapping = state.configuration.get("delta.columnMapping.mode", "none")
    schema = T.StructType.fromJson(json.loads(state.schema_string))
    return list(state.partition_columns), mapping, schema
