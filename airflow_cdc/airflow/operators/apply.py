"""Apply a staged batch to Delta Lake with ``spark-submit`` (a ``SparkSubmitOperator``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook
from airflow_cdc.airflow.links import CdcBatchLink, CdcDeltaLink, storage_url
from airflow_cdc.airflow.metrics import record_and_export
from airflow_cdc.apply.submit import ApplyOptions, apply_exit_error, build_apply_job, run_apply_job
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.lease import Leases
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.core.step_metrics import record_apply


def _local_spark_env() -> dict[str, str]:
    """Defaults for a pip-installed Spark: Python workers on this interpreter, and ``SPARK_HOME`` when
    the ``spark-submit`` on PATH is pyspark's wrapper next to it (which cannot find Spark on its own
    unless this interpreter is first on PATH)."""
    env = {"PYSPARK_PYTHON": sys.executable}
    found = shutil.which("spark-submit")
    if "SPARK_HOME" not in os.environ and found and Path(found).parent == Path(sys.executable).parent:
        spec = importlib.util.find_spec("pyspark")
        if spec is not None and spec.submodule_search_locations:
            env["SPARK_HOME"] = next(iter(spec.submodule_search_locations))
    return env


class CdcApplyOperator(SparkSubmitOperator):
    """Run ``spark_jobs/apply_changes.py`` on one batch: bronze change log + silver MERGE.

    The spark-submit arguments come from :func:`airflow_cdc.apply.submit.build_apply_job` at execute
    time (the batch path is only known then); the Spark master comes from ``conn_id`` (a Spark
    Connection, e.g. host ``local[2]`` or ``spark://master:7077``).  Re-running on an applied batch
    changes nothing, so retries are safe.  A batch without events or snapshot rows is not submitted.

    Given the ``pipeline``, the task holds the connector's lease around spark-submit (two applies
    of one connector never overlap; a busy connector fails the task as retryable) and hands the
    lease's fencing token to the job.  A killed spark-submit (signal, out of memory) fails as
    "interrupted: re-run apply" (retryable); a damaged batch, a refused schema change or a job
    error each fail with their own message and next step.

    With the ``pipeline`` known, the step's metrics (duration, silver's lag, batches not applied)
    are saved for ``status`` and sent to Airflow's metrics backend.

    :param batch_path: the staged batch directory, usually the capture task's XCom. (templated)
    :param target: the Delta root (``<target>/<layer>/<connector>/<table>``). (templated)
    :param spark_conf: extra Spark conf; overrides the Delta defaults. (templated)
    :param delete_mode: ``delete`` or ``soft`` (keep rows flagged ``__deleted``).
    :param bronze: append events to the bronze change log.
    :param options: all apply options at once (``delete_mode`` and ``bronze`` are then ignored).
    :param skip_empty: do not start Spark for a batch with nothing in it: the task is skipped
        (the commit task still runs, see :func:`~airflow_cdc.airflow.dag_factory.cdc_dag`).
    :param pipeline: pipeline file path or mapping, to hold the connector's lease. (templated)
    :param cdc_conn_id: Airflow Connection of the source database (with ``pipeline``). (templated)
    :param spark_remote: a Spark Connect server (``sc://host:15002``) to apply through instead of
        ``spark-submit``: the task runs the job as its client (no Java or jars on the worker).
        Default: the pipeline's ``spark.remote``, else the ``conn_id`` Connection when it is of
        type ``spark_connect`` (Airflow's Spark Connect connection: host, port, token). (templated)
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "batch_path",
        "target",
        "spark_conf",
        "pipeline",
        "cdc_conn_id",
        "spark_remote",
    )
    ui_color = "#fdebd0"
    operator_extra_links = (CdcBatchLink(), CdcDeltaLink())

    def __init__(
        self,
        *,
        batch_path: str,
        target: str,
        spark_conf: dict[str, str] | None = None,
        delete_mode: str = "delete",
        bronze: bool = True,
        options: ApplyOptions | None = None,
        skip_empty: bool = True,
        pipeline: str | Mapping[str, Any] | None = None,
        cdc_conn_id: str | None = None,
        spark_remote: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spark_remote = spark_remote
        self.pipeline = pipeline
        self.cdc_conn_id = cdc_conn_id
        self.batch_path = batch_path
        self.target = target
        self.spark_conf = spark_conf
        self.options = options or ApplyOptions(delete_mode=delete_mode, bronze=bronze)
        self.skip_empty = skip_empty

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        if not self.batch_path:  # a partition whose capture was skipped, in a row of applies
            raise AirflowSkipException("no batch to apply: the capture did not run")
        with airflow_errors("apply"):
            batch = Batch(self.batch_path)
        CdcBatchLink().persist(context, storage_url(self.batch_path))
        CdcDeltaLink().persist(context, storage_url(self.target))
        if self.skip_empty and batch.empty:  # commit still runs: the offset may move
            raise AirflowSkipException(f"batch {batch.batch_id} holds no events: nothing to apply")
        with airflow_errors("apply"):
            if self.pipeline is None:
                self.log.warning("no pipeline given: applying without the connector lease")
                self._submit(context, batch, None, self._remote(None))
            else:
                hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
                config = hook.get_partition(batch.partition)  # the lease of the partition that captured it
                self._lineage_config = config
                leases = Leases(build_store(config), config.state_name, config["lease.timeout.ms"] / 1000)
                started = time.monotonic()
                with leases.hold("apply") as lease:
                    self._submit(context, batch, lease, self._remote(config["spark.remote"]))
                seconds = time.monotonic() - started
                record_and_export(lambda: record_apply(config, [batch.manifest], seconds))
        return {"batch_id": batch.batch_id, "applied": True}

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the batch's source tables in (when the pipeline is known), its bronze and
        silver Delta tables out."""
        from airflow_cdc.airflow.lineage import delta_datasets, operator_lineage, source_datasets

        batch = Batch(self.batch_path)
        tables = batch.tables()
        config = getattr(self, "_lineage_config", None)
        inputs = source_datasets(config, tables) if config is not None else []
        outputs = delta_datasets(self.target, batch.manifest["connector"], tables, self.options.bronze)
        return operator_lineage(inputs, outputs)

    def _remote(self, configured: str | None) -> str | None:
        """The Spark Connect server to apply through: the operator's, the pipeline's, or the
        ``conn_id`` Connection's when it is a ``spark_connect`` one; None: ``spark-submit``."""
        if self.spark_remote or configured:
            return self.spark_remote or configured
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            connection = SparkConnectHook.get_connection(self._conn_id)
        except Exception:  # noqa: BLE001 - no such Connection: spark-submit's own default applies
            return None
        if connection.conn_type != SparkConnectHook.conn_type:
            return None
        return SparkConnectHook(self._conn_id).get_connection_url()

    def _submit(self, context: Context, batch: Batch, lease: Any, remote: str | None) -> None:
        counts = batch.manifest.get("counts", {})
        fence = lease.token if lease is not None else None
        job = build_apply_job(
            batch.path, self.target, options=self.options, conf=self.spark_conf, fence=fence, remote=remote
        )
        self.application = job.application
        self.application_args = job.application_args
        self.conf = dict(job.conf)
        self.packages = job.packages
        self.jars = job.jars
        self.py_files = job.py_files
        self.name = job.name
        # the job's Python workers run on this interpreter unless the caller says otherwise
        self.env_vars = {**_local_spark_env(), **job.env, **(self.env_vars or {})}
        self.log.info(
            "applying batch %s (%s events, %s snapshot rows) to %s",
            batch.batch_id,
            counts.get("events"),
            counts.get("snapshot_rows"),
            self.target,
        )
        if job.remote:  # the Connect client runs here, in a child process (a fail point kills only it)
            run_apply_job(job, lease=lease)
            return
        try:
            super().execute(context)
        except AirflowException as e:  # the hook only says "Error code is: N"; say what N means
            code = _EXIT_CODE.search(str(e))
            if code is None:
                raise
            raise apply_exit_error(int(code.group(1)), batch.batch_id) from e


_EXIT_CODE = re.compile(r"[Ee]rror code is:? *(-?\d+)")
