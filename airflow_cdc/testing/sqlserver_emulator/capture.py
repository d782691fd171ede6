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
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from airflow_cdc.sources.postgres import protocol as P
from airflow_cdc.testing.sqlserver_emulator.catalog import PUBLICATION

_PG_EPOCH = dt.datetime(2000, 1, 1)


def lsn_bytes(pg_lsn: int, slot: int = 0) -> bytes:
    """A PostgreSQL LSN as SQL Server's 10-byte LSN (VLF sequence, block offset, slot)."""
    return pg_lsn.to_bytes(8, "big") + slot.to_bytes(2, "big")


def pg_lsn_text(pg_lsn: int) -> str:
    return f"{pg_lsn >> 32:X}/{pg_lsn & 0xFFFFFFFF:X}"


@dataclass
class CaptureInstance:
    name: str
    schema: str
    table: str
    start_lsn: bytes
    columns: list[str]  # captured columns in column_ordinal order


@dataclass
class _Txn:
    commit_lsn: int = 0
    end_lsn: int = 0
    xid: int = 0
    commit_ts_us: int = 0
    changes: list[tuple[int, Any]] = field(default_factory=list)  # (change lsn, message)


def slot_name(database: str) -> str:
    return "sqlsrv_emu_" + "".join(c if c.isalnum() else "_" for c in database.lower())[:40]


class CaptureJob:
    """The log reader of one emulated database (thread-safe; one run at a time)."""

    def __init__(self, dsn: str, database: str) -> None:
        self.dsn, self.database, self.slot = dsn, database, slot_name(database)
        self._lock = threading.Lock()
        self._relations: dict[int, P.Relation] = {}

    def create_slot(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("CREATE PUBLICATION {}").format(sql.Identifier(PUBLICATION)))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))

    def run(self) -> int:
        """Move committed changes from the WAL into the change tables; return the rows written.

        Repeating it is safe: an interrupted run leaves the slot where it was and the next run skips
        transactions already recorded in ``cdc.lsn_time_mapping``.
        """
        with self._lock, psycopg.connect(self.dsn) as conn:
            cur = conn.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
                " 'proto_version', '1', 'publication_names', %s)",
                (self.slot, PUBLICATION),
            )
            txns = list(self._transactions(cur))
            if not txns:
                return 0
            done = conn.execute("SELECT max(start_lsn) FROM cdc.lsn_time_mapping").fetchone()
            last = bytes(done[0]) if done and done[0] is not None else b""
            instances = _instances(conn)
            written = 0
            for txn in txns:
                if lsn_bytes(txn.commit_lsn) > last:
                    written += self._write(conn, txn, instances)
            conn.commit()
            conn.execute(
                "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                (self.slot, pg_lsn_text(txns[-1].end_lsn)),
            )
            conn.commit()
            return written

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

    def _write(self, conn: psycopg.Connection, txn: _Txn, instances: list[CaptureInstance]) -> int:
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
            command_id += 1
            names = [c.name for c in rel.columns]
            for op, values, mask_from in _operations(msg):
                row = dict(zip(names, (_text(v) for v in values), strict=True))
                for ci in targets:
                    mask = _update_mask(ci.columns, row, mask_from, names)
                    pending.setdefault(ci.name, []).append(
                        (
                            start,
                            None,
                            lsn_bytes(change_lsn),
                            op,
                            mask,
                            *(row.get(c) for c in ci.columns),
                            command_id,
                        )
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
        when = _PG_EPOCH + dt.timedelta(microseconds=txn.commit_ts_us)
        conn.execute(
            "INSERT INTO cdc.lsn_time_mapping VALUES (%s, %s, %s, %s, %s)",
            (start, when, when, txn.xid.to_bytes(10, "big"), lsn_bytes(txn.changes[0][0])),
        )
        return sum(len(r) for r in pending.values())


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return bytes(value).decode("utf-8")


def _operations(msg: Any) -> list[tuple[int, tuple, tuple | None]]:
    """(``__$operation``, values, old values for the update mask) for one decoded change."""
    if isinstance(msg, P.Insert):
        return [(2, msg.new, None)]
    if isinstance(msg, P.Delete):
        return [(1, msg.old, None)]
    old = msg.old if msg.old is not None else msg.new
    new = tuple(o if n is P.UNCHANGED_TOAST else n for n, o in zip(msg.new, old, strict=True))
    return [(3, old, new), (4, new, old)]


def _update_mask(captured: list[str], row: dict[str, Any], other: tuple | None, names: list[str]) -> bytes:
    """SQL Server's mask: bit (ordinal - 1) counted from the end; updates set only changed columns."""
    nbytes = (len(captured) + 7) // 8
    bits = 0
    other_row = dict(zip(names, (_text(v) for v in other), strict=True)) if other is not None else None
    for ordinal, col in enumerate(captured, start=1):
        if other_row is None or other_row.get(col) != row.get(col):
            bits |= 1 << (ordinal - 1)
    return bits.to_bytes(nbytes, "big")


def _instances(conn: psycopg.Connection) -> list[CaptureInstance]:
    rows = conn.execute(
        "SELECT ct.capture_instance, n.nspname, c.relname, ct.start_lsn,"
        " array_agg(cc.column_name ORDER BY cc.column_ordinal)"
        " FROM cdc.change_tables ct JOIN pg_class c ON c.oid = ct.source_object_id::oid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN cdc.captured_columns cc ON cc.object_id = ct.object_id"
        " GROUP BY ct.capture_instance, n.nspname, c.relname, ct.start_lsn"
    ).fetchall()
    return [CaptureInstance(r[0], r[1], r[2], bytes(r[3]), list(r[4])) for r in rows]
