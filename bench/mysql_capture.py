"""Benchmark: capture of a 750k-row binlog window (500k inserts + 250k updates) into staged Parquet,
against a bare ``mysql-replication`` loop (rows only, no conversion) and ``mariadb-binlog -v`` over
the same window, all measured in this run on a throwaway MariaDB.

Measured: ``build_capture(config).run(commit=False)`` (the window is not consumed, so every
repeat reads the same window).  Baselines: ``BinLogStreamReader`` from the committed file/pos,
non-blocking, rows events only, iterating ``event.rows``; ``mariadb-binlog -v
--base64-output=DECODE-ROWS`` on the binlog files from the same position, output discarded.

The capture runs with the compiled row decoder's columnar hand-over (``_binlogcols.c``: values
straight into Arrow buffers), once more per repeat with ``AIRFLOW_CDC_MYSQL_COLUMNAR=0`` (the
compiled decoder building event tuples, the path before it) and with ``AIRFLOW_CDC_MYSQL_ROWS=python``
(the generated pure-Python readers) for comparison.  The first repeat checks that the columnar
and the tuple route staged identical rows and that every column of the table took a fast buffer.
``BENCH_MYSQL_INSERTS`` shrinks the window for profiling runs (default 500000);
``BENCH_MYSQL_QUICK=1`` leaves out the pure-Python and mysql-replication runs (the slow ones).

Last line: ``mysql_capture: <rows/s> rows/s; ratio <x> vs mariadb-binlog -v`` (issue 15's
headline); the mysql-replication ratio and the pure-Python capture are printed above it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import logging  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

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
COLUMNAR_ENV = "AIRFLOW_CDC_MYSQL_COLUMNAR"
QUICK = os.environ.get("BENCH_MYSQL_QUICK") == "1"

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


def staged_rows(staging: Path) -> pa.Table:
    """Every staged change row, in position order, without the write-time columns."""
    files = sorted(staging.rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f).drop_columns(["ts_ms", "ts_us", "ts_ns"]) for f in files])
    return table.sort_by("__position")


class _Buffers(logging.Handler):
    """Collects the column buffer kinds the columnar hand-over logs per table structure."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


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

        buffers = _Buffers()
        columnar_log = logging.getLogger("airflow_cdc.sources.mysql.columnar")
        columnar_log.addHandler(buffers)
        columnar_log.setLevel(logging.DEBUG)
        capture_t, tuples_t, python_t, bare_t, tool_t = [], [], [], [], []
        routes = [(capture_t, None, None), (tuples_t, COLUMNAR_ENV, "0")]
        routes += [] if QUICK else [(python_t, ROWS_ENV, "python")]
        for i in range(REPEATS):
            staged: list[pa.Table] = []
            for times, env, value in routes:
                clear_batches(staging, keep=set())
                if env:
                    os.environ[env] = value
                dt, result = timed(lambda: build_capture(config).run(commit=False))
                if env:
                    os.environ.pop(env)
                assert result.events == events, result.events
                times.append(dt)
                if i == 0 and env != ROWS_ENV:
                    staged.append(staged_rows(staging))
            if staged:
                assert staged[0].equals(staged[1]), "the columnar and the tuple route staged different rows"
                kinds = [line for line in buffers.lines if "bench.orders" in line]
                assert kinds and "=object" not in kinds[0], kinds
                log(f"staged rows identical on both routes ({staged[0].num_rows:,}); {kinds[0]}")
            if not QUICK:
                dt, rows = timed(lambda: bare_replication(server, file, pos, events))
                assert rows == events, rows
                bare_t.append(dt)
            dt, rows = timed(lambda: mariadb_binlog(server, files, pos))
            tool_t.append(dt)
            slow = (
                ""
                if QUICK
                else f", pure Python rows {python_t[-1]:.2f}s, mysql-replication {bare_t[-1]:.2f}s"
            )
            log(
                f"repeat {i + 1}: capture {capture_t[-1]:.2f}s, event tuples {tuples_t[-1]:.2f}s{slow}, "
                f"mariadb-binlog -v {tool_t[-1]:.2f}s"
            )
        clear_batches(staging, keep=set())
        _, top = profile(lambda: build_capture(config).run(commit=False), top=12)
        print(top)
        cap, tool = events / median(capture_t), events / median(tool_t)
        tuples = events / median(tuples_t)
        log(
            f"capture seconds {fmt(capture_t, 2)}, event tuples {fmt(tuples_t, 2)}, "
            f"pure-Python rows {fmt(python_t, 2) if python_t else '-'}, "
            f"mysql-replication {fmt(bare_t, 2) if bare_t else '-'}, mariadb-binlog {fmt(tool_t, 2)}"
        )
        if not QUICK:
            bare, pure = events / median(bare_t), events / median(python_t)
            print(
                f"mysql-replication loop: {bare:,.0f} rows/s (median of {REPEATS}); capture ratio {cap / bare:.2f}"
            )
            print(
                f"capture with pure-Python row readers: {pure:,.0f} rows/s; ratio {pure / tool:.2f} vs mariadb-binlog -v"
            )
        print(
            f"capture with event tuples (AIRFLOW_CDC_MYSQL_COLUMNAR=0): {tuples:,.0f} rows/s; "
            f"ratio {tuples / tool:.2f} vs mariadb-binlog -v"
        )
        print(f"mariadb-binlog -v: {tool:,.0f} rows/s (median of {REPEATS})")
        print(f"mysql_capture: {cap:,.0f} rows/s; ratio {cap / tool:.2f} vs mariadb-binlog -v")


if __name__ == "__main__":
    main()
