"""``airflow.task_options``: where each step runs (Celery queues, pools, executors, pod overrides),
set on every partition's task; bad options name the step and argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.airflow.dag_factory import cdc_dag
from airflow_cdc.core.errors import ConfigError


def pipeline(tmp_path: Path, options: str, extra: str = "") -> Path:
    f = tmp_path / "shop.yaml"
    f.write_text(
        f"name: shop\nconnector: postgresql\ntable.include.list: public.orders\nstaging.path: {tmp_path}/s\n"
        f"{extra}airflow:\n  target: {tmp_path}/delta\n  task_options:\n{options}"
    )
    return f


def test_steps_get_their_queue_pool_and_executor(tmp_path):
    options = (
        "    capture: {queue: db, pool: sources}\n"
        "    apply: {queue: spark, executor: KubernetesExecutor, executor_config: {pod_override: null}}\n"
        "    sense: {priority_weight: 5}\n"
    )
    dag = cdc_dag(pipeline(tmp_path, options))
    capture, apply, sense, commit = (dag.get_task(t) for t in ("capture", "apply", "sense", "commit"))
    assert (capture.queue, capture.pool) == ("db", "sources")
    assert (apply.queue, apply.executor, apply.executor_config) == ("spark", "KubernetesExecutor", {"pod_override": None})
    assert sense.priority_weight == 5
    assert commit.queue not in ("db", "spark") and commit.pool != "sources"  # untouched defaults


def test_partitions_each_get_the_options(tmp_path):
    extra = "connector: sqlserver\ndatabase.names: a,b\n"
    f = pipeline(tmp_path, "    capture: {queue: db}\n", extra)
    f.write_text(f.read_text().replace("connector: postgresql\n", ""))
    dag = cdc_dag(f)
    captures = [t for t in dag.tasks if t.task_id.endswith(".capture")]
    assert len(captures) == 2 and all(t.queue == "db" for t in captures)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ("    capturing: {queue: db}\n", "task_options.capturing': expected one of sense, capture"),
        ("    apply: {queue: s, cpu: 2}\n", "unknown argument(s) cpu (allowed: queue, pool"),
        ("    apply: spark\n", "task_options.apply': expected one of"),
    ],
)
def test_bad_task_options_are_refused(tmp_path, options, needle):
    with pytest.raises(ConfigError) as err:
        cdc_dag(pipeline(tmp_path, options))
    assert needle in str(err.value)
