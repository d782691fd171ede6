"""GTID sets of both flavours Vitess reports: parsing, ``covers``, ``reached``, transaction counts."""

from __future__ import annotations

import pytest

from airflow_cdc.sources.vitess import offsets, position
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def _vgtid(*gtids: str) -> b.VGtid:
    return b.VGtid(
        shard_gtids=[
            b.ShardGtid(keyspace="ks", shard=s, gtid=g) for s, g in zip(("-80", "80-"), gtids, strict=True)
        ]
    )


def test_mysql56_unchanged() -> None:
    s = offsets.GtidSet(f"MySQL56/{UUID.upper()}:1-5:7-9,{UUID[:-1]}0:3")
    assert s.flavour == "MySQL56"
    assert s.intervals == {UUID: [(1, 5), (7, 9)], UUID[:-1] + "0": [(3, 3)]}
    assert offsets.GtidSet(f"{UUID}:1-5").intervals == {UUID: [(1, 5)]}  # no flavour: MySQL56
    assert position.transactions_in(f"MySQL56/{UUID}:1-5:7-9") == 8
    assert offsets.GtidSet(f"{UUID}:1-9").covers(offsets.GtidSet(f"{UUID}:2-3:5"))
    assert not offsets.GtidSet(f"{UUID}:1-5:7-9").covers(offsets.GtidSet(f"{UUID}:6"))


def test_mariadb_domains_count_sequence_numbers() -> None:
    s = offsets.GtidSet("MariaDB/0-1-31,2-7-4")
    assert s.flavour == "MariaDB"
    assert s.intervals == {"mariadb:0": [(1, 31)], "mariadb:2": [(1, 4)]}
    assert position.transactions_in("MariaDB/0-1-31,2-7-4") == 35
    assert position.transactions_in("MariaDB/0-1-0") == 0
    # a domain named twice keeps its last entry (ParseMariadbGTIDSet)
    assert offsets.GtidSet("MariaDB/0-1-9,0-2-3").intervals == {"mariadb:0": [(1, 3)]}


def test_mariadb_order_ignores_the_server_id() -> None:
    """As ``MariadbGTIDSet.Contains``: per domain, sequence at least; the server id plays no part."""
    later, earlier = offsets.GtidSet("MariaDB/0-2-31"), offsets.GtidSet("MariaDB/0-1-30")
    assert later.covers(earlier) and not earlier.covers(later)
    assert later.covers(offsets.GtidSet("MariaDB/0-9-31"))
    assert not later.covers(offsets.GtidSet("MariaDB/0-2-31,1-1-1"))  # a domain it lacks
    assert offsets.GtidSet("MariaDB/0-2-31,1-1-1").covers(later)
    assert not offsets.GtidSet("MariaDB/1-1-5").covers(offsets.GtidSet("MariaDB/0-1-0"))
    assert later.covers(offsets.GtidSet("")) and later.covers(offsets.GtidSet("MariaDB/"))


def test_flavours_never_cover_each_other() -> None:
    assert not offsets.GtidSet(f"MySQL56/{UUID}:1-50").covers(offsets.GtidSet("MariaDB/0-1-3"))
    assert not offsets.GtidSet("MariaDB/0-1-50").covers(offsets.GtidSet(f"MySQL56/{UUID}:1-3"))


def test_reached_and_coordinates_over_mariadb_positions() -> None:
    old, new = _vgtid("MariaDB/0-1-10", "MariaDB/0-2-4"), _vgtid("MariaDB/0-1-11", "MariaDB/0-2-4")
    assert offsets.reached(new, old) and not offsets.reached(old, new)
    assert offsets.reached(new, new)
    assert position.VitessCoord(old) < position.VitessCoord(new)
    assert not position.VitessCoord(new) < position.VitessCoord(old)
    a = position.sort_key(0, 0, position.transactions_in("MariaDB/0-1-10"), 1)
    assert a < position.sort_key(0, 0, position.transactions_in("MariaDB/0-3-11"), 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("MariaDB/0-1", "is not a MariaDB GTID <domain>-<server>-<seq>"),
        ("MariaDB/0-1-x", "is not a MariaDB GTID"),
        ("MariaDB/a-1-2", "is not a MariaDB GTID"),
        ("MariaDB/-1-1-2", "is not a MariaDB GTID"),
        (f"MariaDB/{UUID}:1-5", "is not a MariaDB GTID"),
        ("MariaDB/0-2-31", None),
        (f"MySQL56/{UUID}", "has no transaction numbers"),
        (f"MySQL56/{UUID}:1-x", "bad interval"),
        (f"MySQL56/{UUID}:5-1", "bad interval"),
        (f"MySQL56/{UUID}:0-3", "bad interval"),
        ("MySQL56/0-2-31", "has no transaction numbers"),
        ("FilePos/binlog.000001:4", "unknown flavour 'FilePos'"),
    ],
)
def test_malformed_sets_raise_a_clear_error(text: str, message: str | None) -> None:
    if message is None:
        offsets.GtidSet(text)
        return
    with pytest.raises(ValueError, match="GTID set") as raised:
        offsets.GtidSet(text)
    assert message in str(raised.value) and repr(text) in str(raised.value)
