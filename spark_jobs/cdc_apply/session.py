"""A local SparkSession with Delta Lake, for tests, benchmarks, ``verify`` and local runs.

``spark-submit`` runs pass the same settings through ``airflow_cdc.apply.submit``; this builder
exists for in-process use.  Delta jars come from :envvar:`AIRFLOW_CDC_DELTA_JARS` (a folder of
jars fetched by ``make setup``) or from Maven coordinates via ``spark.jars.packages``.
"""

from __future__ import annotations

import glob
import os

from pyspark.sql import SparkSession

from .layout import DELTA_CONF, DELTA_PACKAGE, JARS_ENV

#: Small-machine defaults: few shuffle partitions, no UI, quiet progress bars.
LOCAL_CONF = {
    **DELTA_CONF,
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}


def build(master: str = "local[2]", app_name: str = "airflow-cdc", **conf: str) -> SparkSession:
    """Get or create a SparkSession with Delta configured."""
    builder = SparkSession.builder.master(master).appName(app_name)
    folder = os.environ.get(JARS_ENV)
    if folder:
        builder = builder.config("spark.jars", ",".join(sorted(glob.glob(os.path.join(folder, "*.jar")))))
    else:
        builder = builder.config("spark.jars.packages", DELTA_PACKAGE)
    for key, value in {**LOCAL_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
