"""Reference applier (test oracle): replays staged batches into in-memory tables.

Keyed by the table's key columns, ordered by ``__position``: an event older than what a key
already reflects is ignored; deletes leave a tombstone with their position; truncate clears the
table (at its position); unavailable (unchanged-TOAST) columns keep the stored value -- on the
``c`` of a primary-key change (``__old_key`` set), the value the *old* key's row had when it
moved.  Deliberately simple and slow: it is the definition of "correct" the capture is checked
against.

Tables without key columns (:class:`KeylessModel`) are replayed batch by batch, in the order the
batches were published, each event in position order: events at or below the greatest position
already replayed for the table are skipped (a window captured again after a crash), a truncate
(also the reset a whole-table snapshot starts with) empties the table.  A ``multiset`` table is a
count per row image: ``c``/``r`` and an update's after image add one occurrence, ``d`` and an
update's before image remove one -- a removal of an image with no occurrence left is counted as
an *anomaly* (the log and the snapshot disagree) and ignored.  An ``append`` table keeps every
event's image in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.batch import Batch


def frozen(value: Any) -> Any:
    """A hashable form of a staged value (lists and structs become tuples)."""
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, frozen(v)) for k, v in value.items())
    return value


@dataclass
class KeylessModel:
    """One table without key columns (see the module notes)."""

    mode: str
    through: bytes | None = None
    counts: Counter = field(default_factory=Counter)
    images: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    log: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    anomalies: int = 0

    def apply_batch(self, events: list[tuple[bytes, int, dict[str, Any]]]) -> None:
        events.sort(key=lambda e: (e[0], e[1]))
        fresh = [e for e in events if self.through is None or e[0] > self.through]
        resets = [i for i, e in enumerate(fresh) if e[2]["op"] == "t"]
        if resets and self.mode == "multiset":  # the batch's events before its last truncate are void
            fresh = fresh[resets[-1] :]
        if events:
            self.through = max(self.through or b"", events[-1][0])
        for _, _, row in fresh:
            self._apply(row)

    def _apply(self, row: dict[str, Any]) -> None:
        op = row["op"]
        if op == "t":
            self.counts.clear()
            if self.mode != "multiset":
                self.log.append(("t", None))
            return
        if self.mode != "multiset":
            self.log.append((op, row["before"] if op == "d" else row["after"]))
            return
        if op in ("u", "d") and row["before"] is not None:
            self._add(row["before"], -1)
        if op in ("c", "u", "r"):
            self._add(row["after"], 1)

    def _add(self, image: dict[str, Any], n: int) -> None:
        key = frozen(image)
        if self.counts[key] + n < 0:
            self.anomalies += 1
            return
        self.counts[key] += n
        self.images[key] = dict(image)
        if not self.counts[key]:
            del self.counts[key]

    def rows(self) -> list[dict[str, Any]]:
        """Every occurrence, duplicates included."""
        return [dict(self.images[k]) for k, n in self.counts.items() for _ in range(n)]


class ReferenceApplier:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple[bytes, dict[str, Any] | None]]] = {}
        self.truncated_at: dict[str, bytes] = {}
        # the newest live row of every key, kept through its delete: a key change's c takes the
        # unsent values of the row that moved from there
        self.last_live: dict[str, dict[tuple, dict[str, Any]]] = {}
        self.events = 0
        self.keyless: dict[str, KeylessModel] = {}

    def apply_batches(self, batches: Iterable[Batch]) -> None:
        per_table: dict[str, list[tuple[bytes, int, dict[str, Any]]]] = {}
        keys: dict[str, list[str]] = {}
        order = 0
        for batch in batches:
            for table in batch.tables():
                info = batch.table_info(table)
                keys[table] = info["key_columns"]
                mine: list[tuple[bytes, int, dict[str, Any]]] = []
                for rb in batch.iter_events(table):
                    for row in rb.to_pylist():
                        order += 1
                        mine.append((row["__position"], order, row))
                if keys[table]:
                    per_table.setdefault(table, []).extend(mine)
                    continue
                model = self.keyless.setdefault(table, KeylessModel(info.get("keyless") or "append"))
                model.mode = info.get("keyless") or "append"
                self.events += len(mine)
                model.apply_batch(mine)
        for table, events in per_table.items():
            events.sort(key=lambda e: (e[0], e[1]))
            for pos, _, row in events:
                self._apply(table, keys[table], pos, row)

    def _apply(self, table: str, key_cols: list[str], pos: bytes, row: dict[str, Any]) -> None:
        self.events += 1
        rows = self.tables.setdefault(table, {})
        op = row["op"]
        if op == "t":
            rows.clear()
            self.truncated_at[table] = pos
            return
        image = row["after"] if op in ("c", "u", "r") else row["before"]
        key = tuple(image[k] for k in key_cols)
        if op == "u" and row["before"] is not None:
            old_key = tuple(row["before"][k] for k in key_cols)
            if old_key != key:
                self._put(rows, old_key, pos, None)
        if op == "d":
            self._put(rows, key, pos, None)
            return
        after = dict(row["after"])
        current = rows.get(key)
        live = self.last_live.setdefault(table, {})
        old_key = row.get("__old_key")
        if old_key is not None:  # the row moved here: its unsent values are the old key's
            source = live.get(tuple(old_key[k] for k in key_cols))
        else:
            source = current[1] if current else None
        for col in row.get("__unavailable") or []:
            after[col] = source[col] if source else None
        self._put(rows, key, pos, after)
        if rows[key][0] == pos:
            live[key] = after

    @staticmethod
    def _put(rows: dict, key: tuple, pos: bytes, value: dict[str, Any] | None) -> None:
        current = rows.get(key)
        if current is not None and current[0] > pos:
            return
        rows[key] = (pos, value)

    def rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        return {k: v for k, (_, v) in self.tables.get(table, {}).items() if v is not None}

    def multiset(self, table: str) -> list[dict[str, Any]]:
        """Every row of a keyless table replayed as a ``multiset``, duplicates included."""
        return self.keyless[table].rows() if table in self.keyless else []
