"""Per-table capture state and the resolution of binlog table maps to table structures.

:class:`TableResolver` turns each TABLE_MAP event into a :class:`TableState`.  A map with full
metadata (column names) states the structure itself; the schema history version that applied
at the event's coordinate only adds declared details the binlog lacks (``tinyint(1)``,
``mediumtext``), and only for columns whose binary form it matches exactly.  A map without names
is decoded with the history version when its layout matches position by position; the version
must then be proved (:mod:`proof`).  A layout that neither explains is handled per
``inconsistent.schema.handling.mode``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from airflow_cdc import __version__
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mappers import Mapper
from airflow_cdc.core.column_mapping import ColumnInfo, declared_size, map_codecs
from airflow_cdc.core.errors import ProtocolError, SchemaError, UnsupportedType
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.table_sink import SourceLayout, TableSink
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.charsets import learn
from airflow_cdc.sources.mysql.mapdef import (
    Charsets,
    column_from_map,
    image_of_def,
    image_of_map,
    images_match,
    layout_matches,
    map_labels,
)
from airflow_cdc.sources.mysql.proof import VersionProof
from airflow_cdc.sources.mysql.schema import (
    ColumnDef,
    SchemaHistory,
    TableDef,
    Version,
    ddl_tables,
    declare_booleans,
)
from airflow_cdc.sources.mysql.types import META_MYSQL_TYPE, Modes, MySqlCodec, column_codec

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
        info = {
            "schema": self.tdef.db,
            "table": self.tdef.table,
            "key_columns": self.key_columns,
            "columns": cols,
        }
        # no key: binlog row images are full (binlog_row_image=FULL), so silver mirrors the rows
        return info if self.key_index else {**info, "keyless": "multiset"}

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
        """Row images of one rows event as (before, after) pairs, read from ``body[o:]`` by the
        compiled reader where :func:`rowcodec.native_reader` gives one, else the generated ones.

        :raises SchemaError: an UPDATE/DELETE image lacks columns (the writing session did not
            use ``binlog_row_image=FULL``).
        """
        self._require_full(op, present, pos)
        readers = self._native(op, present, after)
        if readers is not None:
            try:
                return readers[0].decode(body, o, op, readers[1])  # type: ignore[no-any-return]
            except ValueError as e:
                raise ProtocolError(f"table {self.name}: cannot decode rows event at {pos}: {e}") from e
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

    def events(
        self,
        body: bytes,
        o: int,
        op: str,
        present: list[bool],
        after: list[bool] | None,
        pos: int,
        info: tuple,
    ) -> list[tuple] | None:
        """The stream's event tuples ``(op, before, after, info, pos, row, None, ordinal)`` of one
        rows event, built by the compiled reader in one pass (a key-changing update is a ``d`` and
        a ``c``, see :meth:`WindowReader._add_all`); None where there is no compiled reader.

        :raises SchemaError: as :meth:`decode`.
        """
        self._require_full(op, present, pos)
        readers = self._native(op, present, after)
        if readers is None:
            return None
        try:
            return readers[0].events(body, o, op, readers[1], self.key_index, info, pos)  # type: ignore[no-any-return]
        except ValueError as e:
            raise ProtocolError(f"table {self.name}: cannot decode rows event at {pos}: {e}") from e

    def native_layouts(
        self, op: str, present: list[bool], after: list[bool] | None, pos: int
    ) -> tuple[Any, Any] | None:
        """The compiled layouts of a rows event's images (before/only, after), or None.

        :raises SchemaError: as :meth:`decode`.
        """
        self._require_full(op, present, pos)
        return self._native(op, present, after)

    def _require_full(self, op: str, present: list[bool], pos: int) -> None:
        """:raises SchemaError: an UPDATE/DELETE image lacks columns (not ``binlog_row_image=FULL``)."""
        if op != "c" and not all(present):
            raise SchemaError(
                f"table {self.name}: rows event at binlog position {pos} lacks columns; the "
                "writing session did not use binlog_row_image=FULL",
                hint="set binlog_row_image=FULL globally and for every writing session",
            )

    def _native(self, op: str, present: list[bool], after: list[bool] | None) -> tuple[Any, Any] | None:
        """The compiled readers of a rows event's images (before/only, after), or None."""
        native = self._reader(present, True)
        second = self._reader(after or present, True) if op == "u" else None
        if native is None or (op == "u" and second is None):
            return None
        return native, second

    def _reader(self, present: list[bool], native: bool = False) -> Any:
        """The generated Python reader, or (``native``) the compiled one or None (:mod:`rowcodec`)."""
        key = (native, *present)
        if key not in self.readers:
            make = rc.native_reader if native else rc.row_reader
            self.readers[key] = make(self.layout, present)
        return self.readers[key]


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
        head: Callable[[], int] | None = None,
        mappers: tuple[Mapper, ...] = (),
    ) -> None:
        """:param head: the binlog head coordinate now (read after each information_schema read).
        :param mappers: the configured column mappers, matched against ``<db>.<table>.<column>``."""
        self.conn, self.filters, self.modes, self.history = conn, filters, modes, history
        self.mappers = mappers
        self.constants, self.json_decoder, self.inconsistent = constants, json_decoder, inconsistent
        self.files, self.head = files, head
        self.charsets = Charsets(conn)
        self.proof = VersionProof(self.where)
        self._states: dict[tuple, TableState | None] = {}
        #: captured tables whose CREATE TABLE this run's windows applied (complete from the log)
        self.created: set[str] = set()

    def where(self, coord: int) -> str:
        return f"{self.file_name(coord >> 32)}:{coord & 0xFFFFFFFF}"

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
        version = self.history.version_at(name, coord)
        tdef = None if version is None else version[1]
        key = (
            tm.signature(),
            tuple(tm.names or ()),
            tuple(tm.unsigned or ()),
            tuple(tm.charsets or ()),
            id(tdef),
        )
        if key in self._states:
            return self._states[key]
        if tm.names is not None:
            resolved: TableDef | None = self._from_map(name, tm, version, coord)
        elif tdef is not None and version is not None and layout_matches(tdef, tm, self.charsets):
            why = "its table map does not name the columns (binlog_row_metadata is not FULL)"
            self.proof.decoded(name, version, coord, why)
            resolved = tdef
        else:
            resolved = self._inconsistent(name, tm, coord)
        state = None if resolved is None else self.build(resolved, tm)
        self._states[key] = state
        return state

    def _from_map(self, name: str, tm: p.TableMap, version: Version | None, coord: int) -> TableDef:
        """The structure a full-metadata map states; history details only where the binary form matches."""
        tdef = None if version is None else version[1]
        known = {c.name: c for c in tdef.columns} if tdef else {}
        cols = []
        for i in range(len(tm.types)):
            col = column_from_map(tm, i, self.charsets)
            old = known.get(col.name)
            if old is not None and images_match(
                image_of_def(old, self.charsets), image_of_map(tm, i, self.charsets)
            ):
                if version is not None and not self._same_encoding(old, col):
                    why = f"column {col.name!r} is {old.column_type!r} per the history, not the binlog"
                    self.proof.decoded(name, version, coord, why)
                col = replace(old, nullable=col.nullable)
            cols.append(col)
        names = [c.name for c in cols]
        if tm.primary_key is not None:
            key = [names[i] for i in tm.primary_key if i < len(names)]
        else:
            key = [k for k in (tdef.key if tdef else []) if k in names]
        resolved = TableDef(tm.schema, tm.table, cols, key, tdef.charset if tdef else None)
        self.proof.stated(name, version, resolved)
        return resolved

    def _same_encoding(self, a: ColumnDef, b: ColumnDef) -> bool:
        """Whether two columns of one binary form are encoded alike (the declared type not mattering)."""
        try:
            fa, fb = column_codec(a, self.modes).field, column_codec(b, self.modes).field
        except UnsupportedType:
            return False
        strip = lambda f: {k: v for k, v in (f.metadata or {}).items() if k != META_MYSQL_TYPE}  # noqa: E731
        return fa.type == fb.type and strip(fa) == strip(fb)

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
        """Capture state of a structure (column filters, key, codecs).  A table without a primary
        key and ``message.key.columns`` entry has no key columns (its silver is a multiset).

        :raises SchemaError: ``message.key.columns`` names columns the table lacks.
        :raises UnsupportedType: naming table and column.
        """
        tid = TableId(tdef.db, tdef.table)
        names = [c.name for c in tdef.columns]
        key = list(self.filters.message_key_columns(tid) or tdef.key)
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(
                f"table {tdef.name} has no column(s) {missing} that message.key.columns names",
                hint="fix message.key.columns=<db.table>:<col>,...",
            )
        select, codecs, layout, infos = [], [], [], []
        for i, col in enumerate(tdef.columns):
            labels = None
            if tm is not None and col.data_type in ("enum", "set") and p.enum_or_set(tm, i):
                labels = map_labels(tm, i, self.charsets, col.charset)
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
            infos.append(_column_info(col))
        codecs = map_codecs(codecs, str(tid), infos, self.mappers, key)
        sig = hashlib.sha1(
            repr([(c.name, c.column_type) for c in tdef.columns] + [tm.signature() if tm else None]).encode()
        ).hexdigest()[:12]
        return TableState(
            tdef.name, tdef, layout, codecs, select, [names.index(k) for k in key], sig, dict(self.constants)
        )

    def current_state(self, name: str, writer: BatchWriter) -> TableState | None:
        tdef = self.history.latest(name)
        return None if tdef is None else self.build(tdef)

    def later_ddl(self, query: p.Query, coord: int) -> None:
        """A DDL logged after the window: only checked against the versions the window relied on."""
        kind, names = ddl_tables(query.query, query.schema)
        if kind not in ("", "TRUNCATE"):
            for db, t in names:
                if self.captured(db, t):
                    self.proof.ddl(f"{db}.{t}", coord)

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
        changes: list[dict[str, Any]] = []
        truncated: list[str] = []
        if kind == "TRUNCATE":
            truncated = [f"{db}.{t}" for db, t in names]
        else:
            for db, t in names:
                self.proof.ddl(f"{db}.{t}", coord)
            current = load_tables(self.conn, names=names)
            learn(self.conn, {c.charset for t in current.values() for c in t.columns})
            read_at = self.head() if self.head is not None else None
            for db, t in names:
                full = f"{db}.{t}"
                tdef = current.get(full)
                if tdef is not None:
                    declare_booleans(query.query, tdef, self.history.latest(full))
                    if kind == "CREATE":
                        self.created.add(full)
                self.history.record(full, coord, tdef, read_at)
                if tdef is not None:
                    changes.append(tdef.table_change("CREATE" if kind == "CREATE" else "ALTER"))
                    self.proof.described(full, self.history.versions[full][-1], changes, len(changes) - 1)
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


#: MySQL types whose JDBC type is a character type (CHAR, VARCHAR, LONGVARCHAR): mappers apply
_CHARACTER = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})


def _column_info(col: ColumnDef) -> ColumnInfo:
    """Whether a column is character-typed and its declared length (``varchar(32)``: 32)."""
    character = col.data_type in _CHARACTER
    sized = character and col.data_type in ("char", "varchar") and "(" in col.column_type
    length = int(col.column_type.split("(", 1)[1].split(")", 1)[0]) if sized else -1
    size, scale = declared_size(col.column_type)
    return ColumnInfo(col.name, character, length, col.data_type.upper(), size, scale)
