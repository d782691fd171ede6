"""Stages the whole transactions of one Vitess window as they arrive (:mod:`.window`'s callback).

Changes go to the table's sink at their per-shard positions (:mod:`.position`); a primary key change
is Debezium's ``d`` + ``c``; a copy chunk's rows are ``op=r`` at the chunk's snapshot position with
the run's stamp.  A table's state and open sink are cached per FIELD description, so the hot path is
a few dict lookups per change.

Tables without key columns (:mod:`.whole`): their changes take the run's keyless round in their
positions (:mod:`.position`), and the changes a whole read of this run holds (each shard's up to
its copy's snapshot) are dropped.  Their images must be full: a partial one cannot be matched to a
row of the multiset.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.config import skipped_ops
from airflow_cdc.core.errors import SchemaError
from airflow_cdc.core.events import now_us
from airflow_cdc.core.failpoints import failpoint
from airflow_cdc.core.table_sink import TableSink
from airflow_cdc.sources.vitess import offsets, position
from airflow_cdc.sources.vitess.position import SNAPSHOT_INDEX as SNAP
from airflow_cdc.sources.vitess.position import shard_set
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.protocol import Table, Transaction
from airflow_cdc.sources.vitess.tables import TableState

if TYPE_CHECKING:
    from airflow_cdc.sources.vitess.source import VitessSource


class Stager:
    """Stages the transactions of one window as they arrive."""

    def __init__(
        self,
        source: VitessSource,
        writer: BatchWriter,
        generation: int,
        shards: frozenset[tuple[str, str]],
        watched: set[str],
    ) -> None:
        self.source, self.writer = source, writer
        self.stamp = now_us() // 1000
        self.watched = watched  # tables with events in uncommitted batches
        self.emitted: dict[str, set[bytes]] = {t: set() for t in watched}
        self.generation, self.shards = generation, shards
        self.skipped = skipped_ops(source.config)
        self.txn_meta = source.config["provide.transaction.metadata"]
        self.events = self.transactions = 0
        self.per_table: dict[str, dict[str, int]] = {}
        self.copied: dict[str, int] = {}
        self.chunks: dict[str, int] = {}
        self.ddl: list[str] = []
        self.last_seen: dict[tuple[str, str], b.ShardGtid] = {}
        self._targets: dict[str, tuple[Table, TableState | None, TableSink | None]] = {}

    def generation_of(self, vgtid: b.VGtid) -> int:
        """The generation of a VGTID seen now: raised when the shard set changed (a reshard)."""
        shards = shard_set(vgtid)
        if shards != self.shards:
            self.generation += 1
            self.shards = shards
        return self.generation

    def stage(self, txn: Transaction, tables: dict[str, Table]) -> None:
        """Stage one whole transaction (changes, or a copy chunk as ``op=r`` rows)."""
        if txn.vgtid is None:
            return
        generation = self.generation_of(txn.vgtid)
        for g in txn.vgtid.shard_gtids:
            self.last_seen[offsets.shard_key(g)] = g
        if txn.kind == "ddl":
            self.ddl.append(f"DDL on shard {txn.shard}: {txn.statement[:200]}")
            return
        if not txn.changes:
            return
        self.transactions += 1
        own = next(
            g.gtid for g in txn.vgtid.shard_gtids if (g.keyspace, g.shard) == (txn.keyspace, txn.shard)
        )
        count = position.transactions_in(own)
        copy = txn.kind == "copy"
        ts_us = now_us() if copy or not txn.timestamp else txn.timestamp * 1_000_000
        vgtid_text = json.dumps(offsets.vgtid_to_json(txn.vgtid))
        src = (ts_us // 1000, ts_us, ts_us * 1000, "true" if copy else "false", txn.shard, vgtid_text)
        if copy:
            self._copy_rows(
                txn, tables, position.sort_key(self.source.epoch, generation, count, SNAP, self.stamp), src
            )
        else:
            self._changes(txn, tables, generation, count, src)
        if self.transactions == 2:
            failpoint("mid_window")  # once per window, with part of it staged

    def _target(self, name: str, tables: dict[str, Table]) -> tuple[TableState, TableSink] | None:
        """The state and open sink of a captured table (None: not captured), cached per FIELD."""
        table = tables[name]
        cached = self._targets.get(name)
        if cached is None or cached[0] is not table or (cached[2] is not None and cached[2].closed):
            if not self.source.includes(name):
                cached = (table, None, None)
            else:
                state = self.source.table_state(table)
                cached = (table, state, state.sink(self.writer))
            self._targets[name] = cached
        return None if cached[1] is None or cached[2] is None else (cached[1], cached[2])

    def _copy_rows(self, txn: Transaction, tables: dict[str, Table], at: bytes, src: tuple) -> None:
        name = txn.changes[0].table
        target = self._target(name, tables)
        if target is None:
            return
        if target[0].keyless:
            # only a start without positions (an empty GTID, no table named to copy) has vttablet
            # copy every table (uvstreamer.go buildTablePlan); such a copy may resume by all columns
            raise SchemaError(
                f"table {name} has no key columns and vttablet's copy phase copied it inside the window",
                hint="start from positions (vitess.gtid 'current' or a VGTID with GTIDs): a table "
                "without key columns is then snapshotted whole in a copy of its own",
            )
        sink = target[1]
        for change in txn.changes:
            sink.append("r", None, _row(change.after), at, src)
        self.copied[name] = self.copied.get(name, 0) + len(txn.changes)
        self.chunks[name] = self.chunks.get(name, 0) + 1

    def _changes(
        self, txn: Transaction, tables: dict[str, Table], generation: int, count: int, src: tuple
    ) -> None:
        index, seen = 0, dict[str, int]()
        epoch, meta = self.source.epoch, None
        reads, shard = self.source.whole_reads, (txn.keyspace, txn.shard)
        for change in txn.changes:
            target = self._target(change.table, tables)
            if target is None:
                continue
            state, sink = target
            held = False  # by a whole read of this run: dropped (its index still taken, see below)
            if state.keyless:
                read = reads.get(change.table)
                held = read is not None and read.covers(shard, count)
                if change.partial and not held:
                    raise SchemaError(
                        f"table {change.table} has no key columns and shard {txn.shard} sent a partial row "
                        "image (binlog_row_image is not FULL): its rows cannot be mirrored",
                        hint="set binlog_row_image=FULL on the shards' MySQL, or name the table's key "
                        "columns in message.key.columns",
                    )
            elif change.partial:
                sink.expect_partial_images()
            ops = [(change.op, _row(change.before), _row(change.after))]
            if change.op == "u" and state.key_text(change.before or {}) != state.key_text(change.after or {}):
                ops = [("d", ops[0][1], None), ("c", ops[0][1], ops[0][2])]  # a key change: Debezium's d + c
            for op, before, after in ops:
                index += 1  # taken whatever is staged: the other changes' positions stay the same
                if op in self.skipped or held:
                    continue
                if state.keyless:
                    at = position.keyless_key(*self.source.keyless_round(), count, index)
                else:
                    at = position.sort_key(epoch, generation, count, index)
                if self.txn_meta:
                    seen[change.table] = seen.get(change.table, 0) + 1
                    meta = (src[-1], index, seen[change.table])
                sink.append(op, before, after, at, src, meta)
                if change.table in self.watched:
                    self.emitted[change.table].add(at)
                self.events += 1
                counts = self.per_table.setdefault(change.table, {})
                counts[op] = counts.get(op, 0) + 1


def _row(values: dict[str, Any] | None) -> tuple | None:
    """A decoded row as the sink's tuple: the decoder fills the dict in FIELD order."""
    return None if values is None else tuple(values.values())
