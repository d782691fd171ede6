"""Per-table capture state and the resolution of binlog table maps to table structures.

:class:`TableResolver` turns each TABLE_MAP event into a :class:`TableState` using the schema
history version that applied at the event's coordinate (checked against the map's layout), or,
when the history does not match and the map carries full metadata, the map itself.  A layout
that neither explains is handled per ``inconsistent.schema.handling.mode``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc import __version__
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.errors import ProtocolError, SchemaError, UnsupportedType
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.table_sink import SourceLayout, TableSink
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.schema import ColumnDef, SchemaHistory, TableDef, binlog_compatible, ddl_tables
from airflow_cdc.sources.mysql.types import Modes, MySqlCodec, column_codec

log = logging.getLogger(__name__)

#: MySQL / MariaDB ``source`` block: Debezium 3.3's fields in its order (SchemaFactory's common
#: fields -- ``ts_us``/``ts_ns`` after ``sequence`` -- then BinlogSourceInfoStructMaker's).
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
            ("ts_us", pa.int64()),
            ("ts_ns", pa.int64()),
            ("table", pa.string()),
            ("server_id", pa.int64()),
            ("gtid", pa.string()),
            ("file", pa.string()),
            ("pos", pa.int64()),
            ("row", pa.int32()),
            ("thread", pa.int64()),
            ("query", pa.string()),
        )
    ]
)
#: the per-event ``source`` values, in the order of the tuples the readers build
VARYING = ("ts_ms", "server_id", "gtid", "file", "pos", "row", "thread", "query", "ts_us", "ts_ns")
_BINLOG_NAMES = {
    rc.T_TINY: "tinyint",
    rc.T_SHORT: "smallint",
    rc.T_INT24: "mediumint",
    rc.T_LONG: "int",
    rc.T_LONGLONG: "bigint",
    rc.T_FLOAT: "float",
    rc.T_DOUBLE: "double",
    rc.T_NEWDECIMAL: "decimal",
    rc.T_DATE: "date",
    rc.T_DATETIME2: "datetime",
    rc.T_DATETIME: "datetime",
    rc.T_TIMESTAMP2: "timestamp",
    rc.T_TIMESTAMP: "timestamp",
    rc.T_TIME2: "time",
    rc.T_TIME: "time",
    rc.T_YEAR: "year",
    rc.T_BIT: "bit",
    rc.T_ENUM: "enum",
    rc.T_SET: "set",
    rc.T_JSON: "json",
    rc.T_GEOMETRY: "geometry",
}
BINARY_COLLATION = 63


@dataclass
class TableState:
    """How rows of one table structure are decoded and captured."""

    name: str
    tdef: TableDef
    layout: list[rc.ColumnLayout]
    codecs: list[MySqlCodec]
    select: list[int]
    key_index: list[int]
    signature: str
    constants: dict[str, Any]
    readers: dict[tuple, Any] = field(default_factory=dict)

    @property
    def key_columns(self) -> list[str]:
        return [self.tdef.columns[i].name for i in self.key_index]

    def source_layout(self, snapshot: str) -> SourceLayout:
        return SourceLayout(
            SOURCE_TYPE,
            dict(self.constants, snapshot=snapshot, db=self.tdef.db, table=self.tdef.table),
            VARYING,
        )

    def table_info(self) -> dict[str, Any]:
        cols = [
            {"name": c.name, "type": c.column_type}
            for i, c in enumerate(self.tdef.columns)
            if i in self.select
        ]
        return {
            "schema": self.tdef.db,
            "table": self.tdef.table,
            "key_columns": self.key_columns,
            "columns": cols,
        }

    def open_sink(self, writer: BatchWriter, kind: str, expand: Any = None) -> TableSink:
        return writer.sink(
            self.name,
            self.table_info(),
            list(self.codecs),
            self.select,
            self.source_layout("false" if kind == "stream" else "incremental"),
            kind,
            self.signature,
            expand=expand,
        )

    def stream_sink(self, writer: BatchWriter, expand: Any) -> TableSink:
        sinks: dict = writer.__dict__.setdefault("_mysql_sinks", {})
        sink = sinks.get(self.name)
        if sink is None or sink.closed or sink.schema_version != self.signature:
            sink = sinks[self.name] = self.open_sink(writer, "stream", expand)
        return sink  # type: ignore[no-any-return]

    def decode(
        self, body: bytes, o: int, op: str, present: list[bool], after: list[bool] | None, pos: int
    ) -> list[tuple[tuple | None, tuple | None]]:
        """Row images of one rows event as (before, after) pairs.

        :raises SchemaError: an UPDATE/DELETE image lacks columns (the writing session did not
            use ``binlog_row_image=FULL``).
        """
        if op != "c" and not all(present):
            raise SchemaError(
                f"table {self.name}: rows event at binlog position {pos} lacks columns; the "
                "writing session did not use binlog_row_image=FULL",
                hint="set binlog_row_image=FULL globally and for every writing session",
            )
        read = self._reader(present)
        end, out = len(body), []
        try:
            if op == "u":
                read_after = self._reader(after or present)
                while o < end:
                    before, o = read(body, o)
                    image, o = read_after(body, o)
                    out.append((before, image))
            elif op == "c":
                while o < end:
                    image, o = read(body, o)
                    out.append((None, image))
            else:
                while o < end:
                    image, o = read(body, o)
                    out.append((image, None))
        except (IndexError, ValueError) as e:
            raise ProtocolError(f"table {self.name}: cannot decode rows event at {pos}: {e}") from e
        return out

    def _reader(self, present: list[bool]) -> Any:
        key = tuple(present)
        reader = self.readers.get(key)
        if reader is None:
            reader = self.readers[key] = rc.row_reader(self.layout, present)
        return reader


def _column_from_map(tm: p.TableMap, i: int, known: ColumnDef | None) -> ColumnDef:
    t, meta = tm.types[i], tm.metas[i]
    binary = tm.charsets is not None and tm.charsets[i] == BINARY_COLLATION
    unsigned = " unsigned" if tm.unsigned and tm.unsigned[i] else ""
    name = tm.names[i] if tm.names else f"col{i}"
    if t in (rc.T_VARCHAR, rc.T_VAR_STRING):
        dtype, ctype = ("varbinary", f"varbinary({meta})") if binary else ("varchar", f"varchar({meta})")
    elif t == rc.T_STRING:
        dtype, ctype = ("binary", f"binary({meta})") if binary else ("char", f"char({meta})")
    elif t == rc.T_BLOB:
        dtype = "blob" if binary else "text"
        ctype = dtype
    elif t in (rc.T_ENUM, rc.T_SET):
        dtype = "enum" if t == rc.T_ENUM else "set"
        ctype = dtype + "()"
    else:
        dtype = _BINLOG_NAMES.get(t, "unknown")
        ctype = dtype + unsigned
    col = ColumnDef(
        name, dtype, ctype, tm.nullable[i], "utf8mb4" if dtype in ("varchar", "char", "text") else None
    )
    if t == rc.T_NEWDECIMAL:
        col.precision, col.scale, col.column_type = (
            meta >> 8,
            meta & 0xFF,
            f"decimal({meta >> 8},{meta & 0xFF})",
        )
    elif t in (rc.T_DATETIME2, rc.T_TIMESTAMP2, rc.T_TIME2):
        col.fsp = meta
    elif t == rc.T_BIT:
        col.precision = meta
    elif dtype == "binary":
        col.length = meta
    if known is not None and known.name == name and known.data_type == dtype:
        return known  # the history's declared type (e.g. tinyint(1)) is still right
    return col


class TableResolver:
    """Table structures for the window: schema history plus table maps, and DDL bookkeeping."""

    def __init__(
        self,
        conn: Any,
        filters: TableFilter,
        modes: Modes,
        history: SchemaHistory,
        constants: dict[str, Any],
        json_decoder: Any,
        inconsistent: str,
        files: dict[int, str],
    ) -> None:
        self.conn, self.filters, self.modes, self.history = conn, filters, modes, history
        self.constants, self.json_decoder, self.inconsistent = constants, json_decoder, inconsistent
        self.files = files
        self._states: dict[tuple, TableState | None] = {}

    def file_name(self, file_no: int) -> str:
        if file_no in self.files:
            return self.files[file_no]
        base = next(iter(self.files.values()), "binlog.000001").rsplit(".", 1)[0]
        return f"{base}.{file_no:06d}"

    def captured(self, db: str, table: str) -> bool:
        return self.filters.includes_table(TableId(db, table))

    def unsupported_event(self, etype: int, file: str, pos: int) -> ProtocolError:
        return ProtocolError(
            f"binlog event type {etype} at {file}:{pos} is not supported (compressed "
            "binlog events or partial JSON updates)",
            hint="disable log_bin_compress / binlog_transaction_compression and set "
            "binlog_row_value_options=''",
        )

    def state_for(self, tm: p.TableMap, coord: int, writer: BatchWriter) -> TableState | None:
        """The capture state for a table map at ``coord`` (None: table not captured or skipped)."""
        if not self.captured(tm.schema, tm.table):
            return None
        name = f"{tm.schema}.{tm.table}"
        tdef = self.history.at(name, coord)
        key = (tm.signature(), tuple(tm.names or ()), id(tdef))
        if key in self._states:
            return self._states[key]
        if tdef is not None and binlog_compatible(tdef, tm):
            resolved: TableDef | None = tdef
        elif tm.names is not None:
            resolved = self._from_map(tm, tdef)
        else:
            resolved = self._inconsistent(name, tm, coord)
        state = None if resolved is None else self.build(resolved, tm)
        self._states[key] = state
        return state

    def _from_map(self, tm: p.TableMap, tdef: TableDef | None) -> TableDef:
        known = {c.name: c for c in tdef.columns} if tdef else {}
        cols = [_column_from_map(tm, i, known.get((tm.names or [])[i])) for i in range(len(tm.types))]
        names = [c.name for c in cols]
        if tm.primary_key is not None:
            key = [names[i] for i in tm.primary_key if i < len(names)]
        else:
            key = [k for k in (tdef.key if tdef else []) if k in names]
        return TableDef(tm.schema, tm.table, cols, key, tdef.charset if tdef else None)

    def _inconsistent(self, name: str, tm: p.TableMap, coord: int) -> TableDef | None:
        msg = (
            f"table {name}: the binlog layout at {self.file_name(coord >> 32)}:{coord & 0xFFFFFFFF} "
            f"({len(tm.types)} columns) does not match the schema history and the server does not log "
            "column names (binlog_row_metadata is not FULL)"
        )
        if self.inconsistent == "fail":
            raise SchemaError(
                msg,
                hint="set binlog_row_metadata=FULL, or inconsistent.schema.handling.mode="
                "warn/skip to skip such events",
            )
        if self.inconsistent == "warn":
            log.warning("%s; skipping its events (inconsistent.schema.handling.mode=warn)", msg)
        return None

    def build(self, tdef: TableDef, tm: p.TableMap | None = None) -> TableState:
        """Capture state of a structure (column filters, key, codecs).

        :raises SchemaError: no key and no ``message.key.columns``.
        :raises UnsupportedType: naming table and column.
        """
        tid = TableId(tdef.db, tdef.table)
        names = [c.name for c in tdef.columns]
        key = list(self.filters.message_key_columns(tid) or tdef.key)
        missing = [k for k in key if k not in names]
        if not key or missing:
            raise SchemaError(
                f"table {tdef.name} has no primary key{f' (missing {missing})' if missing else ''};"
                " set message.key.columns to name its key columns",
                hint="add a primary key or set message.key.columns=<db.table>:<col>,...",
            )
        enums = iter(tm.enums) if tm is not None else iter(())
        sets = iter(tm.sets) if tm is not None else iter(())
        select, codecs, layout = [], [], []
        for i, col in enumerate(tdef.columns):
            labels = (
                next(enums, None)
                if col.data_type == "enum"
                else next(sets, None)
                if col.data_type == "set"
                else None
            )
            unsigned = bool(tm.unsigned[i]) if tm is not None and tm.unsigned else col.unsigned
            if tm is not None:
                layout.append(rc.ColumnLayout(tm.types[i], tm.metas[i], unsigned, self.json_decoder))
            if not self.filters.includes_column(tid, col.name, is_key=col.name in key):
                continue
            try:
                codecs.append(column_codec(col, self.modes, labels or None))
            except UnsupportedType as e:
                raise UnsupportedType(f"table {tdef.name}, {e.args[0]}", hint=e.hint) from e
            select.append(i)
        sig = hashlib.sha1(
            repr([(c.name, c.column_type) for c in tdef.columns] + [tm.signature() if tm else None]).encode()
        ).hexdigest()[:12]
        return TableState(
            tdef.name, tdef, layout, codecs, select, [names.index(k) for k in key], sig, dict(self.constants)
        )

    def current_state(self, name: str, writer: BatchWriter) -> TableState | None:
        tdef = self.history.latest(name)
        return None if tdef is None else self.build(tdef)

    def apply_ddl(
        self, query: p.Query, coord: int, gtid: str | None, ts_ms: int, file: str
    ) -> dict[str, Any] | None:
        """Record a DDL statement touching captured tables; returns its schema change event."""
        from airflow_cdc.sources.mysql.schema import load_tables

        kind, names = ddl_tables(query.query, query.schema)
        names = [n for n in names if self.captured(*n)]
        if not names:
            return None
        pos = coord & 0xFFFFFFFF
        changes, truncated = [], []
        if kind == "TRUNCATE":
            truncated = [f"{db}.{t}" for db, t in names]
        else:
            current = load_tables(self.conn, names=names)
            for db, t in names:
                full = f"{db}.{t}"
                tdef = current.get(full)
                self.history.record(full, coord, tdef)
                if tdef is not None:
                    changes.append(tdef.table_change("CREATE" if kind == "CREATE" else "ALTER"))
                else:
                    changes.append({"type": "DROP", "id": f'"{db}"."{t}"', "table": None})
            self._states.clear()
        src = dict(
            self.constants,
            ts_ms=ts_ms,
            snapshot="false",
            db=names[0][0],
            table=None,
            file=file,
            pos=pos,
            gtid=gtid,
            row=0,
            thread=query.thread_id,
            query=None,
        )
        self.history.ddl.append(
            {"file": file, "pos": pos, "gtid": gtid, "db": names[0][0], "ddl": query.query}
        )
        return {
            "source": src,
            "databaseName": names[0][0],
            "schemaName": None,
            "ddl": query.query,
            "tableChanges": changes,
            "ts_ms": ts_ms,
            "_truncated": truncated,
        }


def source_constants(connector_name: str, connector: str = "mysql") -> dict[str, Any]:
    """The constant ``source`` fields; ``connector`` is ``mysql`` or ``mariadb`` as configured
    (Debezium's MariaDbConnector writes ``mariadb``, its MySqlConnector ``mysql`` whatever the
    server is)."""
    return {"version": __version__, "connector": connector, "name": connector_name, "sequence": None}
