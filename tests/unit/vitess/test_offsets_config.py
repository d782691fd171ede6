"""Vitess offsets (Debezium's vgtid JSON, GTID-set order) and configuration."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q

BASE = {"name": "v", "staging.path": "/tmp/x", "vitess.keyspace": "commerce"}


def test_gtid_set_cover():
    big = offsets.GtidSet(
        "MySQL56/AAAAAAAA-0000-0000-0000-000000000001:1-10:12-20,bbbbbbbb-0000-0000-0000-000000000002:1-3"
    )
    assert big.covers(offsets.GtidSet("MySQL56/aaaaaaaa-0000-0000-0000-000000000001:1-10"))
    assert big.covers(offsets.GtidSet("aaaaaaaa-0000-0000-0000-000000000001:13-15"))
    assert not big.covers(offsets.GtidSet("aaaaaaaa-0000-0000-0000-000000000001:1-11"))
    assert not big.covers(offsets.GtidSet("cccccccc-0000-0000-0000-000000000003:1"))
    with pytest.raises(ValueError):
        offsets.GtidSet("MySQL56/aaaa")


def test_vgtid_json_round_trip_with_table_p_ks():
    lastpk = q.QueryResult(fields=[q.Field(name="id", type=q.INT64)], rows=[q.Row(lengths=[2], values=b"42")])
    vgtid = b.VGtid(
        shard_gtids=[
            b.ShardGtid(
                keyspace="ks",
                shard="-80",
                gtid="MySQL56/u:1-5",
                table_p_ks=[b.TableLastPK(table_name="t", lastpk=lastpk)],
            ),
            b.ShardGtid(keyspace="ks", shard="80-", gtid="MySQL56/v:1-7"),
        ]
    )
    data = offsets.to_offset(vgtid)
    assert data["vgtid"][1] == {"keyspace": "ks", "shard": "80-", "gtid": "MySQL56/v:1-7"}
    assert data["vgtid"][0]["table_p_ks"][0]["table_name"] == "t"
    assert offsets.from_offset(data) == vgtid
    import json

    assert offsets.vgtid_from_json(json.dumps(data["vgtid"])) == vgtid
    assert offsets.copying(vgtid) and not offsets.copying(b.VGtid(shard_gtids=[vgtid.shard_gtids[1]]))
    for bad in (
        [],
        [{"keyspace": "ks"}],
        "not json",
        [{"keyspace": "k", "shard": "0", "gtid": "", "table_p_ks": [{"nope": 1}]}],
    ):
        with pytest.raises(ConfigError):
            offsets.vgtid_from_json(bad)


def test_reached_per_shard():
    target = offsets.vgtid_from_json([{"keyspace": "k", "shard": "0", "gtid": "u:1-5"}])
    assert offsets.reached(
        offsets.vgtid_from_json([{"keyspace": "k", "shard": "0", "gtid": "u:1-6"}]), target
    )
    assert not offsets.reached(
        offsets.vgtid_from_json([{"keyspace": "k", "shard": "0", "gtid": "u:1-4"}]), target
    )
    assert not offsets.reached(
        offsets.vgtid_from_json([{"keyspace": "k", "shard": "0", "gtid": "current"}]), target
    )
    resharded = offsets.vgtid_from_json([{"keyspace": "k", "shard": "-80", "gtid": "v:1-2"}])
    assert not offsets.reached(resharded, target)
    assert offsets.missing_targets(resharded, target) == [("k", "-80")]
    both = offsets.vgtid_from_json(
        [{"keyspace": "k", "shard": "0", "gtid": "u:1-5"}, {"keyspace": "k", "shard": "-80", "gtid": "v:1-2"}]
    )
    assert offsets.reached(resharded, both)


def test_config_names_and_errors():
    config = vitess_config({**BASE, "vitess.vtgate.host": "vtgate", "vitess.vtgate.port": 15999})
    assert (config["database.hostname"], config["database.port"]) == ("vtgate", 15999)
    assert (
        vitess_config(BASE)["database.port"] == 15991
        and vitess_config(BASE)["vitess.tablet.type"] == "master"
    )
    with pytest.raises(ConfigError, match="alias"):
        vitess_config({**BASE, "vitess.vtgate.host": "a", "database.hostname": "b"})
    with pytest.raises(ConfigError, match="vitess.shard"):
        vitess_config({**BASE, "vitess.gtid": "MySQL56/u:1-3"})
    with pytest.raises(ConfigError, match="vitess.keyspace"):
        vitess_config({"name": "v", "staging.path": "/x"})
    with pytest.raises(ConfigError, match="database.dbname"):
        vitess_config({**BASE, "database.dbname": "x"})
    with pytest.raises(ConfigError, match="vitess.tablet.type"):
        vitess_config({**BASE, "vitess.tablet.type": "BACKUP"})
    assert vitess_config({**BASE, "vitess.tablet.type": "REPLICA"})["vitess.tablet.type"] == "replica"


def test_offset_storage_per_task_settings():
    config = vitess_config(
        {**BASE, "tasks.max": 4, "vitess.offset.storage.per.task": True,
         "vitess.offset.storage.task.key.gen": 2, "vitess.prev.num.tasks": 2}
    )  # fmt: skip
    assert (config["tasks.max"], config["vitess.offset.storage.task.key.gen"], config["vitess.prev.num.tasks"]) == (4, 2, 2)
    with pytest.raises(ConfigError, match="task.key.gen"):
        vitess_config({**BASE, "tasks.max": 2, "vitess.offset.storage.per.task": True})
