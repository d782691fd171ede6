"""The emulated CDC capture job: a log reader from PostgreSQL's WAL into ``cdc.<ci>_CT`` tables.

SQL Server's capture job (an Agent job) reads committed transactions from the transaction log and
writes one change-table row per row change, tagged with the commit LSN (``__$start_lsn``) and the
change's own LSN (``__$seqval``).  Here the log is PostgreSQL's WAL, read through a logical
replication slot with ``pgoutput`` (decoded by :mod:`airflow_cdc.sources.postgres.protocol`):

* only committed transactions are decoded, in commit order, so changes appear only after commit
  *and* after :meth:`CaptureJob.run`;
* LSNs are the PostgreSQL LSNs as 10 bytes (``xlogid:offset:0000``), so they grow with commit order;
* the slot is peeked, the change rows and ``cdc.lsn_time_mapping`` are written in one transaction,
  and only then the slot is advanced; a transaction already in ``lsn_time_mapping`` is skipped, so a
  crash between the two never loses or duplicates a transaction.

What a real server writes and a reader must cope with, reproduced here (Microsoft's
"cdc.<capture_instance>_CT" and "cdc.lsn_time_mapping" references; Debezium's SQL Server connector):

* **Deferred updates.** An update of a primary-key or unique-index column (and, with
  ``deferred="all"``, any update, as MERGE and some plans log them) is a delete (``__$operation``
  1) and an insert (2) sharing one ``__$start_lsn`` *and* one ``__$seqval`` (Debezium's
  ``updatePrimaryKey`` test: both events at one change position).  The insert row is stored first,
  so a reader without ``ORDER BY __$operation`` sees insert-before-delete.
* **Large values and computed columns.** ``text``/``ntext``/``image`` are NULL when ``__$operation``
  is 1 or 3; ``varchar(max)``/``nvarchar(max)``/``varbinary(max)`` (and ``xml``, SQL Server 2008's
  list) are NULL in the update before-image (3) unless the column changed; computed columns are
  NULL in every row.
* **Local time.** ``tran_begin_time``/``tran_end_time`` are the server's local time (``timezone``),
  not UTC; a run whose log held no captured transaction writes a *filler* row (``tran_id = 0x00``)
  so ``sys.fn_cdc_get_max_lsn()`` moves on, as the real capture job does at low activity.
* **A new capture instance's start.** ``sys.sp_cdc_enable_table`` leaves ``cdc.change_tables.start_lsn``
  NULL ("the low endpoint has not been established"); the capture job's next scan sets it to the
  LSN of the enable and captures the instance from there.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
from psycopg import sql

from airflow_cdc.sources.postgres import protocol as P
from airflow_cdc.testing.sqlserver_emulator.catalog import PUBLICATION


def lsn_bytes(pg_lsn: int, slot: int = 0) -> bytes:
    """A PostgreSQL LSN as SQL Server's 10-byte LSN (VLF sequence, block offset, slot)."""
    return pg_lsn.to_bytes(8, "big") + slot.to_bytes(2, "big")


def pg_lsn_text(pg_lsn: int) -> str:
    return f"{pg_lsn >> 32:X}/{pg_lsn & 0xFFFFFFFF:X}"


#: Columns NULL in deletes and update before-images; those NULL in before-images unless changed.
_ALWAYS_NULL_BEFORE = frozenset({"text", "ntext", "image"})
_MAX_TYPES = frozenset({"varchar", "nvarchar", "varbinary"})


def _large(type_name: str, max_length: int) -> bool:
    """A (max) type or ``xml``: its before-image holds a value only when the update changed it."""
    return type_name == "xml" or (type_name in _MAX_TYPES and max_length == -1)


@dataclass
class CaptureInstance:
    name: str
    schema: str
    table: str
    start_lsn: bytes
    columns: list[str]  # captured columns in column_ordinal order
    types: list[tuple[str, int, bool]] = field(default_factory=list)  # (type, max_length, computed)

    def image(self, op: int, row: dict[str, Any], changed: set[str]) -> list[Any]:
        """The captured values of one change-table row as SQL Server writes them."""
        out = []
        for col, (tname, max_len, computed) in zip(self.columns, self.types, strict=True):
            value = row.get(col)
            if computed:
                value = None
            elif op in (1, 3) and tname in _ALWAYS_NULL_BEFORE:
                value = None
            elif op == 3 and col not in changed and _large(tname, max_len):
                value = None
            out.append(value)
        return out


@dataclass
class _Txn:
    commit_lsn: int = 0
    end_lsn: int = 0
    xid: int = 0
    commit_ts_us: int = 0
    changes: list[tuple[int, Any]] = field(default_factory=list)  # (change lsn, message)


#: The emulator's own bookkeeping: enabled capture instances waiting for the capture job's next scan.
PENDING_DDL = (
    "CREATE TABLE cdc.emulator_pending_starts (capture_instance text PRIMARY KEY, enable_lsn bytea NOT NULL)"
)


#: The newest mapping row by its primary key (an index scan, not an aggregate over every row).
_NEWEST = "SELECT start_lsn, tran_id FROM cdc.lsn_time_mapping ORDER BY start_lsn DESC LIMIT 1"


def slot_name(database: str) -> str:
    return "sqlsrv_emu_" + "".join(c if c.isalnum() else "_" for c in database.lower())[:40]


class CaptureJob:
    """The log reader of one emulated database (thread-safe; one run at a time).

    :param timezone: the server's time zone (``tran_end_time`` is local time in it).
    :param deferred: ``"key"``: updates of primary-key or unique-index columns are logged as
        deferred (delete + insert under one seqval); ``"all"``: every update is; ``"mixed"``: every
        update of every other transaction (by transaction id) is, as when plans vary.
    """

    def __init__(self, dsn: str, database: str, timezone: str = "UTC", deferred: str = "key") -> None:
        self.dsn, self.database, self.slot = dsn, database, slot_name(database)
        self.zone, self.deferred = ZoneInfo(timezone), deferred
        self._lock = threading.Lock()
        self._relations: dict[int, P.Relation] = {}

    def create_slot(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(PUBLICATION)))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))

    def run(self) -> int:
        """Move committed changes from the WAL into the change tables; return the rows written.

        Repeating it is safe: an interrupted run leaves the slot where it was and the next run skips
        transactions already recorded in ``cdc.lsn_time_mapping``.  Decoding stops at the WAL
        position read first, so the filler row written at it covers every transaction the run saw.
        """
        with self._lock, psycopg.connect(self.dsn) as conn:
            upto = int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]
            _establish_starts(conn)
            cur = conn.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL,"
                " 'proto_version', '1', 'publication_names', %s)",
                (self.slot, pg_lsn_text(upto), PUBLICATION),
            )
            txns = list(self._transactions(cur))
            newest = conn.execute(_NEWEST).fetchone()
            last = bytes(newest[0]) if newest is not None else b""
            written = 0
            if txns:  # an idle scan (a poller's usual one) reads no catalog
                instances, unique = _instances(conn), _unique_columns(conn)
                for txn in txns:
                    if lsn_bytes(txn.commit_lsn) > last:
                        written += self._write(conn, txn, instances, unique)
            filler = lsn_bytes(upto - 1)
            if upto and filler > max(last, *(lsn_bytes(t.commit_lsn) for t in txns), b""):
                # a mapping row written by this run is a transaction's; else the newest is the old one
                trailing = newest is not None and not written and bytes(newest[1]) == b"\x00"
                self._filler(conn, filler, last if trailing else None)
            conn.commit()
            target = txns[-1].end_lsn if txns else 0
            if upto:
                conn.execute(
                    "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                    (self.slot, pg_lsn_text(max(target, upto))),
                )
            conn.commit()
            return written

    def _filler(self, conn: psycopg.Connection, lsn: bytes, replaces: bytes | None) -> None:
        """Record that the log was scanned up to ``lsn`` without a captured transaction: a filler
        row (``tran_id = 0x00``).  A filler right after another one (``replaces``: its LSN) takes its
        place, so a poller scanning an idle log many times a second keeps one trailing row, not
        thousands (the real job writes them at low activity, not on every scan)."""
        now = self._local(dt.datetime.now(dt.UTC))
        if replaces is not None:
            conn.execute(
                "UPDATE cdc.lsn_time_mapping SET start_lsn = %s, tran_begin_time = %s, tran_end_time = %s"
                " WHERE start_lsn = %s",
                (lsn, now, now, replaces),
            )
        else:
            conn.execute(
                "INSERT INTO cdc.lsn_time_mapping VALUES (%s, %s, %s, %s, NULL)", (lsn, now, now, b"\x00")
            )

    def _local(self, moment: dt.datetime) -> dt.datetime:
        """An aware moment as the server's local wall-clock time (datetime columns have no zone)."""
        return moment.astimezone(self.zone).replace(tzinfo=None)

    def _transactions(self, cur: Iterable[tuple[str, bytes]]) -> Iterable[_Txn]:
        txn = _Txn()
        for lsn_text, data in cur:
            msg = P.decode(bytes(data))
            if isinstance(msg, P.Begin):
                txn = _Txn(xid=msg.xid, commit_ts_us=msg.commit_ts_us)
            elif isinstance(msg, P.Relation):
                self._relations[msg.relid] = msg
            elif isinstance(msg, P.Insert | P.Update | P.Delete):
                hi, lo = lsn_text.split("/")
                txn.changes.append(((int(hi, 16) << 32) | int(lo, 16), msg))
            elif isinstance(msg, P.Commit):
                txn.commit_lsn, txn.end_lsn = msg.commit_lsn, msg.end_lsn
                yield txn

    def _write(
        self,
        conn: psycopg.Connection,
        txn: _Txn,
        instances: list[CaptureInstance],
        unique: dict[tuple[str, str], list[set[str]]],
    ) -> int:
        start = lsn_bytes(txn.commit_lsn)
        by_table: dict[tuple[str, str], list[CaptureInstance]] = {}
        for ci in instances:
            if ci.start_lsn <= start:
                by_table.setdefault((ci.schema, ci.table), []).append(ci)
        pending: dict[str, list[tuple[Any, ...]]] = {}
        command_id = 0
        for change_lsn, msg in txn.changes:
            rel = self._relations[msg.relid]
            targets = by_table.get((rel.namespace, rel.name), [])
            names = [c.name for c in rel.columns]
            keys = unique.get((rel.namespace, rel.name), [])
            deferred = self.deferred if self.deferred != "mixed" else ("all" if txn.xid % 2 else "key")
            for op, values, mask_from in _operations(msg, names, keys, deferred):
                command_id += 1
                row = dict(zip(names, (_text(v) for v in values), strict=True))
                other = dict(zip(names, (_text(v) for v in mask_from), strict=True)) if mask_from else None
                changed = {c for c in names if other is None or other.get(c) != row.get(c)}
                for ci in targets:
                    mask = _update_mask(ci.columns, changed)
                    image = ci.image(op, row, changed)
                    pending.setdefault(ci.name, []).append(
                        (start, None, lsn_bytes(change_lsn), op, mask, *image, command_id)
                    )
        for ci in instances:
            rows = pending.get(ci.name)
            if rows:
                cols = [
                    "__$start_lsn",
                    "__$end_lsn",
                    "__$seqval",
                    "__$operation",
                    "__$update_mask",
                    *ci.columns,
                    "__$command_id",
                ]
                stmt = sql.SQL("INSERT INTO cdc.{} ({}) VALUES ({})").format(
                    sql.Identifier(ci.name + "_CT"),
                    sql.SQL(", ").join(map(sql.Identifier, cols)),
                    sql.SQL(", ").join(sql.Placeholder() * len(cols)),
                )
                with conn.cursor() as cur:
                    cur.executemany(stmt, rows)
        if not pending:
            return 0
        # the decoder's commit time is already Unix-epoch microseconds (the emulator used to add
        # PostgreSQL's 2000 epoch once more: commit times 30 years ahead that no test looked at)
        when = self._local(dt.datetime.fromtimestamp(txn.commit_ts_us / 1e6, dt.UTC))
        conn.execute(
            "INSERT INTO cdc.lsn_time_mapping VALUES (%s, %s, %s, %s, %s)",
            (start, when, when, txn.xid.to_bytes(10, "big"), lsn_bytes(txn.changes[0][0])),
        )
        return sum(len(r) for r in pending.values())


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return bytes(value).decode("utf-8")


def _operations(
    msg: Any, names: list[str], unique: list[set[str]], deferred: str
) -> list[tuple[int, tuple, tuple | None]]:
    """(``__$operation``, values, the other image for the update mask) for one decoded change,
    in the order the rows are stored: a deferred update's insert before its delete."""
    if isinstance(msg, P.Insert):
        return [(2, msg.new, None)]
    if isinstance(msg, P.Delete):
        return [(1, msg.old, None)]
    old = msg.old if msg.old is not None else msg.new
    new = tuple(o if n is P.UNCHANGED_TOAST else n for n, o in zip(msg.new, old, strict=True))
    changed = {c for c, n, o in zip(names, new, old, strict=True) if n != o}
    if deferred == "all" or any(changed & cols for cols in unique):
        return [(2, new, None), (1, old, None)]
    return [(3, old, new), (4, new, old)]


def _update_mask(captured: list[str], changed: set[str]) -> bytes:
    """SQL Server's mask: bit (ordinal - 1) counted from the end; updates set only changed columns."""
    nbytes = (len(captured) + 7) // 8
    bits = 0
    for ordinal, col in enumerate(captured, start=1):
        if col in changed:
            bits |= 1 << (ordinal - 1)
    return bits.to_bytes(nbytes, "big")


def _establish_starts(conn: psycopg.Connection) -> None:
    """Give capture instances enabled since the last scan their start LSN (the enable's LSN).

    One statement, so one snapshot: as two (set the starts, then empty the waiting list) an enable
    committed between them lost its waiting row without getting its start, and the instance was
    never captured (a polling test's insert never appeared, 2026-12-06).
    """
    conn.execute(
        "WITH p AS (DELETE FROM cdc.emulator_pending_starts RETURNING capture_instance, enable_lsn)"
        " UPDATE cdc.change_tables ct SET start_lsn = p.enable_lsn FROM p"
        " WHERE ct.capture_instance = p.capture_instance AND ct.start_lsn IS NULL"
    )


def _unique_columns(conn: psycopg.Connection) -> dict[tuple[str, str], list[set[str]]]:
    """Column sets of every primary key and unique index, by (schema, table)."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname, array_agg(a.attname::text) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indisunique AND n.nspname NOT IN ('cdc', 'sys', 'pg_catalog')"
        " GROUP BY n.nspname, c.relname, i.indexrelid"
    ).fetchall()
    out: dict[tuple[str, str], list[set[str]]] = {}
    for schema, table, cols in rows:
        out.setdefault((schema, table), []).append(set(cols))
    return out


def _instances(conn: psycopg.Connection) -> list[CaptureInstance]:
    """Capture instances whose start LSN is established, with their captured columns' types."""
    rows = conn.execute(
        "SELECT ct.capture_instance, n.nspname, c.relname, ct.start_lsn,"
        " array_agg(cc.column_name ORDER BY cc.column_ordinal),"
        " array_agg(cc.column_type ORDER BY cc.column_ordinal),"
        " array_agg(COALESCE(sc.max_length, 0) ORDER BY cc.column_ordinal),"
        " array_agg(cc.is_computed ORDER BY cc.column_ordinal)"
        " FROM cdc.change_tables ct JOIN pg_class c ON c.oid = ct.source_object_id::oid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN cdc.captured_columns cc ON cc.object_id = ct.object_id"
        " LEFT JOIN sys.columns sc ON sc.object_id = ct.source_object_id AND sc.name = cc.column_name"
        " WHERE ct.start_lsn IS NOT NULL"
        " GROUP BY ct.capture_instance, n.nspname, c.relname, ct.start_lsn"
    ).fetchall()
    return [
        CaptureInstance(r[0], r[1], r[2], bytes(r[3]), list(r[4]),
                        [(t, int(m), bool(k)) for t, m, k in zip(r[5], r[6], r[7], strict=True)])
        for r in rows
    ]  # fmt: skip
