"""SQL Server LSNs, positions and offsets: Debezium's text form, byte order = typed order, JSON."""

from __future__ import annotations

import random

import pytest

from airflow_cdc.sources.sqlserver.offsets import (
    SqlServerLsn,
    SqlServerPosition,
    committed_lsns,
    window_offset,
)


def test_lsn_prints_and_parses_like_debezium() -> None:
    lsn = SqlServerLsn(bytes.fromhex("00000027000007580003"))
    assert str(lsn) == "00000027:00000758:0003"
    assert SqlServerLsn.parse("00000027:00000758:0003") == lsn
    assert SqlServerLsn.parse("0000002A:00000AC0:0007") == SqlServerLsn(bytes.fromhex("0000002a00000ac00007"))
    assert lsn.increment() == SqlServerLsn.parse("00000027:00000758:0004")
    assert SqlServerLsn.parse("00000027:ffffffff:ffff").increment() == SqlServerLsn.parse("00000028:00000000:0000")
    assert not SqlServerLsn.NULL.is_available and SqlServerLsn.of(None) == SqlServerLsn.NULL
    assert SqlServerLsn.of(bytearray(lsn.raw)) == lsn


@pytest.mark.parametrize("bad", ["", "27:758:3", "00000027:00000758", "0000002g:00000758:0003", None, 5])
def test_bad_lsn_text_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="not a SQL Server LSN"):
        SqlServerLsn.parse(bad)  # type: ignore[arg-type]


def test_lsn_needs_ten_bytes() -> None:
    with pytest.raises(ValueError, match="10 bytes"):
        SqlServerLsn(b"\x00" * 9)


def test_position_byte_order_equals_typed_order_and_round_trips() -> None:
    rng = random.Random(7)

    def lsn() -> SqlServerLsn:
        return SqlServerLsn(bytes(rng.choice([0, 1, 255]) for _ in range(10)))

    positions = [SqlServerPosition(rng.randrange(3), lsn(), lsn(), rng.randrange(4)) for _ in range(300)]
    assert sorted(positions) == sorted(positions, key=SqlServerPosition.sort_key)
    for p in positions:
        assert SqlServerPosition.from_sort_key(p.sort_key()) == p
        assert SqlServerPosition.from_json(p.to_json()) == p


def test_snapshot_rows_sit_after_the_window_and_before_later_transactions() -> None:
    end = SqlServerLsn.parse("00000027:00000758:0005")
    snap = SqlServerPosition.snapshot_at(0, end)
    last_in_window = SqlServerPosition(0, end, SqlServerLsn.parse("00000027:00000758:0004"), 2)
    next_txn = SqlServerPosition(0, end.increment(), SqlServerLsn.parse("00000027:00000758:0006"), 1)
    assert last_in_window.sort_key() < snap.sort_key() < next_txn.sort_key()


def test_window_offset_uses_debezium_keys() -> None:
    one = window_offset({"shop": SqlServerLsn.parse("00000027:00000758:0005")}, epoch=1)
    assert one["commit_lsn"] == "00000027:00000758:0005"
    assert one["change_lsn"] is None and one["event_serial_no"] is None
    two = window_offset({"a": SqlServerLsn.NULL, "b": SqlServerLsn.MAX}, epoch=0)
    assert "commit_lsn" not in two and set(two["databases"]) == {"a", "b"}
    assert committed_lsns(two) == {"a": SqlServerLsn.NULL, "b": SqlServerLsn.MAX}
    assert committed_lsns(None) == {}
