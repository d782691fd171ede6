"""Benchmark: the latency of one small apply -- ``airflow-cdc apply --commit`` of a 1,000-event
batch (500 inserts, 500 updates of a 20,000-row PostgreSQL table), from process start to commit --
through a warm **Spark Connect** server (``spark.remote``: the job runs as its client, no JVM on
this side), and beside it with ``spark-submit`` on ``local[2]`` (a JVM and session per apply).

Two pipelines (two slots) capture the same changes each round, so both engines apply batches of
the same 1,000 events; the Connect server is started once and warmed by the untimed first batch
(the initial snapshot, which creates the tables) and ``--warmup`` untimed rounds (2): a server that
applies a pipeline's batches every few minutes has its JIT-compiled code, as one fresh from its
start does not (its first 1,000-event apply took 8-9 s where the fifth took 5-6 s, 2026-12-04).

Options for measuring settings: ``--conf`` (the Connect client's runtime conf), ``--server-conf``
(the Connect server's launch conf: a profiler, an event log), ``--property`` (pipeline properties,
both engines), ``--connect-only`` (no spark-submit rounds, no ratio).

Parts, from the job's JSON report (``timings``, ``plan_seconds``, per table ``seconds`` and
``log_replay_seconds``) and the wall clock around the CLI process:

* start: CLI start-up, lease, and the job process (``spark-submit`` + JVM, or the Connect client)
  until the job's Python starts;
* session: ``SparkSession`` creation (a SparkContext with Delta; or a Connect client session);
* plan: reading the staged parts' schemas and the silver tables' schemas;
* per table: bronze, silver (and its Delta log replay);
* end: the job's shutdown, then the commit of the batch (state store and slot).

With ``AIRFLOW_CDC_CONNECT_TRACE=1`` each Connect round also prints the client's RPCs by job line.

Also measured: ``spark-submit`` of a script that builds the same session and counts one row (the
fixed cost of any Spark job started that way).

Last line: ``apply_latency: <median s> s; ratio <x> vs spark-submit apply`` (Connect's median over
spark-submit's, same run).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import psycopg  # noqa: E402

from bench._common import REPO, TABLE_DDL, fmt, insert_range, log, median, pipeline_config  # noqa: E402

os.environ.setdefault("AIRFLOW_CDC_DELTA_JARS", str(REPO / ".jars"))

DB, TABLE = "bench_latency", "orders"
BARE = """
import time
from pyspark.sql import SparkSession
t0 = time.time()
spark = SparkSession.builder.appName("bench-bare").getOrCreate()
print("BARE", spark.range(1).count(), round(time.time() - t0, 3), flush=True)
"""


def _env() -> dict[str, str]:
    path = str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    return dict(os.environ, PYTHONPATH=path)


def _cli(args: list[str]) -> tuple[float, float, str]:
    """Run ``python -m airflow_cdc.cli ARGS``; returns (start epoch, wall seconds, output)."""
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_cdc.cli", *args],
        env=_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"airflow-cdc {args[0]} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return started, wall, proc.stdout + proc.stderr


def _report(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("{") and '"timings"' in line:
            return dict(json.loads(line))
    raise RuntimeError(f"no job report in the apply output:\n{output[-3000:]}")


def parts(started: float, wall: float, report: dict[str, Any]) -> dict[str, float]:
    timings = report["timings"]
    out = {
        "start": timings["python_started_at"] - started,
        "session": timings["session_seconds"],
        "plan": report.get("plan_seconds", 0.0),
    }
    for name, table in report["tables"].items():
        out[f"table {name}"] = table.get("seconds", 0.0)
        out[f"  log replay {name}"] = table.get("log_replay_seconds", 0.0)
    out["end (shutdown, commit)"] = started + wall - timings["finished_at"]
    return out


def bare_session(job: Any, work: Path) -> float:
    script = work / "bare.py"
    script.write_text(BARE)
    bare = dataclasses.replace(job, application=str(script), application_args=[], name="bench-bare")
    t0 = time.perf_counter()
    proc = subprocess.run(
        bare.command("local[2]"), env={**os.environ, **bare.env}, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or "BARE 1" not in proc.stdout:
        raise RuntimeError(f"bare spark-submit failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=20_000, help="rows of the table before the timed batches")
    p.add_argument("--events", type=int, default=1_000, help="events per timed batch (half inserts)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed rounds first (a server applying every few minutes is warm)",
    )
    p.add_argument("--conf", action="append", default=[], help="KEY=VALUE for the Connect applies")
    p.add_argument("--server-conf", action="append", default=[], help="KEY=VALUE for the Connect server")
    p.add_argument(
        "--property", action="append", default=[], help="KEY=VALUE pipeline property (both engines)"
    )
    p.add_argument("--connect-only", action="store_true", help="no spark-submit path (no ratio)")
    args = p.parse_args()
    from airflow_cdc.apply.submit import build_apply_job
    from airflow_cdc.core.batch import list_batches
    from airflow_cdc.testing.servers import PostgresServer
    from airflow_cdc.testing.spark_connect import SparkConnectServer

    with (
        PostgresServer() as server,
        tempfile.TemporaryDirectory(prefix="bench_latency_") as tmp,
        SparkConnectServer(
            env={"PYSPARK_PYTHON": sys.executable},
            conf=dict(item.partition("=")[::2] for item in args.server_conf),
        ) as connect,
    ):
        server.start()
        work = Path(tmp)
        dsn = server.create_database(DB)
        with psycopg.connect(dsn) as conn:
            conn.execute(TABLE_DDL.format(name=TABLE))
            conn.commit()
            insert_range(conn, TABLE, 1, args.rows)
        engines: dict[str, tuple[dict[str, Any], list[str]]] = {}
        conf = [arg for item in args.conf for arg in ("--conf", item)]
        choices = [("connect", ["--remote", connect.url, *conf])]
        if not args.connect_only:
            choices.insert(0, ("spark-submit", []))
        for engine, extra in choices:
            name = f"bench_latency_{engine.replace('-', '_')}"
            config = pipeline_config(
                server, DB, work / engine / "staging", name, f"{name}_slot", f"{name}_pub",
                **{"delta.root": str(work / engine / "delta")},
                **dict(item.partition("=")[::2] for item in args.property),
            )  # fmt: skip
            path = work / f"{engine}.json"
            path.write_text(json.dumps(config))
            engines[engine] = (config, ["--config", str(path), *extra])
        log(f"initial snapshot of {args.rows:,} rows, applied untimed (creates the Delta tables)")
        for _config, cli in engines.values():
            _cli(["capture", *cli[:2]])
            _cli(["apply", "--commit", *cli])
        walls: dict[str, list[float]] = {e: [] for e in engines}
        all_parts: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
        bares = []
        next_id = args.rows + 1
        for i in range(args.warmup + args.repeats):
            timed, label = i >= args.warmup, f"round {i + 1 - args.warmup}" if i >= args.warmup else "warm-up"
            half = args.events // 2
            with psycopg.connect(dsn) as conn:
                insert_range(conn, TABLE, next_id, next_id + half - 1)
                conn.execute(f"UPDATE {TABLE} SET qty = qty + 1 WHERE id <= %s", (args.events - half,))  # noqa: S608
                conn.commit()
            next_id += half
            for engine, (config, cli) in engines.items():
                _cli(["capture", *cli[:2]])
                batch = list_batches(config["staging.path"], config["name"])[-1]
                events = sum(t["rows"] for t in batch.manifest["tables"].values())
                if events != args.events:
                    raise RuntimeError(f"{engine}: batch has {events} events, not {args.events}")
                started, wall, output = _cli(["apply", "--commit", "--batch", str(batch.path), *cli])
                split = parts(started, wall, _report(output))
                if timed:
                    walls[engine].append(wall)
                    all_parts[engine].append(split)
                detail = ", ".join(f"{k.strip()} {v:.2f}s" for k, v in split.items())
                log(f"{label} {engine}: {events} events, apply --commit {wall:.2f}s ({detail})")
                if engine == "connect" and "connect rpcs:" in output:  # AIRFLOW_CDC_CONNECT_TRACE=1
                    rpcs = [line for line in output.splitlines() if "connect rpc " in line]
                    log("\n".join([*rpcs, output[output.index("connect rpcs:") :].strip()]))
            if args.connect_only or not timed:
                continue
            submit_config = engines["spark-submit"][0]
            last = list_batches(submit_config["staging.path"], submit_config["name"])[-1]
            bares.append(bare_session(build_apply_job(last.path, submit_config["delta.root"]), work))
            log(f"{label}: bare spark-submit session {bares[-1]:.1f}s")
        for engine in engines:
            log(f"{engine}: apply --commit walls {fmt(walls[engine], 2)} s")
            for key in all_parts[engine][0]:
                log(f"  median {key.strip()}: {median([s[key] for s in all_parts[engine]]):.2f}s")
        if bares:
            log(f"bare spark-submit sessions {fmt(bares, 1)} s")
        remote = median(walls["connect"])
        if args.connect_only:
            print(f"apply_latency: {remote:.2f} s (Connect only, no baseline)")
            return
        submit = median(walls["spark-submit"])
        print(f"apply_latency: {remote:.2f} s; ratio {remote / submit:.2f} vs spark-submit apply")


if __name__ == "__main__":
    main()
