"""Benchmark: initial snapshot through the capture pipeline vs ``COPY (SELECT * FROM t) TO STDOUT``.

Two tables (1M + 0.5M rows, realistic column mix).  Baseline: psycopg COPY of every table in text
format, reading all blocks.  Measured: a fresh connector (new name, slot, staging dir) with
``snapshot.mode=initial``, the default chunk settings (``incremental.snapshot.chunk.size`` unset:
chunks grow from 1024 rows towards ``incremental.snapshot.chunk.target.ms``) and
``snapshot.max.rows.per.run=10000000``, running ``run(commit=True)`` until no snapshot is pending.
Also: rows/s at fixed chunk sizes 1024 / 10k / 50k (one repeat each), peak RSS of a snapshot run in a
fresh CLI subprocess, and a cProfile of one run.

Last line: ``pg_snapshot: <rows/s> rows/s; ratio <x> vs COPY TO STDOUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import shutil  # noqa: E402
import tempfile  # noqa: E402

import psycopg  # noqa: E402

from bench._common import (  # noqa: E402
    REPEATS,
    dir_size_mib,
    fmt,
    log,
    median,
    pipeline_config,
    populate,
    profile,
    run_cli_capture,
    self_maxrss_mib,
    timed,
)

DB, PUB = "bench_snapshot", "bench_snap_pub"
TABLES = {"items": 1_000_000, "items_small": 500_000}
CHUNK = None  # the default settings: adaptive chunk size
TOTAL = sum(TABLES.values())


def copy_all(dsn: str) -> int:
    """COPY every table to STDOUT (text), reading all blocks; returns the rows copied."""
    rows = 0
    with psycopg.connect(dsn) as conn:
        for table in TABLES:
            query = f"COPY (SELECT * FROM {table}) TO STDOUT"  # noqa: S608
            with conn.cursor().copy(query) as copy:
                nbytes = 0
                for block in copy:
                    nbytes += len(block)
            rows += TABLES[table]
    return rows


class Runner:
    def __init__(self, server, tmp: Path) -> None:
        self.server, self.tmp, self.n = server, tmp, 0

    def config(self, chunk: int | None) -> dict:
        self.n += 1
        staging = self.tmp / f"staging_{self.n}"
        sized = {"incremental.snapshot.chunk.size": chunk} if chunk else {}
        return pipeline_config(self.server, DB, staging, f"bench_snap_{self.n}",
                               f"bench_snap_slot_{self.n}", PUB,
                               **{"snapshot.mode": "initial", **sized,
                                  "snapshot.max.rows.per.run": 10_000_000, "run.max.events": 5_000_000})

    def cleanup(self, config: dict) -> None:
        self.server.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s", (config["slot.name"],), dbname=DB)
        shutil.rmtree(config["staging.path"], ignore_errors=True)


def snapshot_until_done(config: dict) -> tuple[int, int]:
    """Run capture with commit until the snapshot is complete; returns (rows, runs)."""
    from airflow_cdc.core.pipeline import build_capture

    capture = build_capture(config)
    rows = runs = 0
    while True:
        res = capture.run(commit=True)
        rows += res.snapshot_rows
        runs += 1
        stored = capture.store.load(config["name"])
        snap = stored.data.get("snapshot") or {}
        if not snap.get("pending"):
            return rows, runs
        if runs > 10_000:
            raise RuntimeError("snapshot did not finish")


def main() -> None:
    from airflow_cdc.testing.servers import PostgresServer

    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_snapshot_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        log(f"populating {', '.join(f'{t}={n:,}' for t, n in TABLES.items())}")
        with psycopg.connect(dsn) as conn:
            for table, n in TABLES.items():
                dt, _ = timed(lambda t=table, k=n: populate(conn, t, k))
                log(f"  {table}: {n:,} rows in {dt:.1f}s")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        runner = Runner(server, Path(tmp))

        copy_times, snap_times = [], []
        for i in range(REPEATS):
            dt, rows = timed(lambda: copy_all(dsn))
            copy_times.append(dt)
            log(f"COPY TO STDOUT #{i + 1}: {rows:,} rows in {dt:.2f}s = {rows / dt:,.0f} rows/s")
            cfg = runner.config(CHUNK)
            dt, (rows, runs) = timed(lambda c=cfg: snapshot_until_done(c))
            snap_times.append(dt)
            size = dir_size_mib(Path(cfg["staging.path"]))
            log(f"snapshot #{i + 1} (default chunk settings): {rows:,} rows in {runs} run(s), {dt:.2f}s = "
                f"{rows / dt:,.0f} rows/s (staged {size:.0f} MiB)")
            if rows != TOTAL:
                log(f"  WARNING: expected {TOTAL:,} snapshot rows, got {rows:,}")
            runner.cleanup(cfg)

        sweep = {}
        for chunk in (1024, 10_000, 50_000):
            cfg = runner.config(chunk)
            dt, (rows, runs) = timed(lambda c=cfg: snapshot_until_done(c))
            sweep[chunk] = rows / dt
            log(f"chunk size {chunk:,}: {rows:,} rows in {runs} run(s), {dt:.2f}s = {rows / dt:,.0f} rows/s")
            runner.cleanup(cfg)

        log("peak RSS: one snapshot run (default chunk settings, whole snapshot) in a fresh CLI subprocess")
        cfg = runner.config(CHUNK)
        wall, child_rss, _ = run_cli_capture(cfg, Path(tmp), commit=True)
        log(f"  subprocess snapshot run: {wall:.2f}s wall (incl. interpreter start), "
            f"peak RSS {child_rss:,.0f} MiB")
        runner.cleanup(cfg)

        log("profiling one in-process snapshot (default chunk settings, cProfile, tottime)")
        cfg = runner.config(CHUNK)
        _, prof = profile(lambda: snapshot_until_done(cfg))
        print(prof, flush=True)
        runner.cleanup(cfg)

        copy_med, snap_med = median(copy_times), median(snap_times)
        copy_rate, snap_rate = TOTAL / copy_med, TOTAL / snap_med
        log(f"COPY seconds {fmt(copy_times, 2)} median {copy_med:.2f}s = {copy_rate:,.0f} rows/s")
        log(f"snapshot seconds {fmt(snap_times, 2)} median {snap_med:.2f}s = {snap_rate:,.0f} rows/s")
        for chunk, rate in sweep.items():
            print(f"chunk size {chunk}: {rate:.0f} rows/s; ratio {rate / copy_rate:.2f} vs COPY TO STDOUT",
                  flush=True)
        log(f"peak RSS: snapshot subprocess {child_rss:,.0f} MiB; this process {self_maxrss_mib():,.0f} MiB")
        ratio = snap_rate / copy_rate
        print(f"pg_snapshot: {snap_rate:.0f} rows/s; ratio {ratio:.2f} vs COPY TO STDOUT", flush=True)


if __name__ == "__main__":
    main()
