"""Verify that the silver tables equal the source (row counts and per-row hashes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook


class CdcVerifyOperator(BaseOperator):
    """Compare every captured table with its silver table; fail listing the differences.

    Read-only on both sides, so it can run at any time and be repeated.

    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param target: the Delta root. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "cdc_conn_id", "target")
    ui_color = "#e8daef"

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        target: str,
        cdc_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.target = target
        self.cdc_conn_id = cdc_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_cdc.apply.verify import verify  # the Spark-side comparison, owned by apply

        with airflow_errors("verify"):
            config = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id).get_conn()
            report = verify(config, self.target)
        differences = getattr(report, "differences", None)
        if not report.ok:
            raise AirflowFailException(f"silver differs from the source: {str(differences)[:4000]}")
        self.log.info("silver equals the source: %s", report)
        return {"ok": True, "report": str(report)[:2000]}
