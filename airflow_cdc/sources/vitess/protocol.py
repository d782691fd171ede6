"""VStream events -> whole transactions of decoded row changes.

vtgate sends, per shard transaction, ``BEGIN, [FIELD], ROW..., VGTID, COMMIT`` (``VGTID, DDL`` /
``VGTID, OTHER`` for statements); a VGTID is the position *after* the transaction.  The copy
phase sends its rows as transactions too (v24 ``uvstreamer``/``copy.go``: ``sendFieldEvent``,
``sendEventsForRows``, ``copyComplete``), and vtgate turns vttablet's GTID and LASTPK events into
VGTIDs (``vstream_manager.go``: ``sendEventsLocked``; LASTPK never reaches a client)::

    BEGIN, FIELD, [VGTID(G)], ROW..., VGTID(G + table_p_ks), COMMIT   first chunk of a table
    BEGIN, ROW..., VGTID(G + table_p_ks), COMMIT                       later chunks
    BEGIN, VGTID(G, the table's table_p_ks removed), COMMIT           table done
    BEGIN, FIELD, [VGTID(G)], BEGIN, VGTID(G), COMMIT                  an empty table

``[VGTID(G)]`` comes only when the snapshot moved the shard's position.  A chunk's last VGTID thus
leaves the shard's GTID where it was (as of the VGTID before it in the transaction, else as of the
previous transaction) and names the shard's ``table_p_ks``; a binlog transaction always moves the
GTID.  Such a chunk's rows are snapshot reads (``op=r``).  FIELD events describe a table until the
next FIELD for it; a ROW of a table never described is a protocol error.

Values arrive as MySQL text (``query.Row``): :func:`decode_value` turns them into neutral Python
values (integers, floats, text for DECIMAL and temporal types, ``str`` for character types,
``bytes`` for binary ones) that :mod:`airflow_cdc.sources.vitess.types` encodes Debezium's way.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.errors import ProtocolError, SchemaError, UnsupportedType
from airflow_cdc.core.table_sink import NOT_SENT
from airflow_cdc.sources.mysql.schema import enum_labels
from airflow_cdc.sources.mysql.types import label_of
from airflow_cdc.sources.vitess.offsets import shard_key
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q

_INTEGRAL, _FLOAT, _TEXT = q.ISINTEGRAL, q.ISFLOAT, q.ISTEXT
_BINARY_TYPES = frozenset({q.BLOB, q.VARBINARY, q.BINARY, q.BIT, q.GEOMETRY})
_TEXT_TYPES = frozenset({q.TEXT, q.VARCHAR, q.CHAR, q.ENUM, q.SET, q.JSON})
_TEMPORAL = frozenset({q.DATE, q.DATETIME, q.TIMESTAMP, q.TIME, q.DECIMAL})


def value_decoder(f: q.Field) -> Callable[[bytes], Any]:
    """How to read one column's text value (not NULL)."""
    t = f.type
    if t in _BINARY_TYPES:
        return bytes
    if t in _TEXT_TYPES or t in _TEMPORAL:  # temporal and DECIMAL text is ASCII, a subset of UTF-8
        return bytes.decode
    if t & _INTEGRAL:
        return int
    if t & _FLOAT:
        return float
    return bytes


@dataclass
class Table:
    """A table as the last FIELD event described it."""

    name: str  # keyspace.table
    fields: list[q.Field]
    decoders: list[Callable[[bytes], Any]]
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names = [f.name for f in self.fields]

    @classmethod
    def from_event(cls, event: b.FieldEvent) -> Table:
        """:raises SchemaError: vttablet could not name the columns (see :func:`schema_drift`)."""
        if event.fields and all(_POSITIONAL.fullmatch(f.name) for f in event.fields):
            raise schema_drift(event.table_name, "its columns arrive unnamed (@1, @2, ...)")
        fields = [_character_type(f) for f in event.fields]
        decoders = [value_decoder(f) for f in fields]
        if not event.enum_set_string_values:
            # vttablet before v20 sends ENUM values as their 1-based index and SET values as a bit
            # mask (as text); v20+ maps them to labels and says so in the FIELD event (v24
            # vstreamer.go: ``EnumSetStringValues: len(plan.EnumSetValuesMap) > 0``; copy.go sets it)
            for i, f in enumerate(fields):
                if f.type in (q.ENUM, q.SET):
                    decoders[i] = _label_decoder(f)
        return cls(event.table_name, fields, decoders)

    def decode(self, row: q.Row) -> dict[str, Any]:
        lengths = row.lengths
        if len(lengths) != len(self.fields):
            raise ProtocolError(
                f"VStream row of {self.name} has {len(lengths)} values, "
                f"its FIELD event {len(self.fields)} columns"
            )
        values = row.values  # one copy out of the message, then slices
        out: list[Any] = []
        offset = 0
        for decode, length in zip(self.decoders, lengths, strict=True):
            if length < 0:
                out.append(None)
                continue
            end = offset + length
            out.append(decode(values[offset:end]))
            offset = end
        return dict(zip(self.names, out, strict=True))


_POSITIONAL = re.compile(r"@\d+")


def schema_drift(table: str, symptom: str) -> SchemaError:
    """The error for rows vttablet cannot describe: written before a DDL that changed the table,
    read after its schema engine loaded the new schema, with no schema history.  vttablet then
    fails the stream when the rows have more columns than the table now has (``cannot determine
    table columns``), and names the columns ``@1, @2, ...`` by the binlog's types when a column's
    type no longer matches (v24 ``vstreamer.go`` ``buildTableColumns``, FieldEventMode
    ``ERR_ON_MISMATCH``, the default).  Nothing is staged and the offset does not move."""
    return SchemaError(
        f"table {table}: vttablet cannot describe this table's rows at the stored position: "
        f"{symptom}; they were written before a DDL that changed the table, and vttablet keeps no "
        "schema history (its --track-schema-versions is off)",
        hint=f"leave {table} out (table.exclude.list, or table.include.list) until a run has read past "
        "that DDL, then capture it again and send an execute-snapshot signal for it; run vttablet with "
        "--track-schema-versions (and --watch-replication-stream) so later DDLs are replayed right",
    )


#: binary-flagged character columns: Vitess's type -> the character type their column type names
_AS_CHARACTER = {q.VARBINARY: q.VARCHAR, q.BINARY: q.CHAR, q.BLOB: q.TEXT}
_CHARACTER_COLUMN_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})


def _character_type(f: q.Field) -> q.Field:
    """A character column with a binary collation (``utf8mb4_bin``; MariaDB's JSON is LONGTEXT
    ``utf8mb4_bin``) carries MySQL's BINARY flag, which Vitess turns into VARBINARY/BINARY/BLOB
    (``sqltypes.MySQLToType``); its ``column_type`` still says ``varchar(n)``/``text``.  Debezium's
    Vitess connector emits such columns as strings (DBZ-6748, DBZ-8679, DBZ-8694: ``VitessType``
    resolves by ``column_type``), and so do we: the field is described with the character type."""
    character = _AS_CHARACTER.get(f.type)
    if character is None or f.charset == 63:  # the binary character set: really binary
        return f
    if f.column_type.split("(", 1)[0].strip().lower() not in _CHARACTER_COLUMN_TYPES:
        return f
    out = q.Field()
    out.CopyFrom(f)
    out.type = character
    return out


def _label_decoder(f: q.Field) -> Callable[[bytes], str]:
    """An ENUM index / SET bit mask (text) -> its label(s), from the column type's labels.  A value
    that is not a number is already a label (a FIELD event without the flag from a v20+ tablet)."""
    label = label_of(enum_labels(f.column_type), f.type == q.SET)

    def decode(value: bytes) -> str:
        return label(int(value)) if value.isdigit() else value.decode()

    return decode


def _bits(bitmap: b.RowChange.Bitmap) -> list[bool]:
    """A vttablet bitmap as flags: bit i is in byte i // 8, least significant bit first (go/mysql
    binlog_event.go ``Bitmap.Bit``)."""
    cols = bitmap.cols
    return [bool(cols[i >> 3] >> (i & 7) & 1) if (i >> 3) < len(cols) else False for i in range(bitmap.count)]


@dataclass
class Change:
    op: str  # c, u, d, or r (a copy-phase read)
    table: str  # keyspace.table
    shard: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    timestamp: int  # binlog seconds (0 for copy reads)
    partial: bool = False  # the after image holds NOT_SENT values


@dataclass
class Transaction:
    """One shard transaction (or statement, or copy chunk) and the VGTID after it."""

    keyspace: str
    shard: str
    vgtid: b.VGtid | None
    kind: str = "commit"  # commit | copy | ddl | other
    changes: list[Change] = field(default_factory=list)
    statement: str = ""
    timestamp: int = 0


@dataclass
class Marker:
    """A non-transaction item: ``position`` (a VGTID between transactions), ``copy_completed``
    (``shard`` empty once every shard is copied), ``journal`` (stop_on_reshard), ``heartbeat``."""

    kind: str
    vgtid: b.VGtid | None = None
    keyspace: str = ""
    shard: str = ""
    journal: b.Journal | None = None


class Assembler:
    """Feeds VStream events, returns whole transactions and markers in stream order."""

    def __init__(
        self, start: b.VGtid | None = None, columns: dict[str, dict[str, str]] | None = None
    ) -> None:
        """:param start: the VGTID the stream starts from (so a resumed copy's first chunk is
        recognised as one).
        :param columns: per shard, per table, the :func:`column_digest` of the columns its last FIELD
        event named as of ``start`` (see :meth:`_check_columns`); kept up to date in
        :attr:`columns`."""
        self.tables: dict[str, Table] = {}
        self.columns: dict[str, dict[str, str]] = {shard: dict(t) for shard, t in (columns or {}).items()}
        self.position: dict[tuple[str, str], str] = {}  # shard -> gtid as of the last VGTID
        self._txn: Transaction | None = None
        self._pending_vgtid: b.VGtid | None = None
        self._txn_base: str | None = None  # the shard's gtid in the open transaction's earlier VGTID
        if start is not None:
            self._remember(start)

    def feed(self, event: b.VEvent) -> list[Transaction | Marker]:
        kind = event.type
        if kind == b.BEGIN:
            # an empty table's copy nests a BEGIN in the FIELD's; the outer one held no rows
            self._txn = Transaction(event.keyspace, event.shard, None, timestamp=event.timestamp)
            self._txn_base = None
            return []
        if kind == b.FIELD:
            table = Table.from_event(event.field_event)
            self._check_columns(event)
            self.tables[table.name] = table
            return []
        if kind == b.ROW:
            self._row(event)
            return []
        if kind == b.VGTID:
            return self._vgtid(event.vgtid)
        if kind == b.COMMIT:
            return self._commit()
        if kind in (b.DDL, b.OTHER):
            if kind == b.DDL:
                self.columns.pop(event.shard, None)  # any table's columns may change from here
            vgtid, self._pending_vgtid = self._pending_vgtid, None
            name = "ddl" if kind == b.DDL else "other"
            return [
                Transaction(
                    event.keyspace,
                    event.shard,
                    vgtid,
                    name,
                    statement=event.statement,
                    timestamp=event.timestamp,
                )
            ]
        if kind == b.COPY_COMPLETED:
            return [Marker("copy_completed", keyspace=event.keyspace, shard=event.shard)]
        if kind == b.JOURNAL:
            return [Marker("journal", keyspace=event.keyspace, shard=event.shard, journal=event.journal)]
        if kind == b.HEARTBEAT:
            return [Marker("heartbeat")]
        return []

    def _check_columns(self, event: b.VEvent) -> None:
        """A table's columns change only at a DDL of its shard's stream.  vttablet without schema
        history describes old rows with the table's *current* columns cut to the row's width
        (v24 ``vstreamer.go`` ``buildTableColumns``): rows written before a column was added in
        the middle (or columns reordered) come named wrongly, silently, when the types still
        match.  So a FIELD event naming other columns than the last one of this table on this
        shard, with no DDL in between (this window or, through the offset, the runs before), is
        refused before any row under it is staged.

        :raises SchemaError: see :func:`schema_drift`."""
        fe = event.field_event
        shard = event.shard or fe.shard
        digest = column_digest(fe)
        known = self.columns.setdefault(shard, {})
        if known.get(fe.table_name, digest) != digest:
            names = ", ".join(f.name for f in fe.fields)
            raise schema_drift(
                fe.table_name,
                f"on shard {shard} its rows arrive as ({names}), other columns than the last rows read "
                "of it, with no DDL in between (a column added other than at the end, read with the "
                "table's current columns)",
            )
        known[fe.table_name] = digest

    def _row(self, event: b.VEvent) -> None:
        if self._txn is None:
            raise ProtocolError(f"VStream ROW event for {event.row_event.table_name} outside a transaction")
        table = self.tables.get(event.row_event.table_name)
        if table is None:
            raise ProtocolError(f"VStream ROW event for {event.row_event.table_name} before its FIELD event")
        for change in event.row_event.row_changes:
            before = table.decode(change.before) if change.HasField("before") else None
            after = table.decode(change.after) if change.HasField("after") else None
            op = "u" if before is not None and after is not None else "d" if before is not None else "c"
            partial = after is not None and change.HasField("data_columns")
            if after is not None and partial:
                _mark_partial(table, change, after)
            self._txn.changes.append(
                Change(op, table.name, event.row_event.shard, before, after, event.timestamp, partial)
            )

    def _vgtid(self, vgtid: b.VGtid) -> list[Transaction | Marker]:
        if self._txn is not None:
            if self._txn.vgtid is not None:
                self._txn_base = _gtid_of(self._txn.vgtid, (self._txn.keyspace, self._txn.shard))
            self._txn.vgtid = vgtid
            return []
        self._pending_vgtid = vgtid
        self._remember(vgtid)
        return [Marker("position", vgtid=vgtid)]

    def _commit(self) -> list[Transaction | Marker]:
        txn, self._txn = self._txn, None
        if txn is None:
            raise ProtocolError("VStream COMMIT without BEGIN")
        if txn.vgtid is not None:
            if txn.changes and self._copy_chunk(txn, txn.vgtid):
                txn.kind = "copy"
                for change in txn.changes:
                    change.op = "r"
            self._remember(txn.vgtid)
        return [txn]

    def _copy_chunk(self, txn: Transaction, vgtid: b.VGtid) -> bool:
        """Whether ``txn`` is a copy chunk: its last VGTID (vtgate's LASTPK) names the shard's
        ``table_p_ks`` and leaves its GTID where the VGTID before it (in the transaction, else the
        previous position) put it."""
        key = (txn.keyspace, txn.shard)
        own = next((g for g in vgtid.shard_gtids if shard_key(g) == key), None)
        before = self._txn_base if self._txn_base is not None else self.position.get(key)
        self._txn_base = None
        return own is not None and bool(own.gtid) and own.gtid == before and bool(own.table_p_ks)

    def _remember(self, vgtid: b.VGtid) -> None:
        for g in vgtid.shard_gtids:
            self.position[shard_key(g)] = g.gtid


def _mark_partial(table: Table, change: b.RowChange, after: dict[str, Any]) -> None:
    """A partial after image (``binlog_row_image=NOBLOB`` or ``MINIMAL`` on the shard; vttablet v24
    sends it with its ``data_columns``, ``--vreplication-experimental-flags`` allowing it by
    default): the columns not in it arrive as NULL and become :data:`NOT_SENT`, so apply keeps the
    stored value instead of writing NULL.  A partial JSON value (``binlog_row_value_options=
    PARTIAL_JSON``, MySQL 8) is an SQL expression of the change, not the document: refused.

    :raises UnsupportedType: a partial JSON value (naming the table, column and setting)."""
    present = _bits(change.data_columns)
    for name, sent in zip(table.names, present, strict=False):
        if not sent:
            after[name] = NOT_SENT
    if change.HasField("json_partial_values") and any(_bits(change.json_partial_values)):
        json_columns = [f.name for f in table.fields if f.type == q.JSON]
        partial = [c for c, p in zip(json_columns, _bits(change.json_partial_values), strict=False) if p]
        raise UnsupportedType(
            f"table {table.name}: column(s) {', '.join(partial)} arrived as partial JSON updates "
            "(binlog_row_value_options=PARTIAL_JSON on the shard), which hold the change, not the value",
            hint="set binlog_row_value_options='' (the default) on every shard's MySQL; events already "
            "written that way cannot be applied: exclude the table for the run that passes them "
            "(table.exclude.list), then include it again with an execute-snapshot signal",
        )


def column_digest(event: b.FieldEvent) -> str:
    """A short digest of the column names and types a FIELD event describes (kept in offsets)."""
    described = "|".join(f"{f.name}:{f.type}" for f in event.fields)
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def _gtid_of(vgtid: b.VGtid, key: tuple[str, str]) -> str | None:
    for g in vgtid.shard_gtids:
        if shard_key(g) == key:
            return g.gtid
    return None
