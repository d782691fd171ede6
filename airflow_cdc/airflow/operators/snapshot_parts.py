"""Spread a run's snapshot chunks over mapped tasks: plan key ranges, read each range in its own task.

``plan_snapshot`` (:class:`CdcSnapshotPlanOperator`) splits the next ``snapshot.max.rows.per.run``
rows of the first pending table snapshot into key ranges; ``read_snapshot_part``
(:class:`CdcSnapshotPartOperator`, mapped with ``.expand(part=plan.output)``) reads one range as
watermarked chunks into the staging directory; the capture task then loads them in key order
(see :mod:`airflow_cdc.core.snapshot_parts`).  No task here changes the connector's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook
from airflow_cdc.core import snapshot_parts


class CdcSnapshotPlanOperator(BaseOperator):
    """Plan the snapshot parts of the next capture run (the committed state's first pending snapshot).

    Returns (XCom) one small dict per part (``plan`` directory, ``part`` index); an empty list when no
    snapshot is pending (the mapped part task then has no instances and the run goes on).

    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    :param parts: how many key ranges (mapped part tasks) at most.
    :param partition: the partition of a partitioned connector; ``None`` for an unpartitioned one. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "cdc_conn_id", "partition")
    ui_color = "#e8f6f3"

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        parts: int,
        cdc_conn_id: str | None = None,
        partition: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.cdc_conn_id, self.parts, self.partition = pipeline, cdc_conn_id, parts, partition

    def execute(self, context: Context) -> list[dict[str, Any]]:
        with airflow_errors("plan_snapshot"):
            hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
            planned = snapshot_parts.plan_parts(hook.get_capture(partition=self.partition), self.parts)
        self.log.info("snapshot parts planned: %d", len(planned))
        return planned


class CdcSnapshotPartOperator(BaseOperator):
    """Read one planned snapshot part (a key range) as watermarked chunks into the staging directory.

    Re-running it replaces the part's files.  Returns (XCom) rows, chunks and whether the range was
    read to its end.

    :param part: one item of the plan task's output (``plan`` directory and ``part`` index). (templated)
    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    :param partition: the partition of a partitioned connector; ``None`` for an unpartitioned one. (templated)
    """

    template_fields: Sequence[str] = ("part", "pipeline", "cdc_conn_id", "partition")
    ui_color = "#e8f6f3"

    def __init__(
        self,
        *,
        part: Mapping[str, Any],
        pipeline: str | Mapping[str, Any],
        cdc_conn_id: str | None = None,
        partition: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.part, self.pipeline, self.cdc_conn_id, self.partition = part, pipeline, cdc_conn_id, partition

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors("read_snapshot_part"):
            hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
            capture = hook.get_capture(partition=self.partition)
            return snapshot_parts.read_part(capture, str(self.part["plan"]), int(self.part["part"]))
