"""Read one change window from the slot into a staged batch (the hot path).

The window's pgoutput messages come from the streaming replication protocol
(:mod:`.walstream`, ``window.reader=stream``) or from one streamed call of
``pg_logical_slot_peek_binary_changes`` per run (``window.reader=peek``: server-side cursor,
fixed fetch size, batches fetched ahead by a helper thread while this one decodes).  Neither
consumes: each run re-decodes from the slot's confirmed position, so the slot is advanced only
when the batch is committed.  The window covers every transaction whose commit record starts
below the window end; the next window starts there.  Transactions below the stored offset
(the slot was not advanced after a commit) are skipped.

Three threads share the work: this one decodes; the compiled decoder's pieces are converted
by a helper (:class:`~.columnar.PieceStage`) and their row groups encoded by another (the part's
``BackgroundWrites``): Arrow and Parquet release the GIL, so on two cores they run beside the
decoding and the fetch.  At most one piece waits for each (memory stays bounded: peak RSS
~300 MiB against ~230 MiB with one thread doing everything, for the 1.5M-event bench), errors
are raised in this thread, and both are stopped before the window's read returns.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.core.events import message_schema, now_us
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.filters import IncludeExclude
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.snapshot import ChunkTracker
from airflow_cdc.core.table_sink import BackgroundWrites, TableSink
from airflow_cdc.core.unchanged import unchanged_row
from airflow_cdc.sources.postgres import copyread, versions
from airflow_cdc.sources.postgres import protocol as proto
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.client import prefetch
from airflow_cdc.sources.postgres.columnar import PieceStage, native_decoder, to_piece
from airflow_cdc.sources.postgres.position import PgPosition, format_pg_lsn
from airflow_cdc.sources.postgres.tables import SOURCE_TYPE, RelationState, source_constants
from airflow_cdc.sources.postgres.walstream import ReplicationStream

log = logging.getLogger(__name__)
_decode: Any = proto.decode  # the hot loop dispatches on the first byte, so the union type adds nothing
FETCH_ROWS = 4096
_B, _C, _R, _I, _U, _D, _T, _M, _Y, _O = b"BCRIUDTMYO"
_N, _K = b"NK"
_U32 = struct.Struct(">I").unpack_from
parse_tuple = proto.parse_tuple
UNCHANGED_TOAST = proto.UNCHANGED_TOAST
_UNSENT = (UNCHANGED_TOAST,)


@dataclass
class WindowResult:
    end_lsn: int
    events: int = 0
    transactions: int = 0
    messages: int = 0
    bounded: bool = False
    last_commit_lsn: int | None = None
    last_xid: int | None = None
    last_commit_ts_us: int | None = None
    per_table: dict[str, dict[str, int]] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        """The window's end coordinate (the source contract's name for ``end_lsn``)."""
        return self.end_lsn


class WindowReader:
    """Decodes pgoutput messages and appends events to the batch's table sinks."""

    def __init__(
        self,
        relation_state: Callable[[proto.Relation], RelationState],
        writer: BatchWriter,
        tracker: ChunkTracker | None,
        skipped: frozenset[str],
        provide_txn: bool,
        message_filter: Callable[[str], bool],
        connector_name: str,
        dbname: str,
        resume: tuple[int | None, int | None] = (None, None),
        epoch: int = 0,
    ) -> None:
        self._relation_state = relation_state
        self.epoch = epoch  # PgPosition.epoch of every event of this window
        self.writer, self.tracker = writer, tracker
        self.skipped, self.provide_txn, self.message_filter = skipped, provide_txn, message_filter
        self.rels: dict[int, RelationState] = {}
        self.consts = source_constants(connector_name, dbname)
        self.messages: list[dict[str, Any]] = []
        self.tracked = tracker.tables() if tracker else frozenset()
        # the compiled decoder takes the row changes of relations whose events need no per-event
        # Python work (no snapshot key tracking, no transaction blocks); None: pure Python only
        self.native = None if provide_txn else native_decoder(writer.piece_rows, skipped)
        if self.native is not None:
            self.native.epoch = epoch
        self.native_rels: dict[int, RelationState] = {}
        self.events = 0
        self.last_commit_end: int | None = None
        self.last_nontx: int | None = None
        #: the compiled decoder's pieces are converted (``_pieces``) and their row groups
        #: encoded and written (``_writes``) by helper threads while this one decodes: see
        #: :meth:`_drain` and :meth:`_sink`; both stopped when the window is read
        self._pieces: PieceStage | None = None
        self._writes: BackgroundWrites | None = None
        self._behind: list[TableSink] = []
        #: Debezium's last commit LSN and source timestamp as the stored offset left them
        self.resume = resume

    def read(
        self,
        conn: psycopg.Connection,
        slot: str,
        publication: str,
        from_lsn: int,
        upto_lsn: int,
        max_events: int,
        copy: bool = False,
    ) -> WindowResult:
        """Peek the window ``[from_lsn, upto_lsn)`` (at most ``max_events`` rows, whole transactions).

        :param copy: read the rows through a ``COPY`` (:func:`_window_rows`; needs
            ``copyread.pairs_available()``), which holds ``conn`` until it ends: ``conn`` must
            serve only this read.  Without it the decoding's catalog lookups share ``conn``
            between fetches of a cursor.
        """
        messages = versions.with_messages(conn.info.server_version)
        query = q.peek_changes(slot, format_pg_lsn(upto_lsn), max_events, publication, messages=messages)
        with conn.transaction(), _window_rows(conn, query, copy) as source:
            # closed explicitly: the fetching thread must be gone before the cursor or COPY ends
            with closing(prefetch(source, FETCH_ROWS)) as batches:
                try:
                    res, rows = self.read_batches(batches, from_lsn, upto_lsn)
                    return self.finish(res, rows >= max_events)
                finally:
                    self._stop_writes()

    def read_stream(self, stream: ReplicationStream) -> WindowResult:
        """Read the window a started :class:`ReplicationStream` delivers (``window.reader=stream``)."""
        try:
            res, _rows = self.read_batches(stream.batches(), stream.from_lsn, stream.upto_lsn)
            return self.finish(res, stream.bounded)
        finally:
            self._stop_writes()

    def read_batches(
        self, batches: Iterable[list[tuple[int, bytes]]], from_lsn: int, upto_lsn: int
    ) -> tuple[WindowResult, int]:
        """Decode the window's ``(lsn, data)`` batches; returns the result so far and the rows read."""
        res = WindowResult(end_lsn=upto_lsn)
        progress = Progress("change window", total=max(upto_lsn - from_lsn, 1), unit="WAL bytes")
        self._progress = progress
        rows = 0
        st = _TxnState(self.epoch)
        st.prev_commit, st.ts_us = self.resume[0], self.resume[1] or 0
        self.last_ts_us = self.resume[1]
        for batch in batches:
            before, rows = rows, rows + len(batch)
            self.consume(batch, st, res, from_lsn)
            progress.update(rows=self._events(), done=max(0, batch[-1][0] - from_lsn))
            if not before or rows // FETCH_ROWS > before // FETCH_ROWS:  # alike for both readers
                failpoint("mid_window")
        return res, rows

    def finish(self, res: WindowResult, bounded: bool) -> WindowResult:
        """Write what is still buffered; a window ``bounded`` by ``max_events`` ends after its
        last transaction (or non-transactional message)."""
        self.drain_all()
        if bounded:
            res.bounded = True
            nontx_end = None if self.last_nontx is None else self.last_nontx + 1
            ends = [x for x in (self.last_commit_end, nontx_end) if x]
            res.end_lsn = max(ends) if ends else res.end_lsn
            self.messages = [m for m in self.messages if not (m["_nontx"] and m["_lsn"] >= res.end_lsn)]
        self._flush_messages()
        res.events += self._events()
        res.per_table.update(self.writer.op_counts("stream"))
        self._progress.finish(rows=res.events)
        return res

    def _events(self) -> int:
        return self.events + (self.native.events if self.native is not None else 0)

    def consume(
        self, batch: list[tuple[int, bytes]], st: _TxnState, res: WindowResult, from_lsn: int
    ) -> None:
        """Decode one fetched batch of ``(lsn, data)`` rows, in order.

        The compiled decoder takes the row changes it can; every other row (and any row it finds
        malformed) goes through :meth:`dispatch`, with the transaction's event counter handed
        back and forth so both number events alike.
        """
        native = self.native
        if native is None:
            for change_lsn, data in batch:
                self.dispatch(change_lsn, data, st, res, from_lsn)
            return
        i, n = 0, len(batch)
        while i < n:
            i = native.feed(batch, i)
            if native.full is not None:
                self._drain(native.full)
            elif i < n:
                st.seq = native.seq
                change_lsn, data = batch[i]
                self.dispatch(change_lsn, data, st, res, from_lsn)
                native.set_txn(
                    st.active,
                    st.commit_lsn,
                    st.ts_us,
                    st.xid,
                    st.prev_commit,
                    st.seq,
                    st.origin,
                    st.origin_lsn or 0,
                )
                i += 1

    def dispatch(self, change_lsn: int, data: bytes, st: _TxnState, res: WindowResult, from_lsn: int) -> None:
        """Decode one pgoutput message of the window (the pure-Python path).

        :raises ProtocolError: the message is malformed or of an unexpected type.
        """
        kind = data[0] if data else -1
        if kind == _C:
            commit = _decode(data)
            if st.active:
                # Debezium's lastCommitLsn: the LSN its replication stream reports for the
                # Commit message, i.e. the commit record's end (commitMessage, Debezium 3.3)
                st.prev_commit = commit.end_lsn
                res.transactions += 1
                res.last_commit_lsn, res.last_xid = commit.end_lsn, st.xid
                res.last_commit_ts_us = self.last_ts_us = st.ts_us
            self.last_commit_end = commit.end_lsn
            st.active = False
        elif kind == _B:
            st.begin(_decode(data), from_lsn)
        elif kind == _O:
            if st.active:
                st.set_origin(_decode(data))
        elif kind == _I or kind == _U or kind == _D:
            if st.active:
                self.events += self._change(data, kind, change_lsn, st)
        elif kind == _R:
            self._relation(_decode(data))
        elif kind == _T:
            if st.active:
                self._truncate(_decode(data), change_lsn, st, res)
        elif kind == _M:
            msg = _decode(data)
            if not msg.transactional:
                self.last_nontx = msg.lsn
            self._message(msg, change_lsn, st, from_lsn, res)
        elif kind != _Y:
            shown = repr(chr(kind)) if kind >= 0 else "(empty)"
            raise ProtocolError(f"unexpected pgoutput message type {shown} at {format_pg_lsn(change_lsn)}")

    def drain_all(self) -> None:
        """Write every event the compiled decoder still buffers (end of the window).

        :raises Exception: what the hand-over of a piece raised (see :class:`PieceStage`).
        """
        for relid in list(self.native_rels):
            self._drain(relid)
        self._sync()

    def _drain(self, relid: int) -> None:
        """Write the compiled decoder's buffered events of a relation (keeps event order)."""
        taken = self.native.take(relid)  # type: ignore[union-attr]
        if taken is not None:
            rs = self.native_rels[relid]
            if self._pieces is None:
                self._pieces = PieceStage()
            self._pieces.submit(lambda: self._sink(rs).write_piece(to_piece(taken)))

    def _sync(self) -> None:
        """Wait for the pieces handed to the helper thread (before this thread touches a part)."""
        if self._pieces is not None:
            self._pieces.sync()

    def _sink(self, rs: RelationState) -> TableSink:
        """The relation's open stream part, its row groups written by a background thread.

        Parquet encoding releases the GIL, so it runs beside the decoding of the next piece (and
        the fetch of the next batches); one write per part is outstanding at most, so row groups
        keep their order, and a write's error is raised by the part's next write or its close.
        """
        sink = rs.sink or rs.open_sink(self.writer, expand=expand_events)
        if sink.writes is None:
            if self._writes is None:
                self._writes = BackgroundWrites(threads=1, most=2)
            sink.writes = self._writes
            self._behind.append(sink)
        return sink

    def _stop_writes(self) -> None:
        """Wait for the pieces and row groups still being written; later writes of the parts
        (their close) happen in the caller's thread."""
        if self._pieces is not None:
            self._pieces.stop()
            self._pieces = None
        if self._writes is None:
            return
        self._writes.shutdown()
        for sink in self._behind:
            sink.writes = None
        self._writes, self._behind = None, []

    def _relation(self, rel: proto.Relation) -> None:
        if rel.relid in self.native_rels:
            self._drain(rel.relid)
            del self.native_rels[rel.relid]
        self._sync()  # the helper thread may still write to the relation's part
        if self.native is not None:
            self.native.unregister(rel.relid)
        old = self.rels.get(rel.relid)
        state = self._relation_state(rel)
        # a changed replica identity turns skip.messages.without.change on or off: a new part
        facts = (state.signature, state.skip_unchanged)
        same = old is not None and (old.signature, old.skip_unchanged) == facts
        if old is not None and old.sink is not None and not same:
            self.writer.close_table(old.name)
        elif old is not None and same:
            state = old
        self.rels[rel.relid] = state
        if self.native is None:
            return
        if not state.included:  # changes of tables not captured are skipped unread either way
            self.native.register(rel.relid, (), True)
        elif state.name not in self.tracked:
            self.native.register(rel.relid, state.select, False, state.key_index)
            self.native_rels[rel.relid] = state

    def _change(self, data: bytes, kind: int, change_lsn: int, st: _TxnState) -> int:
        """Decode an Insert/Update/Delete without building message objects (hot path)."""
        try:
            relid = _U32(data, 1)[0]
            rs = self.rels.get(relid)
            if rs is None or not rs.included:
                return 0
            marker = data[5]
            before: tuple | None
            if kind == _I:
                op, before = "c", None
                after = parse_tuple(data, 6)[0] if marker == _N else _bad(data, change_lsn)
            elif kind == _U:
                op = "u"
                if marker == _N:
                    before, after = None, parse_tuple(data, 6)[0]
                else:
                    before, off = parse_tuple(data, 6) if marker in (_K, _O) else _bad(data, change_lsn)
                    marker = data[off] if off < len(data) else -1
                    after = parse_tuple(data, off + 1)[0] if marker == _N else _bad(data, change_lsn)
                    if UNCHANGED_TOAST in after:
                        after = _fill_unchanged(after, before)
            else:
                op, after = "d", None
                before = parse_tuple(data, 6)[0] if marker in (_K, _O) else _bad(data, change_lsn)
        except (IndexError, struct.error):
            raise ProtocolError(
                f"truncated pgoutput {chr(data[0])!r} message of {len(data)} bytes "
                f"at {format_pg_lsn(change_lsn)}"
            ) from None
        emitted: list[tuple[str, tuple | None, tuple | None]]
        if op == "u" and before is not None and key_changed(before, after, rs.key_index):
            # Debezium: a key change is a delete of the old key, then a create of the new one
            # (consecutive sequence numbers); the create carries the old image as its old key
            emitted = [("d", before, None), ("c", before, after)]
        elif op == "u" and rs.skip_unchanged and unchanged_row(before, after, rs.select, _UNSENT):
            return 0  # skip.messages.without.change: no event, so no chunk row is dropped for it
        else:
            emitted = [(op, before, after)]
        emitted = [e for e in emitted if e[0] not in self.skipped]
        if not emitted:
            return 0
        for event in emitted:
            self._emit(relid, rs, *event, change_lsn, st)
        if rs.name in self.tracked:
            # a NULL key column of a full image (new row, or REPLICA IDENTITY FULL old row) is the
            # row's real key (NULL-able message.key.columns); in a key-only old row it is unknown
            self._observe(rs, before, after, st, full_before=kind != _I and data[5] == _O)
        return len(emitted)

    def _observe(
        self, rs: RelationState, before: tuple | None, after: tuple | None, st: _TxnState, full_before: bool
    ) -> None:
        """Tell the chunk tracker which keys the change touched; a change that leaves TOAST values
        unsent asks for the dropped chunk row of its (old) key as a pre-image (see ChunkTracker)."""
        unsent = after is not None and any(v is UNCHANGED_TOAST for v in after)
        old = before if before is not None else after
        for image, full in ((before, full_before), (after, True)):
            if image is not None:
                key = tuple(_text(image[i]) for i in rs.key_index)
                if full or None not in key:
                    # (commit LSN, 0): after every earlier transaction, before this one's events
                    pre = st.commit_key + bytes(8) if unsent and image is old else None
                    self.tracker.observe(rs.name, key, st.xid, pre_image=pre)  # type: ignore[union-attr]

    def _emit(
        self,
        relid: int,
        rs: RelationState,
        op: str,
        before: tuple | None,
        after: tuple | None,
        change_lsn: int,
        st: _TxnState,
    ) -> None:
        if relid in self.native_rels:
            self._drain(relid)  # the compiled decoder's earlier events of this table go first
        self._sync()
        st.seq += 1
        block = st.txn_block(rs.name, change_lsn) if self.provide_txn else None
        self._sink(rs).add((op, before, after, st.info, st.seq, change_lsn, block))

    def _truncate(self, msg: proto.Truncate, change_lsn: int, st: _TxnState, res: WindowResult) -> None:
        for relid in msg.relids:
            rs = self.rels.get(relid)
            if rs is None or not rs.included:
                continue
            if rs.name in self.tracked:
                self.tracker.observe_truncate(rs.name, st.xid)  # type: ignore[union-attr]
            if "t" in self.skipped:
                continue
            self._emit(relid, rs, "t", None, None, change_lsn, st)
            res.events += 1

    def _message(
        self, msg: proto.Message, change_lsn: int, st: _TxnState, from_lsn: int, res: WindowResult
    ) -> None:
        if not msg.transactional:
            if msg.lsn < from_lsn:
                return
            # Debezium commits a non-transactional message's LSN as soon as it sees the message
            # (commitMessage: lastCommitLsn = its LSN), before the prefix filter and before the
            # event is built, so the event's own sequence is ["<its LSN>","<its LSN>"]
            st.prev_commit = res.last_commit_lsn = msg.lsn
            res.last_xid, res.last_commit_ts_us = None, self.last_ts_us
        if not self.message_filter(msg.prefix):
            return
        if msg.transactional:
            if not st.active:
                return
            st.seq += 1
            pos = st.commit_key + st.seq.to_bytes(8, "big")
            ts_us, xid, origin = st.ts_us, st.xid, (st.origin, st.origin_lsn)
        else:
            # pgoutput sends no time for a non-transactional message: Debezium's source info
            # keeps the timestamp of the last event it processed -- the previous transaction's
            # commit time, or the stored offset's (SourceInfo.update ignores a null commit time)
            ts_us = self.last_ts_us if self.last_ts_us is not None else now_us()
            pos, xid = PgPosition(self.epoch, msg.lsn, 0).sort_key(), None
            # outside any transaction: no origin (Debezium keeps the last transaction's until the
            # next Begin clears it, an artefact of where its connector happened to start)
            origin = (None, None)
        src = self._message_source(ts_us, sequence(st.prev_commit, msg.lsn), xid, msg.lsn, origin)
        self.messages.append(
            {
                "op": "m",
                "source": src,
                "message": {"prefix": msg.prefix, "content": msg.content},
                "transaction": st.txn_block("\0message", msg.lsn)
                if (self.provide_txn and msg.transactional)
                else None,
                "__position": pos,
                "_nontx": not msg.transactional,
                "_lsn": msg.lsn,
            }
        )
        res.messages += 1

    def _message_source(
        self, ts_us: int, seq: str, xid: int | None, lsn: int, origin: tuple[str | None, int | None]
    ) -> dict[str, Any]:
        return dict(
            self.consts,
            ts_ms=ts_us // 1000,
            ts_us=ts_us,
            ts_ns=ts_us * 1000,
            snapshot="false",
            sequence=seq,
            schema="",
            table="",
            txId=xid,
            lsn=lsn,
            origin=origin[0],
            origin_lsn=origin[1],
        )

    def _flush_messages(self) -> None:
        if not self.messages:
            return
        ts = now_us()
        rows = [
            {k: v for k, v in m.items() if not k.startswith("_") or k == "__position"} for m in self.messages
        ]
        for r in rows:
            r.update(ts_ms=ts // 1000, ts_us=ts, ts_ns=ts * 1000)
            if r["transaction"] is not None:
                r["transaction"] = dict(
                    zip(("id", "total_order", "data_collection_order"), r["transaction"], strict=True)
                )
        self.writer.write_messages(pa.Table.from_pylist(rows, schema=message_schema(SOURCE_TYPE)))
        self.messages = []


@contextmanager
def _window_rows(conn: psycopg.Connection, query: Any, copy: bool) -> Iterator[Any]:
    """What the peek's ``(lsn, data)`` rows are fetched from: with ``copy``, a binary ``COPY``
    drained by the compiled reader (:class:`copyread.PairCopy`); else a server-side binary
    cursor.  Both have ``fetchmany`` with the same rows."""
    if copy:
        with conn.cursor().copy(q.binary_copy(query)) as started:
            yield copyread.PairCopy(conn, started)
        return
    with conn.cursor(name="airflow_cdc_window", binary=True) as cur:
        cur.execute(query)
        yield cur


class _TxnState:
    """Per-transaction facts the events of one transaction share (``info`` is one tuple)."""

    __slots__ = (
        "active",
        "xid",
        "commit_lsn",
        "ts_us",
        "seq",
        "prev_commit",
        "commit_key",
        "per_table",
        "info",
        "epoch",
        "origin",
        "origin_lsn",
    )

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.active = False
        #: Debezium's lastCommitLsn (None before the first commit: the sequence shows null)
        self.prev_commit: int | None = None
        self.seq = 0
        self.xid = self.commit_lsn = self.ts_us = 0
        self.origin: str | None = None
        self.origin_lsn: int | None = None

    def begin(self, begin: proto.Begin, from_lsn: int) -> None:
        # final_lsn is the commit record's start: below the offset means already committed
        self.active = begin.final_lsn >= from_lsn
        self.xid, self.commit_lsn = begin.xid, begin.final_lsn
        self.ts_us = begin.commit_ts_us
        self.seq = 0
        self.commit_key = self.epoch.to_bytes(4, "big") + begin.final_lsn.to_bytes(8, "big")
        self.per_table: dict[str, int] = {}
        # Debezium 3.6 clears the origin at Begin; an Origin message right after sets it
        self.origin = self.origin_lsn = None
        self.info: tuple[bytes, int, int, int | None, str | None, int | None]
        self.info = (self.commit_key, self.ts_us, self.xid, self.prev_commit, None, None)

    def set_origin(self, origin: proto.Origin) -> None:
        """The transaction came through a replication origin: its events carry ``source.origin``
        (the origin's name) and ``origin_lsn`` (the commit LSN on the origin server)."""
        self.origin, self.origin_lsn = origin.name, origin.lsn
        self.info = (self.commit_key, self.ts_us, self.xid, self.prev_commit, origin.name, origin.lsn)

    def txn_block(self, table: str, lsn: int) -> tuple[str, int, int]:
        """``(id, total_order, data_collection_order)`` of the transaction's next event.

        Debezium's PostgresTransactionMonitor writes the id as ``"<txId>:<LSN>"`` with the LSN
        of the event itself (the source info's last seen LSN), so it varies within a
        transaction; the orders count the events emitted (skipped operations excluded).
        """
        self.per_table[table] = n = self.per_table.get(table, 0) + 1
        return (f"{self.xid}:{lsn}", self.seq, n)


def sequence(last_commit: int | None, lsn: int) -> str:
    """Debezium's PostgreSQL ``source.sequence``: the JSON array ``[lastCommitLsn, lsn]`` of
    decimal strings, ``null`` for a commit LSN not known yet (SourceInfo.sequence)."""
    return f'[null,"{lsn}"]' if last_commit is None else f'["{last_commit}","{lsn}"]'


def expand_events(rows: list[tuple]) -> tuple[list[bytes], list[tuple], list | None]:
    """Positions, ``source`` values and transaction blocks for a piece of buffered events.

    A row is ``(op, before, after, txn_info, seq, change_lsn, txn_block)``; ``txn_info`` is
    ``(commit_key, commit_ts_us, xid, previous_commit_lsn, origin, origin_lsn)``, shared by the
    transaction's events.
    """
    positions = [r[3][0] + r[4].to_bytes(8, "big") for r in rows]
    source = [
        (t[1] // 1000, t[1], t[1] * 1000, sequence(t[3], r[5]), t[2], r[5], t[4], t[5])
        for r in rows
        for t in (r[3],)
    ]
    return positions, source, [r[6] for r in rows]


def _fill_unchanged(after: tuple, before: tuple) -> tuple:
    """The new row image with unchanged TOAST values taken from the old image where it has them.

    Debezium does this for any update carrying an old tuple (REPLICA IDENTITY FULL, or the key
    columns of a key change): PostgresChangeRecordEmitter.columnValues caches the old values and
    replaces an unchanged-TOAST new value by the cached one when that is not null.
    """
    return tuple(
        old if new is UNCHANGED_TOAST and old is not None and old is not UNCHANGED_TOAST else new
        for new, old in zip(after, before, strict=True)
    )


def key_changed(before: tuple, after: tuple | None, key_index: list[int]) -> bool:
    """Whether an update moved the row to another key (text values compared as sent; an
    unchanged-TOAST key value did not change).  The compiled decoder compares alike."""
    if after is None:
        return False
    for i in key_index:
        new = after[i]
        if new is not proto.UNCHANGED_TOAST and before[i] != new:
            return True
    return False


def _bad(data: bytes, change_lsn: int) -> Any:
    raise ProtocolError(
        f"malformed pgoutput {chr(data[0])!r} message at {format_pg_lsn(change_lsn)}: "
        f"unexpected tuple marker {data[5:6]!r}"
    )


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else None


def prefix_filter(include: tuple[str, ...], exclude: tuple[str, ...]) -> Callable[[str], bool]:
    return IncludeExclude("message.prefix.include.list", include, "message.prefix.exclude.list", exclude)
