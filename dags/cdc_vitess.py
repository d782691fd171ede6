"""Example: Vitess -> Delta Lake CDC from one pipeline file (vtgate VStream, VGTID offsets).

Same shape as ``cdc_postgres.py``; vtgate's address is in the pipeline file (no Connection), plus
``spark_default``, ``AIRFLOW_CDC_DATA`` and ``AIRFLOW_CDC_STATE_STORE``.  The sensor compares the
shards' current VGTID with the committed one (one short VStream call, no rows read); the initial
snapshot is Vitess's copy phase, spread over runs by ``run.max.events``.
"""

from __future__ import annotations

from pathlib import Path

from airflow_cdc.airflow.dag_factory import cdc_dag

dag = cdc_dag(Path(__file__).parent / "pipelines" / "vitess_commerce.yaml")
