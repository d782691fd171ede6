"""Benchmark: one capture run's snapshot rows read by 1 vs 3 parallel snapshot parts (PostgreSQL).

A 300k-row table (the bench column mix).  Each measured run is a fresh connector whose state was
anchored by a first run that read a single row; the measured run then captures
``snapshot.max.rows.per.run = 300000`` rows (chunk size 50k):

* baseline: ``Capture.run(commit=True)`` reading its chunks itself;
* parts N: ``plan_parts`` + N ``read_part`` in separate processes (as N mapped Airflow tasks; a
  warm process pool, so interpreter start-up is not counted) + ``Capture.run(prepared=...)``.

Rows/s = snapshot rows of the run / wall seconds of the whole run (plan + parts + capture).
Last line: ``snapshot_parts: <rows/s with 3 parts> rows/s; ratio <x> vs 1 part``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import shutil  # noqa: E402
import tempfile  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

import psycopg  # noqa: E402

from bench._common import REPEATS, fmt, log, median, pipeline_config, populate, timed  # noqa: E402

DB, PUB, ROWS, CHUNK = "bench_parts", "bench_parts_pub", 300_000, 50_000


def _read(config: dict, plan: str, part: int) -> int:
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.core.snapshot_parts import read_part

    return read_part(build_capture(config), plan, part)["rows"]


def measured_run(config: dict, parts: int, pool: ProcessPoolExecutor) -> int:
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.core.snapshot_parts import plan_parts

    if parts == 0:
        return build_capture(config).run(commit=True).snapshot_rows
    planned = plan_parts(build_capture(config), parts)
    list(pool.map(_read, [config] * len(planned), [p["plan"] for p in planned], [p["part"] for p in planned]))
    return build_capture(config).run(commit=True, prepared=planned[0]["plan"]).snapshot_rows


def main() -> None:
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.testing.servers import PostgresServer

    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_parts_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        with psycopg.connect(dsn) as conn:
            populate(conn, "items", ROWS)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        results: dict[int, list[float]] = {0: [], 1: [], 3: []}
        n = 0
        with ProcessPoolExecutor(3) as pool:
            list(pool.map(abs, range(3)))  # start the workers
            for _ in range(REPEATS):
                for parts in results:
                    n += 1
                    props = {"incremental.snapshot.chunk.size": CHUNK, "snapshot.max.rows.per.run": 1}
                    cfg = pipeline_config(server, DB, Path(tmp) / f"s{n}", f"bp{n}", f"bp_slot_{n}", PUB, **props)
                    build_capture(cfg).run(commit=True)  # anchors the state; one row read
                    cfg["snapshot.max.rows.per.run"] = ROWS
                    dt, rows = timed(lambda c=cfg, p=parts: measured_run(c, p, pool))
                    results[parts].append(rows / dt)
                    log(f"{'own reads' if parts == 0 else f'{parts} part(s)'}: {rows:,} rows in {dt:.2f}s "
                        f"= {rows / dt:,.0f} rows/s")
                    server.execute("SELECT pg_drop_replication_slot(%s)", (cfg["slot.name"],), dbname=DB)
                    shutil.rmtree(cfg["staging.path"], ignore_errors=True)
        med = {k: median(v) for k, v in results.items()}
        for k, v in results.items():
            log(f"{'own reads' if k == 0 else f'{k} part(s)'}: rows/s {fmt(v)} median {med[k]:,.0f}")
        print(f"snapshot_parts: {med[3]:.0f} rows/s; ratio {med[3] / med[1]:.2f} vs 1 part "
              f"({med[0]:.0f} rows/s reading in the capture itself)", flush=True)


if __name__ == "__main__":
    main()
