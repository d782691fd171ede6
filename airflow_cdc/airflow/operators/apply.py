"""Apply a staged batch to Delta Lake with ``spark-submit`` (a ``SparkSubmitOperator``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.apply.submit import ApplyOptions, build_apply_job
from airflow_cdc.core.batch import Batch


class CdcApplyOperator(SparkSubmitOperator):
    """Run ``spark_jobs/apply_changes.py`` on one batch: bronze change log + silver MERGE.

    The spark-submit arguments come from :func:`airflow_cdc.apply.submit.build_apply_job` at execute
    time (the batch path is only known then); the Spark master comes from ``conn_id`` (a Spark
    Connection, e.g. host ``local[2]`` or ``spark://master:7077``).  Re-running on an applied batch
    changes nothing, so retries are safe.  A batch without events or snapshot rows is not submitted.

    :param batch_path: the staged batch directory, usually the capture task's XCom. (templated)
    :param target: the Delta root (``<target>/<layer>/<connector>/<table>``). (templated)
    :param spark_conf: extra Spark conf; overrides the Delta defaults. (templated)
    :param delete_mode: ``delete`` or ``soft`` (keep rows flagged ``__deleted``).
    :param history: also maintain SCD type 2 history tables.
    :param bronze: append events to the bronze change log.
    :param skip_empty: do not start Spark for a batch with nothing in it.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "batch_path",
        "target",
        "spark_conf",
    )
    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        batch_path: str,
        target: str,
        spark_conf: dict[str, str] | None = None,
        delete_mode: str = "delete",
        history: bool = False,
        bronze: bool = True,
        skip_empty: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.batch_path = batch_path
        self.target = target
        self.spark_conf = spark_conf
        self.options = ApplyOptions(delete_mode=delete_mode, history=history, bronze=bronze)
        self.skip_empty = skip_empty

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        with airflow_errors("apply"):
            batch = Batch(self.batch_path)
            counts = batch.manifest.get("counts", {})
            if self.skip_empty and not batch.tables() and not batch.manifest.get("messages"):
                self.log.info("batch %s holds no events: nothing to apply", batch.batch_id)
                return {"batch_id": batch.batch_id, "applied": False}
            job = build_apply_job(batch.path, self.target, options=self.options, conf=self.spark_conf)
        self.application = job.application
        self.application_args = job.application_args
        self.conf = dict(job.conf)
        self.packages = job.packages
        self.jars = job.jars
        self.py_files = job.py_files
        self.name = job.name
        # the job's Python workers run on this interpreter unless the caller says otherwise
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {}), **job.env}
        self.log.info(
            "applying batch %s (%s events, %s snapshot rows) to %s",
            batch.batch_id,
            counts.get("events"),
            counts.get("snapshot_rows"),
            self.target,
        )
        super().execute(context)
        return {"batch_id": batch.batch_id, "applied": True}
