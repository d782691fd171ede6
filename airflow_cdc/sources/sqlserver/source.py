"""The SQL Server change source: CDC change tables polled between LSNs, chunked snapshots.

Offsets are Debezium's (``commit_lsn``, ``change_lsn``, ``event_serial_no``) plus the capture
instances known at that point (to tell a purged instance from a new one) and an epoch.  Inside a
run an LSN is one integer (its 10 bytes, big-endian) so the source-independent capture can
compare coordinates.  A window is every transaction with a commit LSN in
``(committed, fn_cdc_get_max_lsn()]``; nothing is acknowledged on the server (the cleanup job's
retention decides how long changes stay).

One source reads one database: LSNs are per database, so a connector with several
``database.names`` is captured as one partition per database (:func:`.config.sqlserver_partitions`),
each with its own offset, as Debezium keeps one offset per database.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mapping import configured_mappers
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY, condition_pieces
from airflow_cdc.core.config import ConnectorConfig, skipped_ops
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.events import now_us
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.snapshot import (
    ChunkRead,
    ChunkSizer,
    ChunkTracker,
    TableSnapshot,
    key_ordered_chunks,
    read_budgeted,
)
from airflow_cdc.core.source import Capabilities, ChangeSource
from airflow_cdc.core.unchanged import SKIP_PROPERTY, unchanged_row
from airflow_cdc.sources.sqlserver import checks, client, overrides, sql
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn, SqlServerPosition, window_offset
from airflow_cdc.sources.sqlserver.schema import CaptureInstance, load_capture_instances, window_segments
from airflow_cdc.sources.sqlserver.schema_changes import switch_events
from airflow_cdc.sources.sqlserver.snapshot import read_chunk
from airflow_cdc.sources.sqlserver.stream import ChangeEvent, read_window
from airflow_cdc.sources.sqlserver.tables import (
    TableState,
    configure_keys,
    key_text,
    key_value,
    warn_append_only,
)
from airflow_cdc.sources.sqlserver.types import Modes

log = logging.getLogger(__name__)


@dataclass
class Watermark:
    """``low``: max LSN before the chunk read (transactions up to it are in the chunk);
    ``lsn_after``: max LSN after it (the window must reach it)."""

    low: int
    lsn_after: int


@dataclass
class SqlServerChunk(ChunkRead):
    rows: list[tuple] = field(default_factory=list)
    state: TableState | None = None


@dataclass
class WindowResult:
    end_lsn: int
    events: int = 0
    transactions: int = 0
    messages: int = 0
    last_commit_lsn: int | None = None
    per_table: dict[str, dict[str, int]] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.end_lsn


class SqlServerSource(ChangeSource):
    """One SQL Server database captured from its CDC change tables."""

    kind = "sqlserver"
    capabilities = Capabilities(checks=("lsn",))

    def __init__(self, config: ConnectorConfig) -> None:
        self.config, self.name = config, config["name"]
        names = config["database.names"]
        if len(names) != 1:  # the core captures each database as a partition of its own
            raise ConfigError(
                f"database.names lists {len(names)} databases: a SqlServerSource reads one; build the "
                "connector's partitions (airflow_cdc.core.pipeline.partitions) for the others"
            )
        self.database: str = names[0]
        self.filters = TableFilter(config)
        self.mappers = configured_mappers(config)
        self.modes = Modes(
            config["decimal.handling.mode"],
            config["time.precision.mode"],
            config["binary.handling.mode"],
            config["include.unknown.datatypes"],
        )
        self.overrides = so.Overrides(config, so.TSQL, fold_case=True, extra_columns=True)
        self.skip_unchanged = bool(config[SKIP_PROPERTY])
        self.conn: Any = None
        self.epoch = 0
        self.instances: list[CaptureInstance] = []
        self._states: dict[str, TableState] = {}  # by capture instance name
        self._current: dict[str, TableState] = {}  # by table id: the newest capture instance
        self._configured_keys: set[str] = set()  # table ids keyed by message.key.columns

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, run the start-up checks, list the captured tables and their capture instances.

        :raises ServerMisconfigured: CDC disabled on the database, or SQL Server Agent stopped.
        :raises MissingPrivilege: a change table the login may not read.
        :raises SchemaError: a key column (of the capture instance, or ``message.key.columns``) is not
            captured.  A table without key columns is captured (:mod:`.tables`, :mod:`.whole`).
        """
        self.conn = client.connect(self.config, self.database)
        checks.check_database(self.conn, self.database)
        checks.check_agent(self.conn)
        found = load_capture_instances(self.conn, self.database)
        found = [ci for ci in found if self.filters.includes_table(TableId(ci.schema, ci.table))]
        self._configured_keys = configure_keys(found, self.filters)
        for ci in found:
            if ci.pending:
                log.warning(
                    "capture instance %s.%s of table %s has no start LSN yet (cdc.change_tables.start_lsn "
                    "is NULL until the capture job scans the log after sys.sp_cdc_enable_table): not read "
                    "until then%s", self.database, ci.name, ci.table_id,
                    "" if any(o.table_id == ci.table_id and not o.pending for o in found)
                    else "; the table is captured (and snapshotted) from the run that sees its start",
                )  # fmt: skip
        self.instances = [ci for ci in found if not ci.pending]
        checks.check_permissions(self.conn, self.database, self.instances)
        self._states = {
            ci.name: TableState.build(
                ci,
                self.modes,
                self.config["topic.prefix"] or self.name,
                self.mappers,
                partial(self.filters.includes_column, TableId(ci.schema, ci.table)),
            )
            for ci in self.instances
        }
        self._current = {}
        for ci in sorted(self.instances, key=lambda c: (c.start_lsn, c.create_date)):
            self._current[ci.table_id] = self._states[ci.name]
        for state in self._current.values():
            warn_append_only(state)
        self._check_overrides()

    def _check_overrides(self) -> None:
        """Check every captured table's snapshot statement on the server (start-up).

        :raises ConfigError: a statement breaks chunking (see ``core.snapshot_overrides``).
        """
        overrides.check_all(self.overrides, self._current, self._snapshot_relation, self.database)

    def _snapshot_relation(self, table: str, origin: str = "initial") -> str | None:
        """What snapshot chunks of ``table`` read instead of it (None: the table itself)."""
        if not self.overrides.statements or not so.applies(origin):
            return None
        return overrides.relation(self.overrides, self.conn, self._current[table].instance)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def heartbeat(self) -> None:
        query = self.config["heartbeat.action.query"]
        if query and self.conn is not None:
            self.conn.cursor().execute(query).close()  # the operator's own SQL, by definition

    def tables(self) -> list[str]:
        return sorted(self._current)

    def table_state(self, table: str) -> TableState:
        """The newest capture instance's state of ``table`` (``database.schema.table``)."""
        return self._current[table]

    # -- offsets ----------------------------------------------------------------------------
    def _max_lsn(self) -> SqlServerLsn:
        return SqlServerLsn.of(client.scalar(self.conn, sql.MAX_LSN))

    def head(self) -> int:
        return int(self._max_lsn())

    def describe_offset(self, offset: Any) -> str:
        if not offset:
            return "(none)"
        epoch = f" (epoch {offset['epoch']})" if offset.get("epoch") else ""
        return f"{offset.get('commit_lsn')}{epoch}"

    def position_floor(self) -> bytes:
        zero = SqlServerLsn.from_int(0)
        return SqlServerPosition(self.epoch, zero, zero, 0).sort_key()

    def write_purge(self, writer: BatchWriter, table: str, position: bytes, end: int) -> None:
        state = self._current[table]
        src = (now_us() // 1000, None, str(SqlServerLsn.from_int(end)), None)
        state.sink(writer, "snapshot").append("t", None, None, position, src)

    def start_offset(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[int, str | None]:
        """The committed LSN to read after, or the head (with the reason a snapshot is due).

        :raises OffsetUnavailable: the cleanup job purged changes after the stored LSN and
            ``snapshot.mode`` is not ``when_needed``.
        """
        head = int(self._max_lsn())
        if offset is None:
            return head, "no stored offset"
        self.epoch = int(offset.get("epoch", 0))
        committed = SqlServerLsn.parse(offset["commit_lsn"])
        known = set(offset.get("capture_instances") or [])
        starts = {k: SqlServerLsn.parse(v) for k, v in (offset.get("capture_instance_starts") or {}).items()}
        problems = checks.check_offset(self.conn, self.database, self.instances, committed, known, starts)
        if committed > SqlServerLsn.from_int(head):
            # fn_cdc_get_max_lsn() never moves back on a live database: it was restored from a
            # backup (or the connector points at another database), the offset's log is gone.
            problems.append(
                f"database {self.database}: the stored offset {committed} is after fn_cdc_get_max_lsn() "
                f"{SqlServerLsn.from_int(head)}; the database was restored from a backup or replaced"
            )
        if checks.raise_purged(problems, when_needed):
            log.warning("%s; snapshot.mode=when_needed: restarting at the head and re-snapshotting", problems)
            self.epoch += 1
            return head, "; ".join(problems)
        return int(committed), None

    def offset_at(self, lsn: int, window: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
        offset = window_offset({self.database: SqlServerLsn.from_int(lsn)}, self.epoch)
        offset["capture_instances"] = sorted(self._states)
        # an instance whose start is unchanged since the offset lost nothing, even when it starts
        # after the offset's LSN (enabled after the last change the database had)
        offset["capture_instance_starts"] = {ci.name: str(ci.start_lsn) for ci in self.instances}
        return offset

    def acknowledge(self, offset: dict[str, Any]) -> None:
        """Nothing to release: the change tables keep rows until the cleanup job's retention."""

    def changes_after(self, offset: dict[str, Any] | None, check: str | None = None) -> bool:
        """Whether a transaction committed after the offset -- one cheap query.  The capture job's
        filler rows move ``fn_cdc_get_max_lsn()`` without a change, so they do not count."""
        if offset is None:
            return True
        conn = self.conn or client.connect(self.config, self.database)
        try:
            latest = client.scalar(conn, sql.max_transaction_lsn(self.database))
            return SqlServerLsn.of(latest) > SqlServerLsn.parse(offset["commit_lsn"])
        finally:
            if conn is not self.conn:
                conn.close()

    # -- snapshot chunks --------------------------------------------------------------------
    def table_columns(self, table: str) -> list[str] | None:
        """The captured columns of the table's current capture instance."""
        return [c.name for c in self._current[table].instance.columns]

    def read_chunks(
        self, pending: list[TableSnapshot], max_rows: int, chunk_size: int | ChunkSizer
    ) -> list[ChunkRead]:
        """Read chunks of pending table snapshots, in order, up to ``max_rows`` rows in total."""
        return read_budgeted(pending, self._current, max_rows, chunk_size, self._read_chunk)

    def _read_chunk(self, snap: TableSnapshot, cursor: list | None, limit: int) -> ChunkRead:
        """A chunk in key order, or in an ad hoc snapshot's surrogate-key order, with its
        additional condition; key texts first, then the surrogate key's text as the cursor."""
        state = self._current[snap.table]
        ci = state.instance
        order = _surrogate(snap, state) if snap.surrogate_key else list(ci.key)
        by_name = {c.name: c for c in ci.columns}
        after = None
        if cursor is not None:
            after = [key_value(by_name[k], v) for k, v in zip(order, cursor, strict=True)]
        chunk = read_chunk(
            self.conn,
            self.config["snapshot.isolation.mode"],
            (ci.database, ci.schema, ci.table),
            ci.columns,
            order,
            after,
            limit,
            condition_pieces(
                snap.table, snap.condition, [c.name for c in ci.columns], self.config[RAW_SQL_PROPERTY]
            ),
            # message.key.columns may name columns whose values repeat: read as a non-unique order
            unique=not snap.surrogate_key and snap.table not in self._configured_keys,
            lock_timeout_ms=self.config["snapshot.lock.timeout.ms"],
            relation=self._snapshot_relation(snap.table, snap.origin),
        )
        computed = [n for n, c in enumerate(ci.columns) if c.computed]
        if computed:  # NULL as in every change-table row, or silver would flip with each change
            for n, row in enumerate(chunk.rows):
                chunk.rows[n] = tuple(None if i in computed else v for i, v in enumerate(row))
        keys = list(ci.key)
        texts = [state.key_text(r) for r in chunk.rows]
        data = {k: pa.array([t[n] for t in texts], pa.string()) for n, k in enumerate(keys)}
        cursor_index = None
        if snap.surrogate_key:
            i = next(n for n, c in enumerate(ci.columns) if c.name == order[0])
            data["__cursor"] = pa.array([key_text(ci.columns[i], r[i]) for r in chunk.rows], pa.string())
            cursor_index = [len(keys)]
        data["__row"] = pa.array(range(len(chunk.rows)), pa.int64())
        return SqlServerChunk(
            snap,
            list(data),
            pa.table(data),
            list(range(len(keys))),
            Watermark(int(chunk.low), int(chunk.high)),
            chunk.last,
            cursor_index,
            chunk.rows,
            state,
        )

    def snapshot_whole(self, table: str) -> bool:
        """Tables without key columns are snapshotted whole (:mod:`.whole`); False for a table not
        captured (any more), whose snapshot the chunk reader skips with a warning."""
        return table in self._current and not self._current[table].key_columns

    def read_whole(self, snap: TableSnapshot, writer: BatchWriter) -> int:
        """Stage a table without key columns whole, at the log's end under a table lock."""
        from airflow_cdc.sources.sqlserver.whole import read_whole  # whole builds on this class

        return read_whole(self, snap, writer)

    def encoded_chunks(self, table: str, chunk_size: int) -> Iterator[pa.Table]:
        """The live table in key order, ``chunk_size`` rows at a time, encoded like captured rows
        (for ``verify``): the snapshot chunk reader, no state stored, nothing written.  A table
        without key columns is read in no order, in one read under a table lock (:mod:`.whole`).

        :raises ConfigError: ``table`` (``database.schema.table``) is not captured.
        """
        if table not in self._current:
            raise ConfigError(
                f"table {table} is not captured by connector {self.name} (check the table filters)"
            )
        if self.snapshot_whole(table):
            from airflow_cdc.sources.sqlserver.whole import encoded_whole  # whole builds on this class

            yield from encoded_whole(self, table, chunk_size)
            return
        for chunk in key_ordered_chunks(self, table, chunk_size):
            assert isinstance(chunk, SqlServerChunk) and chunk.state is not None
            if chunk.rows:
                codecs = chunk.state.codecs
                keep = chunk.state.select
                arrays = [codecs[i].convert_values([r[i] for r in chunk.rows]) for i in keep]
                yield pa.Table.from_arrays(arrays, schema=pa.schema([codecs[i].field for i in keep]))

    def continue_window(self, window: WindowResult) -> bool:
        """Windows are LSN ranges ``(from, upto]``: a follow-on window needs nothing."""
        return True

    def reflects(self, watermark: Watermark, txn: int) -> bool:
        """A chunk reflects every transaction captured before it was read (commit LSN <= low)."""
        return txn <= watermark.low

    def write_snapshot_rows(
        self, writer: BatchWriter, chunk: ChunkRead, rows: pa.Table, end_lsn: int, at: bytes | None = None
    ) -> None:
        """Append a chunk's surviving rows as ``op=r`` positioned at the window end (``at``:
        pre-images, which change tables' full row images never ask for)."""
        assert isinstance(chunk, SqlServerChunk) and chunk.state is not None
        sink = chunk.state.sink(writer, "snapshot")
        end = SqlServerLsn.from_int(end_lsn)
        position = at or SqlServerPosition.snapshot_at(self.epoch, end).sort_key()
        src = (now_us() // 1000, None, str(end), None)
        for i in rows.column("__row").to_pylist():
            sink.append("r", None, chunk.rows[i], position, src)

    # -- the change window ------------------------------------------------------------------
    def read_window(
        self, from_lsn: int, upto_lsn: int, writer: BatchWriter, tracker: ChunkTracker | None, max_events: int
    ) -> WindowResult:
        """Stage every transaction with a commit LSN in ``(from_lsn, upto_lsn]``, whole transactions
        only; stops after the transaction that reaches ``max_events``."""
        result = WindowResult(end_lsn=max(from_lsn, upto_lsn))
        if upto_lsn <= from_lsn:
            return result
        low, high = SqlServerLsn.from_int(from_lsn).increment(), SqlServerLsn.from_int(upto_lsn)
        segments = window_segments(self.instances, low, high)
        times = self._commit_times(low, high)
        skipped = skipped_ops(self.config)
        provide_txn = self.config["provide.transaction.metadata"]
        for txn in read_window(self.conn, segments):
            commit = int(txn[0].commit_lsn)
            ts_ms = times.get(txn[0].commit_lsn, 0)
            orders: dict[str, int] | None = {} if provide_txn else None
            for ev in txn:
                self._stage(writer, tracker, ev, (commit, ts_ms, orders), skipped, result)
            result.transactions += 1
            result.last_commit_lsn = commit
            failpoint("mid_window")  # crash tests: a window with at least one transaction staged
            if result.events >= max_events and commit < upto_lsn:
                result.end_lsn = commit  # whole transactions: resume after this one
                break
        if self.config["include.schema.changes"]:
            constants = {s.name: s.constants for s in self._states.values()}
            changes = switch_events(
                self.instances, low, SqlServerLsn.from_int(result.end_lsn), constants, now_us() // 1000
            )
            result.manifest_extra = {"schema_changes": changes} if changes else {}
        return result

    def _stage(
        self,
        writer: BatchWriter,
        tracker: ChunkTracker | None,
        ev: ChangeEvent,
        txn: tuple[int, int, dict[str, int] | None],
        skipped: frozenset[str],
        result: WindowResult,
    ) -> None:
        """Stage one event; ``txn`` is (commit LSN, ``source.ts_ms``, per-table event counts of the
        transaction so far, or None without ``provide.transaction.metadata``)."""
        commit, ts_ms, orders = txn
        state = self._states[ev.instance.name]
        if ev.op == "u" and self.skip_unchanged and unchanged_row(ev.before, ev.after, state.select):
            return  # skip.messages.without.change: no event, so no chunk row is dropped for it
        if tracker is not None and state.name in tracker.tables():
            # both images: an update may change the key, and a chunk row under either key is stale
            for image in (ev.before, ev.after):
                if image is not None:
                    tracker.observe(state.name, state.key_text(image), commit)
        if ev.op in skipped:
            return
        position = SqlServerPosition(self.epoch, ev.commit_lsn, ev.change_lsn, ev.event_serial_no).sort_key()
        src = (ts_ms, str(ev.change_lsn), str(ev.commit_lsn), ev.event_serial_no)
        block = None
        if orders is not None:  # Debezium: id = the commit LSN; orders count emitted events only
            orders[state.name] = orders.get(state.name, 0) + 1
            orders[""] = orders.get("", 0) + 1
            block = (str(ev.commit_lsn), orders[""], orders[state.name])
        state.sink(writer, "stream").append(ev.op, ev.before, ev.after, position, src, block)
        result.events += 1
        counts = result.per_table.setdefault(state.name, {})
        counts[ev.op] = counts.get(ev.op, 0) + 1

    def _commit_times(self, low: SqlServerLsn, high: SqlServerLsn) -> dict[SqlServerLsn, int]:
        """``source.ts_ms`` per commit LSN from ``cdc.lsn_time_mapping``.

        ``tran_end_time`` is the server's local wall-clock time: it is shifted by the server's
        UTC offset now (``SYSDATETIME()`` - ``SYSUTCDATETIME()``), as Debezium shifts it by
        ``DATEPART(TZOFFSET, SYSDATETIMEOFFSET())``; around a daylight-saving change commits of the
        other side of it are an hour off, as in Debezium.  Filler rows (``tran_id = 0x00``) are
        not transactions and are not read.
        """
        cur = self.conn.cursor()
        try:
            local, utc = cur.execute(sql.SERVER_CLOCKS).fetchone()
            rows = cur.execute(sql.lsn_times(self.database), low.raw, high.raw).fetchall()
        finally:
            cur.close()
        offset_ms = round((local - utc) / 6e10) * 60_000  # whole minutes: the calls are µs apart
        return {SqlServerLsn.of(r[0]): _epoch_ms(r[1]) - offset_ms for r in rows}


def _surrogate(snap: TableSnapshot, state: TableState) -> list[str]:
    """The ad hoc snapshot's surrogate key as the chunk order.

    :raises ConfigError: not a captured column of the table, or NULL-able (SQL Server sorts NULLs
        first and no range predicate reaches them, so their rows would be skipped).
    """
    column = next((c for c in state.instance.columns if c.name == snap.surrogate_key), None)
    if column is None:
        raise ConfigError(
            f"snapshot of {snap.table}: surrogate-key {snap.surrogate_key!r} is not a captured column "
            f"of capture instance {state.instance.name}"
        )
    if column.nullable:
        raise ConfigError(
            f"snapshot of {snap.table}: surrogate-key {snap.surrogate_key!r} allows NULLs; "
            "choose a NOT NULL column (rows with NULL there could not be chunked)"
        )
    return [column.name]


def _epoch_ms(value: Any) -> int:
    if isinstance(value, int):  # the client's timestamp converter: nanoseconds since the epoch
        return value // 10**6
    return 0
