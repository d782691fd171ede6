"""Capture one change window (plus pending snapshot chunks) into an immutable staged batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook
from airflow_cdc.airflow.links import CdcBatchLink, storage_url
from airflow_cdc.airflow.metrics import export_metrics
from airflow_cdc.airflow.signals import signals_from_run


class CdcCaptureOperator(BaseOperator):
    """Capture the change window since the committed offset into a new staged batch.

    The offset is *not* moved (that is :class:`CdcCommitOperator`'s job after apply), so a retry or
    a re-run captures again from the same committed offset.  Ad hoc snapshots come from the DAG run:
    Debezium ``execute-snapshot`` / ``stop-snapshot`` data in the run conf or the trigger form.
    Returns (XCom) only small metadata: batch id and path, offsets, counts, notes.  The run's
    snapshot and streaming metrics go to Airflow's metrics backend (docs: Monitoring).

    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    :param signals: explicit signals; ``None`` reads them from the run conf and params. (templated)
    :param partition: the partition of a partitioned connector to capture (a SQL Server database, a
        Vitess task); ``None`` for an unpartitioned one. (templated)
    :param snapshot_plan: a snapshot-parts plan directory whose prepared chunks to use instead of
        reading them (``plan_snapshot`` / ``read_snapshot_part`` tasks); empty or ``None``: read them
        here.  A stale plan is refused (logged) and the chunks are read here. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "cdc_conn_id", "signals", "partition", "snapshot_plan")
    template_fields_renderers = {"signals": "json"}
    ui_color = "#d6eaf8"
    operator_extra_links = (CdcBatchLink(),)

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        cdc_conn_id: str | None = None,
        signals: list[dict[str, Any]] | None = None,
        partition: str | None = None,
        snapshot_plan: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partition = partition
        self.snapshot_plan = snapshot_plan
        self.pipeline = pipeline
        self.cdc_conn_id = cdc_conn_id
        self.signals = signals

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors("capture"):
            signals = self.signals
            if signals is None:
                dag_run = context.get("dag_run")
                signals = signals_from_run(getattr(dag_run, "conf", None), context.get("params"))
            if signals:
                self.log.info("ad hoc snapshot signals: %s", signals)
            hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
            capture = hook.get_capture(partition=self.partition)
            result = capture.run(signals=list(signals), prepared=self.snapshot_plan or None)
        export_metrics(result.metrics)  # Debezium's snapshot and streaming metrics, to [metrics]
        self._lineage = (capture.config, list(result.tables))
        CdcBatchLink().persist(context, storage_url(result.batch_path))
        describe = capture.source.describe_offset
        for note in result.notes:
            self.log.info("note: %s", note)
        self.log.info(
            "batch %s: %d change events, %d snapshot rows, offset %s -> %s",
            result.batch_id,
            result.events,
            result.snapshot_rows,
            describe(result.from_offset),
            describe(result.to_offset),
        )
        summary = result.summary(max_notes=20)
        del summary["committed"]  # the commit task commits
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the source tables this run captured from (the batch is intermediate)."""
        from airflow_cdc.airflow.lineage import operator_lineage, source_datasets

        config, tables = getattr(self, "_lineage", (None, []))
        return operator_lineage(source_datasets(config, tables) if config is not None else [], [])
