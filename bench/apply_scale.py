"""Benchmark: the cost of a small batch into big silver tables.  A batch of 5,000 updates of
random keys is applied (silver only) to silver tables of 0.2M, 2M and 10M rows, in one warm Spark
session (local[2]); per size the median of ``--repeats`` batches, the files the MERGE rewrote,
the unchanged rows it copied and the deletion vectors it wrote.  The silver tables are built with
a plain Delta write (the layout an initial snapshot apply gives them), not through apply, with the
job's default table properties: deletion vectors on (``--no-deletion-vectors``: as
``delta.deletion.vectors.enabled: false`` creates them, for a before/after under the same load).
On tables with deletion vectors the job MERGEs this batch in one scan of the stored keys
(``spark_jobs/cdc_apply/vectors.py``); ``--delta-merge`` runs Delta's own MERGE instead.

Headline (last line): ``apply_scale: <median s> s per batch into 10M rows; ratio <x> vs 0.2M rows``
(ratio = median at the largest size / median at the smallest; the target is <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from _common import REPO, fmt, log, median  # noqa: I001
from delta_apply import COLUMNS, write_batch

os.environ.setdefault("AIRFLOW_CDC_DELTA_JARS", str(REPO / ".jars"))

BATCH_POS0 = 1 << 40  # batch positions above every stored one


def build_silver(spark, path: str, rows: int, vectors: bool = True) -> None:
    """A silver table of ``rows`` keys as the apply job lays it out, written in one plain write
    (``vectors``: with deletion vectors, as the job creates it by default)."""
    from pyspark.sql import functions as F

    from spark_jobs.cdc_apply import silver
    from spark_jobs.cdc_apply.frames import TableFrame
    from spark_jobs.cdc_apply.types import natural
    from spark_jobs.cdc_apply.writes import create_table

    columns = {f.name: natural(f).spark_type for f in COLUMNS}
    frame = TableFrame(None, columns, ["id"], None)  # type: ignore[arg-type]
    schema = silver.target_schema(frame, soft=False)
    properties = silver.table_properties(deletion_vectors=vectors)
    create_table(spark, path, schema, properties)
    ids = spark.range(rows).withColumnRenamed("id", "i")
    data = ids.select(
        F.col("i").alias("id"),
        (F.col("i") % 1024).cast("int").alias("qty"),
        ((F.col("i") % 100000) / 100).cast("decimal(12,2)").alias("price"),
        F.concat(F.lit("customer-"), F.col("i").cast("string"), F.lit("-v1")).alias("label"),
        F.lit("2024-01-01 00:00:00").cast("timestamp").alias("created"),
        (F.col("i") % 2 == 1).alias("active"),
        F.lit('{"k": 1}').alias("attrs"),
        F.concat(F.unhex(F.lpad(F.hex("i"), 16, "0")), F.unhex(F.lit("0" * 16))).alias("__position"),
        F.lit("r").alias("__op"),
        F.lit(1_700_000_000_000).alias("__ts_ms"),
        F.lit("seed").alias("__batch_id"),
        F.lit(None).cast(silver.PENDING_TYPE).alias("__pending"),
    )
    data.write.format("delta").mode("append").save(path)


def files_changed(spark, path: str) -> dict[str, int]:
    """What the newest commit of ``path`` did (Delta's operation metrics)."""
    row = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]
    metrics = row["operationMetrics"] or {}
    keys = (
        "numTargetFilesRemoved",
        "numTargetFilesAdded",
        "numTargetDeletionVectorsAdded",
        "numTargetRowsCopied",
        "numTargetRowsUpdated",
        "numRemovedFiles",
        "numAddedFiles",
    )
    return {"operation": row["operation"], **{k: int(metrics[k]) for k in keys if k in metrics}}


def run(
    spark, work: Path, sizes: list[int], updates: int, repeats: int, settings, vectors: bool = True
) -> tuple[dict[int, list[float]], dict[int, list[tuple[int, int, int]]]]:
    """Per size: the seconds of each timed batch, and per batch the files it rewrote, the
    unchanged rows it copied and the deletion vectors it wrote."""
    from spark_jobs.cdc_apply.job import apply_batch

    rng = random.Random(11)
    out: dict[int, list[float]] = {}
    rewritten: dict[int, list[tuple[int, int, int]]] = {}
    for size in sizes:
        path = work / f"lake-{size}"
        silver_path = path / "silver" / "bench" / "public.items"
        t0 = time.perf_counter()
        build_silver(spark, str(silver_path), size, vectors)
        files = spark.read.format("delta").load(str(silver_path)).inputFiles()
        log(f"silver of {size:,} rows built in {time.perf_counter() - t0:.1f}s ({len(files)} files)")
        times = []
        for r in range(repeats + 1):  # the first batch warms this table's code paths up
            ids = pa.array([rng.randrange(size) for _ in range(updates)], pa.int64())
            batch = write_batch(
                work / f"staging-{size}",
                f"20260101T00000000000{r}Z-{size}",
                "u",
                ids,
                2 + r,
                BATCH_POS0 * (r + 1),
                100_000,
            )
            t0 = time.perf_counter()
            report = apply_batch(spark, str(batch), str(path), settings)
            took = time.perf_counter() - t0
            changed = files_changed(spark, str(silver_path))
            log(
                f"  {size:,} rows, batch {r}: {took:.2f}s {report['tables']['public.items']['silver']} {json.dumps(changed)}"
            )
            if r:
                times.append(took)
                rewritten.setdefault(size, []).append(
                    (
                        changed.get("numTargetFilesRemoved", changed.get("numRemovedFiles", 0)),
                        changed.get("numTargetRowsCopied", 0),
                        changed.get("numTargetDeletionVectorsAdded", 0),
                    )
                )
        out[size] = times
        shutil.rmtree(path, ignore_errors=True)
    return out, rewritten


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="200000,2000000,10000000")
    p.add_argument("--updates", type=int, default=5_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--deletion-vectors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="silver tables with deletion vectors, the job's default (--no-deletion-vectors: as "
        "delta.deletion.vectors.enabled: false creates them, MERGE copies the files it touches)",
    )
    p.add_argument(
        "--full-merge",
        action="store_true",
        help="the MERGE that reads stored values (as when rows wait for unchanged-TOAST values), "
        "instead of the lean one this batch qualifies for",
    )
    p.add_argument(
        "--delta-merge",
        action="store_true",
        help="Delta's own MERGE for the lean batch too (the one-scan vector MERGE is what the job "
        "uses on tables with deletion vectors): the before of a before/after",
    )
    args = p.parse_args()
    from spark_jobs.cdc_apply import session, silver
    from spark_jobs.cdc_apply.job import ApplySettings

    if args.full_merge:
        silver.has_pending = lambda *args: True
    if args.delta_merge:
        from spark_jobs.cdc_apply import vectors

        vectors.applies = lambda state, table_columns, carried: False

    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-apply-scale-"))
    try:
        spark = session.build(app_name="bench-apply-scale")
        vectors = args.deletion_vectors
        settings = ApplySettings(bronze=False, deletion_vectors=vectors)
        times, rewritten = run(spark, work, sizes, args.updates, args.repeats, settings, vectors)
        for size in sizes:
            log(
                f"{size:>12,} rows: {fmt(times[size], 2)} s, median {median(times[size]):.2f}s; per batch "
                f"files rewritten {[r[0] for r in rewritten[size]]}, unchanged rows copied "
                f"{[r[1] for r in rewritten[size]]}, deletion vectors written {[r[2] for r in rewritten[size]]}"
            )
        ratio = median(times[sizes[-1]]) / median(times[sizes[0]])
        spark.stop()
        print(
            f"apply_scale: {median(times[sizes[-1]]):.2f} s per batch into {sizes[-1]:,} rows; "
            f"ratio {ratio:.2f} vs {sizes[0]:,} rows"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
