"""Spark sessions for the apply job, tests, benchmarks and ``verify``: Delta configured, settings
sized to the cores and heap the session has.

``spark-submit`` runs pass the launch-time settings (driver memory, Delta jars) through
``airflow_cdc.apply.submit``; :func:`tune` then sizes the runtime settings inside the job, so every
path (CLI, Airflow operator, in-process) gets the same defaults.  Anything the user sets
explicitly (``--conf``, ``spark_conf``, the builder) wins.  Delta jars come from
:envvar:`AIRFLOW_CDC_DELTA_JARS` (a folder of jars fetched by ``make setup``) or from Maven
coordinates via ``spark.jars.packages``.
"""

from __future__ import annotations

import glob
import logging
import os

from pyspark.sql import SparkSession

from .layout import (
    CALL_SITES_CONF,
    DELTA_CONF,
    DELTA_PACKAGE,
    JARS_ENV,
    S3_LOG_STORE_CONF,
    default_driver_memory,
)

log = logging.getLogger("airflow_cdc.apply")

#: Small-machine defaults of in-process sessions: no UI, quiet progress bars, no call sites
#: recorded per DataFrame call.
LOCAL_CONF = {
    **DELTA_CONF,
    **CALL_SITES_CONF,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
MIB = 1 << 20


def runtime_defaults(cores: int, heap: int | None) -> dict[str, str]:
    """Runtime settings for ``cores`` task slots and a driver heap of ``heap`` bytes (None: a
    cluster, whose executors' heaps the driver cannot see).

    Spark's defaults suit clusters: 200 shuffle partitions and 50 Delta log-replay partitions are
    hundreds of tiny tasks on two cores.  Parquet row groups and read splits shrink with a small
    heap: a task holds a whole row group's column chunks while it reads or writes one.
    """
    out = {
        "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        "spark.databricks.delta.snapshotPartitions": str(max(1, cores)),
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(max(1, cores)),
    }
    if heap is not None:
        # two tasks per core may each hold a row group being read and one being written
        block = max(8 * MIB, min(128 * MIB, heap // (8 * max(1, cores)) // MIB * MIB))
        out["parquet.block.size"] = str(block)
        out["spark.sql.files.maxPartitionBytes"] = str(block)
        # a broadcast join builds the small side in the driver, uncompressed: its size estimate
        # comes from compressed files and shuffle blocks
        out["spark.sql.autoBroadcastJoinThreshold"] = str(min(10 * MIB, heap // 64))
    return out


def task_memory(spark: SparkSession) -> int:
    """Bytes one task may hold in a batch of rows it reads: 1/32 of its share of the heap (the
    driver's with a local master; ``spark.executor.memory`` / cores on a cluster).  A column
    vector grows by doubling into one contiguous array, and the rows are copied on downstream.
    Over Spark Connect the heap is the server's: its configured sizes stand in for it."""
    if connected(spark):
        master = spark.conf.get("spark.master", "local") or "local"
        local = master.startswith("local")
        size = spark.conf.get("spark.driver.memory" if local else "spark.executor.memory", "1g") or "1g"
        cores = _local_cores(master) if local else int(spark.conf.get("spark.executor.cores", "1") or 1)
        return byte_size(size) // (32 * max(1, cores))
    sc = spark.sparkContext
    if (sc.master or "").startswith("local"):
        heap = int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())  # type: ignore[union-attr]
        return heap // (32 * max(1, sc.defaultParallelism))
    conf = sc.getConf()
    heap = sc._jvm.org.apache.spark.util.Utils.byteStringAsBytes(  # type: ignore[union-attr]
        conf.get("spark.executor.memory", "1g")
    )
    return int(heap) // (32 * max(1, int(conf.get("spark.executor.cores", "1"))))


def connected(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM, no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def byte_size(text: str) -> int:
    """Spark's size strings (``512m``, ``2g``, ``1024k``; plain numbers are MiB for memory)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text)) << 20


def _local_cores(master: str) -> int:
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    if inside == "*":
        return os.cpu_count() or 1
    return int(inside.split(",")[0])


def user_set(spark: SparkSession, key: str) -> bool:
    """Whether the session's launch conf sets ``key`` (over Connect: whether the session has it)."""
    if connected(spark):
        try:
            return spark.conf.get(key, None) is not None
        except Exception:  # noqa: BLE001 - an unknown key without default
            return False
    return bool(spark.sparkContext.getConf().contains(key))


def size_reads(spark: SparkSession, row_bytes: int) -> int:
    """Size Parquet read batches for rows of about ``row_bytes`` bytes: the vectorized reader
    holds a batch of rows of every column at once (4,096 rows by default -- 400 MB of 100 KB
    blobs).  Returns the rows per batch set, unless the user chose a batch size."""
    key = "spark.sql.parquet.columnarReaderBatchSize"
    if not connected(spark) and spark.sparkContext.getConf().contains(key):
        return int(spark.conf.get(key) or 4096)
    rows = max(16, min(4096, task_memory(spark) // max(1, row_bytes)))
    spark.conf.set(key, str(rows))
    return rows


def tune(spark: SparkSession) -> dict[str, str]:
    """Apply :func:`runtime_defaults` for this session, except settings the user chose; returns
    what it set.  Over Spark Connect the server's own settings stand (it sized them at launch)."""
    if connected(spark):
        return {}
    sc = spark.sparkContext
    local = (sc.master or "").startswith("local")
    heap = int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory()) if local else None  # type: ignore[union-attr]
    chosen = sc.getConf()
    applied = {}
    for key, value in runtime_defaults(sc.defaultParallelism, heap).items():
        if not chosen.contains(key) and not chosen.contains(f"spark.hadoop.{key}"):
            spark.conf.set(key, value)
            applied[key] = value
    log.debug("session defaults: %s", applied)
    return applied


#: seconds a Spark Connect client keeps retrying an unreachable server (a restart takes 20-60 s)
#: before its job fails as "server lost" (pyspark's own default waits at least 10 minutes)
RETRY_ENV = "AIRFLOW_CDC_CONNECT_RETRY_SECONDS"


#: set (to anything) to log every Spark Connect RPC of a client job with its seconds and the job
#: line that made it, and a summary by line at exit: where a small apply's time goes
TRACE_ENV = "AIRFLOW_CDC_CONNECT_TRACE"


def _trace_rpcs(client: object) -> None:
    """Wrap the client's analyze and execute calls with timers (see :data:`TRACE_ENV`)."""
    import atexit
    import time
    import traceback

    totals: dict[str, list[float]] = {}

    def caller() -> str:
        for frame in reversed(traceback.extract_stack()[:-3]):
            if "cdc_apply" in frame.filename or "airflow_cdc" in frame.filename:
                return f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}"
        return "?"

    def timed(kind: str, call: object) -> object:
        def run(*args: object, **kwargs: object) -> object:
            began = time.monotonic()
            try:
                return call(*args, **kwargs)  # type: ignore[operator]
            finally:
                seconds = time.monotonic() - began
                where = f"{kind} {caller()}"
                totals.setdefault(where, []).append(seconds)
                log.warning("connect rpc %.3fs %s", seconds, where)

        return run

    client._analyze = timed("analyze", client._analyze)  # type: ignore[attr-defined]
    client._execute_and_fetch = timed("execute", client._execute_and_fetch)  # type: ignore[attr-defined]
    client._execute = timed("command", client._execute)  # type: ignore[attr-defined]

    def summary() -> None:
        ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))
        lines = [f"{sum(v):7.3f}s x{len(v):<3} {k}" for k, v in ranked]
        log.warning(
            "connect rpcs: %.3fs in %d\n%s",
            sum(map(sum, totals.values())),
            sum(map(len, totals.values())),
            "\n".join(lines),
        )

    atexit.register(summary)


def remote(url: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A Spark Connect client session of the server at ``url`` (``sc://host:port``), retrying an
    unreachable server for :data:`RETRY_ENV` seconds (120 by default), with the runtime settings
    ``conf`` and the UTC session time zone set on it."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    spark = SparkSession.builder.remote(url).getOrCreate()
    seconds = float(os.environ.get(RETRY_ENV) or 120)
    # pyspark's default policy with a 10 s backoff cap, as many retries as fit: 50 ms, 200 ms,
    # 800 ms, 3.2 s, then 10 s each
    waits, retries = [0.05, 0.2, 0.8, 3.2], 0
    while sum(waits[:retries]) < seconds:
        retries += 1
        if retries > len(waits):
            waits.append(10.0)
    spark.client.set_retry_policies([DefaultPolicy(max_retries=max(1, retries), max_backoff=10_000)])  # type: ignore[attr-defined]
    if os.environ.get(TRACE_ENV):
        _trace_rpcs(spark.client)  # type: ignore[attr-defined]
    for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
        spark.conf.set(key, value)
    return spark


def build(master: str = "local[2]", app_name: str = "airflow-cdc", **conf: str) -> SparkSession:
    """Get or create a SparkSession with Delta configured and :func:`tune` applied."""
    builder = SparkSession.builder.master(master).appName(app_name)
    folder = os.environ.get(JARS_ENV)
    if folder:
        builder = builder.config("spark.jars", ",".join(sorted(glob.glob(os.path.join(folder, "*.jar")))))
    else:
        builder = builder.config("spark.jars.packages", DELTA_PACKAGE)
    # our put-if-absent S3 log store is in the jar folder only (not on Maven Central)
    store = S3_LOG_STORE_CONF if folder else {}
    defaults = {**LOCAL_CONF, **store, "spark.driver.memory": default_driver_memory(master)}
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    tune(spark)
    return spark
