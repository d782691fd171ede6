"""Offset storage per task: shard assignment and the migration of positions across generations."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import ConfigError, OffsetUnavailable
from airflow_cdc.sources.vitess import offsets, tasks

SHARDS = ["-40", "40-80", "80-c0", "c0-"]


def _offset(*pairs):
    return {"vgtid": [{"keyspace": "ks", "shard": s, "gtid": g} for s, g in pairs]}


def test_round_robin_like_debezium():
    assert tasks.assign_shards(SHARDS, 2) == [["-40", "80-c0"], ["40-80", "c0-"]]
    assert tasks.assign_shards(SHARDS, 4) == [["-40"], ["40-80"], ["80-c0"], ["c0-"]]
    assert tasks.assign_shards(SHARDS[:1], 3) == [["-40"]]
    with pytest.raises(ConfigError):
        tasks.assign_shards(SHARDS, 0)


def test_two_to_four_tasks_keeps_every_shard_position():
    stored = {
        "task0_2_1": _offset(("-40", "u:1-5"), ("80-c0", "w:1-7")),
        "task1_2_1": _offset(("40-80", "v:1-6"), ("c0-", "x:1-8")),
    }
    got = [tasks.task_offset(stored, "ks", SHARDS, i, 4, 2, 2) for i in range(4)]
    assert [offsets.from_offset(o).shard_gtids[0].gtid for o in got] == ["u:1-5", "v:1-6", "w:1-7", "x:1-8"]
    stored["task2_4_2"] = _offset(("80-c0", "w:1-9"))
    assert tasks.task_offset(stored, "ks", SHARDS, 2, 4, 2, 2) == stored["task2_4_2"]


def test_legacy_single_offset_to_generation_one():
    stored = {"legacy": _offset(*[(s, f"g{i}:1-{i + 1}") for i, s in enumerate(SHARDS)])}
    got = tasks.task_offset(stored, "ks", SHARDS, 1, 2, 1, 1, legacy_key="legacy")
    assert [(g.shard, g.gtid) for g in offsets.from_offset(got).shard_gtids] == [
        ("40-80", "g1:1-2"),
        ("c0-", "g3:1-4"),
    ]
    assert tasks.task_offset({}, "ks", SHARDS, 0, 2, 1, 1, legacy_key="legacy") is None


def test_wrong_previous_task_count_is_an_error():
    stored = {"task0_2_1": _offset(("-40", "u:1-5"), ("80-c0", "w:1-7"))}
    with pytest.raises(OffsetUnavailable, match="40-80"):
        tasks.task_offset(stored, "ks", SHARDS, 1, 4, 2, 2)


def test_task_keys_and_partitions():
    from airflow_cdc.sources.vitess.config import vitess_config

    assert tasks.parse_task_key("task1_4_2") == (1, 4, 2)
    for bad in (None, "task4_4_2", "task1_4", "x1_4_2", "task-1_4_2"):
        with pytest.raises(ConfigError, match="not a task key"):
            tasks.parse_task_key(bad)
    base = {"name": "vt", "connector": "vitess", "staging.path": "/tmp/x", "vitess.keyspace": "ks"}
    assert [p.partition for p in tasks.task_partitions(vitess_config(base))] == [None]
    per_task = {**base, "vitess.offset.storage.per.task": "true", "tasks.max": 3,
                "vitess.offset.storage.task.key.gen": 2, "vitess.prev.num.tasks": 2}  # fmt: skip
    parts = tasks.task_partitions(vitess_config(per_task))
    assert [p.state_name for p in parts] == ["vt.task0_3_2", "vt.task1_3_2", "vt.task2_3_2"]
    assert all(p["name"] == "vt" for p in parts)  # the connector's tables and Assets
    with pytest.raises(ConfigError, match="has none"):
        tasks.task_shards(SHARDS[:2], 2, 3, "ks", "task2_3_2")
    assert tasks.task_shards(list(reversed(SHARDS)), 1, 2, "ks", "task1_2_1") == ["40-80", "c0-"]


def _state(*pairs, epoch=0, pending=(), tables=("ks.t",)):
    offset = {**_offset(*pairs), "epoch": epoch, "generation": 0}
    return {"offset": offset, "snapshot": {"pending": list(pending), "initial_done": True}, "tables": list(tables)}


def test_inherited_offset_takes_positions_epoch_and_tables_of_the_previous_generation():
    stored = {
        "vt.task0_2_1": _state(("-40", "u:1-5"), ("80-c0", "w:1-7"), epoch=1, tables=("ks.a",)),
        "vt.task1_2_1": _state(("40-80", "v:1-6"), ("c0-", "x:1-8"), epoch=3, tables=("ks.b",)),
    }
    got = tasks.inherited_offset(stored.get, "vt", "ks", SHARDS, "task0_1_2", 2)
    assert [g["shard"] for g in got["offset"]["vgtid"]] == SHARDS
    assert got["offset"]["epoch"] == 3 and got["tables"] == ["ks.a", "ks.b"]
    assert got["snapshot"] == {"pending": [], "initial_done": True}
    legacy = {"vt": _state(*[(s, f"g:1-{i + 1}") for i, s in enumerate(SHARDS)], epoch=2)}
    first = tasks.inherited_offset(legacy.get, "vt", "ks", SHARDS, "task1_2_1", 1)
    assert [g["shard"] for g in first["offset"]["vgtid"]] == ["40-80", "c0-"] and first["offset"]["epoch"] == 2
    assert tasks.inherited_offset({}.get, "vt", "ks", SHARDS, "task0_2_1", 1) is None  # a new connector
    with pytest.raises(OffsetUnavailable, match="no stored offset of generation 1 with 3 task"):
        tasks.inherited_offset(stored.get, "vt", "ks", SHARDS, "task0_1_2", 3)
    stored["vt.task1_2_1"]["snapshot"]["pending"] = [{"table": "ks.b"}]
    with pytest.raises(OffsetUnavailable, match="vt.task1_2_1 still has a snapshot running"):
        tasks.inherited_offset(stored.get, "vt", "ks", SHARDS, "task0_1_2", 2)


def test_a_task_refuses_re_snapshots_of_captured_tables():
    from airflow_cdc.core.snapshot import TableSnapshot

    new = TableSnapshot(table="ks.new", origin="initial")
    tasks.check_task_snapshots([new], "task0_2_1")  # a table new to the connector: copied as usual
    for refused in (TableSnapshot(table="ks.t", origin="adhoc"), TableSnapshot(table="ks.t", origin="initial", purge_below="00")):
        with pytest.raises(ConfigError, match="re-snapshot of ks.t refused"):
            tasks.check_task_snapshots([new, refused], "task0_2_1")
