"""Debezium's offset-storage-per-task mode, mapped onto Airflow mapped tasks.

With ``vitess.offset.storage.per.task`` the keyspace's shards are dealt round-robin over
``tasks.max`` tasks (task ``i`` gets shards ``i, i + n, i + 2n ...`` in shard order), and each task
keeps its own offset under the key ``task<i>_<n>_<gen>`` (``gen`` =
``vitess.offset.storage.task.key.gen``).  When the task count changes, ``gen`` is raised and
``vitess.prev.num.tasks`` names the old count: a task whose key has no offset yet takes its
shards' positions from the previous generation's offsets, so every shard keeps its position.
Generation 0 is the single offset stored without the per-task mode.

Each task is a partition of the connector (:meth:`ConnectorConfig.for_partition`, key
``task<i>_<n>_<gen>``): captured, committed and resumed on its own, its batches applied to the
connector's tables.  Limits of the mode: a task's re-snapshot of a table it captured before cannot
void only its own shards' rows in the shared tables, so a lost VGTID, ``snapshot.mode`` ``always``
/ ``when_needed`` and ad hoc snapshots of captured tables are refused; a reshard of the keyspace
stops the tasks (raise the generation once the new shards serve).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
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


_TASK_KEY = re.compile(r"^task([0-9]+)_([0-9]+)_([0-9]+)$")


def parse_task_key(key: str | None) -> tuple[int, int, int]:
    """``(task, tasks, gen)`` of a task key.

    :raises ConfigError: not a ``task<i>_<n>_<gen>`` key.
    """
    m = _TASK_KEY.match(key or "")
    if m is None or int(m.group(1)) >= int(m.group(2)):
        raise ConfigError(
            f"{key!r} is not a task key task<i>_<tasks>_<gen> of vitess.offset.storage.per.task"
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def task_partitions(config: ConnectorConfig) -> list[ConnectorConfig]:
    """The connector's tasks as partitions (``tasks.max`` of the current generation), or the
    unpartitioned connector without ``vitess.offset.storage.per.task``."""
    if not config["vitess.offset.storage.per.task"]:
        return [config]
    tasks, gen = config["tasks.max"], config["vitess.offset.storage.task.key.gen"]
    return [config.for_partition(task_key(i, tasks, gen), {}) for i in range(tasks)]


def task_shards(shards: Sequence[str], task: int, tasks: int, keyspace: str, key: str) -> list[str]:
    """The shards dealt to ``task``.

    :raises ConfigError: more tasks than shards (the task would have none).
    """
    dealt = assign_shards(sorted(shards), tasks)
    if task >= len(dealt):
        raise ConfigError(
            f"property 'tasks.max': {tasks} tasks but keyspace {keyspace!r} has {len(shards)} shard(s), "
            f"so task {key} has none",
            hint="set tasks.max to at most the number of shards "
            "(and raise vitess.offset.storage.task.key.gen)",
        )
    return dealt[task]


def inherited_offset(
    load: Callable[[str], dict[str, Any] | None],
    name: str,
    keyspace: str,
    shards: Sequence[str],
    key: str,
    prev_tasks: int,
) -> dict[str, Any] | None:
    """The state a task without an offset of its own starts from: its shards' positions in the
    previous generation's stored states (see :func:`task_offset`), the highest epoch among them,
    every table they captured; None for a generation-1 task with nothing stored before it.

    :param load: the stored state data of a state name (``<name>.<key>``; ``name`` itself for the
        offset stored without the per-task mode), or None.
    :raises OffsetUnavailable: a previous task still has a snapshot running, or lacks shards, or
        (from generation 2 on) the previous generation stored nothing under ``prev_tasks``.
    """
    task, tasks, gen = parse_task_key(key)
    if gen <= 0:
        return None
    names = [name] if gen == 1 else []
    names += [f"{name}.{task_key(i, prev_tasks, gen - 1)}" for i in range(prev_tasks)]
    states = {n: s for n in names if (s := load(n)) is not None and s.get("offset") is not None}
    if not states and gen >= 2:  # only generation 1 may start a connector afresh
        raise OffsetUnavailable(
            f"task {key}: no stored offset of generation {gen - 1} with {prev_tasks} task(s)",
            hint="set vitess.prev.num.tasks to the task count generation "
            f"{gen - 1} really ran; a new connector starts at generation 1",
        )
    if not states:
        return None
    busy = [n for n, s in states.items() if (s.get("snapshot") or {}).get("pending")]
    if busy:
        raise OffsetUnavailable(
            f"task {key}: the previous generation's {', '.join(sorted(busy))} still has a snapshot running",
            hint="finish the snapshot with the previous tasks.max and generation, then raise the generation",
        )
    by_key = {n.removeprefix(f"{name}.") if n != name else name: s["offset"] for n, s in states.items()}
    offset = task_offset(by_key, keyspace, shards, task, tasks, gen, prev_tasks, legacy_key=name)
    if offset is None:
        return None
    offset["epoch"] = max(int(s["offset"].get("epoch", 0)) for s in states.values())
    offset["generation"] = max(int(s["offset"].get("generation", 0)) for s in states.values())
    first = next(iter(states.values()))
    return {
        "offset": offset,
        "snapshot": {**(first.get("snapshot") or {}), "pending": []},
        "tables": sorted({t for s in states.values() for t in s.get("tables") or ()}),
    }


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


def check_task_snapshots(new: Sequence[Any], key: str) -> None:
    """Refuse a task's re-snapshot of a table it captured before (see the module notes): only
    tables new to the connector may be copied, which leaves nothing behind to void.

    :raises ConfigError: an ad hoc snapshot (``origin == "adhoc"``) or a purging re-snapshot.
    """
    refused = [s.table for s in new if s.origin == "adhoc" or s.purge_below]
    if refused:
        raise ConfigError(
            f"task {key}: re-snapshot of {', '.join(sorted(refused))} refused with "
            "vitess.offset.storage.per.task: a task cannot void only its own shards' rows of a shared table",
            hint="run ad hoc snapshots without offset storage per task (one task reads every shard)",
        )
