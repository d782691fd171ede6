"""Two consecutive change windows of one run as one (a follow-on window, e.g. the one that
reconciles the first chunks of a snapshot the signal table started)."""

from __future__ import annotations

import dataclasses
from typing import Any

_COUNTS = ("events", "transactions", "messages")


def merge_windows(first: Any, second: Any) -> Any:
    """``second`` (a source's window result dataclass) with ``first``'s counts added, per-table
    op counts summed, manifest extras combined, and any field ``second`` left unset (``None``,
    e.g. the last commit of a follow-on window without transactions) taken from ``first``."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(second):
        a, b = getattr(first, f.name, None), getattr(second, f.name)
        if f.name in _COUNTS and isinstance(a, int):
            changes[f.name] = a + b
        elif f.name == "per_table" and isinstance(a, dict):
            merged = {t: dict(ops) for t, ops in a.items()}
            for table, ops in b.items():
                row = merged.setdefault(table, {})
                for op, n in ops.items():
                    row[op] = row.get(op, 0) + n
            changes[f.name] = merged
        elif f.name == "manifest_extra" and isinstance(a, dict):
            extra = dict(a)
            for key, value in b.items():
                old = extra.get(key)
                extra[key] = old + value if isinstance(old, list) and isinstance(value, list) else value
            changes[f.name] = extra
        elif b is None and a is not None:
            changes[f.name] = a
    return dataclasses.replace(second, **changes)
