"""Copy staged parts whose Parquet row groups are too large for Spark into smaller row groups.

Spark's Parquet reader holds a row group's column chunks whole while it reads it.  Batches staged
before parts were cut by bytes (``airflow_cdc.core.table_sink``) hold up to 65,536 events per row
group: gigabytes with blobs, which no sensible driver heap reads.  Such parts are copied once per
run into a scratch folder with row groups of :data:`ROW_GROUP_BYTES`; the batch itself is never
changed (it is immutable once published).  Copying needs the Python process to hold one old row
group, not the JVM.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .delta_log import filesystem
from .staged import StagedBatch, StagedTable

log = logging.getLogger("airflow_cdc.apply")

ROW_GROUP_BYTES = 16 << 20  # what the staging writer writes now
OVERSIZED = 64 << 20  # a row group above this (uncompressed) is copied


def oversized(meta: pq.FileMetaData, limit: int = OVERSIZED) -> bool:
    return any(meta.row_group(i).total_byte_size > limit for i in range(meta.num_row_groups))


def scratch_dir(target: str, staged: StagedBatch) -> str:
    """Where this run's copies go: beside the Delta tables, so every executor can read them."""
    return f"{target.rstrip('/')}/_airflow_cdc_scratch/{quote(staged.connector, safe='')}/{staged.batch_id}"


def copy_oversized(
    staged: StagedBatch,
    tables: list[StagedTable],
    scratch: str,
    limit: int = OVERSIZED,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> list[str]:
    """Point ``tables`` at small-row-group copies of their oversized parts; returns the copies.

    Repeating it rewrites the copies (a crashed run may have left partial ones).
    """
    copies: list[str] = []
    fs, local = filesystem(scratch)
    for table in tables:
        for g, group in enumerate(table.groups):
            for f, file in enumerate(group.files):
                if not oversized(staged.footer(file), limit):
                    continue
                copy = f"{scratch}/{table.name}/{g:03d}-{f:05d}.parquet"
                _copy(staged, file, fs, f"{local}/{table.name}/{g:03d}-{f:05d}.parquet", row_group_bytes)
                log.info("%s: row groups too large for Spark, read from a copy %s", file, copy)
                group.files[f] = copy
                copies.append(copy)
    return copies


def _copy(staged: StagedBatch, file: str, fs: pafs.FileSystem, out: str, row_group_bytes: int) -> None:
    fs.create_dir(out.rsplit("/", 1)[0], recursive=True)
    source = pq.ParquetFile(f"{staged.local}{file[len(staged.path) :]}", filesystem=staged.fs)
    with fs.open_output_stream(out) as sink, pq.ParquetWriter(sink, source.schema_arrow) as writer:
        for i in range(source.num_row_groups):
            rows = source.read_row_group(i)
            width = max(1, rows.nbytes // max(1, rows.num_rows))
            writer.write_table(rows, row_group_size=max(1, row_group_bytes // width))


def remove(scratch: str) -> None:
    """Drop this run's copies (best effort: a leftover folder is only disk space)."""
    fs, local = filesystem(scratch)
    try:
        fs.delete_dir(local)
    except (FileNotFoundError, OSError) as e:
        log.debug("scratch %s not removed: %s", scratch, e)
