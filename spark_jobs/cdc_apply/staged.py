"""Read a staged batch (``manifest.json`` + Parquet parts) from the Spark driver.

The batch format is written by ``airflow_cdc.core.batch``; this module only reads it, with no
import of ``airflow_cdc`` so the job runs on a cluster that has just pyspark, delta and pyarrow.
Paths may be local or any filesystem ``pyarrow.fs`` understands (``s3://``, ``gs://``, ``hdfs://``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .delta_log import filesystem, hadoop_url

SUPPORTED_FORMAT = 1


class StagedBatchError(RuntimeError):
    """The batch is missing, incomplete or of a format this job does not read."""


@dataclass
class SchemaGroup:
    """Consecutive parts of one table that share a schema version."""

    version: str
    schema: pa.Schema
    files: list[str] = field(default_factory=list)
    rows: int = 0
    batch_id: str = ""  # the batch the parts belong to (each event's ``__batch_id`` in silver)


@dataclass
class StagedTable:
    name: str
    key_columns: list[str]
    groups: list[SchemaGroup]
    ops: dict[str, int]
    toast: bool = True  # some event may list unchanged-TOAST columns (see may_have_unavailable)
    ops_counted: bool = True  # every part lists its op counts
    row_bytes: int = 0  # the widest row group's uncompressed bytes per event (sizes Spark's reads)
    #: tables without key columns: ``multiset`` (silver mirrors the rows, duplicates included: the
    #: source sends full old images) or ``append`` (silver is an append-only log of row images);
    #: decided at capture, recorded in the manifest (batches staged before it: ``append``)
    keyless: str | None = None
    _removes: list[bool | None] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def may_remove(self) -> bool:
        """Whether an event may remove a key: a delete, or an update that changed the key."""
        return not self.ops_counted or bool(self.ops.get("d") or self.ops.get("u"))

    def removes_keys(self) -> bool | None:
        """Whether an event removes a key: a ``d``, or a ``u`` whose before image has another key
        (SQL Server's updates; every source's in batches staged before key changes became d + c
        pairs).  From the op counts where they tell, else read on the driver from the parts'
        ``op`` and key columns only (row groups whose ``op`` statistics rule out ``u`` and ``d``
        unread): no Spark job.  ``None`` where a key column is not a plain value or its name has
        a dot (Spark decides).  A key counts as changed unless its staged values are equal (both
        null, or equal values), so it never misses a change Spark's comparison of the converted
        values would see.  Read once per table."""
        if not self._removes:
            self._removes.append(self._read_removes())
        return self._removes[0]

    def _read_removes(self) -> bool | None:
        if not self.key_columns:
            return None
        if self.ops_counted and (self.ops.get("d") or not self.ops.get("u")):
            return bool(self.ops.get("d"))
        for group in self.groups:
            row = group.schema.field("after").type
            keys = [k for k in self.key_columns if row.get_field_index(k) >= 0]
            if not keys or any("." in k or not _plain(row.field(k).type) for k in keys):
                return None
            if any(_part_removes(file, keys) for file in group.files):
                return True
        return False

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)

    @property
    def latest_schema(self) -> pa.Schema:
        return self.groups[-1].schema

    def may_have_unavailable(self, footer: Callable[[str], pq.FileMetaData]) -> bool:
        """False when Parquet statistics prove no event lists unchanged-TOAST columns."""
        for group in self.groups:
            if "__unavailable" not in group.schema.names:
                continue
            for file in group.files:
                meta = footer(file)
                for i in range(meta.num_row_groups):
                    rg = meta.row_group(i)
                    col = next(
                        rg.column(j)
                        for j in range(rg.num_columns)
                        if rg.column(j).path_in_schema.startswith("__unavailable")
                    )
                    stats = col.statistics
                    if stats is None or not stats.has_null_count or stats.null_count != col.num_values:
                        return True
        return False

    def after_fields(self) -> Iterator[tuple[int, pa.Field]]:
        """Every row field of every schema version (newest definition of a name last)."""
        for i, group in enumerate(self.groups):
            row_type = group.schema.field("after").type
            for f in row_type:
                yield i, f


def _plain(arrow: pa.DataType) -> bool:
    """A type whose equal staged values are one value (floats: -0.0 and NaN are not)."""
    return (
        pa.types.is_integer(arrow)
        or pa.types.is_string(arrow)
        or pa.types.is_large_string(arrow)
        or pa.types.is_binary(arrow)
        or pa.types.is_large_binary(arrow)
        or pa.types.is_decimal(arrow)
        or pa.types.is_boolean(arrow)
        or pa.types.is_date(arrow)
        or pa.types.is_timestamp(arrow)
    )


def _may_remove(meta: pq.RowGroupMetaData) -> bool:
    """Whether a row group's ``op`` statistics allow a ``d`` or ``u`` (no statistics: yes)."""
    op = next(meta.column(j) for j in range(meta.num_columns) if meta.column(j).path_in_schema == "op")
    stats = op.statistics
    if stats is None or not stats.has_min_max:
        return True
    return any(stats.min <= op_ <= stats.max for op_ in ("d", "u"))


def _part_removes(file: str, keys: list[str]) -> bool:
    """Whether a part holds a ``d``, or a ``u`` with a before image whose key differs from its
    after image's (columns ``op`` and the key columns of both images only)."""
    fs, local = filesystem(file)
    columns = ["op", *(f"{side}.{k}" for side in ("before", "after") for k in keys)]
    with fs.open_input_file(local) as f:
        part = pq.ParquetFile(f)
        for i in range(part.num_row_groups):
            if not _may_remove(part.metadata.row_group(i)):
                continue
            events = part.read_row_group(i, columns=columns)
            op, before, after = (events.column(c).combine_chunks() for c in ("op", "before", "after"))
            if pc.any(pc.equal(op, "d")).as_py():
                return True
            same = pa.repeat(pa.scalar(True), len(op))
            for k in keys:
                old, new = pc.struct_field(before, k), pc.struct_field(after, k)
                equal = pc.or_(pc.and_(old.is_null(), new.is_null()), pc.fill_null(pc.equal(old, new), False))
                same = pc.and_(same, equal)
            moved = pc.and_(pc.and_(pc.equal(op, "u"), before.is_valid()), pc.invert(same))
            if pc.any(moved).as_py():
                return True
    return False


def row_bytes(meta: pq.FileMetaData) -> int:
    """The widest row group's uncompressed bytes per row (0 for a file without rows)."""
    widest = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        if group.num_rows:
            widest = max(widest, -(-group.total_byte_size // group.num_rows))
    return widest


class StagedBatch:
    """A published batch as the apply job sees it."""

    def __init__(self, path: str) -> None:
        # Spark reads the parts by these names: Hadoop's scheme for S3 (s3a://)
        self.path = hadoop_url(path.rstrip("/"))
        self.fs, self.local = filesystem(self.path)
        try:
            with self.fs.open_input_stream(f"{self.local}/manifest.json") as f:
                self.manifest: dict[str, Any] = json.loads(f.read())
        except FileNotFoundError as e:
            raise StagedBatchError(f"{path}: no manifest.json (incomplete batch or not a batch)") from e
        if self.manifest.get("format") != SUPPORTED_FORMAT:
            raise StagedBatchError(f"{path}: unsupported batch format {self.manifest.get('format')!r}")
        self._footers: dict[str, pq.FileMetaData] = {}

    def footer(self, file: str) -> pq.FileMetaData:
        """The Parquet footer of a part (``file`` as in :attr:`SchemaGroup.files`), read once."""
        meta = self._footers.get(file)
        if meta is None:
            meta = self._footers[file] = pq.read_metadata(
                f"{self.local}{file[len(self.path) :]}", filesystem=self.fs
            )
        return meta

    @property
    def batch_id(self) -> str:
        return str(self.manifest["batch_id"])

    @property
    def connector(self) -> str:
        return str(self.manifest["connector"])

    @property
    def to_offset(self) -> Any:
        return self.manifest.get("to_offset")

    def tables(self) -> list[StagedTable]:
        out = []
        for name in sorted(self.manifest["tables"]):
            info = self.manifest["tables"][name]
            groups: list[SchemaGroup] = []
            ops: dict[str, int] = {}
            counted = True
            for part in info["parts"]:
                file = f"{self.path}/{part['file']}"
                if not groups or groups[-1].version != part["schema_version"]:
                    schema = pq.read_schema(f"{self.local}/{part['file']}", filesystem=self.fs)
                    groups.append(SchemaGroup(part["schema_version"], schema, batch_id=self.batch_id))
                groups[-1].files.append(file)
                groups[-1].rows += part["rows"]
                counted = counted and "ops" in part
                for op, n in part.get("ops", {}).items():
                    ops[op] = ops.get(op, 0) + n
            keys = list(info.get("key_columns") or [])
            keyless = None if keys else str(info.get("keyless") or "append")
            table = StagedTable(name, keys, groups, ops, ops_counted=counted, keyless=keyless)
            table.toast = table.may_have_unavailable(self.footer)
            table.row_bytes = max((row_bytes(self.footer(f)) for g in groups for f in g.files), default=0)
            out.append(table)
        return out

    def verify_parts(self) -> None:
        """Read every part's footer: a missing, truncated or corrupt file fails here, before any write.

        :raises StagedBatchError: naming the file and what is wrong with it.
        """
        for name, info in sorted(self.manifest["tables"].items()):
            for part in info["parts"]:
                where = f"{self.path}/{part['file']}"
                try:
                    rows = self.footer(where).num_rows
                except (OSError, pa.ArrowException) as e:
                    raise StagedBatchError(f"{where} (table {name}) is missing or unreadable: {e}") from e
                if rows != part["rows"]:
                    raise StagedBatchError(
                        f"{where} (table {name}) has {rows} rows, manifest says {part['rows']}"
                    )

    def commit_metadata(self, fence: int | None = None, batches: list[str] | None = None) -> str:
        """What goes into the Delta commit info (``userMetadata``): batch id, end offset and the
        lease's fencing token (when the submitter held the lease); ``batches``: every batch a
        write of several batches carries (this one last)."""
        doc: dict[str, Any] = {
            "batch_id": self.batch_id,
            "connector": self.connector,
            "to_offset": self.to_offset,
        }
        if batches:
            doc["batches"] = batches
        if fence is not None:
            doc["fence"] = fence
        if self.manifest.get("partition") is not None:
            doc["partition"] = self.manifest["partition"]
        return json.dumps({"airflow_cdc": doc}, sort_keys=True, default=str)
