"""Offset storage per task (``vitess.offset.storage.per.task``): the keyspace's shards dealt over
``tasks.max`` partitions, each with its own offset, copy phase and batches; a new generation (or
the first one after an unpartitioned connector) takes every shard's position from the previous
one's offsets, so nothing is captured twice or lost when the task count changes."""

from __future__ import annotations

import contextlib
import io
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_cdc import cli
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError, OffsetUnavailable
from airflow_cdc.core.pipeline import build_capture, build_config, build_store, partitions
from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.support.oracle import ReferenceApplier
from tests.support.pipeline import assert_rows_equal

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


@pytest.fixture
def sharded(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    for i in range(1, 41):
        vtgate.execute(keyspace, INSERT, order_values(i), key=i)
    return keyspace


def per_task(props: dict[str, Any], tasks: int, gen: int, prev: int) -> dict[str, Any]:
    return {
        **props,
        "vitess.offset.storage.per.task": True,
        "tasks.max": tasks,
        "vitess.offset.storage.task.key.gen": gen,
        "vitess.prev.num.tasks": prev,
    }


def cli_capture(tmp_path: Path, props: dict[str, Any]) -> dict[str | None, Any]:
    """``airflow-cdc capture --commit`` over every partition; the runs keyed by partition."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(props))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["capture", "--config", str(path), "--commit"]) == 0
    doc = json.loads(out.getvalue())
    return doc["partitions"] if "partitions" in doc else {None: doc}


def every_batch(props: dict[str, Any], state_names: list[str]) -> ReferenceApplier:
    oracle = ReferenceApplier()
    oracle.apply_batches([b for n in state_names for b in list_batches(props["staging.path"], n)])
    return oracle


class Writers:
    def __init__(self, vtgate: Any, ks: str) -> None:
        self.stop, self.errors = threading.Event(), []
        self.threads = [threading.Thread(target=self._write, args=(vtgate, ks, s)) for s in (1, 2)]

    def _write(self, vtgate: Any, ks: str, seed: int) -> None:
        rng, version = random.Random(seed), 0
        try:
            while not self.stop.is_set():
                key, action, version = rng.randrange(1, 70), rng.random(), version + 1
                if action < 0.45:
                    upsert = INSERT + " ON DUPLICATE KEY UPDATE item = VALUES(item), qty = VALUES(qty)"
                    vtgate.execute(ks, upsert, order_values(key, version), key=key)
                elif action < 0.85:
                    sql = "UPDATE orders SET qty = qty + 1, note = %s WHERE id = %s"
                    vtgate.execute(ks, sql, (f"v{version}", key), key=key)
                else:
                    vtgate.execute(ks, "DELETE FROM orders WHERE id = %s", (key,), key=key)
                time.sleep(0.005)
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        assert not self.errors


def test_tasks_copy_and_stream_their_shards_and_keep_positions_across_generations(vtgate, sharded, tmp_path):
    ks = sharded
    base = vitess_props(vtgate, ks, tmp_path, **{"run.max.events": 20})
    gen1 = per_task(base, tasks=2, gen=1, prev=1)
    assert [p.state_name for p in partitions(build_config(gen1))] == [
        f"vt_{ks}.task0_2_1",
        f"vt_{ks}.task1_2_1",
    ]
    # generation 0: the connector without offset storage per task copies part of the keyspace ...
    with Writers(vtgate, ks):
        first = cli_capture(tmp_path, {**base, "run.max.events": 5})
        assert set(first) == {None}
        # ... then two tasks take over its shards' positions (and its unfinished copy is refused)
        with pytest.raises(OffsetUnavailable, match="still has a snapshot running"):
            build_capture(gen1, "task0_2_1").run(commit=True)
        for _ in range(30):
            if not any(g.get("table_p_ks") for g in cli_capture(tmp_path, base)[None]["to_offset"]["vgtid"]):
                break
        runs = [cli_capture(tmp_path, gen1) for _ in range(4)]
    assert all(set(r) == {"task0_2_1", "task1_2_1"} for r in runs)
    store = build_store(build_config(gen1))
    held = {t: [g["shard"] for g in store.load(f"vt_{ks}.{t}").data["offset"]["vgtid"]] for t in runs[0]}
    assert held == {"task0_2_1": ["-80"], "task1_2_1": ["80-"]}
    assert sum(r[t]["snapshot_rows"] for r in runs for t in r) == 0  # positions taken over, no re-copy
    # generation 2: one task over both shards, from the two tasks' offsets
    gen2 = per_task(base, tasks=1, gen=2, prev=2)
    with Writers(vtgate, ks):
        runs = [cli_capture(tmp_path, gen2) for _ in range(3)]
    runs.append(cli_capture(tmp_path, gen2))
    assert sum(r["task0_1_2"]["snapshot_rows"] for r in runs) == 0
    names = [f"vt_{ks}", f"vt_{ks}.task0_2_1", f"vt_{ks}.task1_2_1", f"vt_{ks}.task0_1_2"]
    for name in names[1:]:
        assert all(b.manifest["connector"] == f"vt_{ks}" for b in list_batches(tmp_path, name))
    got = every_batch(base, names).rows(f"{ks}.orders")
    assert_rows_equal(f"{ks}.orders", shard_rows(vtgate, ks), {k: v for k, v in got.items() if v is not None})


def test_task_settings_it_cannot_honour_are_refused(vtgate, sharded, tmp_path):
    ks = sharded
    base = vitess_props(vtgate, ks, tmp_path)
    with pytest.raises(ConfigError, match="snapshot.mode"):
        build_config(per_task({**base, "snapshot.mode": "when_needed"}, 2, 1, 1))
    with pytest.raises(ConfigError, match="unset vitess.shard"):
        build_config(per_task({**base, "vitess.shard": "-80"}, 2, 1, 1))
    too_many = per_task(base, tasks=3, gen=1, prev=1)
    with pytest.raises(ConfigError, match="task task2_3_1 has none"):
        build_capture(too_many, "task2_3_1").run(commit=True)
    assert build_store(build_config(too_many)).load(f"vt_{ks}.task2_3_1") is None
    gen1 = per_task(base, tasks=2, gen=1, prev=1)
    build_capture(gen1, "task0_2_1").run(commit=True)
    before = build_store(build_config(gen1)).load(f"vt_{ks}.task0_2_1")
    signal = {"type": "execute-snapshot", "data": {"data-collections": [f"{ks}.orders"]}}
    with pytest.raises(ConfigError, match="re-snapshot of .*orders refused"):
        build_capture(gen1, "task0_2_1").run(signals=[signal], commit=True)
    assert build_store(build_config(gen1)).load(f"vt_{ks}.task0_2_1").version == before.version
    wrong_prev = per_task(base, tasks=1, gen=2, prev=1)  # generation 1 really ran two tasks
    with pytest.raises(OffsetUnavailable, match="no stored offset of generation 1 with 1 task"):
        build_capture(wrong_prev, "task0_1_2").run(commit=True)
    half = per_task(base, tasks=1, gen=2, prev=2)  # task1_2_1 never committed: shard 80- has no position
    with pytest.raises(OffsetUnavailable, match="no position for shard"):
        build_capture(half, "task0_1_2").run(commit=True)
    assert build_store(build_config(half)).load(f"vt_{ks}.task0_1_2") is None
