"""Benchmark: a window whose updates carry unchanged-TOAST placeholders, applied to silver.

The shape of ``bench/scale.py``'s window without a database: a silver table of ``--rows`` keys
(an initial batch applied by the job, a ``doc`` text column set on every row), then one staged
window of ``--events`` events: 60 % updates of keys 0..U (``--toast-share`` of them leave ``doc``
out and list it in ``__unavailable``; the others send a new ``doc``), 20 % inserts of new keys,
20 % deletes of the keys after U.  The window is applied with the job's default settings (silver
only unless ``--bronze``), ``--repeats`` times on a fresh copy of the silver table, and silver is
compared with the expected rows (exact: every column of every row).  Several windows
(``--toast-shares``, default 1.0 and 0.0: the same events without placeholders) run alternately
in one session, for a same-load ratio.

Headline (last line): ``toast_window: <median events/s> events/s (...) with toast share <first>;
ratio <x> vs toast share <last>; <rows> rows, <events> events``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _common import REPO, fmt, log, median  # noqa: I001
from delta_apply import COLUMNS, StageLog, _positions, _rows, _source, write_manifest

from airflow_cdc.core.events import TRANSACTION_TYPE, envelope_schema
from airflow_cdc.sources.postgres.tables import SOURCE_TYPE

os.environ.setdefault("AIRFLOW_CDC_DELTA_JARS", str(REPO / ".jars"))

DOC = pa.field("doc", pa.string(), metadata={b"connect.type": b"string"})
FIELDS = [*COLUMNS, DOC]
PIECE = 100_000


def _full(ids: pa.Array, version: int, doc: pa.Array) -> pa.StructArray:
    base = _rows(ids, version)
    return pa.StructArray.from_arrays([*base.flatten(), doc], fields=FIELDS)


def _doc(ids: pa.Array, version: int) -> pa.Array:
    return pc.binary_join_element_wise(
        pc.cast(ids, pa.string()), pa.scalar(f"-doc-v{version}-" + "x" * 200), ""
    )


def write_batch(
    root: Path,
    batch_id: str,
    events: list[tuple[str, pa.Array, pa.Array, pa.Array]],
    pos0: int,
    prev: str | None,
) -> Path:
    """``events``: (op, before rows or nulls, after rows or nulls, __unavailable) runs, in order."""
    schema = envelope_schema(FIELDS, SOURCE_TYPE)
    path = root / "batches" / batch_id
    (path / "tables" / "public.items").mkdir(parents=True)
    parts, pos, k = [], pos0, 0
    for op, before, after, unavailable in events:
        for lo in range(0, len(after), PIECE):
            b, a, u = before.slice(lo, PIECE), after.slice(lo, PIECE), unavailable.slice(lo, PIECE)
            n = len(a)
            table = pa.Table.from_arrays(
                [
                    pa.array([op] * n),
                    pa.array([1_700_000_000_000] * n, pa.int64()),
                    pa.array([1_700_000_000_000_000] * n, pa.int64()),
                    pa.array([1_700_000_000_000_000_000] * n, pa.int64()),
                    b,
                    a,
                    _source(n),
                    pa.nulls(n, TRANSACTION_TYPE),
                    _positions(pos, n),
                    u,
                ],
                schema=schema,
            )
            rel = f"tables/public.items/part-{k:05d}.parquet"
            pq.write_table(table, path / rel)
            parts.append({"file": rel, "rows": n, "kind": "stream", "schema_version": "v1", "ops": {op: n}})
            pos, k = pos + n, k + 1
    write_manifest(path, batch_id, parts, pos - pos0, {"lsn": prev} if prev else None)
    return path


def make(root: Path, rows: int, events: int, share: float) -> tuple[Path, Path, pa.Table]:
    """The initial batch, the window and the rows silver must hold after both."""
    ids = pa.array(range(rows), pa.int64())
    empty = pa.array([[]] * rows, pa.list_(pa.string()))
    first = write_batch(
        root,
        "20260101T000000000000Z-000001",
        [("c", pa.nulls(rows, _full(ids[:1], 1, _doc(ids[:1], 1)).type), _full(ids, 1, _doc(ids, 1)), empty)],
        0,
        None,
    )
    updates, inserts = int(events * 0.6), int(events * 0.2)
    deletes = events - updates - inserts
    up = pa.array(range(updates), pa.int64())
    toast = pc.less(pc.modulo(pc.multiply(up, 7919), 1000), int(share * 1000))  # spread over keys
    new_doc = pc.if_else(toast, pa.nulls(updates, pa.string()), _doc(up, 2))
    up_after = _full(up, 2, new_doc)
    up_unavail = pa.array([["doc"] if t else [] for t in toast.to_pylist()], pa.list_(pa.string()))
    ins = pa.array(range(rows, rows + inserts), pa.int64())
    gone = pa.array(range(updates, updates + deletes), pa.int64())
    row_type = up_after.type
    window = write_batch(
        root,
        "20260101T000000000001Z-000002",
        [
            ("u", _full(up, 1, _doc(up, 1)), up_after, up_unavail),
            (
                "c",
                pa.nulls(inserts, row_type),
                _full(ins, 2, _doc(ins, 2)),
                pa.array([[]] * inserts, pa.list_(pa.string())),
            ),
            (
                "d",
                _full(gone, 1, _doc(gone, 1)),
                pa.nulls(deletes, row_type),
                pa.array([[]] * deletes, pa.list_(pa.string())),
            ),
        ],
        rows,
        first.name,
    )
    kept = pa.array(range(updates + deletes, rows), pa.int64())
    expected = pa.concat_arrays(
        [
            _full(up, 2, pc.if_else(toast, _doc(up, 1), _doc(up, 2))),
            _full(kept, 1, _doc(kept, 1)),
            _full(ins, 2, _doc(ins, 2)),
        ]
    )
    return first, window, pa.Table.from_struct_array(expected)


def check(spark, silver: str, expected: pa.Table) -> None:
    """Silver's data columns equal the expected rows exactly (a two-way except of all columns)."""
    have = spark.read.format("delta").load(silver).select(*(f.name for f in FIELDS))
    want = spark.createDataFrame(expected.to_pandas())
    want = want.select(*(want[c].cast(have.schema[c].dataType).alias(c) for c in have.columns))
    missing, extra = want.exceptAll(have).count(), have.exceptAll(want).count()
    if missing or extra or have.count() != expected.num_rows:
        raise SystemExit(f"silver differs from the source: {missing} rows missing, {extra} extra")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=600_000)
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument(
        "--toast-shares",
        default="1.0,0.0",
        help="shares of updates with doc unchanged, one window each, run alternately",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bronze", action="store_true")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--stages", action="store_true", help="log each run's Spark jobs by time (Spark UI)")
    args = p.parse_args()
    from spark_jobs.cdc_apply import session
    from spark_jobs.cdc_apply.job import ApplySettings, apply_batch

    work = Path(tempfile.mkdtemp(prefix="bench-toast-"))
    try:
        shares = [float(x) for x in args.toast_shares.split(",")]
        made = [make(work / f"share{j}", args.rows, args.events, share) for j, share in enumerate(shares)]
        ui = {"spark.ui.enabled": "true"} if args.stages else {}
        spark = session.build(app_name="bench-toast", **ui)
        stages = StageLog(spark) if args.stages else None
        settings = ApplySettings(bronze=args.bronze, optimize_interval=0)
        base = work / "base"
        apply_batch(spark, str(made[0][0]), str(base), settings)
        rates: dict[float, list[float]] = {share: [] for share in shares}
        for i in range(args.repeats):
            for share, (_, window, expected) in zip(shares, made, strict=True):
                target = work / f"lake{i}"
                shutil.copytree(base, target)
                if stages:
                    stages.skip()
                started = time.perf_counter()
                report = apply_batch(spark, str(window), str(target), settings)
                took = time.perf_counter() - started
                rates[share].append(args.events / took)
                log(
                    f"  share {share}, run {i}: {took:.1f}s, {rates[share][-1]:,.0f} events/s "
                    f"({report['tables']['public.items']['silver']}); load {os.getloadavg()[0]:.2f}"
                )
                if stages:
                    stages.report(f"window, share {share}, run {i}", top=12)
                if not args.no_check and i == 0:
                    from spark_jobs.cdc_apply.layout import table_path

                    check(spark, table_path(str(target), "silver", "bench", "public.items"), expected)
                    log("  silver == expected rows")
                shutil.rmtree(target)
        spark.stop()
        for share in shares[1:]:
            log(f"toast share {share}: {median(rates[share]):,.0f} events/s ({fmt(rates[share])})")
        first = shares[0]
        ratio = median(rates[first]) / median(rates[shares[-1]])
        print(
            f"toast_window: {median(rates[first]):,.0f} events/s ({fmt(rates[first])}) with toast share "
            f"{first}; ratio {ratio:.2f} vs toast share {shares[-1]}; {args.rows:,} rows, "
            f"{args.events:,} events",
            flush=True,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
