"""Per table, as its last FIELD event describes it: codecs, key, the ``source`` struct and sinks.

The sink signature is the table plus a hash of its FIELD description, so a schema change (a new
FIELD event after a DDL) starts a new part with the new columns.  Key columns are the fields with
MySQL's ``PRI_KEY_FLAG`` (in column order), or ``message.key.columns``.  A table with neither is
captured as a ``keyless: multiset``: Vitess streams full before and after images (vttablet reads
the shards' row-based binlog; a partial image of such a table is refused by the stager), so silver
mirrors its rows, duplicates included (``spark_jobs/cdc_apply/keyless.py``).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc import __version__
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mappers import Mapper
from airflow_cdc.core.column_mapping import ColumnInfo, declared_size, map_codecs
from airflow_cdc.core.errors import SchemaError
from airflow_cdc.core.table_sink import SourceLayout, TableSink
from airflow_cdc.sources.postgres.types_base import connect_metadata
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.types import DBZ, KAFKA, VitessCodec, _same, column_codec

SOURCE_TYPE = pa.struct(
    [
        pa.field(n, t)
        for n, t in (
            ("version", pa.string()),
            ("connector", pa.string()),
            ("name", pa.string()),
            ("ts_ms", pa.int64()),
            ("ts_us", pa.int64()),
            ("ts_ns", pa.int64()),
            ("snapshot", pa.string()),
            ("db", pa.string()),
            ("sequence", pa.string()),
            ("keyspace", pa.string()),
            ("table", pa.string()),
            ("shard", pa.string()),
            ("vgtid", pa.string()),
        )
    ]
)
# snapshot varies per event: copy rows and streamed changes interleave inside one window and share
# one part per table (a part per switch would split a copy phase into thousands of files)
VARYING = ("ts_ms", "ts_us", "ts_ns", "snapshot", "shard", "vgtid")
_PRI_KEY_FLAG = 2
_CONNECT = {
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.binary(): "bytes",
}
_BINARY_ENCODERS: dict[str, Callable[[bytes], str]] = {
    "base64": lambda v: base64.b64encode(v).decode(),
    "hex": lambda v: v.hex(),
    "base64-url-safe": lambda v: base64.urlsafe_b64encode(v).decode(),
}


class Codec:
    """One column's Python values (from :mod:`.protocol`) -> its Debezium-encoded Arrow array."""

    __slots__ = ("field", "placeholder", "_convert", "_type", "_fast")

    def __init__(self, name: str, codec: VitessCodec, binary_mode: str) -> None:
        arrow, convert, schema_name, params = (
            codec.arrow_type,
            codec.convert,
            codec.schema_name,
            codec.parameters,
        )
        if pa.types.is_decimal(arrow):
            connect, schema_name, params = "bytes", KAFKA + "Decimal", {"scale": str(arrow.scale)}
        elif arrow == pa.binary() and binary_mode != "bytes":
            encode, inner = _BINARY_ENCODERS[binary_mode], convert
            arrow, connect = pa.string(), "string"

            def convert(v: Any) -> Any:
                return encode(inner(v))
        else:
            connect = _CONNECT[arrow]
        meta = connect_metadata(connect, schema_name, params or None)
        self.field = pa.field(name, arrow, nullable=True, metadata=meta)
        self.placeholder = None
        self._convert, self._type = convert, arrow
        self._fast = _vectorised(codec, arrow, convert)

    def convert_values(self, values: list) -> pa.Array:
        if self._fast is not None:
            try:
                return self._fast(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass  # zero dates and the like: value by value
        convert = self._convert
        return pa.array([None if v is None else convert(v) for v in values], type=self._type)

    def convert(self, values: pa.Array) -> pa.Array:
        return self.convert_values(values.to_pylist())


def _vectorised(
    codec: VitessCodec, arrow: pa.DataType, convert: Callable
) -> Callable[[list], pa.Array] | None:
    """A whole-column conversion for the common cases (values as decoded, DATETIME(4-6) text)."""
    if convert is _same:
        return lambda values: pa.array(values, type=arrow)
    if codec.schema_name == DBZ + "MicroTimestamp":
        return lambda values: pa.array(values, pa.string()).cast(pa.timestamp("us")).cast(pa.int64())
    return None


@dataclass
class TableState:
    """How rows of one table (one FIELD description) are encoded and staged."""

    name: str  # keyspace.table
    names: list[str]
    select: list[int]
    codecs: list[Codec]
    key: list[str]
    signature: str
    constants: dict[str, Any]
    sinks: dict[tuple, TableSink] = field(default_factory=dict)

    @property
    def keyless(self) -> bool:
        """No key columns: silver holds the rows as a multiset."""
        return not self.key

    @classmethod
    def build(
        cls,
        name: str,
        fields: list[q.Field],
        config: Any,
        keep_column: Callable[[str, str, bool], bool],
        key_override: tuple[str, ...] | None,
        mappers: tuple[Mapper, ...] = (),
    ) -> TableState:
        """:param mappers: the configured column mappers, matched against
        ``<keyspace>.<table>.<column>``.
        A table without a primary key (and without ``message.key.columns``) has no key columns.

        :raises SchemaError: a ``message.key.columns`` column the FIELD event does not have;
        :raises UnsupportedType: naming the column; :raises ConfigError: a truncation or mask maps
        a key column."""
        keyspace, _, table = name.partition(".")
        names = [f.name for f in fields]
        key = list(key_override) if key_override else [f.name for f in fields if f.flags & _PRI_KEY_FLAG]
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(
                f"table {name}: key column(s) {', '.join(missing)} of message.key.columns missing",
                hint="name columns the table has in message.key.columns",
            )
        precision = config["time.precision.mode"]
        precision = "adaptive_time_microseconds" if precision == "adaptive" else precision
        unsigned, unknown = config["bigint.unsigned.handling.mode"], config["include.unknown.datatypes"]
        select, codecs, infos = [], [], []
        for i, f in enumerate(fields):
            if not keep_column(name, f.name, f.name in key):
                continue
            codec = column_codec(f, name, precision, unsigned, unknown)
            select.append(i)
            codecs.append(Codec(f.name, codec, config["binary.handling.mode"]))
            infos.append(_column_info(f))
        codecs = map_codecs(codecs, name, infos, mappers, key)
        described = "|".join(f"{f.name}:{f.type}:{f.column_type}:{f.decimals}" for f in fields)
        signature = name + ":" + hashlib.sha256(described.encode()).hexdigest()[:16]
        constants = {
            "version": __version__,
            "connector": "vitess",
            "name": config["topic.prefix"] or config["name"],
            "db": "",
            "sequence": None,
            "keyspace": keyspace,
            "table": table,
        }
        return cls(name, names, select, codecs, key, signature, constants)

    @property
    def key_columns(self) -> list[str]:
        return list(self.key)

    def table_info(self) -> dict[str, Any]:
        keyspace, _, table = self.name.partition(".")
        return {
            "schema": keyspace,
            "table": table,
            "keyspace": keyspace,
            "key_columns": list(self.key),
            "columns": [{"name": c.field.name, "type": str(c.field.type)} for c in self.codecs],
        } | ({"keyless": "multiset"} if self.keyless else {})

    def sink(self, writer: BatchWriter) -> TableSink:
        """This table's open sink in ``writer`` (copy rows and changes alike)."""
        key = (id(writer),)
        sink = self.sinks.get(key)
        if sink is None or sink.closed:
            layout = SourceLayout(SOURCE_TYPE, dict(self.constants), VARYING)
            sink = writer.sink(
                self.name,
                self.table_info(),
                list(self.codecs),
                list(self.select),
                layout,
                "stream",
                self.signature,
            )
            self.sinks[key] = sink
        return sink

    def row(self, values: dict[str, Any] | None) -> tuple | None:
        if values is None:
            return None
        return tuple(values.get(n) for n in self.names)

    def key_text(self, values: dict[str, Any]) -> tuple:
        return tuple(None if values.get(k) is None else str(values.get(k)) for k in self.key)


#: Vitess types whose JDBC type is a character type (CHAR, VARCHAR, TEXT): mappers apply
_CHARACTER = frozenset({q.CHAR, q.VARCHAR, q.TEXT, q.ENUM, q.SET})


def _column_info(f: q.Field) -> ColumnInfo:
    """Whether a column is character-typed.  Its mapper length stays unknown, as in Debezium's
    Vitess connector (its columns carry no length), so a hash is never cut; the propagated type is
    the FIELD event's ``column_type`` (name, declared length and scale) when vtgate sends it."""
    base = f.column_type.split("(", 1)[0].split(" ", 1)[0].strip()
    size, scale = declared_size(f.column_type)
    return ColumnInfo(f.name, f.type in _CHARACTER, -1, (base or q.Type.Name(f.type)).upper(), size, scale)
