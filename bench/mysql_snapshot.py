"""Benchmark: initial snapshot of a MariaDB table through the capture pipeline vs plain SELECTs.

One table (500k rows, the ``mysql_capture`` column mix).  Baselines: PyMySQL (the connector's own
driver) streaming ``SELECT * FROM orders`` with an unbuffered cursor, and the ``mariadb`` command
line client (C) with ``--quick --batch``, output discarded.  Measured: a fresh connector with
``snapshot.mode=initial``, the default chunk settings and ``snapshot.max.rows.per.run=10000000``,
``run(commit=True)`` until no snapshot is pending; median of 3 each, plus a cProfile of one run.

Last line: ``mysql_snapshot: <rows/s> rows/s; ratio <x> vs PyMySQL SELECT; <y> vs mariadb client``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from bench._common import MYSQL_DDL, MYSQL_INSERT, REPEATS, fmt, log, median, profile, timed  # noqa: E402

ROWS, STEP = 500_000, 100_000


def pymysql_select(server) -> int:  # noqa: ANN001
    import pymysql
    import pymysql.cursors

    conn = pymysql.connect(host=server.host, port=server.port, user="root", password=server.password,
                           database="bench", cursorclass=pymysql.cursors.SSCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM orders")
            return sum(1 for _ in cur)
    finally:
        conn.close()


def client_select(server) -> int:  # noqa: ANN001
    out = subprocess.run(
        ["mariadb", "-h", server.host, "-P", str(server.port), "-u", "root", f"-p{server.password}",
         "--quick", "--batch", "--skip-column-names", "bench", "-e", "SELECT * FROM orders"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
    )
    return out.stdout.count(b"\n")


def main() -> None:
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.testing.servers import MariaDbServer

    with MariaDbServer() as server, tempfile.TemporaryDirectory(prefix="bench_mysql_snap_") as tmp:
        server.start()
        server.create_database("bench")
        server.execute(MYSQL_DDL, database="bench")
        for lo in range(1, ROWS + 1, STEP):
            server.execute(MYSQL_INSERT.format(lo=lo, hi=min(ROWS, lo + STEP - 1)), database="bench")
        log(f"populated orders with {ROWS:,} rows")
        n = 0

        def config() -> dict:
            nonlocal n
            n += 1
            return {"name": f"bench_mysql_snap_{n}", "connector": "mariadb", "database.hostname": server.host,
                    "database.port": server.port, "database.user": "root",
                    "database.password": server.password, "database.include.list": "bench",
                    "staging.path": str(Path(tmp) / f"staging_{n}"), "snapshot.mode": "initial",
                    "snapshot.max.rows.per.run": 10_000_000, "run.max.events": 5_000_000}

        def snapshot(cfg: dict) -> tuple[int, int]:
            capture = build_capture(cfg)
            rows = runs = 0
            while True:
                res = capture.run(commit=True)
                rows, runs = rows + res.snapshot_rows, runs + 1
                if not (capture.store.load(cfg["name"]).data.get("snapshot") or {}).get("pending"):
                    return rows, runs

        py_t, cli_t, snap_t = [], [], []
        for i in range(REPEATS):
            dt, rows = timed(lambda: pymysql_select(server))
            py_t.append(dt)
            dt2, rows2 = timed(lambda: client_select(server))
            cli_t.append(dt2)
            cfg = config()
            dt3, (srows, runs) = timed(lambda c=cfg: snapshot(c))
            snap_t.append(dt3)
            shutil.rmtree(cfg["staging.path"], ignore_errors=True)
            log(f"#{i + 1}: PyMySQL SELECT {rows:,} rows {dt:.2f}s; mariadb client {rows2:,} rows {dt2:.2f}s; "
                f"snapshot {srows:,} rows in {runs} run(s) {dt3:.2f}s")
        cfg = config()
        _, prof = profile(lambda: snapshot(cfg), top=12)
        print(prof, flush=True)
        py, cli, snap = median(py_t), median(cli_t), median(snap_t)
        log(f"PyMySQL {fmt(py_t, 2)}, mariadb client {fmt(cli_t, 2)}, snapshot {fmt(snap_t, 2)} seconds")
        print(f"PyMySQL SELECT: {ROWS / py:.0f} rows/s; mariadb client: {ROWS / cli:.0f} rows/s", flush=True)
        print(f"mysql_snapshot: {ROWS / snap:.0f} rows/s; ratio {py / snap:.2f} vs PyMySQL SELECT; "
              f"{cli / snap:.2f} vs mariadb client", flush=True)


if __name__ == "__main__":
    main()
