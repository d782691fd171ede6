"""Example: PostgreSQL -> Delta Lake CDC, one DAG from one pipeline file.

sense (deferrable) -> capture -> apply (spark-submit) -> commit, every 5 minutes, one run at a time.
Needs the Connections ``cdc_postgres_default`` (source) and ``spark_default`` (Spark master) and the
environment variables ``AIRFLOW_CDC_DATA`` (staging + Delta root) and ``AIRFLOW_CDC_STATE_STORE``
(e.g. ``airflow-variable://`` or ``postgresql://...?table=cdc_state``).  ``make demo`` and
``docker-compose.yml`` set all of them.
"""

from __future__ import annotations

from pathlib import Path

from airflow_cdc.airflow.dag_factory import cdc_dag

dag = cdc_dag(Path(__file__).parent / "pipelines" / "postgres_shop.yaml")
