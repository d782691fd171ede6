"""Commit an applied batch: store its end offset (compare-and-set), acknowledge the source, expire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowSkipException

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook
from airflow_cdc.airflow.metrics import export_metrics
from airflow_cdc.apply.applied import ensure_applied
from airflow_cdc.core.batch import Batch


class CdcCommitOperator(BaseOperator):
    """Store the batch's end state, then acknowledge the source (PostgreSQL: advance the slot) and
    expire old batches.  Run it only after the batch is durably applied.

    Before moving the offset it checks, from each Delta table's log, that the batch reached every
    table it touches (``commit.require.applied``; a batch marked successful in the UI after a
    failed apply is refused, and nothing moves).  It holds the connector's lease while it works.

    Committing the same batch again is a no-op apart from re-acknowledging.  If another run
    committed first (compare-and-set lost), the task fails without retrying and the offset stays
    where the winner put it; the next run continues from there.  If another run holds the lease,
    the task fails as retryable.  Asset outlets (one per silver table) get the batch id and counts
    as event extra.

    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    :param batch_path: the staged batch directory, usually the capture task's XCom. (templated)
    :param target: the Delta root the batch was applied to; default the ``delta.root`` property. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "cdc_conn_id", "batch_path", "target")
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        batch_path: str,
        cdc_conn_id: str | None = None,
        target: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.cdc_conn_id = cdc_conn_id
        self.batch_path = batch_path
        self.target = target

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors("commit"):
            batch = Batch(self.batch_path)
            hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
            capture = hook.get_capture(partition=batch.partition)  # the partition that captured it
            with capture.leases.hold("commit"):
                ensure_applied(batch, capture.config, self.target)
                version = capture.commit(batch)
        export_metrics(capture.metrics)  # duration, silver lag, the retained log, staged batches
        offset = batch.manifest["to_offset"]
        counts = batch.manifest.get("counts", {})
        self.log.info("committed batch %s: offset %s, state version %d", batch.batch_id, offset, version)
        if batch.empty:  # committed; skipped so that no Asset event wakes downstream DAGs for nothing
            raise AirflowSkipException(f"batch {batch.batch_id} held no events: no Asset event")
        self._annotate_assets(context, batch, counts)
        return {"batch_id": batch.batch_id, "offset": offset, "state_version": version, "counts": counts}

    def _annotate_assets(self, context: Context, batch: Batch, counts: dict[str, Any]) -> None:
        events = context.get("outlet_events")
        if events is None:
            return
        for outlet in self.outlets or []:
            table = (getattr(outlet, "extra", None) or {}).get("table")
            if table is None:
                continue
            rows = batch.manifest["tables"].get(table, {}).get("rows", 0)
            events[outlet].extra = {"batch_id": batch.batch_id, "rows": rows, "table": table}
