"""Benchmark: apply 1M staged events (300k inserts, then 700k updates of those 300k keys) into a
silver Delta table on local[2], against a plain Delta overwrite of the same final rows read from
the same Parquet, in the same Spark session, after an untimed warm-up round (``--warmup``).

The batches are synthesised in the staged format (manifest + envelope Parquet, the columns of
bench/_common.TABLE_DDL as the PostgreSQL capture encodes them), so the benchmark needs no
database.  The applies run batch by batch and as a backlog (both batches in one ``apply_batches`` call, as
``airflow-cdc apply`` applies the batches it finds staged).  Headline (last line): ``delta_apply:
<events/s> events/s; ratio <x> vs plain Delta overwrite`` for the backlog, with the batch-by-batch
ratio beside it.

Each round times the overwrite and the applies back to back, the overwrite first in odd rounds and
last in even ones (what runs second in a session finds the heap the first left).  A ratio is the
median over rounds of each round's overwrite time / apply time: a round's two runs see the same
machine, so a slow stretch of a shared machine moves both, where the ratio of the two medians
takes them from different rounds.  The ratio of the medians is logged beside it.

``--stages`` turns Spark's UI on and logs, after each timed overwrite and silver backlog, its
Spark jobs by wall time (start to end, with what called them) and the executor seconds of their
stages, from the UI's REST API: where the apply spends its time against the overwrite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import urllib.request
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _common import REPO, fmt, log, median  # noqa: I001

from airflow_cdc.core.events import TRANSACTION_TYPE, envelope_schema
from airflow_cdc.sources.postgres.tables import SOURCE_TYPE

os.environ.setdefault("AIRFLOW_CDC_DELTA_JARS", str(REPO / ".jars"))

KAFKA_DECIMAL = {
    b"connect.type": b"bytes",
    b"connect.name": b"org.apache.kafka.connect.data.Decimal",
    b"connect.parameters": b'{"scale": "2", "connect.decimal.precision": "12"}',
}
COLUMNS = [
    pa.field("id", pa.int64(), metadata={b"connect.type": b"int64"}),
    pa.field("qty", pa.int32(), metadata={b"connect.type": b"int32"}),
    pa.field("price", pa.decimal128(12, 2), metadata=KAFKA_DECIMAL),
    pa.field("label", pa.string(), metadata={b"connect.type": b"string"}),
    pa.field(
        "created",
        pa.string(),
        metadata={b"connect.type": b"string", b"connect.name": b"io.debezium.time.ZonedTimestamp"},
    ),
    pa.field("active", pa.bool_(), metadata={b"connect.type": b"boolean"}),
    pa.field(
        "attrs", pa.string(), metadata={b"connect.type": b"string", b"connect.name": b"io.debezium.data.Json"}
    ),
]


def _rows(ids: pa.Array, version: int) -> pa.StructArray:
    n = len(ids)
    qty = pc.cast(pc.add(pc.bit_wise_and(ids, 1023), version), pa.int32())
    price = pa.array([Decimal(i % 100000) / 100 + version for i in ids.to_pylist()], pa.decimal128(12, 2))
    label = pc.binary_join_element_wise(
        pa.array(["customer-"] * n), pc.cast(ids, pa.string()), f"-v{version}", ""
    )
    created = pa.array(["2024-01-01T00:00:00Z"] * n)
    active = pc.equal(pc.bit_wise_and(ids, 1), version % 2)
    attrs = pa.array([f'{{"k": {version}}}'] * n)
    return pa.StructArray.from_arrays([ids, qty, price, label, created, active, attrs], fields=COLUMNS)


def _positions(start: int, n: int) -> pa.Array:
    return pa.array([(start + i).to_bytes(8, "big") + b"\0" * 8 for i in range(n)], pa.binary())


def _source(n: int) -> pa.Array:
    """``n`` copies of the bench's constant ``source`` struct."""
    one = {
        "version": "bench",
        "connector": "postgresql",
        "name": "bench",
        "ts_ms": 0,
        "snapshot": "false",
        "db": "bench",
        "schema": "public",
        "table": "items",
    }
    return pa.array([one] * n, SOURCE_TYPE)


def write_manifest(path: Path, batch_id: str, parts: list[dict], rows: int, from_offset: dict | None) -> None:
    """The batch's ``manifest.json``: its ``parts`` of ``public.items``, ``rows`` in all."""
    manifest = {
        "format": 1,
        "batch_id": batch_id,
        "connector": "bench",
        "messages": [],
        "tables": {
            "public.items": {
                "schema": "public",
                "table": "items",
                "key_columns": ["id"],
                "parts": parts,
                "rows": rows,
            }
        },
        "from_offset": from_offset or {},
        "to_offset": {"lsn": batch_id},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))


def write_batch(
    root: Path,
    batch_id: str,
    op: str,
    ids: pa.Array,
    version: int,
    pos0: int,
    piece: int,
    from_offset: dict | None = None,
) -> Path:
    schema = envelope_schema(COLUMNS, SOURCE_TYPE)
    path = root / "bench" / "batches" / batch_id
    (path / "tables" / "public.items").mkdir(parents=True)
    parts = []
    for k, lo in enumerate(range(0, len(ids), piece)):
        chunk = ids.slice(lo, piece)
        n = len(chunk)
        after = _rows(chunk, version)
        before = _rows(chunk, version - 1) if op == "u" else pa.nulls(n, after.type)
        source = _source(n)
        table = pa.Table.from_arrays(
            [
                pa.array([op] * n),
                pa.array([1_700_000_000_000] * n, pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.int64()),
                pa.array([1_700_000_000_000_000_000] * n, pa.int64()),
                before,
                after,
                source,
                pa.nulls(n, TRANSACTION_TYPE),
                _positions(pos0 + lo, n),
                pa.nulls(n, pa.list_(pa.string())),
            ],
            schema=schema,
        )
        rel = f"tables/public.items/part-{k:05d}.parquet"
        pq.write_table(table, path / rel)
        parts.append({"file": rel, "rows": n, "kind": "stream", "schema_version": "v1", "ops": {op: n}})
    write_manifest(path, batch_id, parts, len(ids), from_offset)
    return path


def make_batches(root: Path, keys: int, updates: int) -> list[Path]:
    import random

    rng = random.Random(7)
    first = write_batch(
        root, "20260101T000000000000Z-000001", "c", pa.array(range(keys), pa.int64()), 1, 0, 100_000
    )
    upd = pa.array([rng.randrange(keys) for _ in range(updates)], pa.int64())
    second = write_batch(
        root, "20260101T000000000001Z-000002", "u", upd, 2, keys, 100_000, {"lsn": first.name}
    )
    return [first, second]


def run_apply(spark, batches: list[Path], target: str, bronze: bool, always_merge: bool = False) -> float:
    from spark_jobs.cdc_apply.job import ApplySettings, apply_batch

    settings = ApplySettings(bronze=bronze)
    if always_merge:
        settings = ApplySettings(bronze=bronze, rewrite_ratio=0)
    start = time.perf_counter()
    for b in batches:
        report = apply_batch(spark, str(b), target, settings)
        done = report["tables"]["public.items"]
        bronze_way = f"bronze {done['bronze']}, " if "bronze" in done else ""
        log(f"  {b.name}: {bronze_way}silver {done['silver']} in {report['seconds']:.1f}s")
    return time.perf_counter() - start


def run_backlog(spark, batches: list[Path], target: str, bronze: bool) -> float:
    """Both batches in one ``apply_batches`` call, as ``airflow-cdc apply`` applies staged batches."""
    from spark_jobs.cdc_apply.job import ApplySettings, apply_batches

    start = time.perf_counter()
    report = apply_batches(spark, [str(b) for b in batches], target, ApplySettings(bronze=bronze))
    done = report["tables"]["public.items"]
    log(f"  backlog of {done['batches']}: {done.get('bronze', 'no bronze')}, silver {done['silver']}")
    return time.perf_counter() - start


def run_overwrite(spark, batches: list[Path], target: str) -> float:
    from pyspark.sql import functions as F

    start = time.perf_counter()
    files = [str(p) for b in batches for p in sorted((b / "tables" / "public.items").glob("*.parquet"))]
    events = spark.read.parquet(*files).select("__position", "after.*")
    final = (
        events.groupBy("id")
        .agg(F.max_by(F.struct(*[c for c in events.columns if c != "id"]), "__position").alias("r"))
        .select("id", "r.*")
        .drop("__position")
    )
    final.write.format("delta").mode("overwrite").save(target)
    return time.perf_counter() - start


def round_ratios(base: list[float], runs: list[float]) -> list[float]:
    """Each round's ``base`` time / its ``runs`` time."""
    return [b / r for b, r in zip(base, runs, strict=True)]


def paired(base: list[float], runs: list[float]) -> float:
    """The median over rounds of :func:`round_ratios`."""
    return median(round_ratios(base, runs))


def _ui_time(text: str) -> float:
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


class StageLog:
    """Spark jobs run since the last :meth:`report`, from the UI's REST API (``spark.ui.enabled``)."""

    def __init__(self, spark) -> None:
        self.base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
        self.seen = -1

    def _get(self, what: str) -> list[dict]:
        with urllib.request.urlopen(f"{self.base}/{what}", timeout=300) as answer:  # noqa: S310 - local UI
            return json.loads(answer.read())

    def skip(self) -> None:
        """Leave the jobs run so far out of the next report."""
        self.seen = max((j["jobId"] for j in self._get("jobs")), default=self.seen)

    def report(self, label: str, top: int = 8) -> None:
        jobs = [j for j in self._get("jobs") if j["jobId"] > self.seen and "completionTime" in j]
        if not jobs:
            return
        self.seen = max(j["jobId"] for j in jobs)
        stages = {s["stageId"]: s for s in self._get("stages?status=complete")}
        rows = []
        for job in jobs:
            wall = _ui_time(job["completionTime"]) - _ui_time(job["submissionTime"])
            run = sum(stages[i]["executorRunTime"] for i in job["stageIds"] if i in stages) / 1000
            where = (job.get("description") or job["name"]).split(" at ")[-1][:60]
            rows.append((wall, run, job["jobId"], job["name"].split(" at ")[0][:40], where))
        total = sum(r[0] for r in rows)
        log(f"  {label}: {len(rows)} Spark jobs, {total:.1f}s of job wall time; the longest:")
        for wall, run, job_id, name, where in sorted(rows, reverse=True)[:top]:
            log(f"    job {job_id}: {wall:5.2f}s wall, {run:5.2f}s executor  {name} <- {where}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=int, default=300_000)
    p.add_argument("--updates", type=int, default=700_000)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (see the module doc)")
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed rounds of the overwrite and the silver backlog first (the JVM's first run of "
        "each is slower, and the overwrite runs first in a round)",
    )
    p.add_argument("--stages", action="store_true", help="log each run's Spark jobs by time (Spark UI)")
    p.add_argument(
        "--backlog-only",
        action="store_true",
        help="time only the overwrite and the silver backlog (the headline's two), not the "
        "batch-by-batch, always-MERGE and bronze runs",
    )
    args = p.parse_args()
    from spark_jobs.cdc_apply import session

    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        log(f"synthesising {args.keys:,} inserts + {args.updates:,} updates as staged Parquet")
        batches = make_batches(work / "staging", args.keys, args.updates)
        events = args.keys + args.updates
        ui = {"spark.ui.enabled": "true"} if args.stages else {}
        spark = session.build(app_name="bench-delta-apply", **{"spark.driver.memory": "4g", **ui})
        stages = StageLog(spark) if args.stages else None
        silver, merge_only, full, base, joint, joint_full = [], [], [], [], [], []
        for i in range(args.warmup):
            took = run_overwrite(spark, batches, str(work / f"warm-overwrite{i}"))
            took_apply = run_backlog(spark, batches, str(work / f"warm-joint{i}"), bronze=False)
            log(f"warm-up {i + 1} (untimed): overwrite {took:.1f}s, silver backlog {took_apply:.1f}s")

        def overwrite(i: int) -> None:
            if stages:
                stages.skip()
            base.append(run_overwrite(spark, batches, str(work / f"overwrite{i}")))
            if stages:
                stages.report(f"overwrite, round {i + 1}")

        for i in range(args.repeats):
            if i % 2 == 0:
                overwrite(i)
            if not args.backlog_only:
                silver.append(run_apply(spark, batches, str(work / f"silver{i}"), bronze=False))
                merge_only.append(
                    run_apply(spark, batches, str(work / f"merge{i}"), False, always_merge=True)
                )
                full.append(run_apply(spark, batches, str(work / f"full{i}"), bronze=True))
            if stages:
                stages.skip()
            joint.append(run_backlog(spark, batches, str(work / f"joint{i}"), bronze=False))
            if stages:
                stages.report(f"silver backlog, round {i + 1}")
            if args.backlog_only:
                if i % 2 == 1:
                    overwrite(i)
                log(f"round {i + 1}: overwrite {base[-1]:.1f}s; as a backlog: silver {joint[-1]:.1f}s")
                continue
            joint_full.append(run_backlog(spark, batches, str(work / f"jointfull{i}"), bronze=True))
            if i % 2 == 1:
                overwrite(i)
            log(
                f"round {i + 1}: overwrite {base[-1]:.1f}s, apply silver {silver[-1]:.1f}s "
                f"(MERGE only {merge_only[-1]:.1f}s), apply bronze+silver {full[-1]:.1f}s; as a backlog: "
                f"silver {joint[-1]:.1f}s, bronze+silver {joint_full[-1]:.1f}s"
            )
        rate = events / median(joint)
        log(
            f"plain Delta overwrite of the {args.keys:,} final rows: {fmt(base, 1)} s, median {median(base):.1f}s"
        )
        others = [
            ("apply (silver), batch by batch", silver),
            ("apply (silver, delta.rewrite.ratio=0: always MERGE)", merge_only),
            ("apply (bronze + silver), batch by batch", full),
            ("apply (bronze + silver), both batches as a backlog", joint_full),
        ]
        for label, runs in others if not args.backlog_only else []:
            log(
                f"{label}: {fmt(runs, 1)} s -> {events / median(runs):,.0f} events/s, "
                f"ratio {paired(base, runs):.2f} (of the medians {median(base) / median(runs):.2f})"
            )
        log(
            f"apply (silver), both batches as a backlog: {fmt(joint, 1)} s -> {rate:,.0f} events/s; "
            f"each round's ratio {fmt(round_ratios(base, joint), 2)}, "
            f"ratio of the medians {median(base) / median(joint):.2f}"
        )
        spark.stop()
        by_batch = "" if args.backlog_only else f"; batch by batch {paired(base, silver):.2f}"
        print(
            f"delta_apply: {rate:,.0f} events/s; ratio {paired(base, joint):.2f} vs plain Delta "
            f"overwrite (silver, the two batches applied as a backlog{by_batch})"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
