"""The pipelines of a DAG as the api-server sees them, and their status documents.

A DAG's pipelines are its capture tasks (:class:`CdcCaptureOperator`): each names its pipeline file,
Connection and partition, which the serialized DAG keeps, so nothing here parses DAG files.  The
api-server then reads what ``airflow-cdc status --json`` reads: the pipeline file (it must see the
same path as the workers), the Connection, the state store, the staging area's ``metrics.json``
and, live, the source (one short connection per partition).  Documents are cached for
:data:`TTL_SECONDS`, so a refreshing page or several viewers cost one read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.health import status_metrics

#: Seconds a DAG's status documents are reused (live and saved-only apart).
TTL_SECONDS = 10.0
CAPTURE_TASK_TYPES = ("CdcCaptureOperator",)


@dataclass(frozen=True)
class PipelineRef:
    """One capture task: where its pipeline's configuration comes from."""

    dag_id: str
    task_id: str
    pipeline: Any  # a file path, or the mapping given to the operator
    conn_id: str | None
    partition: str | None


class TtlCache:
    """Values by key for ``ttl`` seconds.  Two readers of an expired key may both compute it."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._values: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        value = compute()
        with self._lock:
            self._values[key] = (time.monotonic(), value)
        return value


_documents = TtlCache(TTL_SECONDS)
_refs_by_hash: dict[tuple[str, str], list[PipelineRef]] = {}


def refs_of(dag: Any) -> list[PipelineRef]:
    """The capture tasks of a (serialized) DAG, in task order."""
    return [
        PipelineRef(
            dag.dag_id, task.task_id, task.pipeline, getattr(task, "cdc_conn_id", None), task.partition
        )
        for task in dag.tasks
        if task.task_type in CAPTURE_TASK_TYPES and hasattr(task, "pipeline")
    ]


def pipeline_refs(dag_ids: Iterable[str]) -> list[PipelineRef]:
    """The capture tasks of the latest version of each active DAG of ``dag_ids``.

    Each DAG is deserialized once per version (its hash), and only while it has capture tasks
    or changed: a deployment's other DAGs cost one small query.
    """
    from airflow.models.dag import DagModel
    from airflow.models.dag_version import DagVersion
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(SerializedDagModel.dag_id, SerializedDagModel.dag_hash)
            .join(DagVersion, SerializedDagModel.dag_version_id == DagVersion.id)
            .join(DagModel, DagModel.dag_id == SerializedDagModel.dag_id)
            .where(SerializedDagModel.dag_id.in_(sorted(set(dag_ids))), ~DagModel.is_stale)
            .order_by(DagVersion.version_number)
        ).all()
        latest = dict(rows)  # ordered by version: the newest one wins
        out: list[PipelineRef] = []
        for dag_id in sorted(latest):
            key = (dag_id, latest[dag_id])
            if key not in _refs_by_hash:
                dag = SerializedDagModel.get_dag(dag_id, session=session)
                _refs_by_hash[key] = refs_of(dag) if dag is not None else []
            out += _refs_by_hash[key]
    return out


def read_status(ref: PipelineRef, live: bool) -> dict[str, Any]:
    """``status --json`` of one capture task's partition, or ``error`` saying why not."""
    from airflow_cdc.airflow.hooks.cdc import CdcHook

    out: dict[str, Any] = {"dag_id": ref.dag_id, "task_id": ref.task_id, "partition": ref.partition}
    try:
        if isinstance(ref.pipeline, str) and "{{" in ref.pipeline:
            raise ValueError(f"the pipeline {ref.pipeline!r} is templated: known only when the task runs")
        hook = CdcHook(pipeline=ref.pipeline, cdc_conn_id=ref.conn_id)
        config = hook.get_partition(ref.partition)
        out["connector"] = str(config["name"])
        stored = hook.get_store(config).load(config.state_name)
        state = dict(stored.data) if stored else None
        out["updated_at"] = stored.updated_at if stored else None
        out["offset"] = (state or {}).get("offset")
        out["metrics"] = status_metrics(config, state, live=live)
    except Exception as e:  # noqa: BLE001 - shown on the page; the other pipelines still are
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def dag_documents(dag_ids: Iterable[str], live: bool) -> dict[str, Any]:
    """The status documents of every pipeline of ``dag_ids`` (cached :data:`TTL_SECONDS`)."""
    key = (tuple(sorted(set(dag_ids))), live)

    def compute() -> dict[str, Any]:
        docs = [read_status(ref, live) for ref in pipeline_refs(key[0])]
        return {"generated_at": time.time(), "live": live, "ttl_seconds": TTL_SECONDS, "pipelines": docs}

    result: dict[str, Any] = _documents.get(key, compute)
    return result
