"""A partitioned connector in Airflow: a SQL Server pipeline naming two databases gets one task
group per database (sense -> capture -> apply -> commit, each with its own offset), run for real
with ``airflow dags test`` against the CDC emulator."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.state import open_state_store
from tests.airflow.conftest import write_dag
from tests.airflow.support import batch_rows, write_pipeline
from tests.contract.harness import HARNESSES  # noqa: F401  (first: it registers the SQL Server harness)
from tests.contract.harness_sqlserver import contract_sqlserver_emulator  # noqa: F401

CONN = "cdc_mssql_parts"


@pytest.fixture
def databases(contract_sqlserver_emulator):  # noqa: F811
    emu = contract_sqlserver_emulator
    names = [f"p_{uuid.uuid4().hex[:8]}_{side}" for side in "ab"]
    for n, db in enumerate(names):
        emu.create_database(db, allow_snapshot_isolation=True)
        emu.create_table(db, "dbo.items", [("id", "int"), ("name", "nvarchar(20)")], primary_key=["id"])
        emu.enable_table(db, "dbo.items")
        with emu.pg_connect(db) as pg:
            pg.execute("INSERT INTO dbo.items SELECT g, 'i' || g FROM generate_series(1, %s) g", (3 + n,))
        emu.run_capture_job(db)
    yield emu, names
    for db in names:
        emu.drop_database(db)


def _dag(tmp_path: Path, emu, names: list[str], **airflow) -> tuple[str, dict[str, str], Path, Path]:
    staging = tmp_path / "staging"
    props = {
        "name": "parts",
        "connector": "sqlserver",
        "database.names": ",".join(names),
        "staging.path": str(staging),
        "snapshot.isolation.mode": "snapshot",
        "state.store": str(tmp_path / "state"),
        "commit.require.applied": "false",
    }
    options = {
        "dag_id": "t_parts",
        "cdc_conn_id": CONN,
        "apply": False,
        "retries": 0,
        "poke_interval": 1,
        "sensor_timeout": 8,
        **airflow,
    }
    pipeline = write_pipeline(tmp_path / "pipeline.yaml", props, options)
    dags = tmp_path / "dags"
    write_dag(dags, pipeline)
    conn = {"conn_type": "cdcsqlserver", "host": emu.host, "port": emu.port, "login": emu.user,
            "password": emu.password, "extra": {"encrypt": False}}  # fmt: skip
    env = {f"AIRFLOW_CONN_{CONN.upper()}": json.dumps(conn)}
    return "t_parts", env, dags, staging


def test_one_task_group_per_database(tmp_path, databases):
    from airflow.dag_processing.dagbag import DagBag

    emu, names = databases
    _, _, dags, _ = _dag(tmp_path, emu, names, apply=True, target=str(tmp_path / "delta"), verify=True)
    bag = DagBag(dag_folder=str(dags))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["t_parts"]
    groups = [f"p_{db}" for db in names]
    assert {t.task_id for t in dag.tasks} == {
        f"{g}.{t}" for g in groups for t in ("sense", "capture", "apply", "commit")
    } | {"verify"}
    assert dag.get_task(f"{groups[0]}.capture").partition == names[0]
    assert dag.get_task(f"{groups[1]}.sense").partition == names[1]
    # applies of partitions run one after the other (Vitess tasks share tables)
    later = dag.get_task(f"{groups[1]}.apply")
    assert f"{groups[0]}.apply" in later.upstream_task_ids and later.trigger_rule == "none_failed"
    assert "p_" not in dag.get_task(f"{groups[0]}.apply").batch_path.split("task_ids=")[0]


def test_partitions_capture_and_commit_in_a_dag_run(tmp_path, databases, airflow_cli):
    emu, names = databases
    dag_id, env, dags, staging = _dag(tmp_path, emu, names)
    airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)
    for n, db in enumerate(names):
        batches = list_batches(staging, f"parts.{db}")
        assert len(batches) == 1 and batches[0].partition == db
        assert sorted(r["after"]["id"] for r in batch_rows(batches[0], f"{db}.dbo.items")) == list(
            range(1, 4 + n)
        )
    with emu.pg_connect(names[1]) as pg:
        pg.execute("UPDATE dbo.items SET name = 'changed' WHERE id = 2")
    emu.run_capture_job(names[1])
    airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)
    # the unchanged database's sensor skipped its chain: no batch; the other one captured the update
    assert len(list_batches(staging, f"parts.{names[0]}")) == 1
    second = list_batches(staging, f"parts.{names[1]}")
    assert len(second) == 2
    assert [(r["op"], r["after"]["name"]) for r in batch_rows(second[-1], f"{names[1]}.dbo.items")] == [
        ("u", "changed")
    ]
    store = open_state_store(str(tmp_path / "state"))
    for db in names:
        assert (
            store.load(f"parts.{db}").data["last_batch"] == list_batches(staging, f"parts.{db}")[-1].batch_id
        )


def test_vitess_tasks_max_becomes_one_task_group_per_task(tmp_path):
    """Debezium's Vitess ``tasks.max`` with per-task offsets: one task group per task of the current
    generation (``task<i>_<tasks.max>_<gen>``: its own shards and offset), the applies one after the
    other (the tasks' shards fill the same Delta tables)."""
    from airflow.dag_processing.dagbag import DagBag

    props = {
        "name": "vparts", "connector": "vitess", "vitess.keyspace": "commerce",
        "staging.path": str(tmp_path / "staging"), "state.store": str(tmp_path / "state"),
        "tasks.max": 3, "vitess.offset.storage.per.task": True,
        "vitess.offset.storage.task.key.gen": 1, "vitess.prev.num.tasks": 1,
    }  # fmt: skip
    options = {
        "dag_id": "t_vparts",
        "cdc_conn_id": "cdc_vitess_parts",
        "retries": 0,
        "target": str(tmp_path / "d"),
    }
    pipeline = write_pipeline(tmp_path / "vitess.yaml", props, options)
    dags = tmp_path / "dags"
    write_dag(dags, pipeline)
    bag = DagBag(dag_folder=str(dags))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["t_vparts"]
    keys = [f"task{i}_3_1" for i in range(3)]
    groups = {t.task_id.split(".")[0] for t in dag.tasks if "." in t.task_id}
    assert len(groups) == 3
    for key in keys:
        group = next(g for g in groups if key in g)
        assert dag.get_task(f"{group}.capture").partition == key
    applies = sorted((t for t in dag.tasks if t.task_id.endswith(".apply")), key=lambda t: t.task_id)
    assert all(a.task_id in b.upstream_task_ids for a, b in zip(applies, applies[1:], strict=False))
