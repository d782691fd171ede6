"""merge_windows: a follow-on window of the same run merged into one result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.windows import merge_windows


@dataclass
class Win:
    end_lsn: int
    events: int = 0
    transactions: int = 0
    messages: int = 0
    bounded: bool = False
    last_commit_lsn: int | None = None
    gtids: str = ""
    per_table: dict[str, dict[str, int]] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)


def test_counts_add_unset_fields_come_from_the_first():
    first = Win(100, 5, 2, 1, False, 90, "a:1-5", {"t": {"c": 3, "u": 2}}, {"schema_changes": [1], "x": 1})
    second = Win(200, 4, 1, 0, True, None, "a:1-9", {"t": {"u": 1}, "s": {"d": 3}}, {"schema_changes": [2]})
    merged = merge_windows(first, second)
    assert (merged.end_lsn, merged.events, merged.transactions, merged.messages) == (200, 9, 3, 1)
    assert merged.bounded is True and merged.gtids == "a:1-9"
    assert merged.last_commit_lsn == 90  # no commit in the follow-on window: the first's last one
    assert merged.per_table == {"t": {"c": 3, "u": 3}, "s": {"d": 3}}
    assert merged.manifest_extra == {"schema_changes": [1, 2], "x": 1}
    assert first.per_table == {"t": {"c": 3, "u": 2}}  # inputs untouched
    assert merge_windows(first, Win(300, last_commit_lsn=250)).last_commit_lsn == 250
