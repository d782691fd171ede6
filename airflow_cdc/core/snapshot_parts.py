"""Snapshot parts: one run's snapshot chunks read in parallel by several workers, loaded in key order.

A capture run reads at most ``snapshot.max.rows.per.run`` snapshot rows, chunk by chunk; the row
conversion is the slow part.  With parts, three steps share that work (Airflow: ``plan_snapshot``,
mapped ``read_snapshot_part`` tasks, then ``capture``):

1. :func:`plan_parts` takes the first pending table snapshot at its *committed* cursor and splits
   the next ``max.rows.per.run`` rows into N consecutive key ranges (boundaries by an index-ordered
   ``OFFSET`` query of the source).  It writes ``plan.json`` under the staging directory and
   changes no state.
2. :func:`read_part` reads one range as ordinary watermarked chunks (the source's own
   ``read_chunks`` on a copy of the table snapshot bounded to the range) and stores them: Parquet
   for the rows, JSON for the watermark and metadata.  Parts run in parallel.
3. :meth:`Capture.run` with ``prepared=<plan dir>`` calls :func:`load_parts`, which checks the plan
   against the state the run starts from and returns the chunks in key order *instead of* reading
   them; the run then goes on as always (window up to the chunks' highest closing watermark,
   reconciliation, cursor advance, one batch, commit).

Why this is exact.  A connector's runs never overlap and the committed state only changes at
commit, so when the state version the plan saw is still the stored one, every part was read after
the commit that the run starts from: each chunk reflects every transaction below the window start,
as chunks read by the run itself do.  Chunks read by different parts are reconciled per reader
(:class:`ChunkTracker` groups), since the order of their snapshots across readers is unknown.

Stale plans (another run committed since, the snapshot was restarted or stopped, a part read
before the window start) are refused: the run discards them with a log line and reads its chunks
itself.  The plan directory is removed once the run loaded or refused it.  Memory stays bounded:
each part reads at most its share of ``max.rows.per.run`` rows.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from airflow_cdc.core.batch import safe_name
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.filemodes import make_private
from airflow_cdc.core.snapshot import ChunkRead, SnapshotContext, TableSnapshot
from airflow_cdc.core.source import ChangeSource
from airflow_cdc.core.storage import Location, open_location

if TYPE_CHECKING:
    from airflow_cdc.core.capture import Capture

log = logging.getLogger(__name__)


def parts_root(capture: Capture) -> Location:
    """``<staging>/<state name>/snapshot_parts``: where a connector partition's plans live (a
    local directory or an object-store prefix, like the batches)."""
    return open_location(capture.config["staging.path"]) / safe_name(capture.name) / "snapshot_parts"


def _check_chunked(capture: Capture) -> None:
    """:raises ConfigError: the source cannot read a snapshot in key ranges."""
    source = capture.source
    why = None
    if not source.capabilities.chunked_snapshots:
        why = f"{source.kind} snapshots natively inside its window"
    elif type(source).snapshot_bounds is ChangeSource.snapshot_bounds:
        why = f"{source.kind} reads its snapshot chunks without an upper key bound"
    if why is not None:
        raise ConfigError(
            f"connector {capture.config['name']!r}: snapshot parts (option 'airflow.snapshot_tasks') "
            f"need a source that reads snapshot chunks in key ranges; {why} (set snapshot_tasks: 0)"
        )


def _write_json(where: Location, data: dict[str, Any]) -> None:
    """Replace a JSON file atomically: by rename locally; an object store's PUT is atomic."""
    if not where.local:
        where.write_bytes(json.dumps(data).encode())
        return
    path = where.as_path()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    make_private(tmp)
    tmp.replace(path)


def _remove(where: Location) -> None:
    if where.local:
        shutil.rmtree(where.path, ignore_errors=True)
    else:
        where.delete_tree()


def plan_parts(capture: Capture, parts: int) -> list[dict[str, Any]]:
    """Split the next run's snapshot rows into ``parts`` key ranges; returns one small dict per part.

    Returns ``[]`` (nothing to prepare) without a stored state, without a pending snapshot, or when
    the first pending snapshot's table is not captured or has no rows left.  Earlier plans of this
    partition are removed.  Repeating it makes a new plan; no state is written.

    :raises ConfigError: ``parts`` < 1, or a source that snapshots natively.
    """
    if parts < 1:
        raise ConfigError(f"snapshot parts: expected at least 1 part, got {parts}")
    _check_chunked(capture)
    root = parts_root(capture)
    _remove(root)
    stored = capture.store.load(capture.name)
    ctx = SnapshotContext.from_json(stored.data.get("snapshot") if stored else None)
    if stored is None or not ctx.pending:
        log.info("snapshot parts: no pending snapshot in the committed state; nothing to prepare")
        return []
    snap = ctx.pending[0]
    per_part = math.ceil(capture.config["snapshot.max.rows.per.run"] / parts)
    capture.source.open()
    try:
        if snap.table not in capture.source.tables():
            log.info("snapshot parts: %s is not captured; capture handles it", snap.table)
            return []
        if capture.source.snapshot_whole(snap.table):
            log.info("snapshot parts: %s has no key columns, capture reads it whole", snap.table)
            return []
        max_key, bounds = capture.source.snapshot_bounds(
            snap, [per_part * k - 1 for k in range(1, parts + 1)]
        )
    finally:
        capture.source.close()
    if not max_key:
        log.info("snapshot parts: %s has no rows left to read; capture handles it", snap.table)
        return []
    specs: list[dict[str, Any]] = []
    lower = snap.last_key
    for bound in [*bounds, None][:parts]:
        upper = max_key if bound is None else bound
        final = bound is None or bound == max_key
        specs.append(
            {"index": len(specs), "lower": lower, "upper": upper, "final": final, "budget": per_part}
        )
        if final:
            break
        lower = upper
    plan_dir = (root / uuid.uuid4().hex[:12]).make_dirs()
    plan = {
        "state_version": stored.version,
        "snapshot": snap.to_json(),
        "max_key": max_key,
        "chunk_size": capture.config["incremental.snapshot.chunk.size"],
        "parts": specs,
    }
    _write_json(plan_dir / "plan.json", plan)
    log.info(
        "snapshot parts: %s from cursor %s split into %d part(s) of up to %d rows (plan %s)",
        snap.table,
        snap.last_key,
        len(specs),
        per_part,
        plan_dir,
    )
    return [{"plan": plan_dir.url, "part": s["index"]} for s in specs]


def read_part(capture: Capture, plan_dir: str, index: int) -> dict[str, Any]:
    """Read part ``index`` of a plan as watermarked chunks and store them in the plan directory.

    Reading a part again replaces its files.  Returns small facts (rows, chunks, complete).
    """
    _check_chunked(capture)
    plan = json.loads((open_location(plan_dir) / "plan.json").read_text())
    spec = plan["parts"][index]
    snap = TableSnapshot.from_json({**plan["snapshot"], "rows": 0, "chunks": 0})
    snap.last_key, snap.max_key = spec["lower"], spec["upper"]
    out = open_location(plan_dir) / f"part-{index:04d}"
    _remove(out)
    out.make_dirs()
    capture.source.open()
    try:
        low = capture.source.head()  # every chunk's snapshot is taken after this coordinate
        chunks = capture.source.read_chunks([snap], spec["budget"], plan["chunk_size"])
    finally:
        capture.source.close()
    rows = 0
    for i, chunk in enumerate(chunks):
        data, meta = capture.source.chunk_to_files(chunk)
        file = out / f"chunk-{i:05d}.parquet"
        pq.write_table(data, file.path, filesystem=file.fs)
        if file.local:
            make_private(file.path)
        _write_json(out / f"chunk-{i:05d}.json", meta)
        rows += chunk.data.num_rows
    complete = bool(chunks) and chunks[-1].last
    done = {"low": int(low), "chunks": len(chunks), "rows": rows, "complete": complete}
    _write_json(out / "done.json", done)  # written last: the part is readable
    log.info(
        "snapshot part %d of %s: %d rows in %d chunk(s)%s",
        index,
        snap.table,
        rows,
        len(chunks),
        "" if complete else " (row budget reached before the range's end)",
    )
    return {"part": index, "rows": rows, "chunks": len(chunks), "complete": complete}


@dataclass
class PreparedChunks:
    """Chunks loaded from a plan, in key order, and the reader (group) of each."""

    chunks: list[ChunkRead]
    groups: list[int]


def _refusal(capture: Capture, plan: dict[str, Any], ctx: SnapshotContext, version: int | None) -> str | None:
    """Why a plan does not fit the state this run starts from (None: it fits)."""
    planned = TableSnapshot.from_json(plan["snapshot"])
    if planned.table not in capture.source.tables():
        return f"{planned.table} is not captured any more"
    if plan["state_version"] != version:
        return f"planned at state version {plan['state_version']}, the run starts from {version}"
    if not ctx.pending or ctx.pending[0].id != planned.id:
        return f"the snapshot of {planned.table} planned is no longer the first pending one"
    snap = ctx.pending[0]
    if snap.last_key != planned.last_key or snap.cursor_format != planned.cursor_format:
        return f"the cursor of {snap.table} moved since the plan"
    if snap.max_key not in (None, plan["max_key"]):
        return f"the key range of {snap.table} changed since the plan"
    return None


def load_parts(
    capture: Capture, plan_dir: str, ctx: SnapshotContext, start: Any, version: int | None
) -> PreparedChunks | None:
    """The chunks a plan's parts prepared, in key order, bound to the run's pending snapshot.

    Parts are taken in order up to the first one missing or cut short by its row budget; the
    table's last chunk is marked ``last`` only when the plan's final part read to ``max_key``.

    :returns: None when the plan does not fit (logged): the run reads its chunks itself.
    """
    path = open_location(plan_dir)
    try:
        plan = json.loads((path / "plan.json").read_text())
    except (OSError, ValueError) as e:
        log.warning("snapshot parts: plan %s unreadable (%s); reading snapshot chunks here", plan_dir, e)
        return None
    why = _refusal(capture, plan, ctx, version)
    if why is None:
        return _load_chunks(capture, path, plan, ctx.pending[0], start)
    log.warning("snapshot parts: stale plan %s refused (%s); reading snapshot chunks here", plan_dir, why)
    return None


def _load_chunks(
    capture: Capture, path: Location, plan: dict[str, Any], snap: TableSnapshot, start: Any
) -> PreparedChunks | None:
    out = PreparedChunks([], [])
    for spec in plan["parts"]:
        part = path / f"part-{spec['index']:04d}"
        if not (part / "done.json").exists():
            log.warning("snapshot parts: part %d of %s missing; later parts unused", spec["index"], path)
            break
        done = json.loads((part / "done.json").read_text())
        if done["low"] < start:
            log.warning(
                "snapshot parts: part %d read before the window start; plan %s refused", spec["index"], path
            )
            return None
        for i in range(done["chunks"]):
            meta = json.loads((part / f"chunk-{i:05d}.json").read_text())
            file = part / f"chunk-{i:05d}.parquet"
            chunk = capture.source.chunk_from_files(snap, pq.read_table(file.path, filesystem=file.fs), meta)
            misfit = capture.source.chunk_misfit(chunk)
            if misfit is not None:
                log.warning("snapshot parts: part %d: %s; plan %s refused", spec["index"], misfit, path)
                return None
            floor = capture.source.chunk_floor(chunk.watermark)
            if floor is not None and floor < start:
                log.warning(
                    "snapshot parts: a chunk of part %d sees less than the window start; plan %s refused",
                    spec["index"],
                    path,
                )
                return None
            chunk.last = False
            out.chunks.append(chunk)
            out.groups.append(spec["index"])
        if not done["complete"]:
            break
        if spec["final"] and out.chunks:
            out.chunks[-1].last = True
    if not out.chunks:
        return None
    if snap.max_key is None:
        snap.max_key = plan["max_key"]  # read by the plan, after the committed offset
    log.info("snapshot parts: %d chunk(s) of %s loaded from %s", len(out.chunks), snap.table, path)
    return out


def discard(plan_dir: str | None) -> None:
    """Remove a plan directory (consumed or refused); no-op when it is gone."""
    if plan_dir:
        _remove(open_location(plan_dir))
