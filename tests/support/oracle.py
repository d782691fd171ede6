"""Reference applier (test oracle): replays staged batches into in-memory tables.

Keyed by the table's key columns, ordered by ``__position``: an event older than what a key
already reflects is ignored; deletes leave a tombstone with their position; truncate clears the
table (at its position); unavailable (unchanged-TOAST) columns keep the stored value.
Deliberately simple and slow: it is the definition of "correct" the capture is checked against.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_cdc.core.batch import Batch


class ReferenceApplier:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple[bytes, dict[str, Any] | None]]] = {}
        self.truncated_at: dict[str, bytes] = {}
        self.events = 0

    def apply_batches(self, batches: Iterable[Batch]) -> None:
        per_table: dict[str, list[tuple[bytes, int, dict[str, Any]]]] = {}
        keys: dict[str, list[str]] = {}
        order = 0
        for batch in batches:
            for table in batch.tables():
                keys[table] = batch.table_info(table)["key_columns"]
                for rb in batch.iter_events(table):
                    for row in rb.to_pylist():
                        order += 1
                        per_table.setdefault(table, []).append((row["__position"], order, row))
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
        for col in row.get("__unavailable") or []:
            after[col] = current[1][col] if current and current[1] else None
        self._put(rows, key, pos, after)

    @staticmethod
    def _put(rows: dict, key: tuple, pos: bytes, value: dict[str, Any] | None) -> None:
        current = rows.get(key)
        if current is not None and current[0] > pos:
            return
        rows[key] = (pos, value)

    def rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        return {k: v for k, (_, v) in self.tables.get(table, {}).items() if v is not None}
