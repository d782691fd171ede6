"""The PostgreSQL change source: offsets, snapshot chunks with visibility watermarks, windows.

Watermark (SPEC §5, trap a): commit-record order is not visibility order, so each chunk is read
in its own REPEATABLE READ transaction that also records ``pg_current_snapshot()`` and, after
it, ``pg_current_wal_insert_lsn()``.  A transaction of the window is *reflected* by the chunk iff
its xid is visible to that snapshot; every transaction the snapshot sees committed below that
LSN, so a window reaching past it holds all of them.  Chunk rows touched by unreflected
transactions are dropped; the rest are emitted at the window end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mapping import configured_mappers
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY, condition_pieces
from airflow_cdc.core.config import ConnectorConfig, skipped_ops
from airflow_cdc.core.errors import ConfigError, OffsetUnavailable, ServerMisconfigured, UnsupportedType
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.snapshot import (
    ChunkRead,
    ChunkSizer,
    ChunkTracker,
    TableSnapshot,
    read_budgeted,
    read_when_visible,
)
from airflow_cdc.core.source import Capabilities, ChangeSource, columns_changed
from airflow_cdc.core.table_sink import SnapshotSinks, TableSink, ahead_rows
from airflow_cdc.core.unchanged import SKIP_PROPERTY
from airflow_cdc.sources.postgres import client, copyread, identity, overrides, replication
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.offsets import PgOffset, ServerIdentity, restart_problem, server_identity
from airflow_cdc.sources.postgres.position import PgPosition, format_pg_lsn, parse_pg_lsn
from airflow_cdc.sources.postgres.stream import WindowReader, WindowResult, prefix_filter
from airflow_cdc.sources.postgres.tables import RelationState, build_state, source_constants
from airflow_cdc.sources.postgres.types import HandlingModes
from airflow_cdc.sources.postgres.walstream import ReplicationStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watermark:
    """A chunk's read snapshot: ``xmin:xmax:xip`` (32-bit xids) and the insert LSN after it."""

    xmin: int
    xmax: int
    xip: frozenset[int]
    lsn_after: int

    def sees(self, xid: int) -> bool:
        """Whether transaction ``xid`` (committed) is visible to the snapshot (wraparound-safe)."""
        if _precedes(xid, self.xmin):
            return True
        return _precedes(xid, self.xmax) and xid not in self.xip


def _precedes(a: int, b: int) -> bool:
    diff = (a - b) & 0xFFFFFFFF
    return diff >= 0x80000000


def parse_snapshot(text: str, lsn_after: int, standby: bool = False) -> Watermark:
    """The watermark of ``pg_current_snapshot()`` text.

    On a standby that text lists no running transaction: recovery keeps the primary's running
    xids apart from the snapshot's ``xip`` (all of them as subtransactions), and
    ``pg_current_snapshot()`` reports ``xip`` only -- '732:734:' while 732 runs on the primary
    (measured on 16).  There only transactions below ``xmin`` are known to be seen; every later one
    counts as unseen (``xmax = xmin``): rows it touched are dropped from the chunk and come from
    its events, which the window holds (it reaches ``lsn_after``).  Found by the standby
    convergence test: a row deleted after the snapshot came back.
    """
    xmin, xmax, xip = text.split(":")
    if standby:
        xmax, xip = xmin, ""
    return Watermark(
        int(xmin) & 0xFFFFFFFF,
        int(xmax) & 0xFFFFFFFF,
        frozenset(int(x) & 0xFFFFFFFF for x in xip.split(",") if x),
        lsn_after,
    )


class PostgresSource(ChangeSource):
    """One PostgreSQL database captured through one slot and one publication."""

    kind = "postgresql"
    capabilities = Capabilities(
        acknowledges=True, checks=("wal", "slot"), snapshot_readers=True, blocking_snapshots=True
    )

    def __init__(self, config: ConnectorConfig) -> None:
        self.config = config
        self.name = config["name"]
        self.filters = TableFilter(config)
        self.mappers = configured_mappers(config)
        self.modes = HandlingModes(
            decimal=config["decimal.handling.mode"],
            time_precision=config["time.precision.mode"],
            binary=config["binary.handling.mode"],
            interval=config["interval.handling.mode"],
            hstore=config["hstore.handling.mode"],
            money_fraction_digits=config["money.fraction.digits"],
            include_unknown_datatypes=config["include.unknown.datatypes"],
            unavailable_value_placeholder=config["unavailable.value.placeholder"],
        )
        self.slot, self.publication = config["slot.name"], config["publication.name"]
        self.overrides = so.Overrides(config, so.POSTGRES)
        self.skip_unchanged = bool(config[SKIP_PROPERTY])
        self.conn: psycopg.Connection | None = None
        self._snapshot_sinks = SnapshotSinks()
        self._table_states: dict[str, RelationState] = {}
        self._tables: dict[str, tuple[TableId, int]] = {}
        self.epoch = 0  # PgPosition.epoch of this run's events
        self._identity: ServerIdentity | None = None
        #: (last commit LSN, source timestamp in µs) the stored offset ends with: the first
        #: events of the next window show them as Debezium's restored offset context does
        self._resume: tuple[int | None, int | None] = (None, None)
        #: the slot position this run may confirm: the committed offset (see ReplicationStream)
        self._committed_lsn: int | None = None
        #: (batch writer, the source whose epoch positions rows) while chunks are written ahead
        self._ahead: tuple[BatchWriter, PostgresSource] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Connect, check the server, list tables and ensure the publication exists."""
        self.conn = client.connect(self.config)
        self._snapshot_sinks.clear()
        self._table_states = {}
        self.server = client.check_server(self.conn)
        self.catalog = client.Catalog(self.conn)
        via_root = self.config["publish.via.partition.root"]
        self._tables = {}
        self._ordered: set[int] = set()  # key types proved orderable in this run
        self._discover_tables()
        identity.apply(self.conn, self.config[identity.PROPERTY], self._tables.values())
        self._check_overrides()
        replication.ensure_publication(
            self.conn,
            self.publication,
            self.config["publication.autocreate.mode"],
            [t for t, _ in self._tables.values()],
            via_root,
        )

    def snapshot_reader(self) -> PostgresSource:
        """A source on its own connection for the tables this one discovered, with their columns as
        this run read them (no publication check): its chunks line up with this source's rows."""
        reader = type(self)(self.config)
        reader.conn = client.connect(self.config)
        reader.server, reader.catalog = self.server, self.catalog.on_connection(reader.conn)
        reader._tables = dict(self._tables)
        reader._ahead = self._ahead
        return reader

    def _check_overrides(self) -> None:
        """Check every captured table's snapshot statement on the server (start-up).

        :raises ConfigError: a statement breaks chunking (see ``core.snapshot_overrides``).
        """
        self.overrides.check_all(self._tables, self._snapshot_relation)

    def _snapshot_relation(self, table: str, origin: str = "initial") -> Any:
        """What snapshot chunks of ``table`` read instead of it (None: the table itself)."""
        if not self.overrides.statements or not so.applies(origin):
            return None
        assert self.conn is not None
        meta = self.catalog.table_meta(*self._tables[table], self.filters)
        return overrides.relation(self.overrides, self.conn, self.catalog, meta)

    def _check_key_order(self, meta: Any, checked: set[int]) -> None:
        """Refuse key columns without a btree order (json, xml, point ...): chunks could not be
        bounded exactly.  Checked once per type by planning a range read; nothing is read.

        :raises UnsupportedType: naming table and column.
        """
        assert self.conn is not None
        types = {c.name: c for c in meta.columns}
        for name in meta.key:
            col = types[name]
            if col.type_oid in checked:
                continue
            try:
                with self.conn.transaction():
                    self.conn.execute(q.order_check(meta.id.schema, meta.id.table, name))
            except (psycopg.errors.UndefinedFunction, psycopg.errors.FeatureNotSupported) as e:
                raise UnsupportedType(
                    f"table {meta.id}: key column {name!r} has type {col.type_sql}, which has no order "
                    f"the snapshot can chunk by exactly ({e.diag.message_primary})",
                    hint="choose other key columns with message.key.columns",
                ) from None
            checked.add(col.type_oid)

    def heartbeat(self) -> None:
        """Run ``heartbeat.action.query`` (once per capture run, not on commit)."""
        query = self.config["heartbeat.action.query"]
        if query and self.conn is not None:
            self.conn.execute(query)  # the operator's own SQL, by definition

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def tables(self) -> list[str]:
        return sorted(self._tables)

    def _discover_tables(self) -> list[str]:
        """Add captured tables the catalog has now (checked for a key and SELECT); returns the new ones."""
        via_root = self.config["publish.via.partition.root"]
        new = []
        for tid, oid, _ in self.catalog.tables(self.filters, via_root):
            if str(tid) not in self._tables:
                meta = self.catalog.table_meta(tid, oid, self.filters)
                self.catalog.check_select(meta)
                self._check_key_order(meta, self._ordered)
                self._tables[str(tid)] = (tid, oid)
                new.append(str(tid))
                if meta.keyless == "append":
                    log.warning(
                        "table %s has no primary key, no message.key.columns entry and REPLICA IDENTITY "
                        "%s: PostgreSQL sends no old row, so silver keeps an append-only log of its rows "
                        "(not a mirror), and refuses UPDATE and DELETE on it while publication %r "
                        "publishes them; ALTER TABLE ... REPLICA IDENTITY FULL mirrors it exactly",
                        tid,
                        "NOTHING" if meta.replica_identity == "n" else "DEFAULT",
                        self.publication,
                    )
        return new

    @property
    def application_name(self) -> str:
        return f"airflow-cdc:{self.name}"

    @property
    def dbname(self) -> str:
        return self.server["dbname"]

    # -- offsets ----------------------------------------------------------------------------
    def start_offset(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[int, str | None]:
        """Resolve where this run's window starts; create the slot when there is none yet.

        A slot left behind the stored offset (a crash between the state commit and the slot
        advance) is advanced to it first: the offset is committed, so nothing is lost, and the
        window then neither re-reads nor counts what the offset already covers.

        :returns: (start LSN, reason a full snapshot is needed or None).
        :raises OffsetUnavailable: the stored offset cannot be read any more (slot lost or ahead,
            another cluster, another timeline, WAL below the offset) and ``snapshot.mode`` is not
            ``when_needed``.
        """
        lsn, reason = self._resolve_start(offset, when_needed)
        self._committed_lsn = lsn
        return lsn, reason

    def _resolve_start(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[int, str | None]:
        assert self.conn is not None
        self._identity = server_identity(self.conn)
        failover = self.config["slot.failover"]
        replication.check_failover(self.conn, failover, standby=self.server.get("standby", False))
        info = replication.slot_info(self.conn, self.slot)
        if info is not None:
            replication.check_slot(info, self.dbname)
            if failover and info.failover is False and info.lost() is None:
                replication.make_failover(self.config, self.slot)
        self._resume = _resume_facts(offset)
        if offset is None:
            if info is None:
                return replication.create_slot(self.conn, self.slot, failover=failover), "no stored offset"
            return info.confirmed_flush or 0, "no stored offset"
        stored = PgOffset.from_json(offset)
        self.epoch = stored.epoch
        problem = restart_problem(stored, self._identity)
        if problem is not None:
            pass
        elif info is None:
            problem = f"replication slot {self.slot!r} no longer exists"
            if self.config["slot.drop.on.stop"]:
                problem += " (slot.drop.on.stop=true dropped it when the last run's batch was committed)"
        elif info.lost() is not None:
            problem = f"replication slot {self.slot!r} cannot be read: {info.lost()}"
        elif info.confirmed_flush is not None and info.confirmed_flush > stored.lsn:
            problem = (
                f"replication slot {self.slot!r} is at {format_pg_lsn(info.confirmed_flush)}, past the "
                f"stored offset {offset['lsn']}"
            )
        if problem is None:
            if info is not None and info.confirmed_flush is not None and info.confirmed_flush < stored.lsn:
                log.info("replication slot %r is behind the committed offset: advancing it", self.slot)
                self.acknowledge(offset)
            return stored.lsn, None
        if not when_needed:
            raise OffsetUnavailable(f"{problem}: changes since {offset['lsn']} cannot be read")
        log.warning("%s; snapshot.mode=when_needed: recreating the slot and re-snapshotting", problem)
        # the log restarts: a new epoch keeps every new position above everything captured
        self.epoch = stored.epoch + 1
        self._resume = (None, None)
        if info is not None:
            replication.drop_slot(self.conn, self.slot)
        return replication.create_slot(self.conn, self.slot, failover=failover), problem

    def head(self) -> int:
        """The server's flushed WAL position now."""
        assert self.conn is not None
        flush, _insert = self.conn.execute(q.HEAD_LSNS).fetchone()  # type: ignore[misc]
        return parse_pg_lsn(flush)

    def flush_log(self) -> None:
        """Commit an empty transaction that has an xid: having written no other WAL it commits
        asynchronously, and the WAL writer flushes its commit record (with every record before it)
        within ``wal_writer_delay``.  PostgreSQL's WAL writer
        flushes only whole pages and asynchronous commits, so a record no commit follows (the
        standby snapshot logged when our slot was created, say) otherwise waits for the next
        commit on the server.  Logical decoding emits nothing for a transaction without changes."""
        assert self.conn is not None
        if self.server.get("standby"):
            return  # recovery assigns no xid; the standby replays what the primary flushes
        with self.conn.transaction():
            self.conn.execute(q.ASSIGN_XID)

    def offset_at(
        self, end: int, window: WindowResult | None, previous: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The JSON offset of LSN ``end``: the last transaction of the window (else the previous
        offset's), this run's epoch, and the server identity the LSN belongs to."""
        last: dict[str, Any] = {}
        if window is not None and window.last_commit_lsn is not None:
            last = {"txid": window.last_xid, "last_commit_lsn": window.last_commit_lsn,
                    "ts_usec": window.last_commit_ts_us}  # fmt: skip
        elif previous is not None:
            old = PgOffset.from_json(previous)
            last = {"txid": old.txid, "last_commit_lsn": old.last_commit_lsn, "ts_usec": old.ts_usec}
        ident = self._identity
        return PgOffset(
            end,
            self.epoch,
            system_id=ident.system_id if ident else None,
            timeline=ident.timeline if ident else None,
            **last,
        ).to_json()

    def describe_offset(self, offset: Any) -> str:
        return PgOffset.from_json(offset).describe() if offset else "(none)"

    def changes_after(self, offset: dict[str, Any] | None, check: str | None = None) -> bool:
        """Whether the source may hold changes past ``offset`` -- cheap, nothing decoded here.

        ``check="slot"`` (the default) lets the server peek at the slot for the first transaction
        with a published change past the offset: it fires only for changes capture would stage.
        ``check="wal"`` compares the flushed WAL position with the offset: cheaper, but any WAL
        counts (other databases, Airflow's own metadata database on the same server), so it
        over-reports and each one costs an empty batch.  No offset means yes (a snapshot is due).
        Uses a connection of its own when the source is not open.
        """
        check = check or "slot"
        if check not in ("wal", "slot"):
            raise ConfigError(f"changes check {check!r} is not supported; use 'wal' or 'slot'")
        if offset is None:
            return True
        conn = self.conn or client.connect(self.config)
        try:
            if check == "slot":
                # a slot left behind the offset would be peeked from below it: the one change the
                # check looks at could be one the offset covers, and the check would never fire
                info = replication.slot_info(conn, self.slot)
                if info is None or (info.confirmed_flush or 0) < parse_pg_lsn(offset["lsn"]):
                    return True
            query, args = changes_query(check, self.slot, self.publication, offset["lsn"])
            row = conn.execute(query, args).fetchone()
            return bool(row and row[0])
        finally:
            if conn is not self.conn:
                conn.close()

    def acknowledge(self, offset: dict[str, Any]) -> None:
        """Advance the slot to the committed offset so the server can free WAL (never backward).

        Works on a closed source too: it then uses a connection of its own for just this, without
        the table discovery and publication checks of :meth:`open`.
        """
        conn = self.conn or client.connect(self.config)
        try:
            replication.wait_slot_free(conn, self.slot, self.application_name)
            replication.advance_slot(conn, self.slot, parse_pg_lsn(offset["lsn"]))
            self._committed_lsn = parse_pg_lsn(offset["lsn"])
            if self.config["slot.drop.on.stop"]:
                # Debezium drops the slot when the connector stops gracefully; a run stops here
                log.warning("slot.drop.on.stop=true: dropping replication slot %r (testing only: the next "
                            "run cannot continue from this offset)", self.slot)
                replication.drop_slot(conn, self.slot)
        finally:
            if conn is not self.conn:
                conn.close()

    # -- tables -----------------------------------------------------------------------------
    def _state_for(self, tid: TableId, columns: list[tuple[str, int, int]]) -> RelationState:
        name = str(tid)
        included = name in self._tables
        key: list[str] = []
        keyless = None
        if included:
            meta = self.catalog.table_meta(tid, self._tables[name][1], self.filters)
            key, keyless = meta.key, meta.keyless
        return build_state(
            tid,
            included,
            columns,
            key,
            self.filters,
            self.modes,
            self.catalog.type_info,
            source_constants(self.config["topic.prefix"] or self.name, self.dbname),
            self.mappers,
            keyless,
        )

    def relation_state(self, rel: Any) -> RelationState:
        tid = TableId(rel.namespace, rel.name)
        state = self._state_for(tid, [(c.name, c.type_oid, c.typmod) for c in rel.columns])
        # skip.messages.without.change needs the old row whole: REPLICA IDENTITY FULL (the seed)
        state.skip_unchanged = self.skip_unchanged and rel.replica_identity == "f"
        return state

    def table_state(self, table: str) -> RelationState:
        """Capture state of a table as the catalog has it now (cached for the run)."""
        if table in self._table_states:
            return self._table_states[table]
        tid, oid = self._tables[table]
        meta = self.catalog.table_meta(tid, oid, self.filters)
        state = self._state_for(tid, [(c.name, c.type_oid, c.typmod) for c in meta.columns])
        self._table_states[table] = state
        return state

    # -- snapshot chunks --------------------------------------------------------------------
    def encoded_chunks(self, table: str, chunk_size: int) -> Iterator[pa.Table]:
        """The live table in key order, encoded like captured rows (``verify``); no state is touched."""
        from airflow_cdc.sources.postgres.rows import encoded_chunks  # rows builds on this class

        return encoded_chunks(self, table, chunk_size)

    def table_columns(self, table: str) -> list[str] | None:
        """Columns of a captured table (generated columns excepted), from the catalog."""
        tid, oid = self._tables[table]
        return [c.name for c in self.catalog.table_meta(tid, oid, self.filters).columns]

    def chunk_misfit(self, chunk: ChunkRead) -> str | None:
        """Chunk rows are staged by position in this run's column order: a chunk read with other
        columns (a column dropped or added since) does not fit."""
        now = self.table_columns(chunk.snapshot.table) or []
        if chunk.columns == now:
            return None
        return columns_changed(chunk.snapshot.table, chunk.columns, now, "reordered")

    def snapshot_whole(self, table: str) -> bool:
        """Tables without key columns are snapshotted whole (:mod:`.whole`); False for a table not
        captured (any more), whose snapshot the chunk reader skips with a warning."""
        return table in self._tables and not self.table_state(table).key_columns

    def read_whole(self, snap: TableSnapshot, writer: BatchWriter) -> int:
        """Stage a table without key columns whole, at its exported snapshot's position."""
        from airflow_cdc.sources.postgres.whole import read_whole  # whole builds on this class

        return read_whole(self, snap, writer)

    def read_chunks(
        self, pending: list[TableSnapshot], max_rows: int, chunk_size: int | ChunkSizer
    ) -> list[ChunkRead]:
        """Read chunks of pending table snapshots, in order, up to ``max_rows`` rows in total.

        :raises MissingPrivilege: synchronous replication is on and the user cannot see waiting commits.
        """
        if pending:
            assert self.conn is not None
            client.check_commit_visibility(self.conn)
        return read_budgeted(pending, self._tables, max_rows, chunk_size, self._read_chunk)

    def _read_chunk(self, snap: TableSnapshot, after: list | None, limit: int) -> ChunkRead:
        """Read one chunk in a snapshot that hides no committed transaction.

        A snapshot taken while a commit waits for a synchronous standby lists that transaction as
        running although its commit is already in the WAL -- and maybe already emitted by an earlier
        window, which the chunk could then not be reconciled with.  The chunk is read once no such
        transaction waits any more (normally milliseconds).

        :raises ServerMisconfigured: a committed transaction stayed invisible for ``timeout`` seconds.
        """

        def attempt() -> tuple[ChunkRead | None, str]:
            # checked before the chunk's snapshot is taken, not in it: a transaction an earlier
            # window emitted is either still waiting now, or visible to the snapshot taken next
            hidden = self._hidden_commits()
            if hidden:
                return None, f"transaction(s) {', '.join(hidden)} committed but stayed invisible"
            return self._read_chunk_once(snap, after, limit), ""

        chunk = read_when_visible(
            snap.table, attempt, "check synchronous_standby_names: a synchronous standby is not confirming"
        )
        self._start_ahead(chunk)
        return chunk

    def _hidden_commits(self) -> list[str]:
        """Xids of transactions committed in the WAL that no snapshot sees yet (waiting for a
        synchronous standby); always empty without superuser or pg_read_all_stats."""
        assert self.conn is not None
        return list(self.conn.execute(q.HIDDEN_COMMITS).fetchone()[0])  # type: ignore[index]

    def _read_chunk_once(self, snap: TableSnapshot, after: list | None, limit: int) -> ChunkRead:
        assert self.conn is not None
        state = self.table_state(snap.table)
        tid = state.tid
        meta = self.catalog.table_meta(tid, self._tables[snap.table][1], self.filters)
        all_cols = [c.name for c in meta.columns]
        order = [snap.surrogate_key] if snap.surrogate_key else state.key_columns
        not_null = {c.name: c.not_null for c in meta.columns}
        nullable = [not not_null.get(c, False) for c in order]
        # a surrogate key or message.key.columns may repeat (NULLs): a full chunk is re-read up
        # to its last value so a run of equal values never straddles two chunks
        unique = not snap.surrogate_key and self.filters.message_key_columns(tid) is None
        condition = condition_pieces(snap.table, snap.condition, all_cols, self.config[RAW_SQL_PROPERTY])
        relation = self._snapshot_relation(snap.table, snap.origin)
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # a chunk is a key-ordered range read with LIMIT: without statistics (fresh tables) the
            # planner sorts the whole remaining range per chunk, which makes a snapshot quadratic
            self.conn.execute("SET LOCAL enable_sort = off")
            self.conn.execute("SET LOCAL enable_bitmapscan = off")
            snap_text = self.conn.execute(q.SNAPSHOT_WATERMARK).fetchone()[0]  # type: ignore[index]
            if snap.max_key is None:
                query = q.max_key(tid.schema, tid.table, order, condition, relation)
                row = self.conn.execute(query).fetchone()
                snap.max_key = list(row) if row else []
            cursor_index = [all_cols.index(k) for k in order]
            data = copyread.parse_csv(b"", len(all_cols))
            bounds = (condition, nullable, relation)
            if snap.max_key:
                data = self._copy_chunk(tid, all_cols, order, after, snap.max_key, limit, *bounds)
                if not unique and data.num_rows == limit:
                    upto = [data.column(i)[-1].as_py() for i in cursor_index]
                    data = self._copy_chunk(tid, all_cols, order, after, upto, None, *bounds)
            lsn_after = parse_pg_lsn(self.conn.execute(q.INSERT_LSN).fetchone()[0])  # type: ignore[index]
        key_index = [all_cols.index(k) for k in state.key_columns]
        last = data.num_rows < limit or (
            data.num_rows > 0 and [data.column(i)[-1].as_py() for i in cursor_index] == snap.max_key
        )
        return ChunkRead(
            snap,
            all_cols,
            data,
            key_index,
            parse_snapshot(snap_text, lsn_after, standby=bool(self.server.get("standby"))),
            last or not snap.max_key,
            cursor_index=cursor_index,
        )

    def snapshot_bounds(self, snap: TableSnapshot, offsets: list[int]) -> tuple[list, list]:
        """``max_key`` and the cursors ``offsets`` rows past ``snap.last_key`` (snapshot parts)."""
        assert self.conn is not None
        state = self.table_state(snap.table)
        tid = state.tid
        meta = self.catalog.table_meta(tid, self._tables[snap.table][1], self.filters)
        order = [snap.surrogate_key] if snap.surrogate_key else state.key_columns
        not_null = {c.name: c.not_null for c in meta.columns}
        nullable = [not not_null.get(c, False) for c in order]
        columns = [c.name for c in meta.columns]
        cond = condition_pieces(snap.table, snap.condition, columns, self.config[RAW_SQL_PROPERTY])
        relation = self._snapshot_relation(snap.table, snap.origin)
        bounds: list = []
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self.conn.execute("SET LOCAL enable_sort = off")  # walk the key's index, as chunks do
            max_key = snap.max_key
            if max_key is None:
                row = self.conn.execute(q.max_key(tid.schema, tid.table, order, cond, relation)).fetchone()
                max_key = list(row) if row else []
            for offset in offsets if max_key else []:
                query = q.key_at(
                    tid.schema, tid.table, order, snap.last_key, max_key, cond, offset, nullable, relation
                )
                row = self.conn.execute(query).fetchone()
                if row is None:
                    break
                bounds.append(list(row))
        return max_key, bounds

    def watermark_from_json(self, data: dict[str, Any]) -> Watermark:
        return Watermark(data["xmin"], data["xmax"], frozenset(data["xip"]), data["lsn_after"])

    def _copy_chunk(
        self,
        tid: TableId,
        cols: list[str],
        order: list[str],
        after: list | None,
        upto: list,
        limit: int | None,
        condition: Any,
        nullable: list[bool],
        relation: Any,
    ) -> pa.Table:
        """One chunk's rows as string columns (:func:`copyread.read_table`); ``relation``: what is
        read instead of the table (a ``snapshot.select.statement.overrides`` statement)."""
        assert self.conn is not None

        def statement(fmt: str) -> Any:
            schema, table = tid.schema, tid.table
            return q.chunk_copy(
                schema, table, cols, order, after, upto, condition, limit, nullable, fmt, relation
            )

        return copyread.read_table(self.conn, statement, len(cols))

    # -- the change window ------------------------------------------------------------------
    def read_window(
        self, from_lsn: int, upto_lsn: int, writer: BatchWriter, tracker: ChunkTracker | None, max_events: int
    ) -> WindowResult:
        assert self.conn is not None
        replication.wait_slot_free(self.conn, self.slot, self.application_name)
        reader = WindowReader(
            self.relation_state,
            writer,
            tracker,
            skipped_ops(self.config),
            self.config["provide.transaction.metadata"],
            prefix_filter(
                self.config["message.prefix.include.list"], self.config["message.prefix.exclude.list"]
            ),
            self.config["topic.prefix"] or self.name,
            self.dbname,
            self._resume,
            epoch=self.epoch,
        )
        try:
            if self.config["window.reader"] == "stream":
                stream = ReplicationStream(
                    self.config, self.slot, self.publication, from_lsn, upto_lsn, max_events,
                    confirmed_lsn=self._committed_lsn,
                )
                try:
                    with stream:
                        res = reader.read_stream(stream)
                finally:
                    if stream.backend_pid:
                        replication.wait_slot_released(self.conn, self.slot, stream.backend_pid)
            elif copyread.pairs_available():
                # a connection of its own: the COPY holds it while the catalog lookups of the
                # decoding use self.conn
                with client.connect(self.config) as own:
                    res = reader.read(
                        own, self.slot, self.publication, from_lsn, upto_lsn, max_events, copy=True
                    )
            else:
                res = reader.read(self.conn, self.slot, self.publication, from_lsn, upto_lsn, max_events)
        except psycopg.errors.ObjectInUse as e:
            raise ServerMisconfigured(
                f"replication slot {self.slot!r} is in use by another process: {e.diag.message_primary}",
                hint="make sure only one consumer uses the slot (slot.name)",
            ) from e
        if res.last_commit_lsn is not None:
            self._resume = (res.last_commit_lsn, res.last_commit_ts_us)
        new = self._discover_tables()  # created (or newly matching) while the window was read
        if new:
            log.info("new captured table(s) %s: they will be snapshotted", ", ".join(new))
        return res

    def continue_window(self, window: WindowResult) -> bool:
        """A follow-on window re-peeks the slot (not advanced before the commit) and skips what
        this one read, as the next run would."""
        return True

    @staticmethod
    def reflects(watermark: Watermark, xid: int) -> bool:
        return watermark.sees(xid)

    def snapshot_position(self, end_lsn: int) -> bytes:
        return PgPosition(self.epoch, end_lsn, 0).sort_key()

    def position_floor(self) -> bytes:
        return PgPosition(self.epoch, 0, 0).sort_key()

    def _snapshot_sink(self, writer: BatchWriter, table: str) -> Any:
        return self._snapshot_sinks.get(writer, self.table_state(table))

    def write_purge(self, writer: BatchWriter, table: str, position: bytes, end: int) -> None:
        ts = time.time_ns() // 1000
        src = (ts // 1000, ts, ts * 1000, None, None, end)
        self._snapshot_sink(writer, table).append("t", None, None, position, src)

    def write_ahead(self, writer: BatchWriter | None) -> None:
        self._ahead = None if writer is None or not writer.writes_ahead() else (writer, self)

    def _start_ahead(self, chunk: ChunkRead) -> None:
        """Encode ``chunk`` as a part of its own on a writer thread while the next chunks are read
        (:meth:`BatchWriter.write_ahead`), as :meth:`write_snapshot_rows` would write it if all its
        rows survive; small chunks are not (a part each would be many small files)."""
        if self._ahead is None or chunk.data.num_rows < ahead_rows():
            return
        writer, owner = self._ahead
        state = self.table_state(chunk.snapshot.table)
        position = owner.snapshot_position(chunk.watermark.lsn_after)
        sink = state.open_sink(writer, "snapshot", ahead=True)
        part = writer.write_ahead(
            state.name, state.table_info(), sink, lambda s: self._write_rows(s, chunk.data, position)
        )
        chunk.ahead = (part, state.signature, position)

    def _kept_ahead(self, writer: BatchWriter, chunk: ChunkRead, rows: pa.Table, position: bytes) -> bool:
        """Whether the part written ahead for ``chunk`` holds exactly ``rows`` at ``position`` and
        is kept; otherwise it is dropped (the rows are written the usual way)."""
        part, signature, written_at = chunk.ahead
        chunk.ahead = None
        if (
            part.table == chunk.snapshot.table
            # no row dropped: survivors are the chunk's rows filtered (ChunkTracker.survivors)
            and rows.num_rows == chunk.data.num_rows
            and written_at == position
            and signature == self.table_state(chunk.snapshot.table).signature
            and writer.keep(part)
        ):
            return True
        writer.drop(part)
        return False

    def write_snapshot_rows(
        self, writer: BatchWriter, chunk: ChunkRead, rows: pa.Table, end_lsn: int, at: bytes | None = None
    ) -> None:
        """Append a chunk's rows as ``op=r`` at the chunk's high watermark (survivors) or at ``at``
        (dropped rows emitted as pre-images, see ``ChunkTracker.pre_images``); chunks of a table
        share one part per batch, but for a chunk written ahead whose rows all survive.

        A survivor's row is at least as new as every event of its key in the window (an event
        its chunk does not reflect drops it), and every event the chunk reflects committed before
        the watermark's ``lsn_after`` was read: so the row sorts after those events and before any
        later batch's, at ``lsn_after`` (<= ``end_lsn``: a chunk beyond the window waits), where
        Debezium emits an incremental snapshot chunk too (its high watermark).  So a chunk's rows
        can be encoded as soon as it is read.
        """
        high = chunk.watermark.lsn_after
        assert high <= end_lsn, "a chunk is written only by a window that reaches its watermark"
        position = at or self.snapshot_position(high)
        if at is None and chunk.ahead is not None and self._kept_ahead(writer, chunk, rows, position):
            return
        self._write_rows(self._snapshot_sink(writer, chunk.snapshot.table), rows, position)

    @staticmethod
    def _write_rows(sink: TableSink, rows: pa.Table, position: bytes) -> None:
        ts = time.time_ns() // 1000
        sink.write_columnar(
            "r",
            [rows.column(i) for i in range(rows.num_columns)],
            position,
            (ts // 1000, ts, ts * 1000, None, None, PgPosition.from_sort_key(position).commit_lsn),
        )


def _resume_facts(offset: dict[str, Any] | None) -> tuple[int | None, int | None]:
    if not offset:
        return None, None
    last_commit, ts_us = offset.get("last_commit_lsn"), offset.get("ts_usec")
    return (parse_pg_lsn(last_commit) if last_commit else None), (int(ts_us) if ts_us is not None else None)


def changes_query(check: str, slot: str, publication: str, lsn: str) -> tuple[str, tuple[str, ...]]:
    """The SQL and parameters of :meth:`PostgresSource.changes_after` (shared with async callers)."""
    if check == "slot":
        return q.CHANGES_SLOT, (slot, publication, lsn)
    return q.CHANGES_WAL, (lsn,)
