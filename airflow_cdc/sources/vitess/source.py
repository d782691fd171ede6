"""The Vitess change source: one keyspace read through vtgate's VStream, snapshots as its copy phase.

Offsets are Debezium's ``{"vgtid": [{keyspace, shard, gtid, table_p_ks?}]}`` plus our ``epoch``,
shard ``generation`` (:mod:`.position`) and ``columns`` (per shard and captured table, the digest of
the columns its last FIELD event named: :meth:`.protocol.Assembler._check_columns`).  A window
streams from the committed VGTID up to the shard positions read at the run's start (:mod:`.window`),
whole transactions, each shard stopping once it passed its target.  Nothing is acknowledged: the
shards' binlog retention decides how far back a VGTID stays readable.

Snapshots are native (``chunked_snapshots=False``): the pending table snapshots go into the VGTID's
``table_p_ks`` (:mod:`.snapshots`), vtgate copies them inside the window interleaved with the
stream, and the copied rows are staged as ``op=r`` at positions that sort after every transaction
their read reflects.  A copy spread over many runs resumes from the last copied key kept in the
committed VGTID.

Tables without key columns are snapshotted whole instead (:meth:`snapshot_whole`,
:mod:`.whole`): a copy of the one table in a call of its own, never resumed, its rows and a
truncate positioned in the run's keyless round (:mod:`.position`); the window then drops the
table's changes the copy holds.

With ``vitess.offset.storage.per.task`` the connector is partitioned into tasks, each reading its
share of the shards with an offset of its own (:mod:`.tasks`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.column_mapping import MappedCodec, configured_mappers
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError, OffsetUnavailable, SchemaError
from airflow_cdc.core.events import now_us
from airflow_cdc.core.filters import IncludeExclude
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.core.source import Capabilities, ChangeSource
from airflow_cdc.sources.vitess import offsets, orphans, position, snapshots, tasks, whole, window
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.position import VitessCoord, shard_set
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.protocol import Table
from airflow_cdc.sources.vitess.stager import Stager
from airflow_cdc.sources.vitess.tables import TableState

log = logging.getLogger(__name__)


@dataclass
class WindowResult:
    end: VitessCoord
    events: int = 0
    messages: int = 0
    per_table: dict[str, dict[str, int]] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    #: native snapshots: the snapshots this window completed, and ``op=r`` rows per table
    snapshots_done: list[TableSnapshot] = field(default_factory=list)
    snapshot_rows: dict[str, int] = field(default_factory=dict)


class VitessSource(ChangeSource):
    """One Vitess keyspace (or one of its shards) captured through vtgate's VStream."""

    kind = "vitess"
    capabilities = Capabilities(chunked_snapshots=False, checks=("vgtid",), stores_run_signals=True)

    def __init__(self, config: ConnectorConfig) -> None:
        self.config, self.name = config, config.state_name
        self.task = (
            tasks.parse_task_key(config.partition) if config["vitess.offset.storage.per.task"] else None
        )
        self.keyspace: str = config["vitess.keyspace"]
        self.shard: str | None = config["vitess.shard"] or None
        self.shards: list[str] | None = None  # a task's shards (offset storage per task), from open()
        self._tables = IncludeExclude(
            "table.include.list",
            config["table.include.list"],
            "table.exclude.list",
            config["table.exclude.list"],
        )
        self.mappers = configured_mappers(config)
        self._columns = IncludeExclude(
            "column.include.list",
            config["column.include.list"],
            "column.exclude.list",
            config["column.exclude.list"],
        )
        self.client: VtgateClient | None = None
        self.epoch = 0
        self.generation = 0
        self.captured: list[str] = []
        self.pending: list[TableSnapshot] = []
        self._states: dict[int, tuple[Table, TableState]] = {}
        self._fields: dict[str, Table] = {}
        self._last_batch: str | None = None
        self._resumed = False  # a stored offset: rows may have been captured before this run
        # per shard, per table: the digest of the columns the last FIELD event named (protocol's
        # Assembler._check_columns), as of the window's start and end
        self._columns_at_start: dict[str, dict[str, str]] = {}
        self._columns_at_end: dict[str, dict[str, str]] = {}
        self._epoch_raised = False
        self._orphan_cache: orphans.Orphans | None = None
        self._start: VitessCoord | None = None
        # tables without key columns: the committed keyless epoch and round, this run's (once
        # used), which captured tables have no key, and the tables read whole in this run (.whole)
        self._keyless_epoch = 0
        self._keyless_round = 0
        self._round: tuple[int, int] | None = None
        self._keyless: dict[str, bool] = {}
        self.whole_reads: dict[str, whole.WholeRead] = {}

    # -- life cycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Connect to vtgate and list the keyspace's captured tables.

        :raises ConnectionFailed: vtgate unreachable; :raises AuthenticationFailed: bad
            credentials; :raises ConfigError: unknown keyspace.
        """
        self.client = VtgateClient(self.config)
        names = self.client.list_tables(self.keyspace)
        self.captured = [t for t in (f"{self.keyspace}.{n}" for n in names) if self._tables(t)]
        if self.task is not None:
            self.shards = self._task_shards(self.client)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def tables(self) -> list[str]:
        return sorted(self.captured)

    def _client(self) -> VtgateClient:
        if self.client is None:
            raise RuntimeError("VitessSource used before open()")
        return self.client

    # -- offsets ----------------------------------------------------------------------------
    def head(self) -> VitessCoord:
        return VitessCoord(self._current(), self.generation)

    def _task_shards(self, client: VtgateClient) -> list[str]:
        """The shards dealt to this task now (see :mod:`.tasks`)."""
        assert self.task is not None
        task, count, _ = self.task
        current = [g.shard for g in client.current_vgtid(self.keyspace).shard_gtids]
        return tasks.task_shards(current, task, count, self.keyspace, str(self.config.partition))

    def inherit_state(self, load: Any) -> dict[str, Any] | None:
        """A task of a new generation starts from its shards' positions in the previous one's offsets."""
        if self.task is None or self.shards is None:
            return None
        every = self.shards + [g.shard for g in self._client().current_vgtid(self.keyspace).shard_gtids]
        return tasks.inherited_offset(
            load,
            self.config["name"],
            self.keyspace,
            sorted(set(every)),
            str(self.config.partition),
            self.config["vitess.prev.num.tasks"],
        )

    def start_offset(
        self, offset: dict[str, Any] | None, when_needed: bool
    ) -> tuple[VitessCoord, str | None]:
        """The committed VGTID, or (without one) ``vitess.gtid``'s start, with the reason to snapshot.

        :raises OffsetUnavailable: a shard no longer has the stored position (and not
            ``when_needed``, which restarts at the current positions in a new epoch).
        :raises ConfigError: the stored VGTID names another keyspace.
        """
        self._start, reason = self._resolve_start(offset, when_needed)
        return self._start, reason

    def _resolve_start(
        self, offset: dict[str, Any] | None, when_needed: bool
    ) -> tuple[VitessCoord, str | None]:
        if offset is None:
            orphan = self._orphans().from_offset
            if orphan and orphan.get("vgtid"):
                # a first batch was published (maybe applied) but never committed: start where it
                # started, or the changes between its start and a later "current" would be lost
                return VitessCoord(offsets.from_offset(orphan), int(orphan.get("generation", 0))), (
                    "no stored offset"
                )
            return self._configured_start(), "no stored offset"
        self.epoch = int(offset.get("epoch", 0))
        self._keyless_round = int(offset.get("keyless_round") or 0)
        self._keyless_epoch = position.stored_keyless_epoch(offset)
        self._columns_at_start = offset.get("columns") or {}
        self._columns_at_end = self._columns_at_start
        self._resumed = True
        self.generation = int(offset.get("generation", 0))
        vgtid = offsets.from_offset(offset)
        others = sorted({g.keyspace for g in vgtid.shard_gtids} - {self.keyspace})
        if others:
            raise ConfigError(
                f"property 'vitess.keyspace' is {self.keyspace!r} but the stored offset is for keyspace(s) "
                f"{', '.join(others)}",
                hint="use a new connector name for another keyspace",
            )
        if self.shards is not None:
            self._check_task_shards(vgtid)
        try:
            self._check_readable(vgtid)
        except OffsetUnavailable as e:
            if self.task is not None:
                e.hint = (
                    "with vitess.offset.storage.per.task a re-snapshot cannot void only this task's shards' "
                    "rows: reset the connector's state and snapshot again"
                )
                raise
            if not when_needed:
                raise
            log.warning("%s; snapshot.mode=when_needed: restarting at the current VGTID and re-copying", e)
            self.epoch += 1
            self._epoch_raised = True
            self.generation = 0
            return VitessCoord(self._current(), 0), f"stored VGTID no longer readable: {e}"
        return VitessCoord(vgtid, self.generation), None

    def restore_state(self, data: Any) -> None:
        self._last_batch = data.get("last_batch")

    def _orphans(self) -> orphans.Orphans:
        if self._orphan_cache is None:
            self._orphan_cache = orphans.load(self.config["staging.path"], self.name, self._last_batch)
        return self._orphan_cache

    def _current(self) -> b.VGtid:
        return self._mine(self._client().current_vgtid(self.keyspace, self.shard))

    def _mine(self, vgtid: b.VGtid) -> b.VGtid:
        """``vgtid`` restricted to this task's shards (all of it without offset storage per task)."""
        if self.shards is None:
            return vgtid
        return b.VGtid(shard_gtids=[g for g in vgtid.shard_gtids if g.shard in self.shards])

    def _configured_start(self) -> VitessCoord:
        gtid = str(self.config["vitess.gtid"]).strip()
        if gtid in (offsets.CURRENT, ""):
            return VitessCoord(self._current(), 0)
        vgtid = self._mine(offsets.start_vgtid(self.keyspace, self.shard, gtid))
        if self.shards is not None:
            self._check_task_shards(vgtid)
        self._check_readable(vgtid)
        return VitessCoord(vgtid, 0)

    def _check_task_shards(self, vgtid: b.VGtid) -> None:
        """A task resumes the shards dealt to it; anything else is a reshard or a changed task count.

        :raises ConfigError: the shards differ (nothing is read).
        """
        held = sorted(g.shard for g in vgtid.shard_gtids)
        if held != sorted(self.shards or ()):
            raise ConfigError(
                f"task {self.config.partition} of vitess.offset.storage.per.task holds shard(s) "
                f"{', '.join(held) or '(none)'} but is dealt {', '.join(self.shards or ())} now: the "
                "keyspace was resharded or tasks.max changed within one generation",
                hint="raise vitess.offset.storage.task.key.gen (with vitess.prev.num.tasks) when tasks.max "
                "changes; a reshard is not followed in this mode",
            )

    def _check_readable(self, vgtid: b.VGtid) -> None:
        """Open a stream from ``vgtid`` over no table and wait for its first answer: vtgate refuses a
        position a shard no longer has (purged binlogs, another server) at once.  Shards with an
        empty GTID (a copy from the start) are not probed: vttablet refuses a stream with neither a
        position nor a table to copy (``uvstreamer.go``: "stream needs a position or a table to copy")."""
        client = self._client()
        probe = b.VGtid(shard_gtids=[g for g in vgtid.shard_gtids if g.gtid])
        if not probe.shard_gtids:
            return
        for g in probe.shard_gtids:
            del g.table_p_ks[:]
        request = client.request(probe, tables=[])
        request.filter.rules.add(match="/^$")
        request.flags.heartbeat_interval = 1
        events = client.stream(request, timeout=30)
        try:
            for _ in events:
                return
        finally:
            events.close()

    def offset_at(self, end: VitessCoord, window: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
        out = offsets.to_offset(end.vgtid)
        out["epoch"], out["generation"] = self.epoch, end.generation
        kepoch, keyless_round = self._round or (self._keyless_epoch, self._keyless_round)
        if keyless_round:
            out["keyless_epoch"], out["keyless_round"] = kepoch, keyless_round
        if self._columns_at_end:
            out["columns"] = self._columns_at_end
        return out

    def describe_offset(self, offset: Any) -> str:
        if not offset:
            return "(none)"
        parts = [f"{g.get('shard')}@{g.get('gtid')}" for g in offset.get("vgtid") or []]
        copying = " (copying)" if any(g.get("table_p_ks") for g in offset.get("vgtid") or []) else ""
        epoch = f" (epoch {offset['epoch']})" if offset.get("epoch") else ""
        return ", ".join(parts) + copying + epoch

    def changes_after(self, offset: dict[str, Any] | None, check: str | None = None) -> bool:
        """Whether some shard's current GTID set is past the offset's (or a copy is unfinished)."""
        client = self.client or VtgateClient(self.config)
        try:
            shards = self._task_shards(client) if self.task is not None else None
            return window.changes_after(client, self.keyspace, self.shard, offset, shards)
        finally:
            if client is not self.client:
                client.close()

    def position_floor(self) -> bytes:
        return position.sort_key(self.epoch, 0, 0, 0)

    def write_purge(self, writer: BatchWriter, table: str, at: bytes, end: VitessCoord) -> None:
        fields = self._fields.get(table)
        if fields is None:
            return  # never described in this run: nothing was captured for it in this epoch either
        state = self.table_state(fields)
        vgtid = json.dumps(offsets.vgtid_to_json(end.vgtid))
        ts = now_us()
        state.sink(writer).append("t", None, None, at, (ts // 1000, ts, ts * 1000, "false", "", vgtid))

    # -- the window ---------------------------------------------------------------------------
    def plan_native_snapshots(self, pending: list[TableSnapshot]) -> None:
        """Keep the snapshots of keyed tables for the copy phase; the core reads the others whole."""
        self.pending = [s for s in pending if not self.snapshot_whole(s.table)]

    def snapshot_whole(self, table: str) -> bool:
        """Whether ``table`` is captured and has no key columns (no primary key, no
        ``message.key.columns``): its snapshot is read whole (:mod:`.whole`)."""
        if table not in self.captured:
            return False
        if table not in self._keyless:
            self._keyless[table] = self.table_state(table).keyless
        return self._keyless[table]

    def read_whole(self, snap: TableSnapshot, writer: BatchWriter) -> int:
        """Stage ``snap``'s table whole (:mod:`.whole`): a truncate and its rows, per shard at its
        copy's snapshot, in this run's keyless round; the window drops what the rows hold."""
        read = whole.read_whole(self, snap.table, writer, self._start_vgtid())
        self.whole_reads[snap.table] = read
        return read.rows

    def keyless_round(self) -> tuple[int, int]:
        """This run's keyless ``(epoch, round)`` (:mod:`.position`), fixed on first use: the round
        one above the committed round and the rounds of batches published but not committed, the
        epoch the greatest of theirs -- not the run's own epoch, which a snapshot request raises
        in the middle of a run (after its tables were read whole), so that a run that started from
        the committed offset after such a run's batch was never committed would sort below it."""
        if self._round is None:
            found = self._orphans()
            self._round = (
                max(self._keyless_epoch, found.keyless_epoch),
                max(self._keyless_round, found.keyless_round) + 1,
            )
        return self._round

    def _start_vgtid(self) -> b.VGtid:
        if self._start is None:
            raise RuntimeError("VitessSource read before start_offset()")
        return self._start.vgtid

    def check_snapshot_requests(self, requested: list[TableSnapshot]) -> None:
        """Refuse what :meth:`read_window` would: conditions and surrogate keys, and with offset
        storage per task any ad hoc snapshot."""
        for snap in requested:
            snapshots.check_supported(snap)
        if self.task is not None:
            tasks.check_task_snapshots(requested, str(self.config.partition))

    def read_window(
        self, start: VitessCoord, upto: VitessCoord, writer: BatchWriter, tracker: Any, max_events: int
    ) -> WindowResult:
        """Stage the changes from ``start`` to ``upto`` and the copy of the pending snapshots."""
        request, notes, new = snapshots.request(start.vgtid, self.pending, set(self.captured))
        if self.task is not None:
            tasks.check_task_snapshots(new, str(self.config.partition))
        elif new and self._resumed and not self._epoch_raised:
            self.epoch += 1  # see snapshots: the copy cannot show deletes, a truncate below it can
            self._epoch_raised = True
        for snap in new if self.task is None else ():
            if self._resumed and snap.purge_below is None:
                snap.purge_below = self.position_floor().hex()
        found = self._orphans()
        notes += whole.read_orphans_whole(self, found.keyless, writer, request)
        # the window reads every shard at least as far as its whole reads stand (past it, their
        # changes are no longer dropped: .whole)
        reads = list(self.whole_reads.values())
        whole.unlist(request, lambda name: self.snapshot_whole(f"{self.keyspace}.{name}"))
        whole.fill_empty_starts(request, reads)
        min_end = whole.read_past(reads, found.end)
        target = whole.read_past(reads, upto.vgtid) or upto.vgtid
        stager = Stager(self, writer, start.generation, shard_set(request), set(found.events))
        win = window.read_window(
            self._client(),
            request,
            target,
            self._streamed_tables(),
            max_events,
            self.config["vitess.window.idle.timeout"],
            on_transaction=stager.stage,
            min_end=min_end,
            columns=self._columns_at_start,
        )
        self._fields.update(win.tables)
        # kept for the captured tables only: DDLs of a table left out are not streamed, so its
        # columns may change unseen before it is captured again
        captured = set(self.captured)
        self._columns_at_end = {
            shard: kept
            for shard, tables in win.columns.items()
            if (kept := {t: d for t, d in tables.items() if t in captured})
        }
        if found.batches:
            voided = self._void_orphans(writer, found, stager)
            notes.append(f"{voided} delete(s) void rows only uncommitted batches held")
        end = b.VGtid()
        end.CopyFrom(win.end)
        carried = snapshots.carry_over_retired(end, stager.last_seen)
        generation = stager.generation_of(end)
        if carried and self.task is None:
            # the next windows (the re-copy, and changes of the table on the new shards, which this
            # window already streamed unfiltered) run in a new epoch; completion voids below it
            self.epoch += 1
            floor = self.position_floor().hex()
            for snap in snapshots.void_before_recopy(self.pending, self.keyspace, carried, floor):
                notes.append(
                    f"snapshot of {snap.table}: copied again on the shards of a reshard; rows captured "
                    "before it are void once it completes"
                )
        result = WindowResult(VitessCoord(end, generation), stager.events)
        result.per_table, result.snapshot_rows = stager.per_table, stager.copied
        result.snapshots_done = snapshots.finished(self.pending, end, self.keyspace)
        for snap in self.pending:
            snap.rows += stager.copied.get(snap.table, 0)
            snap.chunks += stager.chunks.get(snap.table, 0)
        extra: dict[str, Any] = {"vitess": {"generation": generation, "transactions": stager.transactions}}
        if win.journal is not None:
            extra["vitess"]["journal"] = [g.shard for g in win.journal.shard_gtids]
        if notes or stager.ddl:
            extra["vitess"]["notes"] = notes + stager.ddl[:20]
        result.manifest_extra = extra
        return result

    def _void_orphans(self, writer: BatchWriter, found: orphans.Orphans, stager: Stager) -> int:
        """Stage the deletes :mod:`.orphans` finds; returns how many."""
        staged = 0
        ts = now_us()
        for table, deletes in orphans.ghosts(found, stager.emitted, stager.stamp).items():
            fields = self._fields.get(table)
            state = self.table_state(fields) if fields is not None else None
            staged_as_is = [c.field for c in state.codecs if not isinstance(c, MappedCodec)] if state else []
            if state is None or not orphans.keys_staged_as_is(staged_as_is, state.key):
                log.warning(
                    "%s: cannot void %d row(s) of uncommitted batches (key type)", table, len(deletes)
                )
                continue
            slots = [state.names.index(k) for k in state.key]
            for key, at in deletes:
                before: list[Any] = [None] * len(state.names)
                for slot, value in zip(slots, key, strict=True):
                    before[slot] = value
                src = (ts // 1000, ts, ts * 1000, "false", "", "")
                state.sink(writer).append("d", tuple(before), None, at, src)
                staged += 1
        return staged

    def _streamed_tables(self) -> list[str] | None:
        """The tables to ask vtgate for: every table (None) when the filters keep all, else the
        captured ones, so that vttablet never even describes a table left out (one whose old rows
        it cannot describe any more fails the whole stream otherwise).  A table created while the
        window runs is then not streamed; the next run lists it and snapshots it."""
        if not self.config["table.include.list"] and not self.config["table.exclude.list"]:
            return None
        return [t.split(".", 1)[1] for t in self.captured]

    def encoded_chunks(self, table: str, chunk_size: int) -> Iterator[pa.Table]:
        """The live table in key order, ``chunk_size`` rows at a time, encoded like captured rows
        (``verify``); nothing is staged and no state is touched.

        Read through vtgate (``Execute``): ``SELECT <columns> ... WHERE (<key>) > (<last key>) ORDER BY
        <key> LIMIT n``, which vtgate runs on every shard and merges in key order.  The rows come
        as the copy phase's do (MySQL text values, ENUM/SET labels), so they are decoded and
        encoded by the same code.  TIMESTAMP values are read in the time zone of vttablet's
        connections (the copy phase uses UTC): run vttablet's MySQL in UTC for an exact compare.

        :raises ConfigError: ``table`` is not captured.
        """
        if table not in self.tables():
            raise ConfigError(
                f"table {table} is not captured by connector {self.name} (check the table filters)"
            )
        client = self._client()
        quoted = "`" + table.split(".", 1)[1].replace("`", "``") + "`"
        described = self._described(table)
        state = self.table_state(described)
        if state.keyless:
            yield from whole.encoded_chunks(self, table, self._current(), chunk_size)
            return
        slots = [described.names.index(k) for k in state.key]
        keys = ", ".join("`" + k.replace("`", "``") + "`" for k in state.key)
        # named, not *: vtgate needs the column list to merge a scatter read in key order (VT09015
        # "schema tracking required" for SELECT * ... ORDER BY without vtgate's schema tracking)
        columns = ", ".join("`" + n.replace("`", "``") + "`" for n in described.names)
        schema = pa.schema([c.field for c in state.codecs])
        last: list[q.BindVariable] | None = None
        while True:
            where, binds = "", {}
            if last is not None:
                where = f" WHERE ({keys}) > ({', '.join(f':k{i}' for i in range(len(last)))})"
                binds = {f"k{i}": v for i, v in enumerate(last)}
            sql = f"SELECT {columns} FROM {quoted}{where} ORDER BY {keys} LIMIT {int(chunk_size)}"  # noqa: S608
            result = client.execute(self.keyspace, sql, binds)
            if not result.rows:
                return
            rows = [list(described.decode(r).values()) for r in result.rows]
            values = [[row[i] for row in rows] for i in state.select]
            arrays = [c.convert_values(v) for c, v in zip(state.codecs, values, strict=True)]
            yield pa.Table.from_arrays(arrays, schema=schema)
            if len(result.rows) < chunk_size:
                return
            last = [_bind(described.fields[i], result.rows[-1], i) for i in slots]

    def _described(self, table: str) -> Table:
        """``keyspace.table`` as vtgate describes it now (``Execute``), as a FIELD event would."""
        client = self._client()
        name = table.split(".", 1)[1]
        quoted = "`" + name.replace("`", "``") + "`"
        fields = list(client.execute(self.keyspace, f"SELECT * FROM {quoted} WHERE 1 != 1").fields)  # noqa: S608
        # Execute's fields carry no column type (a FIELD event's do): information_schema has them
        types = client.execute(
            self.keyspace,
            "SELECT column_name, column_type FROM information_schema.columns"
            " WHERE table_schema = :ks AND table_name = :t",
            {"ks": q.BindVariable(type=q.VARCHAR, value=self.keyspace.encode()),
             "t": q.BindVariable(type=q.VARCHAR, value=name.encode())},
        )  # fmt: skip
        column_types = {}
        for row in types.rows:
            cut = row.lengths[0]
            column_types[bytes(row.values[:cut]).decode()] = bytes(row.values[cut:]).decode()
        for f in fields:
            f.column_type = column_types.get(f.name, f.column_type)
        return Table.from_event(b.FieldEvent(table_name=table, fields=fields, enum_set_string_values=True))

    def table_state(self, table: Table | str) -> TableState:
        """How ``table`` (a FIELD event's description, or a name: described through vtgate now)
        is encoded."""
        if isinstance(table, str):
            table = self._described(table)
        cached = self._states.get(id(table))
        if cached is not None and cached[0] is table:
            return cached[1]
        state = TableState.build(
            table.name,
            table.fields,
            self.config,
            lambda t, c, is_key: is_key or self._columns(f"{t}.{c}"),
            _key_override(self.config, table.name),
            self.mappers,
        )
        if state.keyless and self.task is not None:
            raise SchemaError(
                f"table {table.name} has no key columns, which vitess.offset.storage.per.task cannot "
                "capture: its silver is one multiset that a task's whole read would replace",
                hint="name its key columns in message.key.columns, or capture it without offset storage "
                "per task",
            )
        self._states[id(table)] = (table, state)
        return state

    def includes(self, table: str) -> bool:
        if table.split(".", 1)[0] != self.keyspace or not self._tables(table):
            return False
        if table not in self.captured:
            self.captured.append(table)  # created since open: the core snapshots it next run
        return True


def _bind(f: q.Field, row: q.Row, index: int) -> q.BindVariable:
    """Column ``index`` of ``row`` as a bind variable: its text value with the field's type."""
    start = sum(max(0, n) for n in row.lengths[:index])
    length = row.lengths[index]
    value = b"" if length < 0 else row.values[start : start + length]
    return q.BindVariable(type=q.NULL_TYPE if length < 0 else f.type, value=value)


def _key_override(config: ConnectorConfig, table: str) -> tuple[str, ...] | None:
    from airflow_cdc.core.filters import parse_message_key_columns

    for pattern, columns in parse_message_key_columns(config["message.key.columns"]):
        if pattern.fullmatch(table):
            return columns
    return None
