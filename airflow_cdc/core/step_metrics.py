"""The metrics of each step (capture, apply, commit), computed from what the step already has:
the capture's window result, snapshot context and staged parts (their Parquet footers), a batch's
manifest, the committed state.  See :mod:`airflow_cdc.core.metrics` for the names and tags.

Nothing here fails a step: a value that cannot be computed is left out, and a source that cannot
be reached for the retained log is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_cdc.core import retained as rl
from airflow_cdc.core.batch import _BATCH_ID, BatchWriter, batches_at
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.metrics import MetricsFile, MetricsRecorder
from airflow_cdc.core.snapshot import SnapshotContext

log = logging.getLogger(__name__)
_S, _T = "snapshot", "streaming"


@dataclass(frozen=True)
class SnapshotBefore:
    """The run's pending snapshots when it opened (what the run aborted, when it all started)."""

    started_at: float | None
    tables: frozenset[str]

    @classmethod
    def of(cls, ctx: SnapshotContext) -> SnapshotBefore:
        return cls(
            min((p.started_at for p in ctx.pending), default=None), frozenset(p.table for p in ctx.pending)
        )


@dataclass(frozen=True)
class ChunkMark:
    """The last chunk a run staged: its snapshot, number and key range (text values)."""

    snapshot_id: str
    table: str
    number: int
    after: list | None
    to: list | None
    table_to: list | None


def _column(where: Any, column: str, row_group: int | None = None) -> pa.ChunkedArray:
    """One (nested, dotted) column of a part, of one row group or all (staged parts keep no
    column statistics but the position's, so values are read; two int64 columns are cheap)."""
    part = pq.ParquetFile(where.path, filesystem=where.fs)
    data = (
        part.read(columns=[column]) if row_group is None else part.read_row_group(row_group, columns=[column])
    )
    out = data.column(0)
    while pa.types.is_struct(out.type):  # "source.ts_ms" comes back as a struct of that one field
        out = pc.struct_field(out, [0])
    return out


def _last_times(where: Any) -> tuple[int, int] | None:
    """(processing time, source time) in epoch ms of a part's last event (its rows are in order)."""
    groups = pq.ParquetFile(where.path, filesystem=where.fs).metadata.num_row_groups
    if not groups:
        return None
    processed, source = _column(where, "ts_ms", groups - 1), _column(where, "source.ts_ms", groups - 1)
    if not len(processed) or processed[-1].as_py() is None or source[-1].as_py() is None:
        return None
    return processed[-1].as_py(), source[-1].as_py()


def _last(parts: list) -> tuple[str, Any, Any] | None:
    """The part holding the last event (largest last position): (table, part, where)."""
    parts = [p for p in parts if p[1].last_position]
    return max(parts, key=lambda p: p[1].last_position) if parts else None


def _lag_statistics(rec: MetricsRecorder, parts: list) -> None:
    """``MilliSecondsBehindSource`` min/max/mean/P50/P95/P99 over every change event staged."""
    chunks: list[pa.Array] = []
    for _table, _part, where in parts:
        changes = pc.not_equal(_column(where, "op"), "r")
        lag = pc.subtract(_column(where, "ts_ms"), _column(where, "source.ts_ms")).filter(changes)
        chunks += [c for c in lag.chunks if len(c)]
    if not chunks:
        return
    values = pa.chunked_array(chunks)
    rec.set(_T, "MilliSecondsBehindSourceMinValue", pc.min(values).as_py())
    rec.set(_T, "MilliSecondsBehindSourceMaxValue", pc.max(values).as_py())
    rec.set(_T, "MilliSecondsBehindSourceAverageValue", int(pc.mean(values).as_py()))
    quantiles = pc.quantile(values, q=[0.5, 0.95, 0.99], interpolation="linear").to_pylist()
    for name, value in zip(("P50", "P95", "P99"), quantiles, strict=True):
        rec.set(_T, f"MilliSecondsBehindSource{name}", round(value, 3))


def record_stream(
    rec: MetricsRecorder, config: ConnectorConfig, writer: BatchWriter, window: Any, started: float
) -> float:
    """Streaming metrics of a capture; returns the batch's position time (epoch ms)."""
    now_ms = time.time() * 1000
    per_table = dict(getattr(window, "per_table", None) or {})
    events = sum(n for ops in per_table.values() for op, n in ops.items() if op != "r")
    for table, ops in per_table.items():
        rec.set(_T, "TotalNumberOfEventsSeen", sum(n for op, n in ops.items() if op != "r"), table)
        for op, name in (("c", "Create"), ("u", "Update"), ("d", "Delete")):
            rec.set(_T, f"TotalNumberOf{name}EventsSeen", ops.get(op, 0), table)
    rec.set(_T, "TotalNumberOfEventsSeen", getattr(window, "events", events) if window is not None else 0)
    for op, name in (("c", "Create"), ("u", "Update"), ("d", "Delete")):
        rec.set(_T, f"TotalNumberOf{name}EventsSeen", sum(ops.get(op, 0) for ops in per_table.values()))
    rec.set(_T, "NumberOfEventsFiltered", int(getattr(window, "filtered", 0) or 0))
    transactions = getattr(window, "transactions", None)
    rec.set(
        _T,
        "NumberOfCommittedTransactions",
        len(transactions) if isinstance(transactions, list) else transactions,
    )
    rec.set(_T, "Connected", 1)
    parts = writer.closed_parts("stream")
    last = _last(parts)
    source_ts = None
    if last is not None:
        table, part, where = last
        rec.set(_T, "LastEvent", f"{table} at position {part.last_position}")
        times = _last_times(where)
        if times is not None:
            processed, source_ts = times
            rec.set(_T, "MilliSecondsSinceLastEvent", max(0, int(now_ms - processed)))
            rec.set(_T, "MilliSecondsBehindSource", max(0, processed - source_ts))
        if config["statistics.metrics.enabled"]:
            _lag_statistics(rec, parts)
    if window is not None and getattr(window, "bounded", False) and source_ts is not None:
        return float(source_ts)  # the source stood at the end offset when that event was written
    return started * 1000  # the window read up to the head, which the source passed after the run began


def record_snapshot(
    rec: MetricsRecorder,
    config: ConnectorConfig,
    writer: BatchWriter,
    ctx: SnapshotContext,
    before: SnapshotBefore,
    mark: ChunkMark | None,
    rows: int,
) -> None:
    """Snapshot metrics after a capture (the snapshot spans runs: its state is the context's).

    A run without snapshot work repeats the last snapshot's values (Debezium keeps them until
    the connector restarts), from the previous capture's saved metrics.
    """
    now = time.time()
    if not before.tables and not ctx.pending and mark is None and not rows:
        previous = ((MetricsFile(config).load().get("capture") or {}).get("metrics") or {}).get(_S) or {}
        kept = {
            k: v for k, v in previous.items() if k not in ("CapturedTables", "MilliSecondsSinceLastEvent")
        }
        rec.merge_json({_S: kept})
        rec.set(_S, "TotalNumberOfEventsSeen", 0)
        if kept:
            return
    starts = [s for s in [before.started_at, *(p.started_at for p in ctx.pending)] if s is not None]
    start = min(starts) if starts else None
    done = [c for c in ctx.completed if start is not None and c.get("finished_at", 0) >= start]
    pending = {p.table for p in ctx.pending}
    finished = {c["table"] for c in done}
    aborted = before.tables - pending - finished
    rec.set(_S, "TotalTableCount", len(pending | finished))
    rec.set(_S, "RemainingTableCount", len(pending))
    rec.set(_S, "SnapshotRunning", int(bool(pending)))
    rec.set(_S, "SnapshotPaused", 0)
    rec.set(_S, "SnapshotPausedDurationInSeconds", 0)
    rec.set(_S, "SnapshotAborted", int(bool(aborted)))
    rec.set(_S, "SnapshotCompleted", int(not pending and bool(ctx.completed)))
    skipped = config["snapshot.mode"] in ("no_data", "never") and not ctx.completed and not pending
    rec.set(_S, "SnapshotSkipped", int(skipped))
    if start is not None:
        end = now if pending else max((c.get("finished_at", now) for c in done), default=now)
        rec.set(_S, "SnapshotDurationInSeconds", round(end - start, 3))
    for c in done:
        rec.set(_S, "RowsScanned", int(c.get("rows", 0)), c["table"])
    for p in ctx.pending:
        rec.set(_S, "RowsScanned", p.rows, p.table)
    rec.set(_S, "TotalNumberOfEventsSeen", rows)
    if mark is not None:
        rec.set(_S, "ChunkId", f"{mark.snapshot_id}-{mark.number}")
        rec.set(_S, "ChunkFrom", _key(mark.after))
        rec.set(_S, "ChunkTo", _key(mark.to))
        rec.set(_S, "TableTo", _key(mark.table_to))
    last = _last(writer.closed_parts("snapshot"))
    if last is not None:
        # rows of one window share its end position: the last chunk says which table came last
        shown = f"{mark.table} key ({_key(mark.to)})" if mark is not None else last[0]
        rec.set(_S, "LastEvent", f"{shown} at position {last[1].last_position}")
        times = _last_times(last[2])
        if times is not None:
            rec.set(_S, "MilliSecondsSinceLastEvent", max(0, int(now * 1000 - times[0])))


def _key(values: list | None) -> str:
    return "" if values is None else ",".join("" if v is None else str(v) for v in values)


def staged_ids(config: ConnectorConfig) -> list[str]:
    """Ids of the connector's staged batches (names only: no manifest is read)."""
    root = batches_at(config["staging.path"], config.state_name)
    return [i.base_name for i in root.children() if _BATCH_ID.match(i.base_name)]


def record_staging(rec: MetricsRecorder, config: ConnectorConfig, done: str | None) -> None:
    """``BatchesStaged`` and ``BatchesNotApplied`` (staged after ``done``, the newest batch both
    applied and committed or applied)."""
    try:
        ids = staged_ids(config)
    except Exception as e:  # noqa: BLE001 - metrics must never fail a step
        log.warning("staged batches not counted: %s", e)
        return
    rec.set("staging", "BatchesStaged", len(ids))
    rec.set("staging", "BatchesNotApplied", sum(1 for i in ids if done is None or i > done))


def position_time(manifest: dict[str, Any] | None) -> float | None:
    """The epoch ms at which the source stood at a batch's end offset (None: an older batch)."""
    return (((manifest or {}).get("metrics") or {}).get("capture") or {}).get("PositionTimeMs")


def record_source(
    rec: MetricsRecorder,
    config: ConnectorConfig,
    offset: dict[str, Any] | None,
    applied: dict[str, Any] | None,
    committed_time_ms: float | None,
) -> rl.Verdict:
    """The retained log (live, best effort), position age and the guard's verdict into ``rec``."""
    retained = None
    try:
        retained = rl.read_retained(config, offset, applied)
    except Exception as e:  # noqa: BLE001 - an unreachable source only loses these values
        log.warning("retained log of %s not read: %s", config.state_name, e)
    age = rl.age_ms(committed_time_ms)
    verdict = rl.evaluate(config, retained, age)
    rl.record(rec, retained, age, verdict)
    return verdict


def record_commit(
    config: ConnectorConfig, manifest: dict[str, Any], seconds: float, applied_newest: str | None = None
) -> MetricsRecorder:
    """Commit metrics, saved as the ``commit`` section: duration, silver lag, retained log, staging."""
    rec = MetricsRecorder(config)
    rec.set("commit", "DurationMs", round(seconds * 1000, 3))
    when = position_time(manifest)
    rec.set("silver", "LagMs", rl.age_ms(when))
    record_source(rec, config, manifest.get("to_offset"), manifest.get("to_offset"), when)
    if applied_newest is None:
        applied_newest = (MetricsFile(config).load().get("apply") or {}).get("batch_id")
    record_staging(rec, config, max(str(manifest.get("batch_id") or ""), applied_newest or "") or None)
    MetricsFile(config).save(
        "commit",
        rec,
        batch_id=manifest.get("batch_id"),
        offset=manifest.get("to_offset"),
        position_time_ms=when,
    )
    return rec


def record_apply(
    config: ConnectorConfig, manifests: Sequence[dict[str, Any]], seconds: float
) -> MetricsRecorder:
    """Apply metrics of the batches one apply step applied, saved as the ``apply`` section."""
    rec = MetricsRecorder(config)
    rec.set("apply", "DurationMs", round(seconds * 1000, 3))
    rec.set("apply", "BatchesApplied", len(manifests))
    counts = [m.get("counts") or {} for m in manifests]
    events = sum(int(c.get("events", 0)) + int(c.get("snapshot_rows", 0)) for c in counts)
    rec.set("apply", "EventsApplied", events)
    newest = max(manifests, key=lambda m: str(m.get("batch_id"))) if manifests else {}
    rec.set("silver", "LagMs", rl.age_ms(position_time(newest)))
    record_staging(rec, config, newest.get("batch_id"))
    MetricsFile(config).save(
        "apply",
        rec,
        batch_id=newest.get("batch_id"),
        offset=newest.get("to_offset"),
        position_time_ms=position_time(newest),
    )
    return rec
