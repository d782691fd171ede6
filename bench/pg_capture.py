"""Benchmark: streaming capture of a 1.5M-event change window vs a bare psycopg peek of the slot.

Baseline: a server-side binary cursor over ``pg_logical_slot_peek_binary_changes`` (fetchmany(4096),
counting rows only).  Measured: ``build_capture(config).run(commit=False)`` over the same window
(peeking does not consume, so both repeat on the same window).  Peak RSS of the capture is taken
from a fresh ``python -m airflow_cdc.cli capture`` subprocess (wait4 rusage).

Last line: ``pg_capture: <events/s> events/s; ratio <capture/bare> vs bare peek fetch``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import tempfile  # noqa: E402

import psycopg  # noqa: E402

from bench._common import (  # noqa: E402
    REPEATS,
    TABLE_DDL,
    clear_batches,
    dir_size_mib,
    fmt,
    insert_range,
    log,
    median,
    pipeline_config,
    profile,
    run_cli_capture,
    self_maxrss_mib,
    timed,
)

INSERTS = 1_000_000
STEP = 250_000
DB, TABLE, SLOT, PUB = "bench_capture", "orders", "bench_slot", "bench_pub"


def bare_peek(dsn: str) -> int:
    rows = 0
    with psycopg.connect(dsn) as conn, conn.transaction(), \
            conn.cursor(name="bench_peek", binary=True) as cur:
        cur.execute("SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                    "'proto_version', '1', 'publication_names', %s, 'messages', 'true')", (SLOT, PUB))
        while True:
            batch = cur.fetchmany(4096)
            if not batch:
                break
            rows += len(batch)
    return rows


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inserts", type=int, default=INSERTS, help="rows inserted (half are then updated)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="repetitions of baseline and capture")
    ap.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-RSS run")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.sources.postgres.columnar import native_available
    from airflow_cdc.testing.servers import PostgresServer

    log(f"pgoutput row decoder: {'compiled (columnar)' if native_available() else 'pure Python'}")

    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_capture_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        staging = Path(tmp) / "staging"
        config = pipeline_config(server, DB, staging, "bench_capture", SLOT, PUB,
                                 **{"snapshot.mode": "no_data", "run.max.events": 5_000_000})
        with psycopg.connect(dsn) as conn:
            conn.execute(TABLE_DDL.format(name=TABLE))
            conn.commit()
        log("initial capture (creates slot, publication, state)")
        first = build_capture(config).run(commit=True)
        log(f"initial capture committed: {first.events} events, offset {first.to_offset}")

        inserts = args.inserts
        log(f"generating {inserts:,} inserts + {inserts // 2:,} updates")
        with psycopg.connect(dsn) as conn:
            dt, _ = timed(lambda: insert_range(conn, TABLE, 1, inserts, STEP))
            log(f"  inserts: {dt:.1f}s")
            update = f"UPDATE {TABLE} SET qty = qty + 1, active = NOT active WHERE id % 2 = 0"  # noqa: S608
            dt, _ = timed(lambda: (conn.execute(update), conn.commit()))
            log(f"  updates: {dt:.1f}s")
            conn.execute("CHECKPOINT")
        expected = inserts + inserts // 2

        bare_times, bare_rows = [], 0
        cap_times, cap_events = [], 0
        for i in range(args.repeats):
            dt, bare_rows = timed(lambda: bare_peek(dsn))
            bare_times.append(dt)
            log(f"bare peek #{i + 1}: {bare_rows:,} rows in {dt:.2f}s = {bare_rows / dt:,.0f} rows/s")
            clear_batches(staging, keep={first.batch_id})
            dt, res = timed(lambda: build_capture(config).run(commit=False))
            cap_times.append(dt)
            cap_events = res.events
            size = dir_size_mib(Path(res.batch_path))
            log(f"capture #{i + 1}: {res.events:,} events in {dt:.2f}s = {res.events / dt:,.0f} events/s "
                f"(batch {size:.0f} MiB)")
            if res.events != expected:
                log(f"  WARNING: expected {expected:,} events, got {res.events:,}")
        clear_batches(staging, keep={first.batch_id})

        child_rss = float("nan")
        if not args.no_rss:
            log("peak RSS: capture in a fresh subprocess (python -m airflow_cdc.cli capture)")
            wall, child_rss, _ = run_cli_capture(config, Path(tmp))
            log(f"  subprocess capture: {wall:.2f}s wall (incl. interpreter start), "
                f"peak RSS {child_rss:,.0f} MiB")
            clear_batches(staging, keep={first.batch_id})

        if not args.no_profile:
            log("profiling one in-process capture (cProfile, tottime)")
            _, prof = profile(lambda: build_capture(config).run(commit=False))
            print(prof, flush=True)
            clear_batches(staging, keep={first.batch_id})

        bare_med = median(bare_times)
        cap_med = median(cap_times)
        bare_rate = bare_rows / bare_med
        cap_rate = cap_events / cap_med
        # the bare peek also returns BEGIN/COMMIT rows; compare wall time for the same window
        ratio = bare_med / cap_med
        log(f"bare peek seconds {fmt(bare_times, 2)} median {bare_med:.2f}s ({bare_rows:,} rows, "
            f"{bare_rate:,.0f} rows/s; {cap_events / bare_med:,.0f} events/s equivalent)")
        log(f"capture seconds {fmt(cap_times, 2)} median {cap_med:.2f}s ({cap_events:,} events)")
        log(f"peak RSS: capture subprocess {child_rss:,.0f} MiB (target < 1024); "
            f"this process {self_maxrss_mib():,.0f} MiB (includes in-process repeats)")
        print(f"pg_capture: {cap_rate:.0f} events/s; ratio {ratio:.2f} vs bare peek fetch", flush=True)


if __name__ == "__main__":
    main()
