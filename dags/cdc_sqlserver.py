"""Example: SQL Server -> Delta Lake CDC from one pipeline file (CDC change tables, LSN positions).

Same shape as ``cdc_postgres.py``; needs the Connection ``cdc_sqlserver_default`` (docker-compose
defines it against its SQL Server 2022 with CDC and the Agent enabled) plus ``spark_default``,
``AIRFLOW_CDC_DATA`` and ``AIRFLOW_CDC_STATE_STORE``.  The sensor's check is one
``sys.fn_cdc_get_max_lsn()`` against the stored offset: a run captures only when the capture job
copied new changes.
"""

from __future__ import annotations

from pathlib import Path

from airflow_cdc.airflow.dag_factory import cdc_dag

dag = cdc_dag(Path(__file__).parent / "pipelines" / "sqlserver_shop.yaml")
