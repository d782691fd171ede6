"""Reference applier (test oracle): replays staged batches into in-memory tables.

Keyed by the table's key columns, ordered by ``__position``: an event older than what a key
already reflects is ignored; deletes leave a tombstone with their position; truncate clears the
table (at its position); unavailable (unchanged-TOAST) columns keep the stored value -- on the
``c`` of a primary-key change (``__old_key`` set), the value the *old* key's row had when it
moved.  Deliberately simple and slow: it is the definition of "correct" the capture is checked
against.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_cdc.core.batch import Batch


class ReferenceApplier:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple[bytes, dict[str, Any] | None]]] = {}
        self.truncated_at: dict[str, bytes] = {}
        # the newest live row of every key, kept through its delete: a key change's c takes the
        # unsent values of the row that moved from there
        self.last_live: dict[str, dict[tuple, dict[str, Any]]] = {}
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
