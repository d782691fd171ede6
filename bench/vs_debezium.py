"""Benchmark: our capture against Debezium embedded, on the same server and data in one run.

Cases (issue 36), each side in a fresh process of its own, ours first and then Debezium's:

- ``pg_window``: a PostgreSQL change window of ``--rows`` events (2/3 inserts, then 1/3 updates; the
  ``pg_capture`` table), pgoutput.  Each side's slot is made before the writes (ours by a first
  committed run, Debezium's by a first ``snapshot.mode=no_data`` run stopped once it streams), so
  both read the same WAL.  Ours: one run with the default window reader (``peek``), not committed.
- ``pg_snapshot``: an initial snapshot of the same table grown to ``--rows`` rows.  Ours: the
  chunked snapshot at the default settings (one reader, adaptive chunks), committed runs until no
  snapshot is pending; Debezium: ``snapshot.mode=initial``, stopped after ``--rows`` read events.
- ``mariadb_window`` / ``mariadb_snapshot``: the same on MariaDB 10.11's binlog with ``--rows / 2``
  events and rows (the ``mysql_capture`` table).  Debezium's first window run also waits for its
  snapshot's last schema record, whose processing stores the binlog offset it resumes from.

Debezium is 3.6.1.Final for the PostgreSQL cases and 3.5.0.Final, with its MariaDB connector, for
the MariaDB ones (``bench/debezium/pom-*.xml``: the MySQL connector of 3.x refuses MariaDB 10.11,
and 3.5.0 is the newest MariaDB connector the Maven mirror here serves); a set Maven cannot
resolve has its cases reported as skipped.  It runs ``DebeziumEngine.create(Json.class)`` with its
defaults (``bench/debezium/``) and a sink writing each record's JSON value as a line; its events/s
are timed from its first data event to its last, leaving the JVM's start-up out (reported apart).
Ours is timed over its capture runs, connections, slot checks and schema reads included; the
interpreter's start-up is reported apart.
Per case: events/s, peak RSS (``wait4``), CPU seconds of the timed phase and of the whole process,
MiB written, and the ratios ours / Debezium; both sides must count the same events.

Last line: ``vs_debezium: <case> <events/s> events/s; ratio <x> vs Debezium <version>``, the case
with the smallest events/s ratio and the Debezium version it ran (issue 36's bar: >= 3 on every
case, and a lower peak RSS).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from bench._common import (  # noqa: E402
    MYSQL_DDL,
    MYSQL_INSERT,
    TABLE_DDL,
    clear_batches,
    dir_size_mib,
    insert_range,
    log,
    pipeline_config,
    run_child,
)
from bench.debezium import engine  # noqa: E402
from bench.debezium.engine import MARIADB, POSTGRES, TOPIC_PREFIX, Build, Measured, NotServed  # noqa: E402
from bench.debezium.report import Case, report  # noqa: E402

CASES = ("pg_window", "pg_snapshot", "mariadb_window", "mariadb_snapshot")
DB = "bench"
PG_TOPIC = f"{TOPIC_PREFIX}.public.orders"
MARIADB_TOPIC = f"{TOPIC_PREFIX}.{DB}.orders"
BIG = 100_000_000  # run.max.events and snapshot.max.rows.per.run: each case in one capture run
MARIADB_STEP = 100_000


@dataclass
class Bench:
    """What every case needs: the options, the classpath of each Debezium set and a work folder."""

    args: argparse.Namespace
    classpaths: dict[Build, str]
    work: Path

    def debezium(self, build: Build, props: dict[str, Any], topic: str, events: int) -> Measured:
        """A run of ``build`` (``events`` 0: the first run, until it streams) with the ``--dbz``
        overrides."""
        opts = tuple(self.args.jvm_opts.split())
        props = {**props, **self.args.dbz}
        return engine.run_engine(
            self.classpaths[build], props, topic, events, self.work, idle_s=self.args.idle, jvm_opts=opts
        )

    def ours(self, config: dict[str, Any], mode: str, expected: int) -> Measured:
        """Our capture in a fresh process (``mode`` window: one run, not committed; snapshot:
        committed runs until no snapshot is pending), measured as Debezium's JVM is."""
        path = self.work / f"{config['name']}.json"
        path.write_text(json.dumps(config))
        run = run_child([sys.executable, str(Path(__file__).resolve()), "--child", str(path), mode])
        lines = [ln for ln in run.out.splitlines() if ln.startswith("RESULT ")]
        if run.code != 0 or not lines:
            raise RuntimeError(f"our capture {config['name']} failed ({run.code}):\n{run.out[-3000:]}")
        res = json.loads(lines[-1][len("RESULT ") :])
        if res["events"] != expected:
            raise RuntimeError(f"our capture {config['name']}: {res['events']} events, expected {expected}")
        return Measured(
            res["events"],
            res["elapsed_s"],
            res["cpu_s"],
            res["startup_s"],
            run.wall,
            run.cpu_s,
            run.rss_mib,
            dir_size_mib(Path(config["staging.path"])),
        )

    def pair(
        self, case: Case, ours: tuple[dict[str, Any], str], theirs: dict[str, Any], topic: str, expected: int
    ) -> None:
        """One repeat of ``case``: ours, then Debezium's, logged."""
        case.ours.append(self.ours(*ours, expected))
        case.theirs.append(self.debezium(case.build, theirs, topic, expected))
        for side, m in (("ours", case.ours[-1]), ("Debezium", case.theirs[-1])):
            log(
                f"{case.name} #{len(case.ours)} {side}: {m.events:,} events in {m.elapsed_s:.2f}s = "
                f"{m.rate:,.0f}/s; start-up {m.startup_s:.2f}s; CPU {m.cpu_s:.2f}s (process "
                f"{m.total_cpu_s:.2f}s); peak RSS {m.rss_mib:,.0f} MiB; wrote {m.out_mib:,.1f} MiB"
            )


def child_main(config_path: str, mode: str) -> None:
    """The child process of :meth:`Bench.ours`: prints ``RESULT {json}``."""
    import psutil

    from airflow_cdc.core.pipeline import build_capture

    def cpu() -> float:
        t = os.times()
        return t.user + t.system

    config = json.loads(Path(config_path).read_text())
    startup = time.time() - psutil.Process().create_time()
    cpu0, t0 = cpu(), time.perf_counter()
    capture = build_capture(config)
    events = runs = 0
    while True:
        res = capture.run(commit=mode == "snapshot")
        events, runs = events + (res.snapshot_rows if mode == "snapshot" else res.events), runs + 1
        stored = capture.store.load(config["name"])
        if mode == "window" or stored is None or not (stored.data.get("snapshot") or {}).get("pending"):
            break
        if runs > 100:
            raise RuntimeError("snapshot did not finish in 100 runs")
    elapsed, used = time.perf_counter() - t0, cpu() - cpu0
    result = {"events": events, "runs": runs, "elapsed_s": elapsed, "cpu_s": used, "startup_s": startup}
    print("RESULT " + json.dumps(result), flush=True)


def drop_slot(server: Any, slot: str) -> None:
    """Drop ``slot`` once its walsender has gone (it may outlive the process by a moment)."""
    for _ in range(100):
        rows = server.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,), dbname=DB
        )
        if not rows:
            return
        if not rows[0][0]:
            server.execute("SELECT pg_drop_replication_slot(%s)", (slot,), dbname=DB)
            return
        time.sleep(0.1)
    raise RuntimeError(f"slot {slot} still active")


def pg_window(b: Bench, server: Any, dsn: str) -> Case:
    import psycopg

    from airflow_cdc.core.pipeline import build_capture

    case, n = Case("pg_window", POSTGRES), b.args.repeats
    name = "ours_window"
    config = pipeline_config(
        server,
        DB,
        b.work / name,
        name,
        name,
        "ours_pub",
        **{"snapshot.mode": "no_data", "run.max.events": BIG},
    )
    first = build_capture(config).run(commit=True)  # our slot and publication
    dbz = [
        engine.postgres_props(server, DB, f"dbz_window_{i}", f"dbz_window_{i}", "no_data", b.work)
        for i in range(n)
    ]
    for props in dbz:
        b.debezium(case.build, props, PG_TOPIC, 0)  # its slot (and its publication, for all tables)
    inserts = b.args.rows * 2 // 3
    log(f"pg_window: {inserts:,} inserts + {inserts // 2:,} updates")
    with psycopg.connect(dsn) as conn:
        insert_range(conn, "orders", 1, inserts)
        conn.execute("UPDATE orders SET qty = qty + 1, active = NOT active WHERE id % 2 = 0")
        conn.commit()
        conn.execute("CHECKPOINT")
    for props in dbz:
        clear_batches(Path(config["staging.path"]), keep={first.batch_id})
        b.pair(case, (config, "window"), props, PG_TOPIC, inserts + inserts // 2)
        drop_slot(server, props["slot.name"])
    drop_slot(server, config["slot.name"])
    return case


def pg_snapshot(b: Bench, server: Any, dsn: str) -> Case:
    import psycopg

    case, rows = Case("pg_snapshot", POSTGRES), b.args.rows
    with psycopg.connect(dsn, autocommit=True) as conn:
        top = conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()[0]  # type: ignore[index]
        insert_range(conn, "orders", top + 1, rows)
        conn.execute("VACUUM ANALYZE orders")
        conn.execute("CHECKPOINT")
    log(f"pg_snapshot: orders holds {rows:,} rows")
    for i in range(b.args.repeats):
        name = f"ours_snap_{i}"
        config = pipeline_config(
            server,
            DB,
            b.work / name,
            name,
            name,
            "ours_pub",
            **{"snapshot.mode": "initial", "snapshot.max.rows.per.run": BIG, "run.max.events": BIG},
        )
        props = engine.postgres_props(server, DB, f"dbz_snap_{i}", f"dbz_snap_{i}", "initial", b.work)
        b.pair(case, (config, "snapshot"), props, PG_TOPIC, rows)
        drop_slot(server, config["slot.name"])
        drop_slot(server, props["slot.name"])
    return case


def postgres_cases(b: Bench, wanted: list[str]) -> list[Case]:
    import psycopg

    from airflow_cdc.testing.servers import PostgresServer

    with PostgresServer() as server:
        server.start()
        dsn = server.create_database(DB)
        with psycopg.connect(dsn) as conn:
            conn.execute(TABLE_DDL.format(name="orders"))
            conn.commit()
        cases = [pg_window(b, server, dsn)] if "pg_window" in wanted else []
        return cases + ([pg_snapshot(b, server, dsn)] if "pg_snapshot" in wanted else [])


def mariadb_fill(server: Any, lo: int, hi: int) -> None:
    for start in range(lo, hi + 1, MARIADB_STEP):
        server.execute(MYSQL_INSERT.format(lo=start, hi=min(hi, start + MARIADB_STEP - 1)), database=DB)


def mariadb_config(server: Any, b: Bench, name: str, **props: Any) -> dict[str, Any]:
    return {
        "name": name,
        "connector": "mariadb",
        "database.hostname": server.host,
        "database.port": server.port,
        "database.user": "root",
        "database.password": server.password,
        "database.include.list": DB,
        "staging.path": str(b.work / name),
        "run.max.events": BIG,
        **props,
    }


def mariadb_window(b: Bench, server: Any) -> Case:
    from airflow_cdc.core.pipeline import build_capture

    case = Case("mariadb_window", MARIADB)
    config = mariadb_config(server, b, "ours_mariadb_window", **{"snapshot.mode": "no_data"})
    first = build_capture(config).run(commit=True)  # our binlog position
    dbz = [
        engine.mariadb_props(server, DB, f"dbz_mariadb_window_{i}", 5400 + i, "no_data", b.work)
        for i in range(b.args.repeats)
    ]
    for props in dbz:
        b.debezium(case.build, props, MARIADB_TOPIC, 0)  # its binlog position and schema history
    inserts = b.args.rows // 3
    log(f"mariadb_window: {inserts:,} inserts + {inserts // 2:,} updates")
    mariadb_fill(server, 1, inserts)
    for lo in range(1, inserts + 1, MARIADB_STEP):
        server.execute(
            "UPDATE orders SET qty = qty + 1, active = 1 - active WHERE id BETWEEN %s AND %s AND id %% 2 = 0",
            (lo, lo + MARIADB_STEP - 1),
            database=DB,
        )
    for props in dbz:
        clear_batches(Path(config["staging.path"]), keep={first.batch_id})
        b.pair(case, (config, "window"), props, MARIADB_TOPIC, inserts + inserts // 2)
    return case


def mariadb_snapshot(b: Bench, server: Any) -> Case:
    case, rows = Case("mariadb_snapshot", MARIADB), b.args.rows // 2
    top = server.execute("SELECT coalesce(max(id), 0) FROM orders", database=DB)[0][0]
    mariadb_fill(server, top + 1, rows)
    log(f"mariadb_snapshot: orders holds {rows:,} rows")
    for i in range(b.args.repeats):
        config = mariadb_config(
            server,
            b,
            f"ours_mariadb_snap_{i}",
            **{"snapshot.mode": "initial", "snapshot.max.rows.per.run": BIG},
        )
        props = engine.mariadb_props(server, DB, f"dbz_mariadb_snap_{i}", 5500 + i, "initial", b.work)
        b.pair(case, (config, "snapshot"), props, MARIADB_TOPIC, rows)
    return case


def mariadb_cases(b: Bench, wanted: list[str]) -> list[Case]:
    from airflow_cdc.testing.servers import MariaDbServer

    with MariaDbServer() as server:
        server.start()
        server.create_database(DB)
        server.execute(MYSQL_DDL, database=DB)
        cases = [mariadb_window(b, server)] if "mariadb_window" in wanted else []
        return cases + ([mariadb_snapshot(b, server)] if "mariadb_snapshot" in wanted else [])


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--rows",
        type=int,
        default=1_500_000,
        help="PostgreSQL window events and snapshot rows; MariaDB's are half (default 1500000)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs of each side per case (medians reported)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    ap.add_argument(
        "--dbz",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Debezium property over its defaults, e.g. max.batch.size=8192 (repeatable)",
    )
    ap.add_argument("--jvm-opts", default="", help="Debezium JVM options: --jvm-opts=-Xmx512m (default none)")
    ap.add_argument("--idle", type=int, default=300, help="seconds with no data event failing a Debezium run")
    ap.add_argument("--workdir", help="keep Debezium's logs and sinks and our staging here (default: temp)")
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.dbz = dict(kv.split("=", 1) for kv in args.dbz)
    return args


def built_sets(sets: dict[Build, list[str]]) -> tuple[dict[Build, str], list[Case]]:
    """Fetch and compile each Debezium set some wanted case needs: the classpaths of those that
    resolve, and the cases of those Maven cannot resolve, marked skipped (tried again next run)."""
    classpaths: dict[Build, str] = {}
    skipped: list[Case] = []
    for build, names in sets.items():
        if not names:
            continue
        try:
            classpaths[build] = engine.ensure_built(build)
        except NotServed as e:
            why = str(e).splitlines()[0]
            log(f"{', '.join(names)} skipped: Debezium {build.version} ({build.name}) not fetched: {e}")
            skipped += [Case(name, build, skipped=f"not fetched: {why}") for name in names]
    return classpaths, skipped


def main() -> None:
    args = parse_args()
    if args.child:
        child_main(*args.child)
        return
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(wanted) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}")
    sets = {
        POSTGRES: [c for c in wanted if c.startswith("pg")],
        MARIADB: [c for c in wanted if c.startswith("mariadb")],
    }
    classpaths, skipped = built_sets(sets)
    overrides = f"; overrides: {args.dbz}" if args.dbz else ""
    note = engine.SETTINGS_NOTE + overrides + (f"; JVM options {args.jvm_opts}" if args.jvm_opts else "")
    with tempfile.TemporaryDirectory(prefix="vs_debezium_") as tmp:
        b = Bench(args, classpaths, Path(args.workdir or tmp))
        b.work.mkdir(parents=True, exist_ok=True)
        cases = postgres_cases(b, sets[POSTGRES]) if POSTGRES in classpaths else []
        cases += mariadb_cases(b, sets[MARIADB]) if MARIADB in classpaths else []
    report(cases + skipped, note)


if __name__ == "__main__":
    main()
