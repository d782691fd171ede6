"""One capture run and its commit, independent of the source (SPEC §3 steps 2 and 4).

Capture reads the committed state, resolves the start offset, reads pending snapshot chunks,
streams the change window, reconciles the chunks, and publishes one immutable batch whose
manifest carries the state to commit.  Capture never changes the stored state or the source's
acknowledged position: re-running it from the same committed state yields an equivalent batch.
Commit compare-and-sets the state (so of two racing runs only one commits) and only then
acknowledges the source; a crash in between leaves the source behind the state, which the next
run tolerates by skipping what the state says is done.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_cdc.core.batch import Batch, BatchWriter, clean_incomplete, expire_batches
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ServerMisconfigured
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.position import format_pg_lsn
from airflow_cdc.core.signals import SnapshotSignal, apply_signals, parse_signal
from airflow_cdc.core.snapshot import ChunkRead, ChunkTracker, SnapshotContext, match_tables
from airflow_cdc.core.state import StateStore

log = logging.getLogger(__name__)


class ChangeSource(Protocol):
    """What a source supplies.  Contract: windows are read without consuming (the source keeps
    everything after the acknowledged position); ``acknowledge`` never moves backward; chunk
    watermarks tell exactly which windowed transactions a chunk already reflects; ``acknowledge``
    works whether or not the source is open."""

    kind: str

    def open(self) -> None: ...
    def close(self) -> None: ...
    def heartbeat(self) -> None: ...
    def tables(self) -> list[str]: ...
    def start_offset(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[int, str | None]: ...
    def head(self) -> tuple[int, int]: ...
    def read_chunks(self, pending: list, max_rows: int, chunk_size: int) -> list[ChunkRead]: ...
    def read_window(
        self, from_lsn: int, upto_lsn: int, writer: BatchWriter, tracker: ChunkTracker | None, max_events: int
    ) -> Any: ...
    def reflects(self, watermark: Any, txn: Any) -> bool: ...
    def write_snapshot_rows(
        self, writer: BatchWriter, chunk: ChunkRead, rows: Any, end_lsn: int, at: bytes | None = None
    ) -> None: ...
    def acknowledge(self, offset: dict[str, Any]) -> None: ...


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


class Capture:
    """Runs captures and commits for one connector."""

    def __init__(self, source: ChangeSource, config: ConnectorConfig, store: StateStore) -> None:
        self.source, self.config, self.store = source, config, store
        self.name = config["name"]

    def _offset_json(self, lsn: int) -> dict[str, Any]:
        """The JSON offset of ``lsn`` outside a window (the source's own form, else a PostgreSQL LSN)."""
        offset_at = getattr(self.source, "offset_at", None)
        return offset_at(lsn, None, None) if offset_at else {"lsn": format_pg_lsn(lsn)}

    def _wait_flushed(self, lsn: int, timeout: float = 10.0) -> int:
        """Poll the source's head until it has flushed ``lsn`` (a chunk's closing watermark)."""
        deadline = time.monotonic() + timeout
        while True:
            flush, _ = self.source.head()
            if flush >= lsn:
                return flush
            if time.monotonic() > deadline:
                raise ServerMisconfigured(
                    f"{self.source.kind}: the server's flushed log did not reach "
                    f"{self._offset_json(lsn)} within {timeout}s"
                )
            time.sleep(0.01)

    def run(
        self, signals: list[dict[str, Any] | SnapshotSignal] | None = None, commit: bool = False
    ) -> CaptureResult:
        """Capture one window (plus snapshot chunks) into a new staged batch; optionally commit it."""
        parsed = [s if isinstance(s, SnapshotSignal) else parse_signal(s) for s in signals or []]
        staging = self.config["staging.path"]
        clean_incomplete(staging, self.name)
        stored = self.store.load(self.name)
        data = dict(stored.data) if stored else {}
        ctx = SnapshotContext.from_json(data.get("snapshot"))
        mode = self.config["snapshot.mode"]
        self.source.open()
        try:
            restore = getattr(self.source, "restore_state", None)
            if restore is not None:  # sources keeping more than an offset (MySQL schema history)
                restore(data)
            self.source.heartbeat()
            from_lsn, reason = self.source.start_offset(data.get("offset"), mode == "when_needed")
            tables = self.source.tables()
            notes = _plan_snapshots(
                ctx, mode, reason, tables, self.config["snapshot.include.collection.list"]
            )
            notes += apply_signals(ctx, parsed, tables)
            writer = BatchWriter(staging, self.name, piece_rows=self.config["staging.piece.rows"])
            try:
                result = self._capture(writer, ctx, from_lsn, data, stored.version if stored else None, notes)
            except BaseException:
                writer.abort()
                raise
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
        from_lsn: int,
        data: dict[str, Any],
        version: int | None,
        notes: list[str],
    ) -> CaptureResult:
        started = time.time()
        streaming_off = (
            self.config["snapshot.mode"] == "initial_only" and ctx.initial_done and not ctx.pending
        )
        chunks = (
            self.source.read_chunks(
                ctx.pending,
                self.config["snapshot.max.rows.per.run"],
                self.config["incremental.snapshot.chunk.size"],
            )
            if ctx.pending
            else []
        )
        flush, _ = self.source.head()
        need = max((c.watermark.lsn_after for c in chunks), default=0)
        upto = max(flush, self._wait_flushed(need)) if need > flush else flush
        tracker = ChunkTracker(chunks, self.source.reflects) if chunks else None
        if streaming_off:
            notes.append("snapshot.mode=initial_only: snapshot complete, changes are not streamed")
            window = None
            end_lsn = upto
        else:
            window = self.source.read_window(from_lsn, upto, writer, tracker, self.config["run.max.events"])
            end_lsn = window.end_lsn
        snap_rows = self._reconcile(writer, ctx, chunks, tracker, end_lsn, notes)
        if not any(p.origin == "initial" for p in ctx.pending):
            ctx.initial_done = True
        offset_at = getattr(self.source, "offset_at", None)
        if offset_at is not None:  # source-specific offset (e.g. MySQL file/pos/GTID set)
            to_offset: dict[str, Any] = offset_at(end_lsn, window, data.get("offset"))
        else:
            to_offset = {"lsn": format_pg_lsn(end_lsn)}
            if window is not None and window.last_commit_lsn is not None:
                to_offset.update(
                    txId=window.last_xid,
                    last_commit_lsn=format_pg_lsn(window.last_commit_lsn),
                    ts_usec=window.last_commit_ts_us,
                )
            elif data.get("offset"):
                to_offset.update({k: v for k, v in data["offset"].items() if k != "lsn"})
        state_after = {
            "source": self.source.kind,
            "offset": to_offset,
            "snapshot": ctx.to_json(),
            "last_batch": writer.batch_id,
        }
        extra_state = getattr(self.source, "extra_state", None)
        if extra_state is not None:
            state_after.update(extra_state())
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
        manifest.update(getattr(window, "manifest_extra", None) or {})
        path = writer.finish(manifest)
        for table, n in self._snapshot_counts.items():
            tables.setdefault(table, {})["r"] = n
        log.info(
            "captured batch %s: %d events, %d snapshot rows, %s -> %s",
            writer.batch_id,
            events,
            snap_rows,
            manifest["from_offset"].get("lsn", manifest["from_offset"]),
            to_offset.get("lsn", to_offset),
        )
        return CaptureResult(
            writer.batch_id, str(path), data.get("offset"), to_offset, events, snap_rows, tables, notes
        )

    def _reconcile(
        self,
        writer: BatchWriter,
        ctx: SnapshotContext,
        chunks: list[ChunkRead],
        tracker: ChunkTracker | None,
        end_lsn: int,
        notes: list[str],
    ) -> int:
        """Emit surviving chunk rows at the window end; chunks the window does not cover wait."""
        total = 0
        self._snapshot_counts: dict[str, int] = {}
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
            snap.last_key = chunk.next_cursor()
            snap.rows += rows.num_rows
            snap.chunks += 1
            total += rows.num_rows
            self._snapshot_counts[snap.table] = self._snapshot_counts.get(snap.table, 0) + rows.num_rows
            if chunk.last:
                ctx.finish(snap)
                notes.append(f"snapshot of {snap.table} complete: {snap.rows} rows in {snap.chunks} chunk(s)")
        return total

    def commit(self, batch: Batch) -> int:
        """Store the batch's end state (compare-and-set), then acknowledge the source.

        Repeating a commit of the same batch is a no-op apart from re-acknowledging.
        :raises StateConflict: another run committed first; this batch must not be committed.
        """
        m = batch.manifest
        stored = self.store.load(self.name)
        if stored is not None and stored.data.get("last_batch") == batch.batch_id:
            version = stored.version
        else:
            version = self.store.compare_and_set(self.name, m["state_version"], m["state_after"])
        failpoint("after_state_commit")
        self.source.acknowledge(m["to_offset"])
        expire_batches(
            self.config["staging.path"], self.name, batch.batch_id, self.config["staging.retention.batches"]
        )
        log.info(
            "committed batch %s at offset %s (state version %d)",
            batch.batch_id,
            m["to_offset"].get("lsn", m["to_offset"]),
            version,
        )
        return version
