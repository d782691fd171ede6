import random

import pytest

from airflow_cdc.sources.postgres.position import PgLsn, PgPosition, parse_pg_lsn


def test_lsn_text_round_trip():
    for text in ["0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"]:
        assert str(PgLsn.parse(text)) == text


@pytest.mark.parametrize("bad", ["", "16", "/1", "1/", "G/1", "123456789/0", None])
def test_lsn_rejects_garbage(bad):
    with pytest.raises((ValueError, TypeError)):
        parse_pg_lsn(bad)


def test_sort_key_order_equals_typed_order():
    rng = random.Random(7)
    positions = [
        PgPosition(
            rng.choice([0, 1, 7, 2**32 - 1]),
            rng.choice([0, 1, 255, 256, 2**32, 2**40 + 5, 2**64 - 1]),
            rng.randrange(0, 2**20),
        )
        for _ in range(500)
    ]
    assert sorted(positions) == sorted(positions, key=PgPosition.sort_key)
    for p in positions:
        assert PgPosition.from_sort_key(p.sort_key()) == p
        assert PgPosition.from_json(p.to_json()) == p


def test_commit_lsn_dominates_sequence():
    # a later transaction with a small sequence sorts after an earlier one with a large sequence
    assert PgPosition(0, 0x200, 1).sort_key() > PgPosition(0, 0x1FF, 10**9).sort_key()
    # text order would get this wrong: "9/0" > "10/0" as strings
    assert PgPosition(0, parse_pg_lsn("10/0"), 1) > PgPosition(0, parse_pg_lsn("9/0"), 1)


def test_epoch_dominates_lsn():
    # after a restore the log restarts lower: the new epoch keeps every new event after the old ones
    assert PgPosition(1, 0x10, 1).sort_key() > PgPosition(0, 2**64 - 1, 2**64 - 1).sort_key()
    assert len(PgPosition(3, 5, 7).sort_key()) == 20
