"""The MySQL / MariaDB change source: binlog windows, schema history, chunked snapshots.

Offsets are JSON: ``{"file", "pos", "gtids", "server_id"}``.  Inside a run, binlog coordinates
are one integer (file number << 32 | position) so the source-independent capture can compare
them.  The window is read as a replica (non-blocking binlog dump) from the committed
coordinate to the head read at the start of the run.  Nothing is acknowledged on the server:
the binlog is kept by the server's own retention, and a purged offset is detected at start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.core.batch import BatchWriter, list_batches
from airflow_cdc.core.column_mapping import configured_mappers
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY, condition_pieces
from airflow_cdc.core.config import ConnectorConfig, skipped_ops
from airflow_cdc.core.errors import OffsetUnavailable, SchemaError
from airflow_cdc.core.events import now_us
from airflow_cdc.core.filters import IncludeExclude, TableFilter
from airflow_cdc.core.snapshot import (
    ChunkRead,
    ChunkSizer,
    ChunkTracker,
    TableSnapshot,
    read_budgeted,
    read_when_visible,
)
from airflow_cdc.core.source import Capabilities, ChangeSource, columns_changed
from airflow_cdc.core.table_sink import SnapshotSinks
from airflow_cdc.core.unchanged import SKIP_PROPERTY
from airflow_cdc.sources.mysql import (
    charsets,
    chunk_keys,
    client,
    offsets,
    overrides,
    parts,
    replica,
    snapshot,
)
from airflow_cdc.sources.mysql.flavour import GtidSet
from airflow_cdc.sources.mysql.position import MySqlPosition, binlog_file_number
from airflow_cdc.sources.mysql.schema import SchemaHistory, TableDef, load_tables
from airflow_cdc.sources.mysql.stream import WindowReader, WindowResult
from airflow_cdc.sources.mysql.tables import TableResolver, TableState, source_constants
from airflow_cdc.sources.mysql.types import Modes

log = logging.getLogger(__name__)


class MySqlSource(ChangeSource):
    """One MySQL or MariaDB server captured from its binlog."""

    kind = "mysql"
    capabilities = Capabilities(
        keeps_state=True, checks=offsets.CHECKS, logs_creation=True, blocking_snapshots=True
    )

    def __init__(self, config: ConnectorConfig) -> None:
        self.config, self.name = config, config["name"]
        self.filters = TableFilter(config)
        self.modes = Modes(
            config["decimal.handling.mode"],
            config["time.precision.mode"],
            config["bigint.unsigned.handling.mode"],
            config["binary.handling.mode"],
            _tinyint_boolean(config),
            config["include.unknown.datatypes"],
            config["enable.time.adjuster"],
        )
        self.gtid_filter = IncludeExclude(
            "gtid.source.includes",
            config["gtid.source.includes"],
            "gtid.source.excludes",
            config["gtid.source.excludes"],
        )
        self.overrides = so.Overrides(config, so.MYSQL, fold_case=True)
        self.conn: Any = None
        self.history = SchemaHistory()
        self.files: dict[int, str] = {}
        self._start: tuple[str, int, str] = ("", 0, "")
        self._head_gtids = ""
        self._skip: GtidSet | None = None  # stored GTIDs to skip when resuming from a file start
        self.epoch = 0  # MySqlPosition.epoch of this run's events
        self._tables: dict[str, Any] = {}
        self._snapshot_sinks = SnapshotSinks()

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, check the server settings and privileges, list captured tables."""
        self.conn = client.connect(self.config)
        self.info = client.check_server(self.conn)
        self.flavour = self.info.flavour
        client.check_privileges(self.conn, self.flavour)
        replica.check(self.conn, self.flavour)  # a replica: its binlog must hold what it replicates
        tables = load_tables(self.conn)
        self._tables = {n: t for n, t in tables.items() if self.filters.includes_table(_tid(t))}
        charsets.learn(self.conn, {c.charset for t in self._tables.values() for c in t.columns})
        self.resolver = TableResolver(
            self.conn,
            self.filters,
            self.modes,
            self.history,
            source_constants(self.config["topic.prefix"] or self.name, self.config["connector"]),
            self.flavour.json_decoder(),
            self.config["inconsistent.schema.handling.mode"],
            self.files,
            self._head_coord,
            configured_mappers(self.config),
        )
        for tdef in self._tables.values():
            # no key / unsupported type / a key without exact chunk order: fail before anything is read
            chunk_keys.check_key(tdef, self.resolver.build(tdef).key_columns)
        self._snapshot_sinks.clear()
        self._check_overrides()

    def _check_overrides(self) -> None:
        """Check every captured table's snapshot statement on the server (start-up).

        :raises ConfigError: a statement breaks chunking (see ``core.snapshot_overrides``).
        """
        self.overrides.check_all(self._tables, self._snapshot_relation)

    def _snapshot_relation(self, table: str, origin: str = "initial") -> str | None:
        """What snapshot chunks of ``table`` read instead of it (None: the table itself)."""
        if not self.overrides.statements or not so.applies(origin):
            return None
        key = self.resolver.build(self._tables[table]).key_columns
        return overrides.relation(self.overrides, self.conn, table, self._tables[table], key)

    def restore_state(self, data: Any) -> None:
        """Load the schema history kept in the connector state."""
        self.history.__init__(data.get("schema_history"))  # type: ignore[misc]

    def extra_state(self) -> dict[str, Any]:
        return {"schema_history": self.history.to_json()}

    def heartbeat(self) -> None:
        sql = self.config["heartbeat.action.query"]
        if sql and self.conn is not None:
            replica.heartbeat(self.conn, sql, self.config["read.only"])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def tables(self) -> list[str]:
        return sorted(self._tables)

    def created_in_log(self) -> frozenset[str]:
        """Tables whose CREATE TABLE a window of this run applied: their rows all stream."""
        return frozenset(self.resolver.created) & frozenset(self._tables)

    # -- offsets ----------------------------------------------------------------------------
    def _coord(self, file: str, pos: int) -> int:
        self.files[binlog_file_number(file)] = file
        return client.coordinate(file, pos)

    def start_offset(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[int, str | None]:
        """Resolve the window start and check the stored offset can still be read.

        The stored file and position on the same server; else, when the offset has a GTID set (the
        file was purged, or the server changed: a failover), the newest binlog file whose preceding
        transactions the set covers, read from its start while skipping the transactions already in
        the set; else -- no stored offset, or a lost one under ``when_needed`` -- the head.

        :raises OffsetUnavailable: the stored position is gone (binlog purged, or another server
            without a GTID set that locates it) and ``snapshot.mode`` is not ``when_needed``.
        """
        file, pos, gtids = client.head(self.conn, self.flavour)
        self._coord(file, pos)
        self._head_gtids, self._skip = gtids, None
        reason = None
        if offset is None:
            offset = self._uncommitted_start()
            reason = "no stored offset"
        if offset is not None:
            available = client.binlog_files(self.conn)
            problem, relocate = self._restarted(offset, file, pos, gtids)
            start = None if problem else self._resume(offset, available, reason is None, relocate)
            if start is not None:
                self.epoch = next_epoch(offset, start)
                return start, reason
            problem = problem or (
                f"the stored offset {offset['file']}:{offset['pos']} (GTIDs {offset.get('gtids') or 'none'}) "
                f"is not in the binlog of this server (server_id {self.info.server_id}, oldest file: "
                f"{available[0] if available else 'none'}); the binlog was purged or the server changed"
            )
            if reason is not None:
                pass  # an uncommitted first batch's start is gone: start at the head
            elif not when_needed:
                raise OffsetUnavailable(f"{problem}: the changes since the offset cannot be read")
            else:
                log.warning(
                    "%s; snapshot.mode=when_needed: restarting from the head and re-snapshotting", problem
                )
                reason = problem
        self._start = (file, pos, client.gtids_at(self.conn, self.flavour, file, pos, gtids))
        start = self._coord(file, pos)
        if offset is None or reason == "no stored offset":
            self.epoch = next_epoch(offset, start) if offset is not None else 0
        else:  # a lost offset: the re-snapshot's completion voids everything below the new epoch
            self.epoch = int(offset.get("epoch", 0)) + 1
        self.history.versions.clear()
        self._init_history(start, only_missing=False)
        return start, reason or "no stored offset"

    def _restarted(self, offset: dict[str, Any], file: str, pos: int, gtids: str) -> tuple[str | None, bool]:
        """``(why the stored offset is lost, whether to relocate it by GTIDs)`` when the binlog of the
        server that wrote the offset now ends below it.

        A binlog ending below the stored coordinates was restored from a backup or reset
        (``RESET MASTER``): file names are reused for other events, so the coordinates mean nothing.
        If the server still has every captured transaction (its GTID set covers the stored one), the
        offset is found again by GTIDs; otherwise the server lost transactions that were captured.
        """
        same_server = int(offset.get("server_id") or self.info.server_id) == self.info.server_id
        stored = client.coordinate(offset["file"], int(offset["pos"]))
        if not same_server or client.coordinate(file, pos) >= stored:
            return None, False
        stored_gtids = GtidSet(offset.get("gtids") or "")
        if stored_gtids and GtidSet(gtids).covers(stored_gtids):
            return None, True
        return (
            f"the binlog of this server ends at {file}:{pos}, below the stored offset {offset['file']}:"
            f"{offset['pos']}, and it lacks captured transactions (restored from a backup, or RESET MASTER)",
            False,
        )

    def _resume(
        self, offset: dict[str, Any], available: list[str], committed: bool, relocate: bool = False
    ) -> int | None:
        """The start coordinate of a stored offset on this server, or None when it cannot be found.

        :param relocate: the stored coordinates are meaningless here: find the offset by GTIDs.
        """
        stored_gtids = offset.get("gtids") or ""
        same_server = int(offset.get("server_id") or self.info.server_id) == self.info.server_id
        if offset["file"] in available and (same_server or not stored_gtids) and not relocate:
            if not same_server:
                log.warning(
                    "the stored offset is from server_id %s, this server is %s; no GTID set to locate "
                    "it: trusting binlog coordinates %s:%s",
                    offset.get("server_id"),
                    self.info.server_id,
                    offset["file"],
                    offset["pos"],
                )
            self._start = (offset["file"], int(offset["pos"]), stored_gtids)
            start = self._coord(offset["file"], int(offset["pos"]))
            self._init_history(start, only_missing=committed)
            return start
        stored = GtidSet(stored_gtids)
        if not stored:
            return None
        file = offsets.gtid_start_file(self.conn, self.flavour, stored, available, self.gtid_filter)
        if file is None:
            return None
        log.info(
            "resuming from GTID set %s: binlog %s read from its start (stored %s:%s %s)",
            stored_gtids,
            file,
            offset["file"],
            offset["pos"],
            "is on another server" if not same_server else "was reset" if relocate else "was purged",
        )
        self._start, self._skip = (file, 4, stored_gtids), stored
        start = self._coord(file, 4)
        trusted = same_server and not relocate
        if not trusted:
            self.history.versions.clear()  # coordinates of another binlog mean nothing here
        self._init_history(start, only_missing=committed and trusted)
        return start

    def _uncommitted_start(self) -> dict[str, Any] | None:
        """The start of the oldest published batch when nothing was committed yet.

        Without a stored offset a window starts at the head; a first batch that was staged (and
        maybe applied) but never committed must be re-captured from the same start, or the changes
        between its end and a later head would be missing from every batch.
        """
        for batch in list_batches(self.config["staging.path"], self.name):
            start = batch.manifest.get("from_offset") or {}
            if "file" in start and "pos" in start:
                return dict(start)
        return None

    def _init_history(self, coord: int, only_missing: bool) -> None:
        """Record the structures of tables the history lacks as applying from ``coord``.

        They are re-read now, after ``coord`` was chosen, with the head read after: the window
        checks that no DDL on them lies in between (:mod:`proof`).
        """
        names = [n for n in self._tables if not only_missing or n not in self.history.versions]
        if names:
            fresh = load_tables(self.conn, names=[(t.db, t.table) for t in map(self._tables.get, names) if t])
            read_at = self._head_coord()
            for name in names:
                tdef = self._tables[name] = fresh.get(name, self._tables[name])
                self.history.record(name, coord, tdef, read_at)
        self.history.prune(coord)

    def _head_coord(self) -> int:
        file, pos, _ = client.head(self.conn, self.flavour)
        return self._coord(file, pos)

    def changes_after(self, offset: dict[str, Any] | None, check: str | None = None) -> bool:
        """Whether the server may hold changes past ``offset`` -- cheap, no event is read.

        See :func:`offsets.changes_after` for the checks (``binlog``/``wal``, ``gtid``).  No offset
        means yes (a snapshot is due).  Uses a connection of its own when the source is not open.
        """
        if offset is None:
            return True
        conn = self.conn or client.connect(self.config)
        try:
            return offsets.changes_after(conn, offset, check or "binlog", self.gtid_filter)
        finally:
            if conn is not self.conn:
                conn.close()

    def head(self) -> int:
        file, pos, gtids = client.head(self.conn, self.flavour)
        self._head_gtids = gtids
        return self._coord(file, pos)

    def describe_offset(self, offset: Any) -> str:
        if not offset:
            return "(none)"
        epoch = f" (epoch {offset['epoch']})" if offset.get("epoch") else ""
        return f"{offset.get('file')}:{offset.get('pos')}{epoch}"

    def offset_at(
        self, lsn: int, window: WindowResult | None, previous: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The JSON offset of coordinate ``lsn`` (the window end, or the start before any window)."""
        if window is not None:
            gtids = window.gtids
        elif previous is not None:
            gtids = previous.get("gtids", "")
        else:
            gtids = self._start[2]
        return {
            "file": self.resolver.file_name(lsn >> 32),
            "pos": lsn & 0xFFFFFFFF,
            "gtids": gtids,
            "server_id": self.info.server_id,
            "epoch": self.epoch,
        }

    def acknowledge(self, offset: dict[str, Any]) -> None:
        """Nothing to release: the server keeps its binlog by its own retention settings."""

    # -- snapshot chunks --------------------------------------------------------------------
    def table_state(self, table: str) -> TableState:
        return self.resolver.build(_declared(self._tables[table], self.history.latest(table)))

    def table_columns(self, table: str) -> list[str] | None:
        """Columns of a captured table, as the schema history has it now."""
        return [c.name for c in self._tables[table].columns]

    def snapshot_whole(self, table: str) -> bool:
        """Tables without key columns are snapshotted whole (:mod:`.whole`); False for a table not
        captured (any more), whose snapshot the chunk reader skips with a warning."""
        return table in self._tables and not self.table_state(table).key_columns

    def read_whole(self, snap: TableSnapshot, writer: BatchWriter) -> int:
        """Stage a table without key columns whole, at its consistent snapshot's coordinate."""
        from airflow_cdc.sources.mysql.whole import read_whole  # whole builds on this class

        return read_whole(self, snap, writer)

    def read_chunks(
        self, pending: list[TableSnapshot], max_rows: int, chunk_size: int | ChunkSizer
    ) -> list[ChunkRead]:
        """Read chunks of pending table snapshots, in order, up to ``max_rows`` rows in total."""
        return read_budgeted(pending, self._tables, max_rows, chunk_size, self._read_chunk)

    def _read_chunk(self, snap: TableSnapshot, cursor: list | None, limit: int) -> ChunkRead:
        """Read one chunk whose snapshot already holds every transaction below the window start.

        With semi-synchronous replication (``AFTER_SYNC``) a transaction is in the binlog -- and
        maybe emitted by an earlier window -- before the engine commits it; a chunk read meanwhile
        would not contain it and could not be reconciled with a window that no longer holds it.
        MariaDB's ``binlog_snapshot_position`` shows this (it lies below the window start): such a
        chunk is read again once the commit completes.

        :raises ServerMisconfigured: the snapshot stayed behind the window start for ``timeout``.
        """
        # no window start when verify reads the live table: nothing to reconcile with
        start = client.coordinate(self._start[0], self._start[1]) if self._start[0] else 0

        def attempt() -> tuple[ChunkRead | None, str]:
            chunk = self._read_chunk_structured(snap, cursor, limit)
            coord = chunk.watermark.coord
            if coord is None or coord >= start:
                return chunk, ""
            return None, (
                f"the consistent snapshot stayed at binlog {self.resolver.file_name(coord >> 32)}:"
                f"{coord & 0xFFFFFFFF}, below the window start {self._start[0]}:{self._start[1]},"
            )

        return read_when_visible(
            snap.table,
            attempt,
            "transactions are logged but not committed: check semi-synchronous replication "
            "(rpl_semi_sync_master_wait_point=AFTER_SYNC waiting for a replica's ACK)",
        )

    def _read_chunk_structured(self, snap: TableSnapshot, cursor: list | None, limit: int) -> ChunkRead:
        for attempt in range(3):
            tdef = self._tables[snap.table]
            state = self.table_state(snap.table)
            columns = [c.name for c in tdef.columns]
            condition = condition_pieces(snap.table, snap.condition, columns, self.config[RAW_SQL_PROPERTY])
            try:
                return snapshot.read_chunk(
                    self.conn,
                    self.flavour.snapshot_watermark_sql(),
                    tdef,
                    snap,
                    cursor,
                    state.key_columns,
                    limit,
                    self.flavour.status_sql,
                    condition,
                    self._snapshot_relation(snap.table, snap.origin),
                )
            except Exception as e:
                if not snapshot.is_missing_column(e) or attempt == 2:
                    raise
                log.info("table %s changed during a chunk read; reloading its structure", snap.table)
                fresh = load_tables(self.conn, names=[(tdef.db, tdef.table)])
                if snap.table not in fresh:
                    raise SchemaError(f"table {snap.table} was dropped during its snapshot") from e
                self._tables[snap.table] = fresh[snap.table]
        raise AssertionError("unreachable")

    def snapshot_bounds(self, snap: TableSnapshot, offsets: list[int]) -> tuple[list, list]:
        """``max_key`` and the cursors ``offsets`` rows past ``snap.last_key`` (snapshot parts)."""
        state = self.table_state(snap.table)
        tdef = self._tables[snap.table]
        columns = [c.name for c in tdef.columns]
        condition = condition_pieces(snap.table, snap.condition, columns, self.config[RAW_SQL_PROPERTY])
        relation = self._snapshot_relation(snap.table, snap.origin)
        return parts.bounds(self.conn, tdef, snap, state.key_columns, offsets, condition, relation)

    def chunk_floor(self, watermark: snapshot.Watermark) -> int | None:
        return watermark.coord  # the consistent snapshot's binlog position (MariaDB)

    def watermark_from_json(self, data: dict[str, Any]) -> snapshot.Watermark:
        return snapshot.Watermark(data["coord"], data["lsn_after"])

    def chunk_to_files(self, chunk: Any) -> tuple[pa.Table, dict[str, Any]]:
        table, width = parts.chunk_to_table(chunk)
        structure = _structure(self._tables[chunk.snapshot.table])  # the one the rows were read with
        return table, {**super().chunk_to_files(chunk)[1], "width": width, "structure": structure}

    def chunk_from_files(self, snap: TableSnapshot, data: Any, meta: dict[str, Any]) -> ChunkRead:
        table, rows = parts.rows_of(data, meta["width"])
        chunk = super().chunk_from_files(snap, table, meta)
        return snapshot.MySqlChunk(**{**vars(chunk), "rows": rows, "structure": meta.get("structure")})

    def chunk_misfit(self, chunk: ChunkRead) -> str | None:
        """A part's rows are staged with this run's structure of the table, by position: a chunk
        read with another one (a column added, dropped or retyped since) does not fit."""
        read = getattr(chunk, "structure", None)
        now = _structure(self._tables[chunk.snapshot.table])
        if read is None or read == now:
            return None
        read_names, now_names = [c[0] for c in read], [c[0] for c in now]
        retyped = "a column changed its type or place"
        return columns_changed(chunk.snapshot.table, read_names, now_names, retyped)

    def encoded_chunks(self, table: str, chunk_size: int) -> Iterator[pa.Table]:
        """The live table in key order, encoded like captured rows (``verify``); no state is touched."""
        from airflow_cdc.sources.mysql.rows import encoded_chunks  # rows builds on this class

        return encoded_chunks(self, table, chunk_size)

    def reflects(self, watermark: snapshot.Watermark, txn_start: int) -> bool:
        return watermark.coord is not None and txn_start < watermark.coord

    def _snapshot_sink(self, writer: BatchWriter, table: str) -> Any:
        return self._snapshot_sinks.get(writer, self.table_state(table))

    def _snapshot_source(self, end_lsn: int) -> tuple:
        """Varying ``source`` values (``tables.VARYING``) of rows staged at window end ``end_lsn``."""
        file, ts_us = self.resolver.file_name(end_lsn >> 32), now_us()
        pos = end_lsn & 0xFFFFFFFF
        return (ts_us // 1000, self.info.server_id, None, file, pos, 0, None, None, ts_us, ts_us * 1000)

    def write_snapshot_rows(
        self, writer: BatchWriter, chunk: ChunkRead, rows: pa.Table, end_lsn: int, at: bytes | None = None
    ) -> None:
        """Append a chunk's surviving rows as ``op=r`` positioned at the window end (``at``:
        pre-images, which the binlog's full row images never ask for)."""
        assert isinstance(chunk, snapshot.MySqlChunk)
        sink = self._snapshot_sink(writer, chunk.snapshot.table)
        position = at or MySqlPosition(self.epoch, end_lsn >> 32, end_lsn & 0xFFFFFFFF, 0).sort_key()
        src = self._snapshot_source(end_lsn)
        for i in rows.column("__row").to_pylist():
            sink.append("r", None, chunk.rows[i], position, src)

    def position_floor(self) -> bytes:
        return MySqlPosition(self.epoch, 0, 0, 0).sort_key()

    def write_purge(self, writer: BatchWriter, table: str, position: bytes, end: int) -> None:
        self._snapshot_sink(writer, table).append("t", None, None, position, self._snapshot_source(end))

    # -- the change window ------------------------------------------------------------------
    def read_window(
        self, from_lsn: int, upto_lsn: int, writer: BatchWriter, tracker: ChunkTracker | None, max_events: int
    ) -> WindowResult:
        start_file = self.resolver.file_name(from_lsn >> 32)
        options = {
            "skipped": skipped_ops(self.config),
            "provide_txn": self.config["provide.transaction.metadata"],
            "include_query": self.config["include.query"],
            "gtid_filter": self.gtid_filter,
            "skip_gtids": self._skip,
            "epoch": self.epoch,
            "skip_unchanged": self.config[SKIP_PROPERTY],
        }
        reader = WindowReader(self.resolver, self.flavour, writer, tracker, options)
        if upto_lsn <= from_lsn:
            return WindowResult(from_lsn, start_file, self._start[2] or self._head_gtids)
        stream = client.BinlogStream(
            self.config, self.info, start_file, from_lsn & 0xFFFFFFFF, self.config["include.query"]
        )
        try:
            result = reader.read(stream, start_file, from_lsn, upto_lsn, self._start[2], max_events)
        finally:
            stream.close()
        if not self.config["include.schema.changes"]:
            result.manifest_extra = {}
        self.history.prune(from_lsn)
        self._discover_tables()
        return result

    def continue_window(self, window: WindowResult) -> bool:
        """A follow-on window starts at this one's end: its file, position and GTID set."""
        self._start = (window.end_file, window.end_lsn & 0xFFFFFFFF, window.gtids)
        self._skip = None
        return True

    def _discover_tables(self) -> None:
        """Add captured tables that a DDL of the window created or renamed into the filters; the
        core snapshots the renamed ones from the next run on.  Tables created after the window
        end are left to the next run, whose window reads their CREATE TABLE."""
        touched = set(self.history.versions)
        for name, tdef in load_tables(self.conn).items():
            if name not in self._tables and name in touched and self.filters.includes_table(_tid(tdef)):
                born = name in self.resolver.created
                log.info("new captured table %s: %s", name, "created in the log" if born else "to snapshot")
                self._tables[name] = tdef


def next_epoch(offset: dict[str, Any], start: int) -> int:
    """The position epoch of a run starting at coordinate ``start`` after ``offset``.

    Coordinates below the stored ones (a failover to a server whose binlog numbers are lower,
    ``RESET MASTER``) open a new epoch, so every new event still sorts after every captured one.
    """
    epoch = int(offset.get("epoch", 0))
    return epoch + 1 if start < client.coordinate(offset["file"], int(offset["pos"])) else epoch


def _tid(tdef: Any) -> Any:
    from airflow_cdc.core.filters import TableId

    return TableId(tdef.db, tdef.table)


def _tinyint_boolean(config: ConnectorConfig) -> bool:
    return "TinyIntOneToBooleanConverter" in str(config["boolean.type"] or "")


def _declared(tdef: TableDef, latest: TableDef | None) -> TableDef:
    """``tdef`` (information_schema) with the BOOLEAN declarations the schema history read from
    DDL (:func:`schema.declare_booleans`), for columns of the same name and declared type."""
    marked = {c.name for c in latest.columns if c.boolean} if latest else set()
    if not marked:
        return tdef
    same = {c.name: c.column_type for c in latest.columns} if latest else {}
    columns = [
        replace(c, boolean=True) if c.name in marked and same.get(c.name) == c.column_type else c
        for c in tdef.columns
    ]
    return replace(tdef, columns=columns)


def _structure(tdef: TableDef) -> list[list[str]]:
    """A table's columns as (name, declared type) pairs, in order (JSON-friendly lists)."""
    return [[c.name, c.column_type] for c in tdef.columns]
