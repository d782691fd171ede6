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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.errors import ProtocolError
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
        return cls(event.table_name, list(event.fields), [value_decoder(f) for f in event.fields])

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


@dataclass
class Change:
    op: str  # c, u, d, or r (a copy-phase read)
    table: str  # keyspace.table
    shard: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    timestamp: int  # binlog seconds (0 for copy reads)


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

    def __init__(self, start: b.VGtid | None = None) -> None:
        """:param start: the VGTID the stream starts from (so a resumed copy's first chunk is
        recognised as one)."""
        self.tables: dict[str, Table] = {}
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
            self.tables[event.field_event.table_name] = Table.from_event(event.field_event)
            return []
        if kind == b.ROW:
            self._row(event)
            return []
        if kind == b.VGTID:
            return self._vgtid(event.vgtid)
        if kind == b.COMMIT:
            return self._commit()
        if kind in (b.DDL, b.OTHER):
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
            self._txn.changes.append(
                Change(op, table.name, event.row_event.shard, before, after, event.timestamp)
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


def _gtid_of(vgtid: b.VGtid, key: tuple[str, str]) -> str | None:
    for g in vgtid.shard_gtids:
        if shard_key(g) == key:
            return g.gtid
    return None
