"""Benchmark: a backlog of small batches applied as one (``apply_batches``, what ``airflow-cdc
apply`` does with the batches it finds staged) against the same batches applied one by one, in
one warm Spark session (``local[2]``).

The batches are synthesised in the staged format (``delta_apply.write_batch``): a first batch of
``--keys`` inserts, then ``--batches`` batches of ``--events`` updates of random keys, each batch
starting at the previous one's end offset.  Both ways start from the same silver table (the first
batch applied) and must end with the same rows.  Headline (last line): ``apply_backlog: <s> s
per backlog of N batches; ratio <x> vs batch by batch`` (time batch by batch / time as a backlog).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from _common import fmt, log, median
from delta_apply import write_batch


def make_backlog(root: Path, keys: int, batches: int, events: int) -> list[Path]:
    rng = random.Random(11)
    first_id = "20260101T000000000000Z-000000"
    out = [write_batch(root, first_id, "c", pa.array(range(keys), pa.int64()), 1, 0, 100_000)]
    position = keys
    for i in range(1, batches + 1):
        ids = pa.array([rng.randrange(keys) for _ in range(events)], pa.int64())
        batch_id = f"20260101T0000000000{i:02d}Z-{i:06d}"
        out.append(write_batch(root, batch_id, "u", ids, i + 1, position, 100_000, {"lsn": out[-1].name}))
        position += events
    return out


def rows(spark, target: str) -> list[tuple]:
    frame = spark.read.format("delta").load(f"{target}/silver/bench/public.items")
    return sorted(tuple(r) for r in frame.drop("__batch_id").collect())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--events", type=int, default=1_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    from spark_jobs.cdc_apply import session
    from spark_jobs.cdc_apply.job import ApplySettings, apply_batch, apply_batches

    work = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    try:
        staged = make_backlog(work / "staging", args.keys, args.batches, args.events)
        spark = session.build(app_name="bench-apply-backlog", **{"spark.driver.memory": "2g"})
        settings = ApplySettings()
        one_by_one, joint = [], []
        for r in range(args.repeats):
            a, b = str(work / f"one{r}"), str(work / f"joint{r}")
            for target in (a, b):
                apply_batch(spark, str(staged[0]), target, settings)
            start = time.perf_counter()
            for path in staged[1:]:
                apply_batch(spark, str(path), a, settings)
            one_by_one.append(time.perf_counter() - start)
            start = time.perf_counter()
            report = apply_batches(spark, [str(s) for s in staged[1:]], b, settings)
            joint.append(time.perf_counter() - start)
            stretch = report["tables"]["public.items"]
            assert stretch.get("batches") == args.batches, report
            assert rows(spark, a) == rows(spark, b), "the backlog must give the rows batch by batch gives"
            log(f"round {r + 1}: batch by batch {one_by_one[-1]:.1f}s, as a backlog {joint[-1]:.1f}s")
        spark.stop()
        log(f"{args.batches} batches of {args.events:,} updates into {args.keys:,} rows (bronze + silver)")
        log(f"batch by batch: {fmt(one_by_one, 1)} s; as a backlog: {fmt(joint, 1)} s")
        ratio = median(one_by_one) / median(joint)
        print(
            f"apply_backlog: {median(joint):.1f} s per backlog of {args.batches} batches; "
            f"ratio {ratio:.2f} vs batch by batch"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
