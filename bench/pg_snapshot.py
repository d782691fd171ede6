"""Benchmark: initial snapshot through the capture pipeline vs ``COPY (SELECT * FROM t) TO STDOUT``.

Two tables (1M + 0.5M rows, realistic column mix).  Baseline: psycopg COPY of every table in text
format, reading all blocks.  Measured: a fresh connector (new name, slot, staging dir) with
``snapshot.mode=initial``, the default chunk settings (``incremental.snapshot.chunk.size`` unset:
chunks grow from 1024 rows towards ``incremental.snapshot.chunk.target.ms``) and
``snapshot.max.rows.per.run=10000000``, running ``run(commit=True)`` until no snapshot is pending,
with ``snapshot.max.threads=--threads`` (default 2, this machine's cores: key ranges read side by
side on that many connections); each repeat also runs it with one reader (Debezium's default).
Also: the CPU seconds of the server (postmaster and backends, from ``/proc``) and of this process
for the COPY and the snapshot (a load-independent view: the machine is shared), one default run
with the pure-Python chunk reader (``AIRFLOW_CDC_PG_COPY=python``), each repeat also without the
background writes (``AIRFLOW_CDC_SNAPSHOT_THREADS=0``), rows/s at fixed chunk sizes
1024 / 10k / 50k / 131072 (one repeat each), peak RSS of a snapshot run in a fresh CLI subprocess,
and a cProfile of one run.  ``--scale 500000,1000000,...`` adds a scaling table: one table per
size (copied from the largest), COPY and snapshot seconds each (one repeat).

Last line: ``pg_snapshot: <rows/s> rows/s; ratio <x> vs COPY TO STDOUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

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


def copy_all(dsn: str, tables: dict[str, int] | None = None) -> int:
    """COPY every table to STDOUT (text), reading all blocks; returns the rows copied."""
    rows = 0
    with psycopg.connect(dsn) as conn:
        for table, n in (tables or TABLES).items():
            query = f"COPY (SELECT * FROM {table}) TO STDOUT"  # noqa: S608
            with conn.cursor().copy(query) as copy:
                nbytes = 0
                for block in copy:
                    nbytes += len(block)
            rows += n
    return rows


class ServerCpu:
    """CPU seconds used by one PostgreSQL cluster so far: the postmaster with its reaped
    children, plus its live backends (``/proc``; Linux only, else 0)."""

    def __init__(self, data_dir: Path) -> None:
        try:
            self.pid = int((data_dir / "postmaster.pid").read_text().split()[0])
            self.tick = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            self.pid = 0

    @staticmethod
    def _stat(pid: int | str) -> tuple[int, list[int]]:
        text = Path(f"/proc/{pid}/stat").read_text()
        rest = text[text.rindex(")") + 2:].split()
        return int(rest[1]), [int(x) for x in rest[11:15]]  # ppid; utime, stime, cutime, cstime

    def seconds(self) -> float:
        if not self.pid:
            return 0.0
        total = sum(self._stat(self.pid)[1])
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid, times = self._stat(entry)
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == self.pid:
                    total += times[0] + times[1]
        return total / self.tick


def cpu_timed(cpu: ServerCpu, fn):  # noqa: ANN001, ANN201
    """(wall, server CPU, this process's CPU, result) of ``fn()``."""
    s0, c0 = cpu.seconds(), time.process_time()
    wall, out = timed(fn)
    client = time.process_time() - c0
    time.sleep(0.3)  # let the postmaster reap the run's backends (their CPU moves to its cutime)
    return wall, cpu.seconds() - s0, client, out


class Runner:
    def __init__(self, server, tmp: Path) -> None:
        self.server, self.tmp, self.n = server, tmp, 0

    def config(self, chunk: int | None, **props: object) -> dict:
        self.n += 1
        staging = self.tmp / f"staging_{self.n}"
        sized = {"incremental.snapshot.chunk.size": chunk} if chunk else {}
        return pipeline_config(self.server, DB, staging, f"bench_snap_{self.n}",
                               f"bench_snap_slot_{self.n}", PUB,
                               **{"snapshot.mode": "initial", **sized,
                                  "snapshot.max.rows.per.run": 10_000_000, "run.max.events": 5_000_000,
                                  **props})

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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=REPEATS, help="repetitions of COPY and snapshot")
    ap.add_argument("--scale", default="", help="comma-separated table sizes for the scaling table")
    ap.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-RSS run")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    ap.add_argument("--no-sweep", action="store_true", help="skip the fixed chunk sizes and the Python reader")
    ap.add_argument("--threads", type=int, default=2, help="snapshot.max.threads of the headline snapshot")
    return ap.parse_args()


def snapshot_with_env(runner: Runner, cpu: ServerCpu, name: str, value: str) -> tuple[float, float, float, int, int]:
    """(wall, server CPU, client CPU, rows, runs) of one default snapshot with ``name=value`` set in
    the environment (restored after)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        cfg = runner.config(CHUNK)
        dt, srv, cli, (rows, runs) = cpu_timed(cpu, lambda: snapshot_until_done(cfg))
        runner.cleanup(cfg)
        return dt, srv, cli, rows, runs
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def inline_run(runner: Runner, cpu: ServerCpu) -> float:
    """Seconds of one default snapshot without the background writes (``AIRFLOW_CDC_SNAPSHOT_THREADS=0``:
    each part's row groups encoded in the capture's thread, table after table)."""
    from airflow_cdc.core.table_sink import THREADS_ENV

    dt, srv, cli, rows, _ = snapshot_with_env(runner, cpu, THREADS_ENV, "0")
    log(f"  the same without background writes: {dt:.2f}s = {rows / dt:,.0f} rows/s "
        f"(server CPU {srv:.2f}s, client CPU {cli:.2f}s)")
    return dt


def python_reader_run(runner: Runner, cpu: ServerCpu) -> float:
    """Seconds of one default snapshot with the pure-Python chunk reader (CSV COPY + pyarrow.csv)."""
    from airflow_cdc.sources.postgres.copyread import COPY_ENV

    dt, _, _, rows, runs = snapshot_with_env(runner, cpu, COPY_ENV, "python")
    log(f"pure-Python chunk reader (default chunk settings): {rows:,} rows in {runs} run(s), {dt:.2f}s "
        f"= {rows / dt:,.0f} rows/s")
    return dt


def scaling(runner: Runner, dsn: str, cpu: ServerCpu, sizes: list[int]) -> list[tuple[int, float, float]]:
    """Per size: a table ``scale_<n>`` (rows 1..n of ``scale``), COPY and default-settings snapshot seconds."""
    top = max(sizes)
    with psycopg.connect(dsn) as conn:
        dt, _ = timed(lambda: populate(conn, "scale", top))
        log(f"scaling: table scale of {top:,} rows in {dt:.1f}s")
        for n in sizes:
            conn.execute(f"CREATE TABLE scale_{n} AS SELECT * FROM scale WHERE id <= {n}")  # noqa: S608
            conn.execute(f"ALTER TABLE scale_{n} ADD PRIMARY KEY (id)")
            conn.commit()
        conn.execute("DROP TABLE scale")
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    out = []
    for n in sizes:
        copy_s, copy_srv, copy_cli, _ = cpu_timed(cpu, lambda k=n: copy_all(dsn, {f"scale_{k}": k}))
        cfg = runner.config(CHUNK, **{"table.include.list": f"public.scale_{n}"})
        snap_s, srv, cli, (rows, runs) = cpu_timed(cpu, lambda c=cfg: snapshot_until_done(c))
        runner.cleanup(cfg)
        log(f"scaling {n:,} rows: COPY {copy_s:.2f}s (server CPU {copy_srv:.2f}s, client {copy_cli:.2f}s); "
            f"snapshot {rows:,} rows in {runs} run(s) {snap_s:.2f}s (server CPU {srv:.2f}s, client {cli:.2f}s)"
            f" = {rows / snap_s:,.0f} rows/s; ratio {copy_s / snap_s:.2f}")
        out.append((n, copy_s, snap_s))
    return out


def main() -> None:
    from airflow_cdc.sources.postgres.copyread import native_available
    from airflow_cdc.testing.servers import PostgresServer

    args = parse_args()
    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_snapshot_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        cpu = ServerCpu(server.data_dir)
        log(f"compiled chunk reader (_pgcopy): {'yes' if native_available() else 'NO (pure Python)'}")
        log(f"populating {', '.join(f'{t}={n:,}' for t, n in TABLES.items())}")
        with psycopg.connect(dsn) as conn:
            for table, n in TABLES.items():
                dt, _ = timed(lambda t=table, k=n: populate(conn, t, k))
                log(f"  {table}: {n:,} rows in {dt:.1f}s")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        runner = Runner(server, Path(tmp))

        copy_times, snap_times, one_times, inline_times = [], [], [], []
        threads = {"snapshot.max.threads": args.threads}
        for i in range(args.repeats):
            dt, srv, cli, rows = cpu_timed(cpu, lambda: copy_all(dsn))
            copy_times.append(dt)
            log(f"COPY TO STDOUT #{i + 1}: {rows:,} rows in {dt:.2f}s = {rows / dt:,.0f} rows/s "
                f"(server CPU {srv:.2f}s, client CPU {cli:.2f}s)")
            for props, times in ((threads, snap_times), ({}, one_times)):
                cfg = runner.config(CHUNK, **props)
                dt, srv, cli, (rows, runs) = cpu_timed(cpu, lambda c=cfg: snapshot_until_done(c))
                times.append(dt)
                size = dir_size_mib(Path(cfg["staging.path"]))
                log(f"snapshot #{i + 1} (default chunk settings, snapshot.max.threads="
                    f"{props.get('snapshot.max.threads', 1)}): {rows:,} rows in {runs} run(s), {dt:.2f}s = "
                    f"{rows / dt:,.0f} rows/s (server CPU {srv:.2f}s, client CPU {cli:.2f}s; staged {size:.0f} MiB)")
                if rows != TOTAL:
                    log(f"  WARNING: expected {TOTAL:,} snapshot rows, got {rows:,}")
                runner.cleanup(cfg)
            dt = inline_run(runner, cpu)
            inline_times.append(dt)

        sweep, python_s = {}, None
        if not args.no_sweep:
            python_s = python_reader_run(runner, cpu)
            for chunk in (1024, 10_000, 50_000, 131_072):
                cfg = runner.config(chunk)
                dt, (rows, runs) = timed(lambda c=cfg: snapshot_until_done(c))
                sweep[chunk] = rows / dt
                log(f"chunk size {chunk:,}: {rows:,} rows in {runs} run(s), {dt:.2f}s = {rows / dt:,.0f} rows/s")
                runner.cleanup(cfg)

        child_rss = None
        if not args.no_rss:
            log(f"peak RSS: one snapshot run (default chunk settings, whole snapshot, {args.threads} readers) "
                "in a fresh CLI subprocess")
            cfg = runner.config(CHUNK, **threads)
            wall, child_rss, _ = run_cli_capture(cfg, Path(tmp), commit=True)
            log(f"  subprocess snapshot run: {wall:.2f}s wall (incl. interpreter start), "
                f"peak RSS {child_rss:,.0f} MiB")
            runner.cleanup(cfg)

        if not args.no_profile:
            log("profiling one in-process snapshot (default chunk settings, cProfile, tottime)")
            cfg = runner.config(CHUNK)
            _, prof = profile(lambda: snapshot_until_done(cfg))
            print(prof, flush=True)
            runner.cleanup(cfg)

        scaled = scaling(runner, dsn, cpu, [int(x) for x in args.scale.split(",")]) if args.scale else []

        copy_med, snap_med = median(copy_times), median(snap_times)
        copy_rate, snap_rate = TOTAL / copy_med, TOTAL / snap_med
        log(f"COPY seconds {fmt(copy_times, 2)} median {copy_med:.2f}s = {copy_rate:,.0f} rows/s")
        log(f"snapshot seconds ({args.threads} readers) {fmt(snap_times, 2)} median {snap_med:.2f}s = "
            f"{snap_rate:,.0f} rows/s")
        one_med, inline_med = median(one_times), median(inline_times)
        log(f"one reader: seconds {fmt(one_times, 2)} median {one_med:.2f}s")
        log(f"one reader without background writes: seconds {fmt(inline_times, 2)} median {inline_med:.2f}s; "
            f"the background writes save {1 - one_med / inline_med:.0%}")
        print(f"snapshot with one reader (snapshot.max.threads=1): {TOTAL / one_med:.0f} rows/s; ratio "
              f"{copy_med / one_med:.2f} vs COPY TO STDOUT", flush=True)
        print(f"snapshot without background writes: {TOTAL / inline_med:.0f} rows/s; ratio "
              f"{copy_med / inline_med:.2f} vs COPY TO STDOUT", flush=True)
        if python_s:
            print(f"pure-Python chunk reader: {TOTAL / python_s:.0f} rows/s; ratio {copy_med / python_s:.2f} "
                  "vs COPY TO STDOUT", flush=True)
        for chunk, rate in sweep.items():
            print(f"chunk size {chunk}: {rate:.0f} rows/s; ratio {rate / copy_rate:.2f} vs COPY TO STDOUT",
                  flush=True)
        for n, copy_s, snap_s in scaled:
            print(f"scaling {n} rows: COPY {copy_s:.2f}s, snapshot {snap_s:.2f}s ({snap_s / n * 1e6:.2f} us/row); "
                  f"ratio {copy_s / snap_s:.2f}", flush=True)
        if child_rss is not None:
            log(f"peak RSS: snapshot subprocess {child_rss:,.0f} MiB; this process {self_maxrss_mib():,.0f} MiB")
        ratio = snap_rate / copy_rate
        print(f"pg_snapshot: {snap_rate:.0f} rows/s; ratio {ratio:.2f} vs COPY TO STDOUT "
              f"(snapshot.max.threads={args.threads})", flush=True)


if __name__ == "__main__":
    main()
