"""Tables without key columns read whole: vttablet's copy phase of the one table, in one VStream call.

The copy phase resumes a table by its last copied key, and a table without a primary key has
none: vttablet then orders and resumes it by every column (v24 ``rowstreamer.go``:
``buildPKColumns`` falls back to "every column in the table if there's no PK or PKE", and
``buildSelect`` resumes with ``(c1 = v1 and c2 > v2) or (c1 > v1)`` terms), so a copy resumed in a
later call skips the rows equal to the last one copied (duplicates) and, when that row holds a
NULL, the later rows equal to it on the columns before the NULL (``c = NULL`` is never true).  A
table with a unique index on NOT NULL columns (Vitess's "PKE") would resume exactly, but its
columns carry no primary key flag here, so it is read whole too.  Inside one call
nothing is resumed: ``uvstreamer`` copies a table with a single ``StreamRows`` (``copy.go``:
``copyTable``), one query in one consistent snapshot (``snapshot_conn.go``: ``startSnapshot``
takes the shard's GTID position under ``LOCK TABLES ... READ`` and starts the transaction with a
consistent snapshot), streamed in packets.  So a table without key columns is read here in a call
of its own that copies only it and is never resumed (a run that dies reads it again from its
first row):

* the VGTID names every shard at ``current`` with the table in ``table_p_ks`` (no last key) and
  ``tables_to_copy`` names it alone (``uvstreamer.go``: ``init`` plans the copy when the VGTID
  names a table, ``setStreamStartPosition`` starts at the shard's position for ``current``);
* on each shard vttablet catches up, then fast-forwards to the snapshot's position ``G`` -- sending
  no change of the table before it, its copy not started (``shouldSendEventForTable``) -- and sends
  the FIELD event, the GTID ``G`` (vtgate's VGTID) and the rows (``copyTable``, ``sendFieldEvent``,
  ``sendEventsForRows``), the table's end and ``COPY_COMPLETED`` (``copyComplete``,
  ``allCopyComplete``), all at ``G``: the rows hold every transaction of the shard up to ``G`` and
  none after it;
* once every shard sent its ``COPY_COMPLETED`` the call is closed (vttablet would go on with the
  table's changes after ``G``: the window streams those).

The rows are staged at ``(keyless epoch, round, transactions in G, max index, stamp)`` per shard,
above a truncate of the table at the round's floor ``(keyless epoch, round, 0, 0, 0)``: the image replaces
silver's multiset, whatever earlier rounds held (:mod:`.position`).  The window then drops the
table's changes of each shard up to its ``G`` (the rows hold them) and reads at least that far
(:attr:`WholeRead.positions`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.errors import ProtocolError, SchemaError
from airflow_cdc.core.events import now_us
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.table_sink import TableSink
from airflow_cdc.sources.vitess import offsets, position
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.protocol import Assembler, Marker, Table, Transaction
from airflow_cdc.sources.vitess.tables import TableState

if TYPE_CHECKING:
    from airflow_cdc.sources.vitess.source import VitessSource

log = logging.getLogger(__name__)


@dataclass
class WholeRead:
    """One table read whole: per shard, the GTID set of its copy's snapshot."""

    table: str
    positions: dict[tuple[str, str], str] = field(default_factory=dict)
    rows: int = 0

    def covers(self, shard: tuple[str, str], count: int) -> bool:
        """Whether the shard's transaction that leaves ``count`` transactions is in the rows."""
        gtid = self.positions.get(shard)
        return gtid is not None and count <= position.transactions_in(gtid)


@dataclass
class Chunk:
    """One copy chunk of the table read whole: its shard, the GTID it stands at, its rows."""

    shard: tuple[str, str]
    gtid: str
    vgtid: b.VGtid
    table: Table
    rows: list[dict[str, Any]]


def copy_table(source: VitessSource, table: str, shards: b.VGtid, read: WholeRead) -> Iterator[Chunk]:
    """The copy chunks of ``table`` (``keyspace.table``) on every shard of ``shards``, from a VStream
    call that copies it alone (see the module notes); fills ``read.positions`` as each shard's copy
    completes and ends when all did.  Reads only; nothing is acknowledged.

    :raises ProtocolError: a reshard during the copy, a shard whose copy completed elsewhere than
        its rows stand, or nothing received for the window idle timeout.
    """
    name = table.split(".", 1)[1]
    vgtid = b.VGtid(
        shard_gtids=[
            b.ShardGtid(keyspace=g.keyspace, shard=g.shard, gtid=offsets.CURRENT,
                        table_p_ks=[b.TableLastPK(table_name=name)])
            for g in shards.shard_gtids
        ]
    )  # fmt: skip
    client = source._client()
    request = client.request(vgtid, [name])  # tables_to_copy: this table alone
    request.flags.heartbeat_interval = 1
    wanted = {offsets.shard_key(g) for g in vgtid.shard_gtids}
    idle = float(source.config["vitess.window.idle.timeout"])
    assembler, copied_at = Assembler(), dict[tuple[str, str], str]()
    events = client.stream(request)
    last = time.monotonic()
    try:
        for event in events:
            for item in assembler.feed(event):
                if isinstance(item, Transaction) and _chunk_of(item, table, read):
                    last = time.monotonic()
                    chunk = _chunk(item, assembler.tables[table])
                    copied_at.setdefault(chunk.shard, chunk.gtid)
                    yield chunk
                elif isinstance(item, Marker) and item.kind == "copy_completed" and item.shard:
                    last = time.monotonic()
                    _completed(read, (item.keyspace, item.shard), assembler, copied_at)
                elif isinstance(item, Marker) and item.kind == "journal":
                    raise ProtocolError(
                        f"keyspace {source.keyspace} was resharded while {table} was read whole; the next "
                        "run reads it again"
                    )
            if wanted <= read.positions.keys():
                return
            if time.monotonic() - last > idle:
                raise ProtocolError(
                    f"the copy of {table} (read whole) sent nothing for {idle:.0f}s on shard(s) "
                    f"{', '.join('/'.join(k) for k in sorted(wanted - read.positions.keys()))}"
                )
    finally:
        events.close()


def _chunk_of(txn: Transaction, table: str, read: WholeRead) -> bool:
    """Whether ``txn`` is a copy chunk of the table on a shard still copying (anything else --
    positions, the table's changes after a shard's copy -- is the window's to stream)."""
    return (
        txn.kind == "copy"
        and txn.vgtid is not None
        and (txn.keyspace, txn.shard) not in read.positions
        and bool(txn.changes)
        and txn.changes[0].table == table
    )


def _chunk(txn: Transaction, table: Table) -> Chunk:
    assert txn.vgtid is not None
    key = (txn.keyspace, txn.shard)
    own = next(g.gtid for g in txn.vgtid.shard_gtids if offsets.shard_key(g) == key)
    return Chunk(key, own, txn.vgtid, table, [c.after or {} for c in txn.changes])


def _completed(
    read: WholeRead, shard: tuple[str, str], assembler: Assembler, copied_at: dict[tuple[str, str], str]
) -> None:
    """A shard's copy completed: it stands where the shard's position is now, its snapshot's --
    nothing moves it between the FIELD's GTID and ``COPY_COMPLETED`` (``copy.go``)."""
    gtid = assembler.position.get(shard, "")
    if gtid in ("", offsets.CURRENT) or copied_at.get(shard, gtid) != gtid:
        raise ProtocolError(
            f"the copy of {read.table} on shard {shard[1]} completed at {gtid or 'no position'}, not "
            f"where its rows stand ({copied_at.get(shard)})"
        )
    read.positions[shard] = gtid
    log.info("snapshot of %s read whole on shard %s at %s", read.table, shard[1], gtid)


def read_whole(source: VitessSource, table: str, writer: BatchWriter, shards: b.VGtid) -> WholeRead:
    """Stage ``table`` (``keyspace.table``, no key columns) whole, on every shard of ``shards``:
    a truncate at the keyless round's floor, then the rows of each shard's copy at its snapshot
    (see the module notes); returns where each shard's copy stands.  Repeating it stages the
    table again, at later positions.

    :raises ProtocolError: see :func:`copy_table`.
    :raises SchemaError: the copy describes the table with key columns (it changed meanwhile).
    """
    read = WholeRead(table)
    (epoch, round_), stamp = source.keyless_round(), now_us() // 1000
    progress = Progress(f"snapshot of {table} (whole)", None)
    described: Table | None = None
    for chunk in copy_table(source, table, shards, read):
        at = position.keyless_key(
            epoch, round_, position.transactions_in(chunk.gtid), position.SNAPSHOT_INDEX, stamp
        )
        ts = now_us()
        vgtid = json.dumps(offsets.vgtid_to_json(chunk.vgtid))
        src = (ts // 1000, ts, ts * 1000, "true", chunk.shard[1], vgtid)
        sink, described = _sink(source, chunk.table, writer), chunk.table
        for row in chunk.rows:
            sink.append("r", None, tuple(row.values()), at, src)
        first = not read.rows
        read.rows += len(chunk.rows)
        progress.update(read.rows)
        if first:
            failpoint("whole_read")  # crash tests: a table read whole, part of it staged
    # the image replaces silver's multiset: a truncate below every row (the apply orders by position)
    ts = now_us()
    floor = position.keyless_key(epoch, round_, 0, 0)
    sink = _sink(source, described or source._described(table), writer)
    sink.append("t", None, None, floor, (ts // 1000, ts, ts * 1000, "true", "", ""))
    progress.finish(read.rows)
    return read


def _sink(source: VitessSource, table: Table, writer: BatchWriter) -> TableSink:
    state = source.table_state(table)
    if not state.keyless:
        raise SchemaError(
            f"table {table.name} has key columns ({', '.join(state.key)}) now: it changed while read whole",
            hint="the next run captures it by its key",
        )
    return state.sink(writer)


def read_orphans_whole(
    source: VitessSource, tables: set[str], writer: BatchWriter, shards: b.VGtid
) -> list[str]:
    """Read whole again the tables without key columns that batches published but not committed
    staged events of (:attr:`.orphans.Orphans.keyless`) and that this run did not read whole: their
    events cannot be told apart from the ones those batches held, in another keyless round
    (:mod:`.position`).  Returns notes for the manifest."""
    notes = []
    for table in sorted(tables - source.whole_reads.keys()):
        if not source.snapshot_whole(table):
            continue  # not captured any more, or keyed now
        read = read_whole(source, table, writer, shards)
        source.whole_reads[table] = read
        notes.append(f"{table} read whole again ({read.rows} rows): uncommitted batches held its changes")
    return notes


def encoded_chunks(source: VitessSource, table: str, shards: b.VGtid, chunk_size: int) -> Iterator[pa.Table]:
    """The live table (no key columns) as ``verify`` reads it: copied on every shard of ``shards``
    by :func:`copy_table` (each shard in one consistent snapshot, in no particular order),
    ``chunk_size`` rows at a time, encoded as its copied rows are staged.  Stages nothing."""
    pending: list[tuple[TableState, list[Any]]] = []
    for chunk in copy_table(source, table, shards, WholeRead(table)):
        state = source.table_state(chunk.table)
        pending += [(state, list(row.values())) for row in chunk.rows]
        while len(pending) >= chunk_size:
            yield _encoded(pending[:chunk_size])
            pending = pending[chunk_size:]
    if pending:
        yield _encoded(pending)


def _encoded(rows: list[tuple[TableState, list[Any]]]) -> pa.Table:
    """Decoded rows (each with the state of the FIELD event that described it) as one Arrow table."""
    state = rows[0][0]
    values = [[row[i] for _, row in rows] for i in state.select]
    arrays = [c.convert_values(v) for c, v in zip(state.codecs, values, strict=True)]
    return pa.Table.from_arrays(arrays, schema=pa.schema([c.field for c in state.codecs]))


def read_past(reads: list[WholeRead], other: b.VGtid | None) -> b.VGtid | None:
    """Per shard the latest of the reads' positions and ``other``'s: the window must not end before
    it (a shard left below a read's position would stream changes the rows hold in the next run)."""
    latest: dict[tuple[str, str], str] = {}
    for gtid_of in [r.positions for r in reads] + [_positions(other)]:
        for key, gtid in gtid_of.items():
            if key not in latest or position.transactions_in(gtid) > position.transactions_in(latest[key]):
                latest[key] = gtid
    if not latest:
        return None
    shard_gtids = [b.ShardGtid(keyspace=k, shard=s, gtid=g) for (k, s), g in sorted(latest.items())]
    return b.VGtid(shard_gtids=shard_gtids)


def fill_empty_starts(start: b.VGtid, reads: list[WholeRead]) -> None:
    """Start the shards of ``start`` that have no position (an empty GTID: copy everything from the
    snapshots on) at the earliest position a read of this run stands at: streamed from an empty
    GTID, a shard's changes begin only at its last copied table's snapshot, and the changes of a
    table read whole between its read and that snapshot would be lost.  The tables to copy are
    named in ``table_p_ks`` (the run's pending snapshots), so they are still copied."""
    for g in start.shard_gtids:
        if g.gtid:
            continue
        known = [r.positions[offsets.shard_key(g)] for r in reads if offsets.shard_key(g) in r.positions]
        if known:
            g.gtid = min(known, key=position.transactions_in)


def unlist(start: b.VGtid, keyless: Callable[[str], bool]) -> None:
    """Take the tables without key columns out of ``start``'s ``table_p_ks``: never copied by the
    window (one a stored VGTID lists lost its ``message.key.columns`` mid-copy; its snapshot, still
    pending, is read whole)."""
    for g in start.shard_gtids:
        kept = [t for t in g.table_p_ks if not keyless(t.table_name)]
        if len(kept) != len(g.table_p_ks):
            del g.table_p_ks[:]
            g.table_p_ks.extend(kept)


def _positions(vgtid: b.VGtid | None) -> dict[tuple[str, str], str]:
    if vgtid is None:
        return {}
    return {offsets.shard_key(g): g.gtid for g in vgtid.shard_gtids if g.gtid not in ("", offsets.CURRENT)}
