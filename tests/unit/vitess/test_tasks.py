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
