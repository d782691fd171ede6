import random

import pytest

from airflow_cdc.sources.mysql.position import MySqlPosition, binlog_file_number


def test_sort_key_order_equals_typed_order():
    rng = random.Random(11)
    positions = [
        MySqlPosition(
            rng.choice([0, 1, 2**32 - 1]),
            rng.choice([1, 2, 9, 10, 255, 256, 999999, 2**32 - 1]),
            rng.choice([4, 255, 256, 65536, 2**32 - 1]),
            rng.randrange(0, 2**20),
        )
        for _ in range(500)
    ]
    assert sorted(positions) == sorted(positions, key=MySqlPosition.sort_key)
    for p in positions:
        assert MySqlPosition.from_sort_key(p.sort_key()) == p
        assert MySqlPosition.from_json(p.to_json()) == p


def test_file_number_dominates_position():
    # a later file with a small position sorts after an earlier file with a large one
    assert MySqlPosition(0, 10, 4).sort_key() > MySqlPosition(0, 9, 10**9, 7).sort_key()
    assert MySqlPosition(0, 3, 100, 2) > MySqlPosition(0, 3, 100, 1)


def test_epoch_dominates_coordinates():
    # after a failover to a server with lower binlog numbers, new events still sort later
    assert MySqlPosition(1, 1, 4).sort_key() > MySqlPosition(0, 999999, 2**32 - 1, 9).sort_key()
    assert MySqlPosition.from_json({"file_no": 3, "pos": 4}) == MySqlPosition(0, 3, 4)


@pytest.mark.parametrize(
    "name,number", [("binlog.000001", 1), ("mysql-bin.000123", 123), ("a.b.1000000", 1000000)]
)
def test_binlog_file_number(name, number):
    assert binlog_file_number(name) == number


@pytest.mark.parametrize("bad", ["binlog", "binlog.", "binlog.abc", "", None])
def test_binlog_file_number_rejects_garbage(bad):
    with pytest.raises(ValueError):
        binlog_file_number(bad)


def test_rejects_out_of_range():
    with pytest.raises(ValueError):
        MySqlPosition(0, -1, 4)
    with pytest.raises(ValueError):
        MySqlPosition(0, 2**32, 4)
    with pytest.raises(ValueError):
        MySqlPosition(0, 1, 2**32)
