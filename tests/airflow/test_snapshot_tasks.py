"""``snapshot_tasks``: a table's snapshot spread over mapped ``read_snapshot_part`` tasks in a real
``airflow dags test`` run, committed in order; the replay equals the source."""

from __future__ import annotations

import re

from tests.airflow.conftest import pg_connection_env, write_dag
from tests.airflow.support import direct_props, pipeline_props, write_pipeline
from tests.integration.postgres.support import assert_converged
from tests.support.pipeline import snapshot_pending

CONN = "cdc_pg_parts"


def test_snapshot_spread_over_four_mapped_tasks(pg_db, tmp_path, airflow_cli):
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 900) g")
    staging = tmp_path / "staging"
    extra = {
        "table.include.list": "public.big",
        "snapshot.max.rows.per.run": 400,
        "incremental.snapshot.chunk.size": 40,
    }
    props = pipeline_props(pg_db, staging, **extra)
    dag_id = f"parts_{pg_db.name}"
    options = {
        "dag_id": dag_id,
        "cdc_conn_id": CONN,
        "apply": False,
        "retries": 0,
        "sense": False,
        "snapshot_tasks": 4,
    }
    dags = tmp_path / "dags"
    write_dag(dags, write_pipeline(tmp_path / "pipeline.yaml", props, options))
    env = pg_connection_env(pg_db, CONN)
    config = direct_props(pg_db, staging, **extra)
    mapped = []
    for run in range(4):
        with pg_db.connect(autocommit=True) as conn:
            conn.execute("UPDATE big SET v = 'u' || %s WHERE id %% 97 = %s", (run, run))
            conn.execute("DELETE FROM big WHERE id = %s", (run * 250 + 5,))
        out = airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)
        mapped.append(sorted(set(re.findall(r"read_snapshot_part[^\n]*?map_index=(\d+)", out))))
        if run:  # the capture used the parts (a stale plan would be refused and read again)
            assert "chunk(s) of public.big loaded" in out and "stale plan" not in out, out[-4000:]
        if not snapshot_pending(config):
            break
    assert mapped[0] == [] and mapped[1] == ["0", "1", "2", "3"], mapped
    assert not snapshot_pending(config)
    assert_converged(config, ["public.big"])


def _pipeline(tmp_path, airflow: str, extra: str = "connector: postgresql\n"):
    f = tmp_path / "shop.yaml"
    f.write_text(
        f"name: shop\n{extra}table.include.list: public.orders\nstaging.path: {tmp_path}/s\n"
        f"airflow:\n  target: {tmp_path}/delta\n{airflow}"
    )
    return f


def test_dag_shape_with_and_without_snapshot_tasks(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    plain = cdc_dag(_pipeline(tmp_path, ""))
    assert sorted(plain.task_ids) == ["apply", "capture", "commit", "sense"]
    assert plain.get_task("capture").upstream_task_ids == {"sense"}
    assert plain.get_task("capture").snapshot_plan is None
    dag = cdc_dag(_pipeline(tmp_path, "  snapshot_tasks: 3\n"))
    assert sorted(dag.task_ids) == [
        "apply",
        "capture",
        "commit",
        "plan_snapshot",
        "read_snapshot_part",
        "sense",
    ]
    capture, plan = dag.get_task("capture"), dag.get_task("plan_snapshot")
    assert plan.upstream_task_ids == {"sense"} and plan.parts == 3
    assert capture.upstream_task_ids == {"plan_snapshot", "read_snapshot_part"}
    assert capture.trigger_rule == "none_failed_min_one_success"
    assert "xcom_pull(task_ids='plan_snapshot')" in capture.snapshot_plan


def test_partitions_each_get_their_part_tasks(tmp_path):
    dag_file = _pipeline(tmp_path, "  snapshot_tasks: 2\n", "connector: sqlserver\ndatabase.names: a,b\n")
    from airflow_cdc.airflow.dag_factory import cdc_dag

    dag = cdc_dag(dag_file)
    for group in ("p_a", "p_b"):
        capture = dag.get_task(f"{group}.capture")
        assert capture.upstream_task_ids == {f"{group}.plan_snapshot", f"{group}.read_snapshot_part"}
        assert f"xcom_pull(task_ids='{group}.plan_snapshot')" in capture.snapshot_plan
        assert dag.get_task(f"{group}.plan_snapshot").partition == group[2:]


def test_bad_snapshot_tasks_is_refused(tmp_path):
    import pytest

    from airflow_cdc.airflow.dag_factory import cdc_dag
    from airflow_cdc.core.errors import ConfigError

    for bad in ("-1", "two", "true"):
        with pytest.raises(ConfigError, match="airflow.snapshot_tasks"):
            cdc_dag(_pipeline(tmp_path, f"  snapshot_tasks: {bad}\n"))


def test_task_options_place_the_plan_and_the_mapped_part_tasks(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    options = (
        "  snapshot_tasks: 2\n  task_options:\n"
        "    plan_snapshot: {queue: sources}\n"
        "    read_snapshot_part: {queue: sources, pool: snapshot_readers, executor: KubernetesExecutor}\n"
    )
    dag = cdc_dag(_pipeline(tmp_path, options))
    plan, part = dag.get_task("plan_snapshot"), dag.get_task("read_snapshot_part")
    assert plan.queue == "sources"
    assert (part.queue, part.pool, part.executor) == ("sources", "snapshot_readers", "KubernetesExecutor")
