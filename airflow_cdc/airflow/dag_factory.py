"""One call builds the standard CDC DAG from a pipeline file: sense -> capture -> apply -> commit.

::

    from airflow_cdc.airflow.dag_factory import cdc_dag

    dag = cdc_dag("/opt/airflow/dags/pipelines/shop.yaml")

Every option can come from the file's ``airflow:`` section (see :mod:`airflow_cdc.airflow.pipeline`)
or from a keyword argument (which wins).  The DAG runs one pipeline run at a time
(``max_active_runs=1``), retries each task, emits an Asset per silver table from the commit task
(so downstream DAGs can be data-aware scheduled), and renders a trigger form for ad hoc snapshots.
Nothing here touches the source at parse time: only the pipeline file is read.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Asset, BaseOperator, Param, TaskGroup, TriggerRule
from airflow.sdk.definitions.mappedoperator import MappedOperator

from airflow_cdc.airflow.operators.apply import CdcApplyOperator
from airflow_cdc.airflow.operators.capture import CdcCaptureOperator
from airflow_cdc.airflow.operators.commit import CdcCommitOperator
from airflow_cdc.airflow.operators.snapshot_parts import CdcSnapshotPartOperator, CdcSnapshotPlanOperator
from airflow_cdc.airflow.operators.verify import CdcVerifyOperator
from airflow_cdc.airflow.pipeline import (
    OPTIONS,
    PipelineSpec,
    delta_location,
    delta_settings,
    literal_tables,
    load_pipeline,
)
from airflow_cdc.airflow.sensors.changes import CdcChangesSensor
from airflow_cdc.apply.submit import silver_table_path
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from airflow_cdc.core.config import COMMON_PROPERTIES
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config, partitions

BATCH_PATH = "{{ ti.xcom_pull(task_ids='capture')['batch_path'] }}"
#: a partition's batch; empty when its capture was skipped (its apply then skips too)
PARTITION_BATCH_PATH = "{{ (ti.xcom_pull(task_ids='%s') or {}).get('batch_path', '') }}"
#: the snapshot-parts plan directory (empty: nothing planned)
SNAPSHOT_PLAN = "{{ ((ti.xcom_pull(task_ids='%s') or [{}])[0] or {}).get('plan', '') }}"


#: What the trigger form says about the condition field (the safe language of
#: :mod:`airflow_cdc.core.conditions`).
CONDITION_HELP = (
    "Optional filter on the rows to snapshot, applied to each table listed. Not SQL but a safe "
    "condition language: column = <> != < <= > >= literal, column IS [NOT] NULL, column [NOT] IN "
    "(literal, ...), column [NOT] BETWEEN literal AND literal, combined with AND, OR, NOT and "
    "parentheses. Literals: numbers, 'text' ('' for a quote), TRUE, FALSE, DATE 'YYYY-MM-DD', "
    "TIMESTAMP 'YYYY-MM-DD HH:MM:SS'; quote odd column names with \"double quotes\". "
    "Example: status = 'open' AND id BETWEEN 10 AND 20. (Debezium additional-conditions.)"
)


def _raw_sql_allowed(spec: PipelineSpec) -> bool:
    """Whether the pipeline opts in to raw-SQL conditions (for the form's wording only: the
    capture task decides with the resolved configuration)."""
    prop = next(p for p in COMMON_PROPERTIES if p.name == RAW_SQL_PROPERTY)
    with contextlib.suppress(ConfigError):
        return bool(prop.parse(spec.properties.get(RAW_SQL_PROPERTY)))
    return False


def snapshot_params(tables: list[str], raw_sql: bool = False) -> dict[str, Param]:
    """The trigger form for ad hoc snapshots (Debezium ``execute-snapshot`` / ``stop-snapshot``).

    Every field may stay empty (JSON schema type includes ``null``: Airflow's form then does not
    mark it required), so a plain run needs nothing and a snapshot needs only its tables.

    :param raw_sql: the pipeline sets ``snapshot.additional.conditions.raw.sql``: the condition
        field takes raw SQL, and says so.
    """
    captured = f" Captured: {', '.join(tables[:20])}{' ...' if len(tables) > 20 else ''}." if tables else ""
    condition_help = (
        "Optional SQL condition on the rows to snapshot, applied to each table listed, run as the "
        f"connector's database user: this pipeline sets {RAW_SQL_PROPERTY}=true. "
        "Example: status = 'open' (Debezium additional-conditions)."
        if raw_sql
        else CONDITION_HELP
    )
    return {
        "snapshot_tables": Param(
            None,
            type=["null", "string"],
            format="multiline",
            title="Ad hoc snapshot: tables",
            section="Ad hoc snapshot",
            description="Tables to re-snapshot (schema.table), one per line or comma-separated; "
            f"leave empty for a normal run.{captured}",
        ),
        "snapshot_filter": Param(
            None,
            type=["null", "string"],
            title="Additional condition",
            section="Ad hoc snapshot",
            description=condition_help,
        ),
        "surrogate_key": Param(
            None,
            type=["null", "string"],
            title="Surrogate key",
            section="Ad hoc snapshot",
            description="Optional column to chunk by instead of the primary key (Debezium surrogate-key).",
        ),
        "stop_snapshot": Param(
            False,
            type="boolean",
            title="Stop snapshot",
            section="Ad hoc snapshot",
            description="Stop the running snapshots of the tables listed (all when none are listed) "
            "instead of starting one.",
        ),
    }


def silver_assets(spec: PipelineSpec, target: str, tables: list[str]) -> list[Asset]:
    """One Asset per silver table, named ``cdc.<connector>.<table>``, URI = its Delta location."""
    local = delta_location(target)
    assets = []
    for table in tables:
        path = silver_table_path(str(local.absolute()) if local else target, spec.name, table)
        uri = f"file://{path}" if local else path
        assets.append(Asset(name=f"cdc.{spec.name}.{table}", uri=uri, extra={"table": table}))
    return assets


def _resolve(spec: PipelineSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(overrides) - set(OPTIONS)
    if unknown:
        raise ConfigError(f"cdc_dag: unknown option(s) {sorted(unknown)}; known: {sorted(OPTIONS)}")
    return {k: overrides[k] if overrides.get(k) is not None else spec.option(k) for k in OPTIONS}


def cdc_dag(
    pipeline: str | os.PathLike[str],
    *,
    default_args: Mapping[str, Any] | None = None,
    dag_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> DAG:
    """Build the CDC DAG for one pipeline file.

    :param pipeline: the pipeline file (YAML/JSON; Debezium properties plus an ``airflow:`` section).
    :param default_args: extra task defaults (merged over retries/retry_delay from the options).
    :param dag_kwargs: extra ``DAG`` arguments (e.g. ``start_date``, ``catchup``, ``doc_md``).
    :param options: any ``airflow:`` section option (``target``, ``schedule``, ``cdc_conn_id``,
        ``spark_conn_id``, ``spark_conf``, ``sense``, ``deferrable``, ``retries``, ``apply``,
        ``snapshot_tasks`` (> 0: plan_snapshot -> mapped read_snapshot_part -> capture), ...).
    :raises ConfigError: unknown option, or ``apply`` without a ``target``.
    """
    path = str(pipeline)
    spec = load_pipeline(path)
    opt = _resolve(spec, options)
    spec = replace(spec, options={k: v for k, v in opt.items() if v is not None})
    target, apply_options = delta_settings(spec)
    if opt["apply"] and target is None:
        raise ConfigError(
            f"pipeline {path}: the Delta root is required to apply: set property 'delta.root' "
            "(or option 'airflow.target')"
        )
    tables = literal_tables(spec)
    outlets = silver_assets(spec, target, tables) if opt["apply"] and target else []
    args = {"retries": int(opt["retries"]), "retry_delay": timedelta(seconds=int(opt["retry_delay_seconds"]))}
    common = {"pipeline": path, "cdc_conn_id": opt["cdc_conn_id"]}
    dag = DAG(
        dag_id=opt["dag_id"] or f"cdc_{spec.name}",
        schedule=opt["schedule"],
        max_active_runs=1,
        catchup=False,
        default_args={**args, **(default_args or {})},
        params=snapshot_params(tables, _raw_sql_allowed(spec)),
        tags=list(opt["tags"]),
        doc_md=f"Change data capture for connector `{spec.name}` from `{path}`: "
        "sense -> capture -> apply -> commit.  Trigger with a config to run an ad hoc snapshot.",
        **(dag_kwargs or {}),
    )
    with dag:
        commits, applies = [], []
        for key in partition_keys(spec):
            with TaskGroup(_group_id(key)) if key is not None else contextlib.nullcontext():
                commit, apply = _partition_chain(opt, common, key, target, apply_options, outlets)
            commits.append(commit)
            applies += [apply] if apply is not None else []
        # partitions may share Delta tables (Vitess tasks): their applies run one at a time
        for earlier, later in zip(applies, applies[1:], strict=False):
            later.trigger_rule = TriggerRule.NONE_FAILED
            earlier >> later
        if opt["verify"] and target is not None and opt["apply"]:
            # runs when any partition committed changes (one without change skips its chain)
            verify_task = CdcVerifyOperator(task_id="verify", target=target, **common)
            verify_task.trigger_rule = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
            commits >> verify_task
    _place_tasks(dag, opt["task_options"], path)
    return dag


#: BaseOperator arguments that say where a task runs (``task_options`` per step)
PLACEMENT_KEYS = ("queue", "pool", "pool_slots", "priority_weight", "executor", "executor_config")
STEPS = ("sense", "capture", "apply", "commit", "verify", "plan_snapshot", "read_snapshot_part")


def _place_tasks(dag: DAG, task_options: Any, path: str) -> None:
    """Set the ``task_options`` of each step on its tasks (every partition's).

    :raises ConfigError: not a mapping, an unknown step or an unknown argument.
    """
    if not isinstance(task_options, dict):
        raise ConfigError(f"pipeline {path}: option 'airflow.task_options' must map steps to arguments")
    for step, kwargs in task_options.items():
        if step not in STEPS or not isinstance(kwargs, dict):
            raise ConfigError(
                f"pipeline {path}: option 'airflow.task_options.{step}': expected one of "
                f"{', '.join(STEPS)} mapped to arguments"
            )
        unknown = sorted(set(kwargs) - set(PLACEMENT_KEYS))
        if unknown:
            raise ConfigError(
                f"pipeline {path}: option 'airflow.task_options.{step}': unknown argument(s) "
                f"{', '.join(unknown)} (allowed: {', '.join(PLACEMENT_KEYS)})"
            )
    for task in dag.tasks:
        for key, value in (task_options.get(task.task_id.rsplit(".", 1)[-1]) or {}).items():
            if isinstance(task, MappedOperator):  # read_snapshot_part: its arguments are the partial's
                task.partial_kwargs[key] = value
            else:
                setattr(task, key, value)


def partition_keys(spec: PipelineSpec) -> list[str | None]:
    """The partitions the pipeline file defines (``[None]``: unpartitioned), known without touching
    the source: SQL Server ``database.names``, Vitess offset storage per task.  A file that only
    validates with its Connection's fields counts as unpartitioned (name the databases or tasks in
    the file to get one task group per partition)."""
    try:
        config = build_config(spec.properties)
    except ConfigError:
        return [None]
    return [p.partition for p in partitions(config)]


def _group_id(partition: str) -> str:
    return "p_" + re.sub(r"[^A-Za-z0-9_-]", "_", partition)


def _partition_chain(
    opt: dict[str, Any],
    common: dict[str, Any],
    partition: str | None,
    target: str | None,
    apply_options: Any,
    outlets: list[Asset],
) -> tuple[BaseOperator, BaseOperator | None]:
    """sense -> capture -> apply -> commit of one partition (in the current task group): the
    commit and apply tasks."""
    # a partition's apply may run after its capture was skipped (applies run in a row): no batch
    batch_path = BATCH_PATH if partition is None else PARTITION_BATCH_PATH % f"{_group_id(partition)}.capture"
    parts = _snapshot_tasks(opt)
    plan_id = "plan_snapshot" if partition is None else f"{_group_id(partition)}.plan_snapshot"
    capture = CdcCaptureOperator(
        task_id="capture",
        partition=partition,
        snapshot_plan=SNAPSHOT_PLAN % plan_id if parts else None,
        **common,
    )
    first: BaseOperator = capture
    if parts:
        first = _snapshot_part_tasks(parts, partition, common, capture)
    last: BaseOperator = capture
    apply = None
    if opt["apply"] and target is not None:
        apply = CdcApplyOperator(
            task_id="apply",
            batch_path=batch_path,
            target=target,
            spark_conf=opt["spark_conf"],
            conn_id=opt["spark_conn_id"],
            options=apply_options,
            **common,
        )
        capture >> apply
        last = apply
    commit = CdcCommitOperator(
        task_id="commit",
        batch_path=batch_path,
        outlets=outlets,
        target=target if opt["apply"] else None,
        # an empty batch skips apply (no Spark) yet is committed (its offset may move): commit runs
        # when its capture succeeded and nothing failed; it skips itself then (no Asset event)
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        **common,
    )
    capture >> commit
    if last is not capture:
        last >> commit
    if opt["sense"]:
        sense_kwargs: dict[str, Any] = {}
        if opt["deferrable"] is not None:
            sense_kwargs["deferrable"] = bool(opt["deferrable"])
        sense = CdcChangesSensor(
            task_id="sense",
            check=opt["check"],
            poke_interval=float(opt["poke_interval"]),
            timeout=float(opt["sensor_timeout"]),
            soft_fail=True,
            mode="reschedule",
            partition=partition,
            **sense_kwargs,
            **common,
        )
        sense >> first
    return commit, apply


def _snapshot_tasks(opt: dict[str, Any]) -> int:
    """The ``snapshot_tasks`` option (0: off).  :raises ConfigError: not a whole number >= 0."""
    value = opt["snapshot_tasks"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"option 'airflow.snapshot_tasks': expected a whole number >= 0, got {value!r}")
    return value


def _snapshot_part_tasks(
    parts: int, partition: str | None, common: dict[str, Any], capture: BaseOperator
) -> BaseOperator:
    """plan_snapshot -> read_snapshot_part (mapped over the plan) -> capture; returns the plan task.

    An empty plan maps no part task (skipped); capture still runs after a successful plan, and is
    skipped with it when the sensor skipped the run.
    """
    plan = CdcSnapshotPlanOperator(task_id="plan_snapshot", parts=parts, partition=partition, **common)
    read = CdcSnapshotPartOperator.partial(
        task_id="read_snapshot_part", partition=partition, **common
    ).expand(part=plan.output)
    capture.trigger_rule = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    plan >> read >> capture
    plan >> capture
    return plan
