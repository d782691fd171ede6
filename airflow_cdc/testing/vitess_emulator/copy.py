"""The copy phase of one shard stream (vttablet's uvstreamer/rowstreamer, as vtgate relays it).

Each table is read inside one ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` in primary key order
(every column in order for a table without one: v24 ``rowstreamer.go`` ``buildPKColumns``; real
vttablet first tries a unique NOT NULL index, which only changes the order), ``copy_chunk_rows``
rows per step; the snapshot's binlog position (MariaDB's ``binlog_snapshot_file/position`` ->
``BINLOG_GTID_POS``) is caught up to before the first row, so the rows, the VGTIDs that follow them
and the binlog after them agree.  As vttablet streams one query per table and call
(``copy.go`` ``copyTable``: one ``StreamRows``, resumed from the call's last key), the steps page
through that query's result in the snapshot (an offset), never by the last key sent: rows equal to
it (a table without a key) are not skipped.  See :mod:`.session`.

What a client gets is what vtgate v24 relays (``vstream_manager.go``: ``sendEventsLocked`` turns
vttablet's GTID and LASTPK events into VGTIDs, the latter carrying ``table_p_ks``; no LASTPK reaches
a client) of what vttablet sends (``copy.go``: ``sendFieldEvent`` opens a transaction with BEGIN,
FIELD and a GTID only if the snapshot moved the position, ``sendEventsForRows`` ends it with the
rows, LASTPK, COMMIT; ``copyComplete`` sends BEGIN, LASTPK(completed), COMMIT)::

    BEGIN, FIELD, [VGTID], ROW..., VGTID(+table_p_ks), COMMIT      first chunk
    BEGIN, ROW..., VGTID(+table_p_ks), COMMIT                       later chunks
    BEGIN, VGTID(table_p_ks without the table), COMMIT              table done
    BEGIN, FIELD, [VGTID], BEGIN, VGTID, COMMIT                     empty table (nested BEGIN)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.testing.vitess_emulator.values import BINARY_COLLATION as BINARY_COLLATION_ID
from airflow_cdc.testing.vitess_emulator.values import make_row

if TYPE_CHECKING:
    from airflow_cdc.testing.vitess_emulator.session import VStreamSession, _ShardStream

_INTEGRAL = 256


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def copy_step(session: VStreamSession, st: _ShardStream) -> Iterator[list[b.VEvent]]:
    """One step: start the next table (snapshot, catch-up, FIELD) or send its next chunk."""
    plan = st.copy
    assert plan is not None
    if not plan.tables:
        yield _finish(session, st)
        return
    if plan.conn is None:
        yield from _start_table(session, st, plan.tables[0])
        return
    yield from _chunk(session, st, plan.tables[0])


def _snapshot(st: _ShardStream) -> tuple[Any, int]:
    conn = st.shard.connect()
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {k.decode().lower(): v.decode() for k, v in cur.fetchall()}
        cur.execute(
            "SELECT BINLOG_GTID_POS(%s, %s)",
            (status["binlog_snapshot_file"], status["binlog_snapshot_position"]),
        )
        gtids = (cur.fetchone()[0] or b"").decode()
    seq = 0
    for part in filter(None, gtids.split(",")):
        domain, server, number = part.strip().split("-")
        if domain == "0" and int(server) == st.shard.server_id:
            seq = int(number)
    return conn, seq


def _start_table(session: VStreamSession, st: _ShardStream, table: str) -> Iterator[list[b.VEvent]]:
    plan = st.copy
    assert plan is not None
    conn, seq = _snapshot(st)
    if st.seq is not None and seq > st.seq:
        try:
            for txn in st.binlog.transactions(st.seq):
                if txn.seq > seq:
                    break
                events = session._transaction(st, txn)
                st.seq = txn.seq
                if events:
                    yield events
                if st not in session.streams:  # retired at a journal: the copy is abandoned
                    conn.close()
                    return
        except ProtocolError as e:
            conn.close()
            raise session._dump_error(st, e) from None
    st.seq = seq
    moved = st.sgtid.gtid != st.shard.position(seq)  # vttablet's setPosition sends no unmoved GTID
    st.sgtid.gtid = st.shard.position(seq)
    plan.conn = conn
    plan.resume, plan.sent = plan.lastpk.get(table), 0
    fields = st.shard.fields(table)
    plan.fields = fields
    from airflow_cdc.testing.vitess_emulator.session import field_event

    event = field_event(session.emulator, st.shard, table, fields)
    st.fields_sent.pop(table, None)  # the binlog stream describes the table again at its first row
    plan.opening = [session._event(st, b.BEGIN), session._event(st, b.FIELD, field_event=event)]
    if moved:
        plan.opening.append(session._vgtid())
    yield from _chunk(session, st, table)


def _param(value: bytes | None, f: q.Field) -> Any:
    if value is None:
        return None
    if f.type & _INTEGRAL:
        return int(value)
    if f.charset == BINARY_COLLATION_ID:
        return value
    return value.decode()


def _chunk(session: VStreamSession, st: _ShardStream, table: str) -> Iterator[list[b.VEvent]]:
    from airflow_cdc.testing.vitess_emulator.session import _pk_index
    from airflow_cdc.testing.vitess_emulator.values import row_values

    plan = st.copy
    assert plan is not None
    fields = plan.fields
    pk = _pk_index(st.shard, table, fields) or list(range(len(fields)))  # rowstreamer: every column
    pk_fields = [fields[i] for i in pk]
    columns = ", ".join(_quote(f.name) for f in pk_fields)
    sql, params = f"SELECT * FROM {_quote(table)}", []  # noqa: S608 - quoted identifiers
    last = plan.resume
    if last is not None:
        values = row_values(last.rows[0])
        sql += f" WHERE ({columns}) > ({', '.join(['%s'] * len(pk))})"
        params = [_param(v, f) for v, f in zip(values, pk_fields, strict=True)]
    limit = session.emulator.copy_chunk_rows
    sql += f" ORDER BY {columns} LIMIT {limit} OFFSET {plan.sent}"
    with plan.conn.cursor() as cur:
        cur.execute(sql, params)
        rows = list(cur.fetchall())
    plan.sent += len(rows)
    name = f"{st.shard.keyspace}.{table}"
    if rows:
        lastpk = q.QueryResult(
            fields=[q.Field(name=f.name, type=f.type, charset=f.charset, flags=f.flags) for f in pk_fields],
            rows=[make_row([rows[-1][i] for i in pk])],
        )
        plan.lastpk[table] = lastpk
        _set_table_pk(st, table, lastpk)
        events, plan.opening = plan.opening or [session._event(st, b.BEGIN)], []
        for row in rows:
            change = b.RowChange(after=make_row(list(row)))
            event = b.RowEvent(
                table_name=name, row_changes=[change], keyspace=st.shard.keyspace, shard=st.shard.name
            )
            events.append(session._event(st, b.ROW, row_event=event))
        yield events + [session._vgtid(), session._event(st, b.COMMIT)]
    if len(rows) < limit:
        plan.conn.close()
        plan.conn = None
        plan.tables.pop(0)
        plan.lastpk.pop(table, None)
        _set_table_pk(st, table, None)
        opening, plan.opening = plan.opening, []  # an empty table: its FIELD's BEGIN stays open
        yield opening + [session._event(st, b.BEGIN), session._vgtid(), session._event(st, b.COMMIT)]
        if not plan.tables:
            yield _finish(session, st)


def _set_table_pk(st: _ShardStream, table: str, lastpk: q.QueryResult | None) -> None:
    entries = [t for t in st.sgtid.table_p_ks if t.table_name != table]
    if lastpk is not None:
        entries.append(b.TableLastPK(table_name=table, lastpk=lastpk))
    del st.sgtid.table_p_ks[:]
    st.sgtid.table_p_ks.extend(entries)


def _finish(session: VStreamSession, st: _ShardStream) -> list[b.VEvent]:
    """The shard's COPY_COMPLETED, and vtgate's keyspace-wide one if every shard has now sent its own.

    vttablet ends a shard's copy with one COPY_COMPLETED stamped with its keyspace and shard
    (v24 ``uvstreamer.go``: ``Stream`` calls ``allCopyComplete`` after ``copy``; ``newUVStreamer``'s
    ``send2`` sets ``Keyspace``/``Shard`` on every event).  vtgate relays it and, in the same send,
    adds a COPY_COMPLETED without keyspace or shard once every shard of the call's VGTID has sent
    one (``vstream_manager.go``: ``streamFromTablet``, ``isCopyFullyCompleted``).  A shard that
    is not copying never sends one, so a call with such a shard never gets the keyspace-wide one.
    """
    st.copy = None
    session.copying -= 1
    session.copy_completed.add((st.shard.keyspace, st.shard.name))
    events = [session._event(st, b.COPY_COMPLETED)]
    if all((g.keyspace, g.shard) in session.copy_completed for g in session.vgtid.shard_gtids):
        events.append(b.VEvent(type=b.COPY_COMPLETED))
    return events
