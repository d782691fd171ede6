"""One capture run and its commit, independent of the source (SPEC §3 steps 2 and 4).

Capture reads the committed state, resolves the start offset, reads pending snapshot chunks,
streams the change window, reconciles the chunks, and publishes one immutable batch whose
manifest carries the state to commit.  Capture never acknowledges a position at the source, and
changes the stored state only before it publishes anything, for what no log would give the next
run again: a new start (:meth:`Capture._anchor`) and, on Vitess, the snapshots of this run's
signals (:meth:`Capture._store_signals`).  Re-running it from the same committed state yields an
equivalent batch.
Commit compare-and-sets the state (so of two racing runs only one commits) and only then
acknowledges the source; a crash in between leaves the source behind the state, which the next
run tolerates by skipping what the state says is done.  Both hold the connector's lease
(:mod:`airflow_cdc.core.lease`), so a second run of the connector is refused while one works.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core import snapshot_blocking, snapshot_parts, snapshot_whole
from airflow_cdc.core import step_metrics as sm
from airflow_cdc.core.batch import Batch, BatchWriter, clean_incomplete, expire_batches
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from airflow_cdc.core.config import ConnectorConfig, signal_table
from airflow_cdc.core.errors import ConfigError, ServerMisconfigured
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.gc_policy import relaxed_gc
from airflow_cdc.core.lease import Lease, Leases, fence_state
from airflow_cdc.core.metrics import MetricsFile, MetricsRecorder
from airflow_cdc.core.signals import SnapshotSignal, apply_signals, check_signals, parse_signal
from airflow_cdc.core.snapshot import (
    ChunkRead,
    ChunkSizer,
    ChunkTracker,
    SnapshotContext,
    TableSnapshot,
    match_tables,
)
from airflow_cdc.core.snapshot_readers import DEFAULT_SPAN, read_side_by_side
from airflow_cdc.core.source import ChangeSource
from airflow_cdc.core.state import StateStore
from airflow_cdc.core.windows import merge_windows

log = logging.getLogger(__name__)


@dataclass
class CaptureResult:
    batch_id: str
    batch_path: str
    from_offset: dict[str, Any] | None
    to_offset: dict[str, Any]
    events: int
    snapshot_rows: int
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    committed: bool = False
    #: the run's metrics (:class:`MetricsRecorder`; the manifest's ``metrics`` as JSON)
    metrics: MetricsRecorder | None = None

    def summary(self, max_notes: int | None = None) -> dict[str, Any]:
        """Small JSON-able facts about the run (CLI output, XCom): never rows."""
        return {
            "batch_id": self.batch_id,
            "batch_path": self.batch_path,
            "from_offset": self.from_offset,
            "to_offset": self.to_offset,
            "events": self.events,
            "snapshot_rows": self.snapshot_rows,
            "tables": self.tables,
            "notes": self.notes[:max_notes],
            "committed": self.committed,
        }


def _plan_snapshots(
    ctx: SnapshotContext, mode: str, reason: str | None, tables: list[str], include: tuple[str, ...]
) -> list[str]:
    notes = []
    wanted = match_tables(include, tables) if include else tables
    if reason is not None and mode != "no_data":
        ctx.pending = [p for p in ctx.pending if p.origin == "adhoc"]
        ctx.add(wanted, "initial")
        ctx.initial_done = False
        notes.append(f"snapshot of {len(wanted)} table(s) scheduled: {reason}")
    elif mode == "always" and not ctx.pending:
        ctx.add(wanted, "initial")
        notes.append(f"snapshot.mode=always: snapshot of {len(wanted)} table(s) scheduled")
    return notes


def _plan_new_tables(
    ctx: SnapshotContext, mode: str, known: list[str] | None, tables: list[str], include: tuple[str, ...]
) -> list[str]:
    """Snapshot captured tables that were not captured at the last commit.

    A table can join the captured set between runs or inside a window (a new partition, a table
    created or renamed into ``table.include.list``, a filtered publication extended at the next
    start): its rows written before the log carried them are only reachable by a snapshot, which
    the window reconciliation keeps exact.  ``no_data`` means stream only, as Debezium does.
    """
    if known is None or mode == "no_data":
        return []
    pending = {p.table for p in ctx.pending}
    new = [t for t in tables if t not in set(known) and t not in pending]
    new = match_tables(include, new) if include else new
    if not new:
        return []
    ctx.add(new, "initial")
    return [f"new captured table(s) {', '.join(new)}: snapshot scheduled"]


class Capture:
    """Runs captures and commits for one connector."""

    def __init__(self, source: ChangeSource, config: ConnectorConfig, store: StateStore) -> None:
        self.source, self.config, self.store = source, config, store
        self.name = config.state_name  # the partition's own state, lease and batches
        self.leases = Leases(store, self.name, config["lease.timeout.ms"] / 1000)
        self._blocking: list[TableSnapshot] = []  # this run's blocking snapshots (never stored)
        self._last_chunk: sm.ChunkMark | None = None
        #: the last commit's metrics (:func:`step_metrics.record_commit`), for the caller to export
        self.metrics: MetricsRecorder | None = None

    def _stored_data(self, name: str) -> dict[str, Any] | None:
        stored = self.store.load(name)
        return None if stored is None else dict(stored.data)

    def _offset_json(self, coord: Any) -> dict[str, Any]:
        """The source's JSON offset of a coordinate outside a window."""
        return self.source.offset_at(coord, None, None)

    def _wait_flushed(self, lsn: Any, timeout: float = 30.0) -> Any:
        """Poll the source's head until it has logged ``lsn`` (a chunk's closing watermark)."""
        deadline = time.monotonic() + timeout
        nudge = time.monotonic() + 0.1
        while True:
            flush = self.source.head()
            if flush >= lsn:
                return flush
            if time.monotonic() > nudge:  # nothing committed since the watermark: flush it ourselves
                self.source.flush_log()
                nudge = time.monotonic() + 1.0
            if time.monotonic() > deadline:
                raise ServerMisconfigured(
                    f"{self.source.kind}: the server's flushed log did not reach "
                    f"{self.source.describe_offset(self._offset_json(lsn))} within {timeout}s"
                )
            time.sleep(0.01)

    def _anchor(
        self, lease: Lease, stored: Any, start: Any, ctx: SnapshotContext, tables: list[str]
    ) -> tuple[dict[str, Any], int]:
        """Store a new start (no offset yet, or a lost one) before any batch is published.

        Without it a run killed after publishing its batch (or a batch applied whose commit failed)
        leaves snapshot rows positioned at a start the next run does not reuse: that run starts at a
        later "now", and a row deleted in between stays in silver from the orphaned batch.  With
        the start stored, every retry re-reads from it, so its batches cover the orphan's.
        """
        state = {
            "source": self.source.kind,
            "offset": self._offset_json(start),
            "snapshot": ctx.to_json(),
            "last_batch": None,
            "tables": tables,
            **self.source.extra_state(),
        }
        lease.check()
        state = fence_state(lease, stored.data if stored else None, state)
        version = self.store.compare_and_set(self.name, stored.version if stored else None, state)
        log.info(
            "stored the start offset %s (state version %d)",
            self.source.describe_offset(state["offset"]),
            version,
        )
        return state, version

    def _store_signals(
        self,
        lease: Lease,
        data: dict[str, Any],
        version: int | None,
        signals: list[SnapshotSignal],
        tables: list[str],
    ) -> tuple[dict[str, Any], int | None]:
        """Store the snapshots this run's signals queued (or stopped) before any batch is published.

        A run signal (the DAG run's or the CLI's ``--signal``) is in no log: were the run killed
        after publishing its batch, the next run would not know of it, while the orphaned batch
        holds its effects.  On Vitess that loses rows: the request raised the epoch and staged a
        truncate below the copy, and the next run, in the old epoch and without the copy, voids
        the keys the orphan copied (:mod:`airflow_cdc.sources.vitess.orphans`).  Stored, the signal
        is taken up again by every retry, as Debezium re-reads a signal whose offset it did not
        commit.  Only for sources that need it (``Capabilities.stores_run_signals``), and only once
        the source accepted the requests (a stored request it refuses would fail every later run).
        Nothing else of the state changes (what this run planned besides is stored with its
        commit, as before); blocking signals store nothing (read whole in this run alone).
        """
        stored = SnapshotContext.from_json(data.get("snapshot"))
        unchanged, before = stored.to_json(), {s.id for s in stored.pending}
        apply_signals(stored, signals, tables, [])
        self.source.check_snapshot_requests([s for s in stored.pending if s.id not in before])
        if stored.to_json() == unchanged:
            return data, version
        state = dict(data, snapshot=stored.to_json())
        lease.check()
        state = fence_state(lease, data or None, state)
        version = self.store.compare_and_set(self.name, version, state)
        log.info("stored the snapshots this run's signals asked for (state version %d)", version)
        return state, version

    def run(
        self,
        signals: list[dict[str, Any] | SnapshotSignal] | None = None,
        commit: bool = False,
        prepared: str | None = None,
    ) -> CaptureResult:
        """Capture one window (plus snapshot chunks) into a new staged batch; optionally commit it.

        :param prepared: a snapshot-parts plan directory (:mod:`airflow_cdc.core.snapshot_parts`)
            whose chunks to use instead of reading them; refused (logged) when stale, removed after.
        :raises LeaseHeld: another run of the connector is working (nothing was read or written).
        """
        parsed = [s if isinstance(s, SnapshotSignal) else parse_signal(s) for s in signals or []]
        started = time.monotonic()
        try:
            with self.leases.hold("capture") as lease, relaxed_gc():
                result = self._run(parsed, commit, lease, prepared)
        finally:
            snapshot_parts.discard(prepared)
        if result.metrics is not None:
            result.metrics.set("capture", "DurationMs", round((time.monotonic() - started) * 1000, 3))
            MetricsFile(self.config).save("capture", result.metrics, batch_id=result.batch_id)
        return result

    def _run(
        self, parsed: list[SnapshotSignal], commit: bool, lease: Lease, prepared: str | None = None
    ) -> CaptureResult:
        staging = self.config["staging.path"]
        clean_incomplete(staging, self.name, lease.token, grace=lease.timeout)
        stored = self.store.load(self.name)
        data = dict(stored.data) if stored else {}
        _check_same_source(self.name, data, self.source.kind)
        mode = self.config["snapshot.mode"]
        self.source.open()
        try:
            if stored is None:
                data = self.source.inherit_state(self._stored_data) or {}
            ctx = SnapshotContext.from_json(data.get("snapshot"))
            self.source.restore_state(data)
            self.source.heartbeat()
            from_lsn, reason = self.source.start_offset(data.get("offset"), mode == "when_needed")
            tables = self.source.tables()
            # a bad signal (unknown table or column, a condition outside the safe language) fails
            # here, before the start is anchored or anything else is stored
            refused = snapshot_blocking.refused(self.source)
            check_signals(parsed, tables, self.source.table_columns, self.config[RAW_SQL_PROPERTY], refused)
            guard = _guardrail(self.config, tables)
            table = signal_table(self.config)
            if table is not None and table not in tables:
                raise ConfigError(
                    f"property 'signal.data.collection': the signal table {table} is not captured; "
                    "include it (table.include.list, and the publication / CDC where the source needs it)"
                )
            include = self.config["snapshot.include.collection.list"]
            notes = _plan_snapshots(ctx, mode, reason, tables, include) + guard
            if reason is not None and data.get("offset") is not None:
                # a lost offset: what changed meanwhile is only in the re-snapshot, which cannot
                # show deletions -- so its completion voids everything captured before this epoch
                floor = self.source.position_floor().hex()
                for snap in ctx.pending:
                    if snap.origin == "initial":
                        snap.purge_below = floor
            planned_before = {s.id for s in ctx.pending}
            if reason is None:
                notes += _plan_new_tables(ctx, mode, data.get("tables"), tables, include)
            # a table new at the start may have been created in the unread log: no chunk of it is
            # read before this window said so (its stream events would come again as op=r)
            self._deferred = (
                {s.id for s in ctx.pending if s.id not in planned_before}
                if self.source.capabilities.logs_creation
                else set()
            )
            version = stored.version if stored else None
            if reason is not None:
                data, version = self._anchor(lease, stored, from_lsn, ctx, tables)
            self._blocking = []
            notes += apply_signals(ctx, parsed, tables, self._blocking)
            if parsed and self.source.capabilities.stores_run_signals:
                data, version = self._store_signals(lease, data, version, parsed, tables)
            writer = BatchWriter(
                staging,
                self.name,
                piece_rows=self.config["staging.piece.rows"],
                owner=lease.owner_json(),
                before_publish=lease.check,
                target=self.config["name"],
                partition=self.config.partition,
            )
            # chunks are encoded as they are read; the window then tells which to keep
            self.source.write_ahead(writer)
            try:
                result = self._capture(writer, ctx, from_lsn, data, version, notes, tables, prepared)
            except BaseException:
                writer.abort()
                raise
            finally:
                self.source.write_ahead(None)
            failpoint("after_batch_write")
            if commit:
                self.commit(Batch(result.batch_path))
                result.committed = True
            return result
        finally:
            self.source.close()

    def _capture(
        self,
        writer: BatchWriter,
        ctx: SnapshotContext,
        from_lsn: Any,
        data: dict[str, Any],
        version: int | None,
        notes: list[str],
        start_tables: list[str] | tuple[str, ...] = (),
        prepared: str | None = None,
    ) -> CaptureResult:
        started = time.time()
        opened = sm.SnapshotBefore.of(ctx)
        self._last_chunk = None
        streaming_off = (
            self.config["snapshot.mode"] == "initial_only" and ctx.initial_done and not ctx.pending
        )
        native = not self.source.capabilities.chunked_snapshots
        if native:
            self.source.plan_native_snapshots(ctx.pending)
        deferred = [s for s in ctx.pending if s.id in getattr(self, "_deferred", ())]
        ctx.pending = [s for s in ctx.pending if s not in deferred]
        order = ctx.pending
        whole, ctx.pending = snapshot_whole.split(self.source, ctx.pending, notes)
        read_whole = snapshot_whole.read(self.source, writer, whole, self.config["snapshot.max.rows.per.run"])
        chunks, groups = self._snapshot_chunks(ctx, from_lsn, version, prepared)
        ctx.pending = [s for s in order if s in whole or s in ctx.pending] + deferred
        flush = self.source.head()
        need = max(c.watermark.lsn_after for c in chunks) if chunks else None
        upto = max(flush, self._wait_flushed(need)) if need is not None and need > flush else flush
        tracker = ChunkTracker(chunks, self.source.reflects, groups) if chunks else None
        previous = data.get("offset")
        if streaming_off:
            notes.append("snapshot.mode=initial_only: snapshot complete, changes are not streamed")
            window = None
            end_lsn = upto
        else:
            log.info(
                "reading changes from %s up to %s (the source's position now; at most %d events)%s",
                self.source.describe_offset(previous or self._offset_json(from_lsn)),
                self.source.describe_offset(self._offset_json(upto)),
                self.config["run.max.events"],
                _chunks_note(chunks),
            )
            window = self.source.read_window(from_lsn, upto, writer, tracker, self.config["run.max.events"])
            end_lsn = window.end
        if native:
            snap_rows = self._finish_native(writer, ctx, window, end_lsn, notes)
        else:
            snap_rows = self._reconcile(writer, ctx, chunks, tracker, end_lsn, notes)
        snap_rows += snapshot_whole.book(ctx, read_whole, self._snapshot_counts, notes)
        born = self.source.created_in_log()
        if born:  # complete from the log: a snapshot planned when the run opened is not needed
            dropped = ctx.stop([p.table for p in ctx.pending if p.table in born and p.origin == "initial"])
            notes += [f"table {t} was created in the captured log: no snapshot" for t in dropped]
        if window is not None:
            before = {s.id for s in ctx.pending}
            signal_notes, seen = self._table_signals(writer, ctx)
            notes += signal_notes
            begun = [s for s in ctx.pending if s.id not in before]
            if begun and not native:
                read = sum(c.data.num_rows for c in chunks)
                window, end_lsn, more = self._signal_chunks(writer, ctx, begun, window, read, seen, notes)
                snap_rows += more
        # blocking snapshots (run signals, signal-table rows of this run's windows): read whole
        # at a position past the windows, so the batch holds the signal, its reads and no gap
        snap_rows += snapshot_blocking.read(self.source, writer, self._blocking, self._snapshot_counts, notes)
        if not any(p.origin == "initial" for p in ctx.pending):
            ctx.initial_done = True
        if end_lsn < from_lsn and previous is not None:
            # a window that ends below its start emitted nothing new (e.g. it only skipped what the
            # stored offset already covers): the offset must not move backward
            to_offset: dict[str, Any] = dict(previous)
        else:
            to_offset = self.source.offset_at(end_lsn, window, previous)
        captured = self.source.tables()  # may have grown inside the window
        known = data.get("tables")
        if known is not None:
            # tables captured at this run's start were planned then; one whose snapshot already
            # completed inside this run must not be scheduled again
            known = sorted(set(known) | set(start_tables) | born)
            include = self.config["snapshot.include.collection.list"]
            notes += _plan_new_tables(ctx, self.config["snapshot.mode"], known, captured, include)
        state_after = {
            "source": self.source.kind,
            "offset": to_offset,
            "snapshot": ctx.to_json(),
            "last_batch": writer.batch_id,
            "tables": captured,
        }
        state_after.update(self.source.extra_state())
        events = window.events if window else 0
        tables = dict(window.per_table) if window else {}
        manifest: dict[str, Any] = {
            "source": self.source.kind,
            "from_offset": data.get("offset") or self._offset_json(from_lsn),
            "to_offset": to_offset,
            "state_version": version,
            "state_after": state_after,
            "counts": {
                "events": events,
                "snapshot_rows": snap_rows,
                "messages": window.messages if window else 0,
            },
            "created_at": started,
            "capture_seconds": round(time.time() - started, 3),
            "notes": notes,
        }
        manifest.update((window.manifest_extra if window is not None else None) or {})
        metrics = self._metrics(writer, ctx, opened, window, started, captured, to_offset, snap_rows)
        manifest["metrics"] = metrics.to_json()
        path = writer.finish(manifest)
        for table, n in self._snapshot_counts.items():
            tables.setdefault(table, {})["r"] = n
        seconds = max(time.time() - started, 1e-9)
        log.info(
            "captured batch %s: %d events, %d snapshot rows in %.1fs (%.0f/s), %s -> %s; %s%s",
            writer.batch_id,
            events,
            snap_rows,
            seconds,
            (events + snap_rows) / seconds,
            self.source.describe_offset(manifest["from_offset"]),
            self.source.describe_offset(to_offset),
            "bounded by run.max.events: the source holds more, the next run goes on"
            if getattr(window, "bounded", False)
            else "caught up with the source's position at the run's start",
            f"; snapshots pending: {', '.join(s.table for s in ctx.pending)}" if ctx.pending else "",
        )
        return CaptureResult(
            writer.batch_id,
            str(path),
            data.get("offset"),
            to_offset,
            events,
            snap_rows,
            tables,
            notes,
            metrics=metrics,
        )

    def _metrics(
        self,
        writer: BatchWriter,
        ctx: SnapshotContext,
        before: sm.SnapshotBefore,
        window: Any,
        started: float,
        captured: list[str],
        to_offset: dict[str, Any],
        snap_rows: int,
    ) -> MetricsRecorder:
        """The run's snapshot and streaming metrics (:mod:`airflow_cdc.core.step_metrics`)."""
        rec = MetricsRecorder(self.config)
        for context in ("snapshot", "streaming"):
            rec.set(context, "CapturedTables", list(captured))
        rec.set("streaming", "SourceEventPosition", self.source.describe_offset(to_offset))
        rec.set("streaming", "LastTransactionId", to_offset.get("txId") or to_offset.get("gtids") or None)
        # the open parts are closed here, outside the guard below: closing one writes its last
        # rows, whose errors (a value the table cannot hold) are the capture's, not the metrics'
        for kind in ("stream", "snapshot"):
            writer.closed_parts(kind)
        try:
            rec.set("capture", "PositionTimeMs", sm.record_stream(rec, self.config, writer, window, started))
            sm.record_snapshot(rec, self.config, writer, ctx, before, self._last_chunk, snap_rows)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a capture
            log.warning("capture metrics incomplete: %s", e)
        return rec

    def _snapshot_chunks(
        self, ctx: SnapshotContext, start: Any, version: int | None, prepared: str | None
    ) -> tuple[list[ChunkRead], list[int] | None]:
        """This run's snapshot chunks: from a fitting snapshot-parts plan, or read here."""
        if not ctx.pending or not self.source.capabilities.chunked_snapshots:
            return [], None
        loaded = snapshot_parts.load_parts(self, prepared, ctx, start, version) if prepared else None
        if loaded is not None:
            return loaded.chunks, loaded.groups
        max_rows = self.config["snapshot.max.rows.per.run"]
        threads = self.config["snapshot.max.threads"] if self.source.capabilities.snapshot_readers else 1
        if threads > 1:
            chunk = self.config["incremental.snapshot.chunk.size"]
            span = int(chunk) if self.config.is_set("incremental.snapshot.chunk.size") else DEFAULT_SPAN
            return read_side_by_side(self, ctx.pending, max_rows, threads, span, self._chunk_size())
        return self.source.read_chunks(ctx.pending, max_rows, self._chunk_size()), None

    def _finish_native(
        self, writer: BatchWriter, ctx: SnapshotContext, window: Any, end: Any, notes: list[str]
    ) -> int:
        """Book the snapshots a natively snapshotting source completed inside its window."""
        self._snapshot_counts: dict[str, int] = dict(window.snapshot_rows) if window is not None else {}
        for snap in window.snapshots_done if window is not None else []:
            if snap.purge_below:
                self.source.write_purge(writer, snap.table, bytes.fromhex(snap.purge_below), end)
                notes.append(f"{snap.table}: rows captured before the offset was lost are void")
            ctx.finish(snap)
            notes.append(f"snapshot of {snap.table} complete: {snap.rows} rows")
        return sum(self._snapshot_counts.values())

    def _chunk_size(self) -> int | ChunkSizer:
        """``incremental.snapshot.chunk.size`` when set, else a size grown towards
        ``incremental.snapshot.chunk.target.ms`` per chunk (one sizer per run)."""
        target = self.config["incremental.snapshot.chunk.target.ms"]
        if self.config.is_set("incremental.snapshot.chunk.size") or not target:
            return int(self.config["incremental.snapshot.chunk.size"])
        if getattr(self, "_sizer", None) is None:
            self._sizer = ChunkSizer(int(self.config["incremental.snapshot.chunk.size"]), target / 1000)
        return self._sizer

    def _signal_chunks(
        self,
        writer: BatchWriter,
        ctx: SnapshotContext,
        started: list[TableSnapshot],
        window: Any,
        read: int,
        seen: int,
        notes: list[str],
    ) -> tuple[Any, Any, int]:
        """Start the snapshots a signal-table row asked for in this run, as Debezium starts them
        at the signal: read their first chunks now and a follow-on window from the first one's
        end that reconciles them (``(window, end, snapshot rows)``, the windows merged).  When the
        first window stopped at ``run.max.events``, the run's row budget is spent, or the source
        cannot continue a window in the same run, the chunks start with the next run."""
        end = window.end
        budget = self.config["snapshot.max.rows.per.run"] - read
        started = [s for s in started if not self.source.snapshot_whole(s.table)]  # next run's
        if getattr(window, "bounded", False) or budget <= 0 or not self.source.continue_window(window):
            notes.append("snapshot(s) started by the signal table are read from the next run on")
            return window, end, 0
        chunks = self.source.read_chunks(started, budget, self._chunk_size())
        if not chunks:
            return window, end, 0
        need = max(c.watermark.lsn_after for c in chunks)
        flush = self.source.head()
        upto = max(flush, self._wait_flushed(need)) if need > flush else flush
        tracker = ChunkTracker(chunks, self.source.reflects)
        second = self.source.read_window(end, upto, writer, tracker, self.config["run.max.events"])
        rows = self._reconcile(writer, ctx, chunks, tracker, second.end, notes, reset=False)
        notes += self._table_signals(writer, ctx, seen)[0]  # signals of the follow-on window
        return merge_windows(window, second), second.end, rows

    def _table_signals(
        self, writer: BatchWriter, ctx: SnapshotContext, seen: int = 0
    ) -> tuple[list[str], int]:
        """Apply the signals inserted into the signal table in this window (Debezium's ``source``
        channel), after the first ``seen`` rows; returns notes and the rows seen.

        A malformed signal is skipped with a warning (as Debezium does): failing the run would
        stop the pipeline at that row forever.
        """
        table = signal_table(self.config)
        if table is None:
            return [], 0
        notes: list[str] = []
        tables = self.source.tables()
        rows = writer.inserted_rows(table)
        for row in rows[seen:]:
            values = list(row.values())
            sig_id = values[0] if values else None
            try:
                if len(values) < 3:
                    raise ConfigError("the signal table needs the columns id, type, data (in that order)")
                sig = parse_signal({"type": values[1], "data": values[2] or "{}"})
                raw, refused = self.config[RAW_SQL_PROPERTY], snapshot_blocking.refused(self.source)
                check_signals([sig], tables, self.source.table_columns, raw, refused)
            except (ConfigError, ValueError) as e:
                log.warning("signal %r from %s ignored: %s", sig_id, table, e)
                notes.append(f"signal {sig_id!r} from {table} ignored: {e}")
                continue
            applied = apply_signals(ctx, [sig], tables, self._blocking)
            notes += [f"signal {sig_id!r} from {table}: {n}" for n in applied]
        return notes, len(rows)

    def _reconcile(
        self,
        writer: BatchWriter,
        ctx: SnapshotContext,
        chunks: list[ChunkRead],
        tracker: ChunkTracker | None,
        end_lsn: Any,
        notes: list[str],
        reset: bool = True,
    ) -> int:
        """Emit surviving chunk rows at the window end; chunks the window does not cover wait."""
        total = 0
        if reset:
            self._snapshot_counts = {}
        for i, chunk in enumerate(chunks):
            if chunk.watermark.lsn_after > end_lsn:
                notes.append(
                    f"{len(chunks) - i} snapshot chunk(s) deferred: the window ended before their watermark"
                )
                break
            assert tracker is not None
            rows = tracker.survivors(chunk)
            if rows.num_rows:
                self.source.write_snapshot_rows(writer, chunk, rows, end_lsn)
            for at, pre in tracker.pre_images(chunk):
                self.source.write_snapshot_rows(writer, chunk, pre, end_lsn, at)
            snap = chunk.snapshot
            self._last_chunk = sm.ChunkMark(
                snap.id, snap.table, snap.chunks + 1, snap.last_key, chunk.next_cursor(), snap.max_key
            )
            snap.last_key = chunk.next_cursor()
            snap.rows += rows.num_rows
            snap.chunks += 1
            total += rows.num_rows
            self._snapshot_counts[snap.table] = self._snapshot_counts.get(snap.table, 0) + rows.num_rows
            if chunk.last:
                if snap.purge_below:
                    self.source.write_purge(writer, snap.table, bytes.fromhex(snap.purge_below), end_lsn)
                    notes.append(f"{snap.table}: rows captured before the offset was lost are void")
                ctx.finish(snap)
                notes.append(f"snapshot of {snap.table} complete: {snap.rows} rows in {snap.chunks} chunk(s)")
        return total

    def commit(self, batch: Batch) -> int:
        """Store the batch's end state (compare-and-set), then acknowledge the source.

        Repeating a commit of the same batch is a no-op apart from re-acknowledging.
        :raises StateConflict: another run committed first; this batch must not be committed.
        :raises LeaseHeld: another run of the connector is working.
        :raises LeaseLost: this run's lease was taken over, or a newer lease holder committed.
        """
        started = time.monotonic()
        with self.leases.hold("commit") as lease:
            version = self._commit(batch, lease)
        try:
            self.metrics = sm.record_commit(self.config, batch.manifest, time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a commit
            log.warning("commit metrics not recorded: %s", e)
        return version

    def _commit(self, batch: Batch, lease: Lease) -> int:
        m = batch.manifest
        if batch.partition != self.config.partition:
            raise ConfigError(
                f"batch {batch.batch_id} was captured by partition {batch.partition!r} of connector "
                f"{self.config['name']!r}, not by {self.config.partition!r}: commit it with its own partition"
            )
        stored = self.store.load(self.name)
        if stored is not None and stored.data.get("last_batch") == batch.batch_id:
            version = stored.version
        else:
            lease.check()
            state = fence_state(lease, stored.data if stored else None, m["state_after"])
            version = self.store.compare_and_set(self.name, m["state_version"], state)
        failpoint("after_state_commit")
        self.source.acknowledge(m["to_offset"])
        expire_batches(
            self.config["staging.path"], self.name, batch.batch_id, self.config["staging.retention.batches"]
        )
        log.info(
            "committed batch %s at offset %s (state version %d)",
            batch.batch_id,
            self.source.describe_offset(m["to_offset"]),
            version,
        )
        return version


def _chunks_note(chunks: list) -> str:
    """``; snapshot: N chunk(s) of t1, t2`` for a run's start line (empty without chunks)."""
    if not chunks:
        return ""
    return f"; snapshot: {len(chunks)} chunk(s) of {', '.join(sorted({c.snapshot.table for c in chunks}))}"


def _guardrail(config: ConnectorConfig, tables: list[str]) -> list[str]:
    """Debezium's ``guardrail.collections.max``: more captured tables than allowed warns (a note
    for the batch) or fails the run before anything is stored.

    :raises ConfigError: over the limit with ``guardrail.collections.limit.action=fail``.
    """
    limit = config["guardrail.collections.max"]
    if not limit or len(tables) <= limit:
        return []
    message = (
        f"the connector captures {len(tables)} tables, more than guardrail.collections.max={limit} "
        f"(e.g. {', '.join(tables[:5])})"
    )
    if config["guardrail.collections.limit.action"] == "fail":
        raise ConfigError(message, hint="narrow table.include.list, or raise guardrail.collections.max")
    log.warning("%s; guardrail.collections.limit.action=warn: going on", message)
    return [message]


def _check_same_source(name: str, data: dict[str, Any], kind: str) -> None:
    """Refuse a stored state another kind of source wrote: its offset means nothing here (two
    pipelines given one state name, e.g. a copied config whose ``name`` was not changed).

    :raises ConfigError: naming the state and both kinds.
    """
    stored = data.get("source")
    if stored is not None and stored != kind:
        raise ConfigError(
            f"state {name!r} was written by a {stored} connector, and this pipeline is {kind}: "
            "its offset cannot be read here (nothing was changed)",
            hint="give this pipeline its own name (each pipeline keeps its own state), or point it "
            f"at the {stored} source that state belongs to",
        )
