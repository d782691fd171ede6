"""Batches published but never committed ("orphans") and the rows only they hold.

A capture can publish its batch, have it applied, and die before committing.  The next run starts
again from the committed VGTID.  Its changes of keys the committed copy had already reached come
out identical (same positions), but a copy in progress makes vtgate drop, during catch-up, the
changes of keys beyond the *committed* last copied key: keys the orphan had copied or seen later
are only re-read by this run's (later) copy.  A key the orphan staged and that is deleted before
this run's copy reaches it would stay in silver for good.

So, when orphans exist, the window is read at least as far as the last orphan's end (then "this
run has no event at that position" is decidable) and, for every key with orphan events this run
does not reproduce, a delete is staged right above the newest such event -- below any later copy of
the key (copy rows carry the run's stamp) and below every change this run streams for it.  Applied
or not, the orphan then leaves no trace.

Keys are compared in their staged (encoded) form; the delete's key columns are written back as
they were staged, which needs key types staged as themselves (integers, character, binary,
DECIMAL text): tables keyed otherwise are skipped with a warning.

Tables without key columns have no key to void: the orphans only name them (:attr:`Orphans.keyless`),
and the run reads each of them whole again, in a keyless round above the orphans' (:mod:`.position`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.sources.vitess import offsets, position
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b

log = logging.getLogger(__name__)
_STAGED_AS_IS = (pa.types.is_integer, pa.types.is_string, pa.types.is_binary)


@dataclass
class Orphans:
    """Events of uncommitted batches: table -> key -> (positions, shard)."""

    end: b.VGtid | None = None
    from_offset: dict[str, Any] | None = None
    events: dict[str, dict[tuple, tuple[list[bytes], str]]] = field(default_factory=dict)
    batches: list[str] = field(default_factory=list)
    #: tables without key columns the batches staged events of, and their greatest keyless epoch
    #: and round
    keyless: set[str] = field(default_factory=set)
    keyless_epoch: int = 0
    keyless_round: int = 0


def load(staging: str, connector: str, last_batch: str | None) -> Orphans:
    """The batches published after ``last_batch`` (all of them when nothing was committed)."""
    out = Orphans()
    for batch in list_batches(staging, connector):
        if last_batch is not None and batch.batch_id <= last_batch:
            continue
        if out.from_offset is None:
            out.from_offset = batch.manifest.get("from_offset")
        out.batches.append(batch.batch_id)
        to = batch.manifest.get("to_offset") or {}
        if to.get("vgtid"):
            out.end = offsets.from_offset(to)
        out.keyless_round = max(out.keyless_round, int(to.get("keyless_round") or 0))
        out.keyless_epoch = max(out.keyless_epoch, position.stored_keyless_epoch(to))
        for table in batch.tables():
            if not batch.table_info(table)["key_columns"]:
                out.keyless.add(table)
                continue
            _read(batch, table, out.events.setdefault(table, {}))
    return out


def _read(batch: Batch, table: str, keys: dict[tuple, tuple[list[bytes], str]]) -> None:
    key_columns = batch.table_info(table)["key_columns"]
    for rb in batch.iter_events(table):
        for row in rb.select(["op", "before", "after", "source", "__position"]).to_pylist():
            image = row["before"] if row["op"] == "d" else row["after"]
            if image is None:
                continue  # a truncate
            key = tuple(image[k] for k in key_columns)
            positions, _ = keys.setdefault(key, ([], row["source"]["shard"]))
            positions.append(row["__position"])


def ghosts(
    orphans: Orphans, emitted: dict[str, set[bytes]], stamp: int
) -> dict[str, list[tuple[tuple, bytes]]]:
    """Per table, ``(key, position)`` of the deletes to stage: keys with orphan events this run
    did not reproduce, each right above the newest of those events (``stamp``: this run's)."""
    out: dict[str, list[tuple[tuple, bytes]]] = {}
    for table, keys in orphans.events.items():
        mine = emitted.get(table, set())
        for key, (positions, _shard) in keys.items():
            missing = [p for p in positions if p not in mine]
            if not missing:
                continue
            epoch, generation, count, _, _ = position.unpack(max(missing))
            at = position.sort_key(epoch, generation, count, position.SNAPSHOT_INDEX, stamp - 1)
            out.setdefault(table, []).append((key, at))
    return out


def keys_staged_as_is(fields: list[pa.Field], key: list[str]) -> bool:
    by_name = {f.name: f for f in fields}
    return all(k in by_name and any(t(by_name[k].type) for t in _STAGED_AS_IS) for k in key)
