"""Benchmark: PostgreSQL capture with column mappers configured, vs none.

One change window (``--inserts`` inserts, half of them then updated: events with before images)
of the ``orders`` table of ``bench/_common.py`` (its ``label`` is a ~40-character text), captured
repeatedly with ``run(commit=False)`` (peek: nothing is consumed) under each configuration:

* ``none``: no mapper property;
* ``other``: a truncation, a mask and a hash configured for another table's columns, so ``orders``
  is unmapped: its codecs are not wrapped and it must cost the same as ``none``;
* ``truncate`` / ``mask`` / ``hash`` / ``hash_v2``: ``orders.label`` mapped.

Last line: ``column_mappers: <events/s of other> events/s; ratio <none s / other s> vs no mappers``
(1.0 = unmapped tables lose no speed); the mapped configurations' ratios are logged above it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import tempfile  # noqa: E402

import psycopg  # noqa: E402

from bench._common import (  # noqa: E402
    TABLE_DDL,
    clear_batches,
    insert_range,
    log,
    median,
    pipeline_config,
    timed,
)

DB, TABLE, SLOT, PUB = "bench_mappers", "orders", "bench_mappers_slot", "bench_mappers_pub"
LABEL = r"public\.orders\.label"
CONFIGS = {
    "none": {},
    "other": {
        "column.truncate.to.8.chars": r"public\.customers\.name",
        "column.mask.with.5.chars": r"public\.customers\.email",
        "column.mask.hash.SHA-256.with.salt.CzQMA0cB5K": r"public\.customers\.phone",
    },
    "truncate": {"column.truncate.to.12.chars": LABEL},
    "mask": {"column.mask.with.8.chars": LABEL},
    "hash": {"column.mask.hash.SHA-256.with.salt.CzQMA0cB5K": LABEL},
    "hash_v2": {"column.mask.hash.v2.SHA-256.with.salt.CzQMA0cB5K": LABEL},
}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inserts", type=int, default=200_000, help="rows inserted (half are then updated)")
    ap.add_argument("--repeats", type=int, default=3, help="captures per configuration")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.sources.postgres.columnar import native_available
    from airflow_cdc.testing.servers import PostgresServer

    log(f"pgoutput row decoder: {'compiled (columnar)' if native_available() else 'pure Python'}")
    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_mappers_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        staging = Path(tmp) / "staging"
        base = pipeline_config(server, DB, staging, "bench_mappers", SLOT, PUB,
                               **{"snapshot.mode": "no_data", "run.max.events": 5_000_000})
        with psycopg.connect(dsn) as conn:
            conn.execute(TABLE_DDL.format(name=TABLE))
            conn.commit()
        first = build_capture(base).run(commit=True)
        with psycopg.connect(dsn) as conn:
            insert_range(conn, TABLE, 1, args.inserts)
            conn.execute(f"UPDATE {TABLE} SET qty = qty + 1 WHERE id % 2 = 0")  # noqa: S608
            conn.commit()
        times: dict[str, list[float]] = {k: [] for k in CONFIGS}
        events = 0
        for i in range(args.repeats):
            for key, props in CONFIGS.items():  # interleaved: drift hits every configuration alike
                clear_batches(staging, keep={first.batch_id})
                cfg = dict(base, **props)
                dt, res = timed(lambda: build_capture(cfg).run(commit=False))  # noqa: B023
                times[key].append(dt)
                events = res.events
                log(f"{key} #{i + 1}: {res.events:,} events in {dt:.2f}s = {res.events / dt:,.0f} events/s")
        none = median(times["none"])
        for key in CONFIGS:
            m = median(times[key])
            log(f"{key}: median {m:.2f}s = {events / m:,.0f} events/s; ratio {none / m:.3f} vs no mappers")
        other = median(times["other"])
        print(f"column_mappers: {events / other:,.0f} events/s; ratio {none / other:.3f} vs no mappers")


if __name__ == "__main__":
    main()
