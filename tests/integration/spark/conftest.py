"""Session-scoped SparkSession with Delta (local[2]) for the apply tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pytest.importorskip("pyspark")
    from spark_jobs.cdc_apply import session
    from spark_jobs.cdc_apply.layout import JARS_ENV

    if not os.environ.get(JARS_ENV) and (REPO / ".jars").is_dir():
        os.environ[JARS_ENV] = str(REPO / ".jars")
    os.environ.setdefault("TZ", "UTC")
    spark = session.build(app_name="airflow-cdc-tests")
    try:
        yield spark
    finally:
        spark.stop()
