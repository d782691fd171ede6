"""Per capture instance: codecs, the ``source`` struct, staged-batch sinks and key text.

A table's captured structure is its capture instance, so the sink signature is the instance
name plus its column types: when a table moves to a newer capture instance its events go to a
new part with the new columns.

A table without key columns (no primary key, no ``@index_name``, no ``message.key.columns``
entry) is captured too; SQL Server allows CDC on it with ``@supports_net_changes = 0``
(``cdc.change_tables.index_name`` NULL: "the source table did not have a primary key and a unique
index was not specified", https://learn.microsoft.com/en-us/sql/relational-databases/system-tables/cdc-change-tables-transact-sql).
Silver mirrors it as a multiset (``keyless: multiset``) when every change-table image is whole,
and keeps an append-only log of its row events (``keyless: append``) when the table stages a
large-object column: change tables hold no whole old images of those
(https://learn.microsoft.com/en-us/sql/relational-databases/system-tables/cdc-capture-instance-ct-transact-sql,
"Large object data types": ``image``/``text``/``ntext`` are NULL when ``__$operation`` is 1 or
3; ``varbinary(max)``/``varchar(max)``/``nvarchar(max)`` are NULL when it is 3 unless the update
changed them), so a delete or an update cannot name the one row it removes.  ``xml`` and the
unlimited CLR types (``geometry``, ``geography``: ``sys.columns.max_length`` -1, stored as large
objects) are counted with them: SQL Server 2008's list of the rule named ``xml`` too, and its
data-type notes say "the previous image of the BLOB column is stored only if the column itself is
changed".  Rows that differ only in such a column would otherwise be told apart by nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pyarrow as pa

from airflow_cdc import __version__
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mappers import Mapper
from airflow_cdc.core.column_mapping import ColumnInfo, map_codecs
from airflow_cdc.core.errors import SchemaError, UnsupportedType
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.table_sink import SourceLayout, TableSink
from airflow_cdc.sources.sqlserver.schema import CaptureInstance, Column
from airflow_cdc.sources.sqlserver.snapshot import key_param
from airflow_cdc.sources.sqlserver.types import Modes, SqlServerCodec, column_codec, unsupported

log = logging.getLogger(__name__)
SOURCE_TYPE = pa.struct(
    [
        pa.field(n, t)
        for n, t in (
            ("version", pa.string()),
            ("connector", pa.string()),
            ("name", pa.string()),
            ("ts_ms", pa.int64()),
            ("snapshot", pa.string()),
            ("db", pa.string()),
            ("sequence", pa.string()),
            ("schema", pa.string()),
            ("table", pa.string()),
            ("change_lsn", pa.string()),
            ("commit_lsn", pa.string()),
            ("event_serial_no", pa.int64()),
        )
    ]
)
VARYING = ("ts_ms", "change_lsn", "commit_lsn", "event_serial_no")
_INTS = frozenset({"tinyint", "smallint", "int", "bigint"})
_DECIMALS = frozenset({"decimal", "numeric", "money", "smallmoney"})
#: Keys read back as bytes (CLR types' serialisations order like their values: hierarchyid is byte-ordered)
_BYTES_KEYS = frozenset({"binary", "varbinary", "image", "timestamp", "rowversion", "hierarchyid", "geometry",
                         "geography"})  # fmt: skip
#: Always NULL in deletes and update before-images of change tables (see the module notes).
_OLD_STYLE_LOBS = frozenset({"text", "ntext", "image"})
MULTISET, APPEND = "multiset", "append"


@dataclass
class TableState:
    """How rows of one capture instance are encoded and staged."""

    instance: CaptureInstance
    codecs: list[SqlServerCodec]
    key_index: list[int]
    signature: str
    constants: dict[str, Any]
    sinks: dict[tuple, TableSink] = field(default_factory=dict)
    #: staged columns (indices into the capture instance's): keys, and the columns
    #: ``column.include.list`` / ``column.exclude.list`` keep
    select: list[int] = field(default_factory=list)
    #: a table without key columns: ``multiset`` or ``append`` (see the module notes); None: keyed
    keyless: str | None = None
    #: the staged large-object columns that make a table without key columns ``append``
    partial_columns: list[str] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        ci: CaptureInstance,
        modes: Modes,
        connector_name: str,
        mappers: tuple[Mapper, ...] = (),
        keep_column: Callable[[str], bool] | None = None,
    ) -> TableState:
        """:param mappers: the configured column mappers, matched against
        ``<schema>.<table>.<column>``.
        :param keep_column: whether a non-key column is staged (the column filters); None: all.
        :raises SchemaError: a key column (``ci.key``: the capture instance's index columns, or the
            table's ``message.key.columns`` entry) is not a captured column.  No key columns at
            all is no error: the table is ``keyless`` (see the module notes).
        :raises ConfigError: a truncation or mask maps a key column.
        :raises UnsupportedType: a staged column of a type Debezium does not map (a column the
            filters leave out is read but never staged, so its type does not matter)."""
        names = [c.name for c in ci.columns]
        missing = [k for k in ci.key if k not in names]
        if missing:
            raise SchemaError(
                f"table {ci.table_id} (capture instance {ci.name}): key columns {', '.join(missing)} "
                "are not captured",
                hint="enable CDC with @captured_column_list including the key columns, or name captured "
                "columns in message.key.columns",
            )
        types = ",".join(
            f"{c.name}:{c.type_name}({c.max_length},{c.precision},{c.scale})" for c in ci.columns
        )
        signature = ci.name + ":" + hashlib.sha256(types.encode()).hexdigest()[:16]
        constants = {
            "version": __version__,
            "connector": "sqlserver",
            "name": connector_name,
            "sequence": None,
        }
        keep = keep_column or (lambda name: True)
        select = [i for i, c in enumerate(ci.columns) if c.name in ci.key or keep(c.name)]
        codecs = [_codec(c, modes, ci, i in select) for i, c in enumerate(ci.columns)]
        infos = [_column_info(c) for c in ci.columns]
        codecs = map_codecs(codecs, f"{ci.schema}.{ci.table}", infos, mappers, ci.key)
        state = cls(ci, codecs, [names.index(k) for k in ci.key], signature, constants, select=select)
        if not ci.key:
            state.partial_columns = [ci.columns[i].name for i in select if partial_image(ci.columns[i])]
            state.keyless = APPEND if state.partial_columns else MULTISET
        return state

    @property
    def name(self) -> str:
        return self.instance.table_id

    @property
    def key_columns(self) -> list[str]:
        """The key columns (``verify`` joins silver on them)."""
        return list(self.instance.key)

    def table_info(self) -> dict[str, Any]:
        ci = self.instance
        return {
            "schema": ci.schema,
            "table": ci.table,
            "database": ci.database,
            "capture_instance": ci.name,
            "key_columns": list(ci.key),
            "columns": [{"name": ci.columns[i].name, "type": ci.columns[i].type_name} for i in self.select],
            **({"keyless": self.keyless} if self.keyless else {}),
        }

    def sink(self, writer: BatchWriter, kind: str) -> TableSink:
        """This table's open sink of ``kind`` (``stream``/``snapshot``) in ``writer``."""
        key = (id(writer), kind)
        sink = self.sinks.get(key)
        if sink is None or sink.closed:
            ci = self.instance
            layout = SourceLayout(
                SOURCE_TYPE,
                dict(
                    self.constants,
                    snapshot="false" if kind == "stream" else "incremental",
                    db=ci.database,
                    schema=ci.schema,
                    table=ci.table,
                ),
                VARYING,
            )
            sink = writer.sink(
                self.name,
                self.table_info(),
                [self.codecs[i] for i in self.select],
                list(self.select),
                layout,
                kind,
                self.signature,
            )
            self.sinks[key] = sink
        return sink

    def key_text(self, row: tuple) -> tuple:
        cols = self.instance.columns
        return tuple(key_text(cols[i], row[i]) for i in self.key_index)


def partial_image(col: Column) -> bool:
    """Whether change tables may hold NULL for ``col`` in an old image although the row had a
    value: ``text``/``ntext``/``image``, and every column of unlimited size (``(max)`` types,
    ``xml``, ``geometry``, ``geography``: ``sys.columns.max_length`` -1); see the module notes."""
    return col.type_name.lower() in _OLD_STYLE_LOBS or col.max_length == -1


def _codec(col: Column, modes: Modes, ci: CaptureInstance, staged: bool) -> SqlServerCodec:
    """The column's codec; a column that is not staged gets the opaque one rather than an error
    (it is still read, so a type that cannot be read at all -- sql_variant -- is refused anyway)."""
    try:
        return column_codec(col, modes, ci.table_id)
    except UnsupportedType:
        if col.name in ci.key:
            raise unsupported(col, ci.table_id, key=True) from None
        if staged:
            raise
    return column_codec(col, replace(modes, include_unknown=True), ci.table_id)


def key_text(col: Column, value: Any) -> str | None:
    """The text of a key value, identical for change rows and snapshot rows (tracker keys, cursors)."""
    if value is None:
        return None
    t = col.type_name.lower()
    if t == "bit":
        return "1" if value else "0"
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.date | int | tuple) and t not in _INTS:
        return str(key_param(col, value))
    return str(value)


def key_value(col: Column, text: str | None) -> Any:
    """A key's text back as a bound parameter (temporal types stay text; SQL Server converts)."""
    if text is None:
        return None
    t = col.type_name.lower()
    if t in _INTS:
        return int(text)
    if t in _DECIMALS:
        return Decimal(text)
    if t in ("real", "float"):
        return float(text)
    if t == "bit":
        return text == "1"
    if t in _BYTES_KEYS:
        return bytes.fromhex(text)
    return text


#: SQL Server types whose JDBC type is a character type (CHAR, VARCHAR, NCHAR, NVARCHAR, CLOB ...)
_CHARACTER = frozenset({"char", "varchar", "text", "nchar", "nvarchar", "ntext"})


def _column_info(col: Column) -> ColumnInfo:
    """Whether a column is character-typed and its declared length in characters
    (``sys.columns.max_length`` counts bytes: two per character for N-types; ``-1`` for MAX)."""
    t = "nvarchar" if col.type_name.lower() == "sysname" else col.type_name.lower()
    character = t in _CHARACTER
    sized = character and t not in ("text", "ntext") and col.max_length > 0
    per_char = 2 if t.startswith("n") else 1
    length = col.max_length // per_char if sized else -1
    size, scale = (length if length >= 0 else None), None
    if t in ("decimal", "numeric"):
        size, scale = col.precision, col.scale
    elif t in ("binary", "varbinary") and col.max_length > 0:
        size = col.max_length
    return ColumnInfo(col.name, character, length, col.type_name, size, scale)


def configure_keys(instances: list[CaptureInstance], filters: TableFilter) -> set[str]:
    """Give each capture instance the key columns its table's ``message.key.columns`` entry names
    (matched against ``schema.table``, the table filters' form): they replace the primary key or
    ``@index_name`` columns, as Debezium's key mapper does, and key a table without key columns.
    Returns the table ids whose key is configured (it may repeat values: chunks of such a table are
    read as of a non-unique order)."""
    configured = set()
    for ci in instances:
        columns = filters.message_key_columns(TableId(ci.schema, ci.table))
        if columns:
            ci.key = list(columns)
            configured.add(ci.table_id)
    return configured


def warn_append_only(state: TableState) -> None:
    """Log, at start, that a table without key columns is staged as an append-only log."""
    if state.keyless == APPEND:
        log.warning(
            "table %s (capture instance %s) has no key columns and stages large-object columns %s: "
            "SQL Server's change tables hold no whole old image of them (NULL in deletes and update "
            "before-images), so silver keeps an append-only log of its row events (keyless: append), "
            "not a mirror; leave the columns out (column.exclude.list) or give the table key columns "
            "(a primary key, @index_name, or message.key.columns) to mirror it exactly",
            state.name,
            state.instance.name,
            ", ".join(state.partial_columns),
        )
