"""Read one binlog window into a staged batch (the hot path).

The window runs from the committed coordinate to the head read at the start of the run; it
ends on a transaction boundary (``run.max.events`` bounds it at the first commit past the
limit).  Row images are decoded by the compiled or the generated readers (:mod:`rowcodec`)
with the structure that applied when they were written (:class:`TableResolver`): straight into
Arrow column buffers where the compiled decoder can (:mod:`columnar`), else as event tuples
buffered per table and converted column-wise by the table sinks.  DDL statements update the
schema history and become schema change events; ``TRUNCATE`` becomes an ``op=t`` event.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.progress import Progress
from airflow_cdc.core.snapshot import ChunkTracker
from airflow_cdc.core.table_sink import TableSink
from airflow_cdc.core.unchanged import unchanged_row
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql.client import BinlogStream
from airflow_cdc.sources.mysql.columnar import ColumnarBuffer, new_columns
from airflow_cdc.sources.mysql.flavour import Flavour, GtidSet
from airflow_cdc.sources.mysql.position import binlog_file_number
from airflow_cdc.sources.mysql.tables import TableResolver, TableState
from airflow_cdc.sources.mysql.types import key_text

log = logging.getLogger(__name__)
_HEADER = p.HEADER.unpack_from
#: MySqlPosition's bytes: (epoch << 32 | file number), pos, ordinal, big-endian
_POS_DTYPE = np.dtype([("file", ">u8"), ("pos", ">u4"), ("ordinal", ">u4")])
_ROWS = p.ROWS_TYPES
_BEGIN, _COMMIT = "BEGIN", "COMMIT"


@dataclass
class WindowResult:
    end_lsn: int
    end_file: str
    gtids: str
    events: int = 0
    transactions: int = 0
    bounded: bool = False
    messages: int = 0
    last_commit_lsn: int | None = None
    per_table: dict[str, dict[str, int]] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        """The window's end coordinate (the source contract's name for ``end_lsn``)."""
        return self.end_lsn


class _Txn:
    __slots__ = (
        "active", "covered", "start", "gtid", "info", "seq", "per_table", "id", "standalone", "query",
    )  # fmt: skip

    def __init__(self) -> None:
        self.active, self.covered, self.start, self.seq, self.standalone = False, False, 0, 0, False
        self.gtid: str | None = None
        self.info: tuple = ()
        self.per_table: dict[str, int] = {}
        self.id = ""
        self.query: str | None = None

    def block(self, table: str) -> tuple[str, int, int]:
        self.per_table[table] = n = self.per_table.get(table, 0) + 1
        return (self.id, self.seq, n)


def _key_changed(before: Any, after: Any, key_index: list[int]) -> bool:
    return any(before[i] != after[i] for i in key_index)


def expand_events(rows: list[tuple]) -> tuple[pa.Array, dict[str, pa.Array], list | None]:
    """Positions, ``source`` arrays and transaction blocks for a piece of buffered events.

    A row is ``(op, before, after, info, pos, row, block, ordinal)``; ``info`` is shared by a
    transaction's events: ``(ts_ms, server_id, gtid, file, epoch << 32 | file_no, thread, query)``.
    ``row`` is the row's index in its rows event (``source.row``); ``ordinal`` numbers the
    *events* of the rows event, so the d + c pair of a key change gets two consecutive positions.
    Column-wise: ``info`` values are taken once per run of events sharing one ``info``.
    """
    n = len(rows)
    _, _, _, infos, pos, row, blocks, ordinal = zip(*rows, strict=True)
    ids = np.fromiter(map(id, infos), dtype=np.int64, count=n)
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = np.concatenate(([0], starts))
    counts = np.diff(np.append(starts, n))
    runs = [infos[s] for s in starts.tolist()]
    take = pa.array(np.repeat(np.arange(len(runs), dtype=np.int32), counts))
    ts_ms = np.repeat(np.array([i[0] for i in runs], dtype=np.int64), counts)
    keys = np.empty(n, dtype=_POS_DTYPE)
    keys["file"] = np.repeat(np.array([i[4] for i in runs], dtype=np.uint64), counts)
    keys["pos"], keys["ordinal"] = pos, ordinal
    positions = pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(keys.tobytes())])
    source = {
        "ts_ms": pa.array(ts_ms),
        "server_id": pa.array([i[1] for i in runs], pa.int64()).take(take),
        "gtid": pa.array([i[2] for i in runs], pa.string()).take(take),
        "file": pa.array([i[3] for i in runs], pa.string()).take(take),
        "pos": pa.array(pos, pa.int64()),
        "row": pa.array(row, pa.int32()),
        "thread": pa.array([i[5] for i in runs], pa.int64()).take(take),
        "query": pa.array([i[6] for i in runs], pa.string()).take(take),
        # ts_us/ts_ns: Debezium derives all three from the binlog event's time (whole seconds)
        "ts_us": pa.array(ts_ms * 1000),
        "ts_ns": pa.array(ts_ms * 1_000_000),
    }
    return positions.cast(pa.binary()), source, None if blocks.count(None) == n else list(blocks)


class WindowReader:
    """Decodes binlog events of one window and appends change events to the batch."""

    def __init__(
        self,
        resolver: TableResolver,
        flavour: Flavour,
        writer: BatchWriter,
        tracker: ChunkTracker | None,
        options: dict[str, Any],
    ) -> None:
        self.resolver, self.flavour, self.writer, self.tracker = resolver, flavour, writer, tracker
        self.skipped: frozenset[str] = options["skipped"]
        self.provide_txn, self.include_query = options["provide_txn"], options["include_query"]
        self.gtid_filter = options["gtid_filter"]
        self.skip_gtids: GtidSet | None = options.get("skip_gtids")
        self.epoch: int = options.get("epoch", 0)
        #: skip.messages.without.change (the binlog's row images are full: always comparable)
        self.skip_unchanged = bool(options.get("skip_unchanged", False))
        self.tracked = tracker.tables() if tracker else frozenset()
        self.maps: dict[int, TableState | None] = {}
        self.schema_changes: list[dict[str, Any]] = []
        #: each table state's column buffers (None: the compiled hand-over does not apply), by id
        #: (the state is kept with them); ``_pending``: the buffer of each table holding events
        self._columnar: dict[int, tuple[TableState, ColumnarBuffer | None]] = {}
        self._pending: dict[str, ColumnarBuffer] = {}

    def read(
        self, stream: BinlogStream, file: str, from_lsn: int, upto_lsn: int, gtids: str, max_events: int
    ) -> WindowResult:
        """Stream the window ``[from_lsn, upto_lsn)``: at most ``max_events`` rows, whole transactions."""
        res = WindowResult(upto_lsn, file, gtids)
        gset = GtidSet(gtids)
        progress = Progress("binlog window", total=max(upto_lsn - from_lsn, 1), unit="binlog bytes")
        file_no, txn, events, n = binlog_file_number(file), _Txn(), 0, 0
        gtid_type = self.flavour.gtid_event
        self.resolver.proof.reset()
        data: bytes | None = None
        while True:
            data = stream.read()
            if data is None:
                break
            _, etype, server_id, size, log_pos, _ = _HEADER(data, 0)
            if etype == p.ROTATE:
                rot = p.parse_rotate(data[p.HEADER_SIZE :])
                file, file_no = rot.next_file, binlog_file_number(rot.next_file)
                continue
            if not log_pos:
                continue  # artificial events (format description resent at the start)
            start = (file_no << 32) | (log_pos - size)
            if start >= upto_lsn:
                break  # ``data`` is the first event after the window: the look-ahead starts there
            if etype in _ROWS:
                if txn.active:
                    events += self._rows(data, etype, file_no, log_pos - size, txn)
            elif etype == p.TABLE_MAP:
                if txn.active or not txn.start:  # skipped transactions' tables need no structure
                    tm = p.parse_table_map(data[p.HEADER_SIZE :], self.flavour.is_mariadb)
                    self.maps[tm.table_id] = self.resolver.state_for(tm, start, self.writer)
            elif etype == gtid_type:
                gtid, standalone = self.flavour.parse_gtid(p.parse_header(data), data[p.HEADER_SIZE :])
                gset.add(gtid)
                self._begin(txn, start, gtid, data, server_id, file, file_no, standalone)
            elif etype == p.XID:
                self._commit(txn, res, (file_no << 32) | log_pos)
                if res.transactions == 1:
                    failpoint("mid_window")  # crash tests: a window with at least one transaction read
            elif etype == p.QUERY:
                self._query(data, txn, res, start, server_id, file, file_no, (file_no << 32) | log_pos)
            elif etype == p.MARIA_ANNOTATE_ROWS or etype == p.ROWS_QUERY:
                if self.include_query:
                    body = data[p.HEADER_SIZE + (1 if etype == p.ROWS_QUERY else 0) :]
                    txn.query = body.decode("utf-8", "replace")
                    txn.info = txn.info[:6] + (txn.query,)
            elif etype in (p.TRANSACTION_PAYLOAD, p.PARTIAL_UPDATE) or etype in p.MARIA_COMPRESSED:
                raise self.resolver.unsupported_event(etype, file, log_pos - size)
            n += 1
            if n % 50_000 == 0:
                progress.update(rows=events, done=max(0, start - from_lsn))
                failpoint("mid_window")
            if not txn.start and events >= max_events and res.last_commit_lsn is not None:
                res.bounded, res.end_lsn = True, res.last_commit_lsn
                data = stream.read()
                break
        self._flush_columnar()
        self._look_ahead(stream, data, file_no)
        for change in self.schema_changes:  # entries the proof could not vouch for are left out
            change["tableChanges"] = [t for t in change["tableChanges"] if t]
        res.events, res.gtids = events, str(gset)
        res.end_file = self.resolver.file_name(res.end_lsn >> 32)
        res.per_table.update(self.writer.op_counts("stream"))
        res.manifest_extra = {"schema_changes": self.schema_changes}
        progress.finish(rows=events)
        return res

    def _look_ahead(self, stream: BinlogStream, data: bytes | None, file_no: int) -> None:
        """Check the DDLs logged after the window up to the proof horizon (see :mod:`proof`).

        The schema history versions the window relied on were read from information_schema during
        this run; a DDL on their table logged after the window but before that read disproves them.
        """
        horizon = self.resolver.proof.horizon()
        while data is not None:
            _, etype, _, size, log_pos, _ = _HEADER(data, 0)
            if etype == p.ROTATE:
                file_no = binlog_file_number(p.parse_rotate(data[p.HEADER_SIZE :]).next_file)
            elif log_pos:
                start = (file_no << 32) | (log_pos - size)
                if start >= horizon:
                    return
                if etype == p.QUERY:
                    self.resolver.later_ddl(p.parse_query(data[p.HEADER_SIZE :]), start)
            data = stream.read()

    # -- transaction boundaries ---------------------------------------------------------------
    def _begin(
        self,
        txn: _Txn,
        start: int,
        gtid: str | None,
        data: bytes,
        server_id: int,
        file: str,
        file_no: int,
        standalone: bool,
        thread: int | None = None,
    ) -> None:
        # covered: captured by an earlier run (resume from a file start); a transaction of a GTID
        # source that gtid.source.* exclude is inactive, but its DDL still changes table structures
        txn.covered = gtid is not None and self.skip_gtids is not None and self.skip_gtids.contains(gtid)
        txn.active = gtid is None or (self.gtid_filter(self.flavour.gtid_source(gtid)) and not txn.covered)
        txn.start, txn.gtid, txn.seq, txn.standalone, txn.query = start, gtid, 0, standalone, None
        txn.per_table = {}
        txn.id = gtid or f"file={file},pos={start & 0xFFFFFFFF}"
        ts_ms = int.from_bytes(data[0:4], "little") * 1000
        txn.info = (ts_ms, server_id, gtid, file, self.epoch << 32 | file_no, thread, None)

    def _commit(self, txn: _Txn, res: WindowResult, end: int) -> None:
        if txn.start:
            res.transactions += 1
        res.last_commit_lsn = end
        txn.active, txn.start, txn.gtid = False, 0, None

    def _query(
        self,
        data: bytes,
        txn: _Txn,
        res: WindowResult,
        start: int,
        server_id: int,
        file: str,
        file_no: int,
        end: int,
    ) -> None:
        query = p.parse_query(data[p.HEADER_SIZE :])
        text = query.query.strip()
        if text == _BEGIN:
            if txn.gtid is None:
                self._begin(txn, start, None, data, server_id, file, file_no, False, query.thread_id)
            else:
                txn.info = txn.info[:5] + (query.thread_id, txn.info[6])
            txn.standalone = False
            return
        if text == _COMMIT or text.startswith("XA "):
            self._commit(txn, res, end)
            return
        if not txn.start:
            # Debezium takes source.thread only from a BEGIN query event and clears it at every
            # commit (BinlogStreamingChangeEventSource), so a DDL's TRUNCATE event has none
            self._begin(txn, start, None, data, server_id, file, file_no, True)
        if not txn.covered:
            self._ddl(query, txn, start, file, file_no)
        if txn.standalone or txn.gtid is None:
            self._commit(txn, res, end)

    def _ddl(self, query: p.Query, txn: _Txn, start: int, file: str, file_no: int) -> None:
        change = self.resolver.apply_ddl(query, start, txn.gtid, txn.info[0], file)
        if change is None:
            return
        truncated = change.pop("_truncated")
        self.schema_changes.append(change)
        if not txn.active:
            return  # the truncate of an excluded GTID source is a data change: not captured
        for table in truncated:
            state = self.resolver.current_state(table, self.writer)
            if state is None:
                continue
            if table in self.tracked:
                self.tracker.observe_truncate(table, txn.start)  # type: ignore[union-attr]
            if "t" not in self.skipped:
                txn.seq += 1
                block = txn.block(table) if self.provide_txn else None
                self._sink(state).add(("t", None, None, txn.info, start & 0xFFFFFFFF, 0, block, 0))

    # -- rows --------------------------------------------------------------------------------
    def _rows(self, data: bytes, etype: int, file_no: int, pos: int, txn: _Txn) -> int:
        body: Any = memoryview(data)[p.HEADER_SIZE :]  # no copy: row images are read from ``data``
        table_id = int.from_bytes(body[0:6], "little")
        state = self.maps.get(table_id)
        if state is None:
            return 0
        op = _ROWS[etype]
        # an update that changes the key is emitted as d + c, which skipping u does not skip
        wanted = {"u", "d", "c"} if op == "u" else {op}
        if wanted <= self.skipped and state.name not in self.tracked:
            return 0
        _, _, o, present, present_after = p.rows_body_start(etype, body)
        info, track = txn.info, state.name in self.tracked
        # the common case: no skipped operation applies, no transaction blocks, no chunk tracking
        every = not track and not self.provide_txn and op not in self.skipped
        every = every and (op != "u" or not {"d", "c"} & self.skipped)
        if every and not self.skip_unchanged:
            buffer = self._buffer(state)
            added = (
                None
                if buffer is None
                else buffer.add(data, o + p.HEADER_SIZE, op, present, present_after, pos, info)
            )
            if added is not None:  # the compiled reader wrote the events into column buffers
                txn.seq += added
                return added
        if every:
            built = state.events(data, o + p.HEADER_SIZE, op, present, present_after, pos, info)
            if built is not None:  # the compiled reader built the events
                if built:
                    self._sink(state).add_many(built)
                txn.seq += len(built)
                return len(built)
        images = state.decode(data, o + p.HEADER_SIZE, op, present, present_after, pos)
        if images and every:
            emitted = self._add_all(state, op, images, info, pos)
            txn.seq += emitted
            return emitted
        sink: Any = None
        emitted = 0
        for row, (before, after) in enumerate(images):
            if op == "u" and _key_changed(before, after, state.key_index):
                # Debezium: d for the old key, c for the new one carrying the old image as old key
                events: tuple = (("d", before, None), ("c", before, after))
            elif op == "u" and self.skip_unchanged and unchanged_row(before, after, state.select):
                continue  # skip.messages.without.change: no event, so no chunk row is dropped for it
            else:
                events = ((op, before, after),)
            for event_op, b, a in events:
                if event_op in self.skipped:
                    continue
                sink = sink or self._sink(state)
                txn.seq += 1
                block = txn.block(state.name) if self.provide_txn else None
                sink.add((event_op, b, a, info, pos, row, block, emitted))
                emitted += 1
            if track:
                self._observe(state, before, after, txn.start)
        return emitted

    def _add_all(self, state: TableState, op: str, images: list, info: tuple, pos: int) -> int:
        """Append every event of a rows event (the common case of :meth:`_rows`: no skipped
        operation applies, no transaction blocks, no snapshot chunk tracking)."""
        add = self._sink(state).add
        if op != "u":
            for row, (before, after) in enumerate(images):
                add((op, before, after, info, pos, row, None, row))
            return len(images)
        key, n = state.key_index, 0
        for row, (before, after) in enumerate(images):
            if any(before[i] != after[i] for i in key):
                add(("d", before, None, info, pos, row, None, n))
                add(("c", before, after, info, pos, row, None, n + 1))
                n += 2
            else:
                add(("u", before, after, info, pos, row, None, n))
                n += 1
        return n

    def _sink(self, state: TableState) -> TableSink:
        """The table's stream sink, after the table's column buffers (events keep their order); it
        drops unchanged updates the compiled reader built (``skip.messages.without.change``), by
        the rule :func:`unchanged_row` applies here."""
        self._flush_columnar(state.name)
        return self._stream_sink(state)

    def _stream_sink(self, state: TableState) -> TableSink:
        sink = state.stream_sink(self.writer, expand_events)
        sink.skip_unchanged = self.skip_unchanged
        return sink

    def _buffer(self, state: TableState) -> ColumnarBuffer | None:
        """The state's column buffers (see :mod:`columnar`), or None; the table's other buffers
        are flushed first."""
        entry = self._columnar.get(id(state))
        if entry is None:
            columns = new_columns(state)
            buffer = (
                None
                if columns is None
                else ColumnarBuffer(state, columns, lambda: self._stream_sink(state), self.writer.piece_rows)
            )
            entry = self._columnar[id(state)] = (state, buffer)
        buffer = entry[1]
        if buffer is not None and self._pending.get(state.name) is not buffer:
            self._flush_columnar(state.name)
            self._pending[state.name] = buffer
        return buffer

    def _flush_columnar(self, table: str | None = None) -> None:
        """Hand the buffered events of ``table`` (None: every table) to the stream sinks."""
        for name in [table] if table is not None else list(self._pending):
            pending = self._pending.pop(name, None)  # type: ignore[arg-type]
            if pending is not None:
                pending.flush()

    def _observe(self, state: TableState, before: Any, after: Any, txn_start: int) -> None:
        for image in (before, after):
            if image is not None:
                # full row images: a NULL in a key column (a NULL-able message.key.columns) is the
                # row's real key, which chunk rows carry too
                key = tuple(key_text(image[i]) for i in state.key_index)
                self.tracker.observe(state.name, key, txn_start)  # type: ignore[union-attr]
