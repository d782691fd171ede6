"""Benchmark: capture of a 750k-row binlog window (500k inserts + 250k updates) into staged Parquet,
against a bare ``mysql-replication`` loop (rows only, no conversion) and ``mariadb-binlog -v`` over
the same window, all measured in this run on a throwaway MariaDB.

Measured: ``build_capture(config).run(commit=False)`` (the window is not consumed, so every
repeat reads the same window).  Baselines: ``BinLogStreamReader`` from the committed file/pos,
non-blocking, rows events only, iterating ``event.rows``; ``mariadb-binlog -v
--base64-output=DECODE-ROWS`` on the binlog files from the same position, output discarded.

The capture runs with the compiled row decoder (``_binlogrows``) and once more per repeat with
``AIRFLOW_CDC_MYSQL_ROWS=python`` (the generated pure-Python readers) for comparison.
``BENCH_MYSQL_INSERTS`` shrinks the window for profiling runs (default 500000).

Last line: ``mysql_capture: <rows/s> rows/s; ratio <x> vs mariadb-binlog -v`` (issue 15's
headline); the mysql-replication ratio and the pure-Python capture are printed above it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from bench._common import (  # noqa: E402
    MYSQL_DDL,
    MYSQL_INSERT,
    REPEATS,
    clear_batches,
    fmt,
    log,
    median,
    profile,
    timed,
)

ROWS_ENV = "AIRFLOW_CDC_MYSQL_ROWS"

INSERTS = int(os.environ.get("BENCH_MYSQL_INSERTS", "500000"))  # smaller for profiling runs
STEP = 100_000


def bare_replication(server, file: str, pos: int, expected: int) -> int:
    """Count the window's rows from ``file:pos`` (plain COM_BINLOG_DUMP: mysql-replication 1.0.17's
    MariaDB GTID mode reconnects and starts over in the middle of large windows)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    stream = BinLogStreamReader(
        connection_settings={
            "host": server.host,
            "port": server.port,
            "user": "root",
            "passwd": server.password,
        },
        server_id=4321,
        log_file=file,
        log_pos=pos,
        resume_stream=True,
        blocking=False,
        is_mariadb=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )
    rows = 0
    try:
        for event in stream:
            rows += len(event.rows)
            if rows >= expected:
                break
    finally:
        stream.close()
    return rows


def mariadb_binlog(server, files: list[str], pos: int) -> int:
    paths = [str(server.data_dir / f) for f in files]
    out = subprocess.run(
        ["mariadb-binlog", "-v", "--base64-output=DECODE-ROWS", f"--start-position={pos}", *paths],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return out.stdout.count(b"\n### INSERT") + out.stdout.count(b"\n### UPDATE")


def main() -> None:
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.testing.servers import MariaDbServer

    with MariaDbServer() as server, tempfile.TemporaryDirectory(prefix="bench_mysql_") as tmp:
        server.start()
        server.create_database("bench")
        staging = Path(tmp) / "staging"
        config = {
            "name": "bench_mysql",
            "connector": "mariadb",
            "database.hostname": server.host,
            "database.port": server.port,
            "database.user": "root",
            "database.password": server.password,
            "database.include.list": "bench",
            "staging.path": str(staging),
            "snapshot.mode": "no_data",
            "run.max.events": 5_000_000,
        }
        server.execute(MYSQL_DDL, database="bench")
        first = build_capture(config).run(commit=True)
        file, pos = first.to_offset["file"], first.to_offset["pos"]
        log(f"initial capture committed at {file}:{pos}")
        log(f"generating {INSERTS:,} inserts + {INSERTS // 2:,} updates")
        for lo in range(1, INSERTS + 1, STEP):
            server.execute(MYSQL_INSERT.format(lo=lo, hi=min(lo + STEP - 1, INSERTS)), database="bench")
        for lo in range(2, INSERTS + 1, STEP):
            server.execute(
                "UPDATE orders SET qty = qty + 1, active = 1 - active WHERE id BETWEEN %s AND %s "
                "AND id %% 2 = 0",
                (lo, lo + STEP - 1),
                database="bench",
            )
        files = [r[0] for r in server.execute("SHOW BINARY LOGS") if r[0] >= file]
        events = INSERTS + INSERTS // 2

        capture_t, python_t, bare_t, tool_t = [], [], [], []
        for i in range(REPEATS):
            for times, rows_env in ((capture_t, None), (python_t, "python")):
                clear_batches(staging, keep=set())
                os.environ.pop(ROWS_ENV, None)
                if rows_env:
                    os.environ[ROWS_ENV] = rows_env
                dt, result = timed(lambda: build_capture(config).run(commit=False))
                os.environ.pop(ROWS_ENV, None)
                assert result.events == events, result.events
                times.append(dt)
            dt, rows = timed(lambda: bare_replication(server, file, pos, events))
            assert rows == events, rows
            bare_t.append(dt)
            dt, rows = timed(lambda: mariadb_binlog(server, files, pos))
            tool_t.append(dt)
            log(
                f"repeat {i + 1}: capture {capture_t[-1]:.2f}s (pure Python rows {python_t[-1]:.2f}s), mysql-replication {bare_t[-1]:.2f}s, "
                f"mariadb-binlog -v {tool_t[-1]:.2f}s"
            )
        clear_batches(staging, keep=set())
        _, top = profile(lambda: build_capture(config).run(commit=False), top=12)
        print(top)
        cap, bare, tool = events / median(capture_t), events / median(bare_t), events / median(tool_t)
        pure = events / median(python_t)
        log(
            f"capture seconds {fmt(capture_t, 2)}, pure-Python rows {fmt(python_t, 2)}, "
            f"mysql-replication {fmt(bare_t, 2)}, mariadb-binlog {fmt(tool_t, 2)}"
        )
        print(
            f"mysql-replication loop: {bare:,.0f} rows/s (median of {REPEATS}); capture ratio {cap / bare:.2f}"
        )
        print(
            f"capture with pure-Python row readers: {pure:,.0f} rows/s; ratio {pure / tool:.2f} vs mariadb-binlog -v"
        )
        print(f"mariadb-binlog -v: {tool:,.0f} rows/s (median of {REPEATS})")
        print(f"mysql_capture: {cap:,.0f} rows/s; ratio {cap / tool:.2f} vs mariadb-binlog -v")


if __name__ == "__main__":
    main()
