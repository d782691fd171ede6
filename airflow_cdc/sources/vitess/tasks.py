"""Debezium's offset-storage-per-task mode, mapped onto Airflow mapped tasks.

With ``vitess.offset.storage.per.task`` the keyspace's shards are dealt round-robin over
``tasks.max`` tasks (task ``i`` gets shards ``i, i + n, i + 2n ...`` in shard order), and each task
keeps its own offset under the key ``task<i>_<n>_<gen>`` (``gen`` =
``vitess.offset.storage.task.key.gen``).  When the task count changes, ``gen`` is raised and
``vitess.prev.num.tasks`` names the old count: a task whose key has no offset yet takes its
shards' positions from the previous generation's offsets, so every shard keeps its position.
Generation 0 is the single offset stored without the per-task mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_cdc.core.errors import ConfigError, OffsetUnavailable
from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b


def assign_shards(shards: Sequence[str], tasks: int) -> list[list[str]]:
    """The shards of each task, round-robin in shard order (fewer tasks when there are fewer shards)."""
    if tasks < 1:
        raise ConfigError(f"property 'tasks.max': {tasks} is below 1")
    count = min(tasks, len(shards))
    return [list(shards[i::count]) for i in range(count)]


def task_key(task: int, tasks: int, gen: int) -> str:
    """The offset key of one task of a generation (Debezium's partition name)."""
    return f"task{task}_{tasks}_{gen}"


def task_offset(
    stored: Mapping[str, dict[str, Any]],
    keyspace: str,
    shards: Sequence[str],
    task: int,
    tasks: int,
    gen: int,
    prev_tasks: int,
    legacy_key: str = "",
) -> dict[str, Any] | None:
    """The offset task ``task`` starts from: its own, else its shards' positions in the previous
    generation's offsets (generation 0: the offset under ``legacy_key``), else None (no offset yet).

    :param stored: every stored offset by key.
    :raises OffsetUnavailable: the previous generation holds some of this task's shards but not all
        (``vitess.prev.num.tasks`` does not match the tasks that really ran).
    """
    own = stored.get(task_key(task, tasks, gen))
    if own is not None:
        return own
    if gen <= 0:
        return None
    if gen == 1 and legacy_key in stored:
        previous = [stored[legacy_key]]
    else:
        previous = [
            o for i in range(prev_tasks) if (o := stored.get(task_key(i, prev_tasks, gen - 1))) is not None
        ]
    if not previous:
        return None
    positions: dict[str, b.ShardGtid] = {}
    for offset in previous:
        for g in offsets.from_offset(offset).shard_gtids:
            if g.keyspace == keyspace:
                positions[g.shard] = g
    mine = assign_shards(shards, tasks)[task]
    found = [positions[s] for s in mine if s in positions]
    if len(found) != len(mine):
        missing = sorted(set(mine) - set(positions))
        raise OffsetUnavailable(
            f"the offsets of generation {gen - 1} ({prev_tasks} tasks) have no position for shard(s) "
            f"{', '.join(missing)} of task {task}",
            hint="set vitess.prev.num.tasks to the number of tasks the previous generation really ran",
        )
    return offsets.to_offset(b.VGtid(shard_gtids=found))
