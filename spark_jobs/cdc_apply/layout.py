"""Where things live and which Delta build to use: shared by the job, ``airflow_cdc.apply``
and the Airflow layer (no pyspark import here)."""

from __future__ import annotations

import os
from urllib.parse import quote

DELTA_VERSION = "4.4.0"
SPARK_SCALA = "4.2_2.13"
DELTA_PACKAGE = f"io.delta:delta-spark_{SPARK_SCALA}:{DELTA_VERSION}"
#: S3A (``s3a://``) for pyspark's Hadoop 3.5.0: hadoop-aws and the AWS SDK v2 modules it uses
#: (not the SDK's 686 MB bundle).  ``make setup`` puts the same jars into the jar folder.
HADOOP_AWS_VERSION = "3.5.0"
AWS_SDK_VERSION = "2.35.4"
S3A_PACKAGES = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
    *(f"software.amazon.awssdk:{m}:{AWS_SDK_VERSION}" for m in ("s3", "s3-transfer-manager", "sts")),
)
#: A folder of Delta jars (``make setup`` fills ``.jars/`` with Maven); preferred over
#: ``spark.jars.packages`` when set, for machines without Ivy access to Maven Central.
JARS_ENV = "AIRFLOW_CDC_DELTA_JARS"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
}
#: PySpark 4 records the Python call site of every DataFrame and Column call for its error
#: messages' query context: three or four Py4J round trips and a stack walk per call.  An apply
#: builds plans of hundreds of calls per table (0.3-0.6 s of a 4 s backlog apply, measured
#: 2026-12-06), and its errors name their table and step themselves.  A launch-time setting.
CALL_SITES_CONF = {"spark.python.sql.dataFrameDebugging.enabled": "false"}
#: Spark settings for Delta tables on S3 (s3a://, and s3:// where it is S3A): our LogStore
#: (scripts/logstore/, ``make setup`` puts its jar into the jar folder) writes each commit file
#: put-if-absent (S3 conditional write, If-None-Match: *), so a second driver -- a zombie whose
#: lease expired after its fence check -- loses the race for a version and Delta retries it at
#: the next one, instead of overwriting a commit as Delta's default S3SingleDriverLogStore would.
#: Launch-time settings: Delta reads them from the SparkConf a session starts with.
S3_LOG_STORE_CONF = {
    "spark.delta.logStore.s3a.impl": "io.airflowcdc.delta.S3ConditionalLogStore",
    "spark.delta.logStore.s3.impl": "io.airflowcdc.delta.S3ConditionalLogStore",
    "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
}
LAYERS = ("bronze", "silver", "tombstones", "history", "history_log")


def table_path(target: str, layer: str, connector: str, table: str) -> str:
    """Where the Delta table of ``layer`` lives for source table ``table`` (e.g. ``public.orders``)."""
    if layer not in LAYERS:
        raise ValueError(f"unknown Delta layer {layer!r}; expected one of {', '.join(LAYERS)}")
    return f"{target.rstrip('/')}/{layer}/{quote(connector, safe='')}/{quote(table, safe='.')}"


def app_id(connector: str, batch_id: str) -> str:
    """The Delta idempotent-transaction id of one batch's writes."""
    return f"airflow-cdc:{connector}:{batch_id}"


#: Spark's own default driver heap (1 GiB) is what a batch of wide rows ran out of; these bound it
GIB = 1 << 30


def default_driver_memory(master: str | None = None) -> str:
    """``spark.driver.memory`` when the caller sets none: with a local master the driver JVM does
    all the work, so a quarter of this machine's memory, between 1 and 4 GiB; else 2 GiB."""
    if master is not None and not master.startswith("local"):
        return "2g"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "2g"
    return f"{max(1, min(4, total // 4 // GIB))}g"


#: Exit codes of ``apply_changes.py`` besides 0 (done) and 1 (an unexpected error: see its output).
#: Anything killed by a signal exits by that signal (or 128 + signal through a shell).
EXIT_DAMAGED = 3  # a staged file is missing or unreadable: the batch itself is broken
EXIT_SCHEMA = 4  # a column type change Delta cannot take; nothing was written
EXIT_FENCED = 5  # a newer lease holder already wrote these tables; this run stopped
EXIT_MEMORY = 6  # the driver JVM ran out of memory; the batch is fine, nothing half-applied counts
EXIT_STORAGE = 7  # the object store (s3a://) failed or was unreachable; nothing half-applied counts
EXIT_REMOTE = 8  # the Spark Connect server was unreachable or went away mid-apply; re-run
EXIT_CATALOG = 9  # a delta.catalog name is taken by a table at another location
