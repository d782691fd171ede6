"""Per-table capture state: captured columns, key, codecs, and the ``source`` block layout."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc import __version__
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mappers import Mapper
from airflow_cdc.core.column_mapping import ColumnInfo, map_codecs
from airflow_cdc.core.errors import SchemaError, UnsupportedType
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.table_sink import SourceLayout, TableSink
from airflow_cdc.sources.postgres.types import ColumnCodec, HandlingModes, PgTypeInfo, column_codec
from airflow_cdc.sources.postgres.types_base import META_PG_TYPE

#: PostgreSQL ``source`` block, exactly Debezium's fields (3.6: ``origin``/``origin_lsn`` last,
#: null unless the transaction came through a replication origin).
SOURCE_TYPE = pa.struct(
    [
        pa.field("version", pa.string()),
        pa.field("connector", pa.string()),
        pa.field("name", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("ts_us", pa.int64()),
        pa.field("ts_ns", pa.int64()),
        pa.field("snapshot", pa.string()),
        pa.field("db", pa.string()),
        pa.field("sequence", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("txId", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("xmin", pa.int64()),
        pa.field("origin", pa.string()),
        pa.field("origin_lsn", pa.int64()),
    ]
)
VARYING = ("ts_ms", "ts_us", "ts_ns", "sequence", "txId", "lsn", "origin", "origin_lsn")
#: snapshot rows belong to no transaction: no origin (null, as a constant)
SNAPSHOT_VARYING = VARYING[:6]


def source_constants(connector_name: str, dbname: str) -> dict[str, Any]:
    return {"version": __version__, "connector": "postgresql", "name": connector_name, "db": dbname}


@dataclass
class RelationState:
    """How events of one relation (one schema version of a table) are captured."""

    name: str
    tid: TableId
    included: bool
    select: list[int] = field(default_factory=list)
    key_index: list[int] = field(default_factory=list)
    key_columns: list[str] = field(default_factory=list)
    codecs: list[ColumnCodec] = field(default_factory=list)
    signature: str = ""
    constants: dict[str, Any] = field(default_factory=dict)
    sink: TableSink | None = None
    columns: list[dict[str, Any]] = field(default_factory=list)
    #: a table without key columns: ``multiset`` or ``append`` (``client.TableMeta.keyless``)
    keyless: str | None = None
    #: ``skip.messages.without.change`` applies (set, with REPLICA IDENTITY FULL, by the source)
    skip_unchanged: bool = False

    def layout(self, snapshot: str) -> SourceLayout:
        return SourceLayout(
            SOURCE_TYPE,
            dict(self.constants, snapshot=snapshot, schema=self.tid.schema, table=self.tid.table),
            VARYING if snapshot == "false" else SNAPSHOT_VARYING,
        )

    def table_info(self) -> dict[str, Any]:
        info = {
            "schema": self.tid.schema,
            "table": self.tid.table,
            "key_columns": self.key_columns,
            "columns": self.columns,
        }
        return info | ({"keyless": self.keyless} if self.keyless and not self.key_columns else {})

    def open_sink(
        self, writer: BatchWriter, kind: str = "stream", expand: Any = None, ahead: bool = False
    ) -> TableSink:
        sink = writer.sink(
            self.name,
            self.table_info(),
            self.codecs,
            self.select,
            self.layout("false" if kind == "stream" else "incremental"),
            kind,
            self.signature,
            expand=expand,
            ahead=ahead,
        )
        if kind == "stream":
            self.sink = sink
            sink.skip_unchanged = self.skip_unchanged
        return sink


def build_state(
    tid: TableId,
    included: bool,
    columns: Sequence[tuple[str, int, int]],
    key: Sequence[str],
    filters: TableFilter,
    modes: HandlingModes,
    type_info: Callable[[int], PgTypeInfo],
    constants: dict[str, Any],
    mappers: Sequence[Mapper] = (),
    keyless: str | None = None,
) -> RelationState:
    """Build the capture state for a table given its columns as (name, type oid, typmod).

    :param mappers: the configured column mappers (``column.truncate/mask...``), matched
        against ``<schema>.<table>.<column>``.
    :param keyless: how silver holds the table when ``key`` is empty (``multiset``, ``append``).
    :raises SchemaError: a key column is missing from the relation.
    :raises UnsupportedType: naming table and column.
    :raises ConfigError: a truncation or mask maps a key column.
    """
    name = str(tid)
    if not included:
        return RelationState(name, tid, False)
    names = [c[0] for c in columns]
    missing = [k for k in key if k not in names]
    if missing:
        raise SchemaError(f"table {name}: key column(s) {missing} not present in the table")
    select, codecs, infos, mapped = [], [], [], []
    for i, (col, oid, typmod) in enumerate(columns):
        if not filters.includes_column(tid, col, is_key=col in key):
            continue
        try:
            codec = column_codec(col, type_info(oid), typmod, modes)
        except UnsupportedType as e:
            raise UnsupportedType(f"table {name}, column {col!r}: {e}", hint=e.hint) from e
        select.append(i)
        codecs.append(codec)
        mapped.append(_column_info(col, type_info(oid), typmod))
        infos.append(
            {
                "name": col,
                "type_oid": oid,
                "typmod": typmod,
                "type": (codec.field.metadata or {}).get(META_PG_TYPE, b"").decode(),
            }
        )
    codecs = map_codecs(codecs, name, mapped, mappers, key)
    sig = hashlib.sha1(repr([(c["name"], c["type_oid"], c["typmod"]) for c in infos]).encode()).hexdigest()[
        :12
    ]
    key_index = [names.index(k) for k in key]
    return RelationState(
        name, tid, True, select, key_index, list(key), codecs, sig, constants, None, infos, keyless
    )


#: PostgreSQL types whose JDBC type is a character type (CHAR/VARCHAR): the ones mappers apply to
_CHARACTER = frozenset({"text", "varchar", "bpchar", "char", "name"})


def _column_info(name: str, info: PgTypeInfo, typmod: int) -> ColumnInfo:
    """Whether a column is character-typed (a domain by its base), its declared length, and its
    type as propagated (the column's own type name; length and scale from the type modifier)."""
    type_name = info.name.upper()  # Debezium: VARCHAR, NUMERIC, INT4 ... (a domain: its own name)
    if info.base is not None:
        info, typmod = info.base, info.base_typmod
    character = info.name in _CHARACTER
    length = typmod - 4 if character and info.name in ("varchar", "bpchar") and typmod >= 4 else -1
    size = scale = None
    if length >= 0:
        size, scale = length, 0  # Debezium reports a scale of 0 for character types
    elif info.name == "numeric" and typmod >= 4:
        size, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    elif info.name in ("bit", "varbit") and typmod >= 0:
        size = typmod
    return ColumnInfo(name, character, length, type_name, size, scale)
