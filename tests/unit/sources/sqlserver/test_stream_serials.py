"""``event_serial_no`` as Debezium numbers it: a change position that repeats continues the count, so
a deferred update (delete + insert sharing one commit LSN and one seqval) gets two positions."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.sqlserver.offsets import SqlServerPosition
from airflow_cdc.sources.sqlserver.schema import CaptureInstance
from airflow_cdc.sources.sqlserver.stream import events, merge

CI = CaptureInstance("db", "dbo", "t", "dbo_t", 1, None, dt.datetime(2024, 1, 1))  # type: ignore[arg-type]


def lsn(n: int) -> bytes:
    return n.to_bytes(10, "big")


def row(commit: int, seqval: int, op: int, key: int) -> tuple:
    return (lsn(commit), lsn(seqval), op, b"\x01", key, f"v{key}")


def test_deferred_update_pair_is_numbered_one_then_two() -> None:
    rows = [row(9, 5, 2, 100), row(9, 5, 1, 1)]  # stored insert-first, as a reader may see them
    got = list(events(merge([(CI, sorted(rows, key=lambda r: (r[0], r[1], r[2])))])))
    assert [(e.op, e.event_serial_no) for e in got] == [("d", 1), ("c", 2)]
    first, second = (SqlServerPosition(0, e.commit_lsn, e.change_lsn, e.event_serial_no).sort_key() for e in got)
    assert first < second


def test_serials_restart_at_a_new_change_position_and_updates_count_two() -> None:
    rows = [row(9, 1, 2, 1), row(9, 2, 3, 2), row(9, 2, 4, 2), row(9, 3, 1, 3), row(9, 3, 2, 3),
            row(9, 4, 3, 4), row(9, 4, 4, 4), row(12, 4, 2, 5)]  # fmt: skip
    got = [(e.op, e.event_serial_no) for e in events((CI, r) for r in rows)]
    assert got == [("c", 1), ("u", 2), ("d", 1), ("c", 2), ("u", 2), ("c", 1)]


def test_merge_orders_a_deferred_pair_delete_first_whatever_the_stream_order() -> None:
    got = list(events(merge([(CI, [row(9, 5, 1, 1)]), (CI, [row(9, 5, 2, 1)])])))
    assert [(e.op, e.event_serial_no) for e in got] == [("d", 1), ("c", 2)]


def test_before_image_without_after_image_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        list(events([(CI, row(9, 2, 3, 2)), (CI, row(9, 3, 4, 2))]))
