"""``make demo``: the example DAG end to end on this machine, with a throwaway PostgreSQL.

1. start PostgreSQL 15 (wal_level=logical) on a free loopback port, load a small shop schema;
2. prepare Airflow in a private AIRFLOW_HOME (SQLite metadata DB, Connections as env variables);
3. run the example DAG ``cdc_postgres_shop`` with ``airflow dags test`` (initial snapshot ->
   staged batch -> Spark local[2] -> Delta bronze/silver -> commit);
4. insert, update and delete rows; 5. run the DAG again;
6. print the silver tables with their row counts next to the source's, and the last offset.

Everything lands under ``.local/demo/`` (logs, staging, Delta); the server is removed at exit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_cdc.testing.servers import PostgresServer  # noqa: E402

DEMO = Path(os.environ.get("DEMO_DIR", ROOT / ".local" / "demo")).absolute()
DAG_ID = "cdc_postgres_shop"
CONNECTOR = "shop"
TABLES = ["public.customers", "public.orders"]
BIN = Path(sys.executable).parent
SHOWN = (
    "[DAG TEST] starting task",
    "[DAG TEST] end task",
    "batch ",
    "applying batch",
    "committed batch",
    "note:",
    "ERROR",
    "Traceback",
    "DagRun Finished",
    "spark-submit",
    "nothing to apply",
)
STARTED = time.monotonic()


def step(n: int, text: str) -> None:
    print(f"\n\033[1m[{n}/6] {text}\033[0m  (+{time.monotonic() - STARTED:.0f}s)", flush=True)


def airflow_env(server: PostgresServer) -> dict[str, str]:
    conn = {
        "conn_type": "cdc_postgres",
        "host": server.host,
        "port": server.port,
        "login": server.superuser,
        "password": server.password,
        "schema": "shop",
    }
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(DEMO / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_CDC_POSTGRES_DEFAULT": json.dumps(conn),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_CDC_DATA": str(DEMO / "data"),
        "AIRFLOW_CDC_STATE_STORE": "airflow-variable://",
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),  # Spark stays on loopback
    }
    if (ROOT / ".jars").is_dir() and "AIRFLOW_CDC_DELTA_JARS" not in env:
        env["AIRFLOW_CDC_DELTA_JARS"] = str(ROOT / ".jars")
    return env


def airflow(env: dict[str, str], *args: str, log: Path) -> str:
    """Run the airflow CLI, echo the interesting lines as they come, keep the full output in ``log``."""
    lines: list[str] = []
    with (
        subprocess.Popen(
            [str(BIN / "airflow"), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=DEMO,
            stdin=subprocess.DEVNULL,
        ) as proc,
        log.open("w") as out,
    ):
        assert proc.stdout is not None
        last_echo = time.monotonic()
        for line in proc.stdout:
            out.write(line)
            lines.append(line)
            now = time.monotonic()
            if any(s in line for s in SHOWN):
                print("   ", line.rstrip()[:220], flush=True)
                last_echo = now
            elif now - last_echo > 10 and " INFO " in line:  # a sign of life from Spark every 10 s
                message = line.split(" INFO ", 1)[1].split(" [airflow.")[0].strip()
                print(f"    ... {message[:150]}", flush=True)
                last_echo = now
    text = "".join(lines)
    if proc.returncode != 0 or ("DagRun Finished" in text and "state=success" not in text):
        print(f"\nairflow {' '.join(args)} failed; full log: {log}", file=sys.stderr)
        sys.exit(1)
    return text


def change_rows(server: PostgresServer) -> None:
    import psycopg

    with psycopg.connect(server.dsn("shop"), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.customers (id, name, email) VALUES (51, 'new customer', 'n@example.com')"
        )
        conn.execute(
            "INSERT INTO public.orders SELECT 400 + i, 51, 'new', 10 * i, 'demo' "
            "FROM generate_series(1, 25) AS i"
        )
        conn.execute("UPDATE public.orders SET status = 'shipped', amount = amount + 1 WHERE id % 10 = 0")
        conn.execute("DELETE FROM public.orders WHERE id % 37 = 0")
        conn.execute("UPDATE public.customers SET email = NULL WHERE id = 7")
    print("    inserted 1 customer + 25 orders, updated 40 orders + 1 customer, deleted 10 orders")


def verify_silver(server: PostgresServer, spark: object) -> bool:
    """The apply issue's verify (row counts + per-row hashes) on the example pipeline's config."""
    from airflow_cdc.airflow.pipeline import load_pipeline
    from airflow_cdc.apply.verify import verify
    from airflow_cdc.core.pipeline import build_config

    spec = load_pipeline(ROOT / "dags" / "pipelines" / "postgres_shop.yaml")
    config = build_config(
        {
            **spec.properties,
            "database.hostname": server.host,
            "database.port": server.port,
            "database.user": server.superuser,
            "database.password": server.password,
            "database.dbname": "shop",
        }
    )
    result = verify(config, str(DEMO / "data" / "delta"), spark=spark)
    print(f"    verify (row counts + per-row hashes): {'equal' if result.ok else result.differences}")
    return bool(result.ok)


def report(server: PostgresServer, env: dict[str, str]) -> None:
    import psycopg

    os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW_CDC", "SPARK_"))})
    warnings.filterwarnings("ignore", category=FutureWarning)  # pyspark's notes on pandas versions
    warnings.filterwarnings("ignore", category=UserWarning)
    from airflow_cdc.apply.submit import silver_table_path
    from spark_jobs.cdc_apply import session

    spark = session.build(app_name="airflow-cdc-demo-report")
    ok = True
    print(f"    {'table':<20} {'source rows':>12} {'silver rows':>12}   silver location")
    with psycopg.connect(server.dsn("shop")) as conn:
        for table in TABLES:
            source = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names
            path = silver_table_path(str(DEMO / "data" / "delta"), CONNECTOR, table)
            silver = spark.read.format("delta").load(path).count()
            ok &= source == silver
            print(f"    {table:<20} {source:>12} {silver:>12}   {path}")
    verified = verify_silver(server, spark)
    ok &= verified
    spark.stop()
    proc = subprocess.run(
        [str(BIN / "airflow"), "variables", "get", f"airflow_cdc_state.{CONNECTOR}"],
        env=env,
        capture_output=True,
        text=True,
        cwd=DEMO,
    )
    state = json.loads(proc.stdout[proc.stdout.index("{") :]) if "{" in proc.stdout else {}
    print(
        f"    last offset: {json.dumps(state.get('state', {}).get('offset'))}  "
        f"(Airflow Variable airflow_cdc_state.{CONNECTOR}, version {state.get('version')})"
    )
    print(f"    staged batches: {DEMO / 'data' / 'staging' / CONNECTOR / 'batches'}")
    print(
        f"\n\033[1m{'source and silver agree' if ok else 'MISMATCH between source and silver'}\033[0m "
        f"({time.monotonic() - STARTED:.0f}s in all; logs in {DEMO / 'logs'})"
    )
    if not ok:
        sys.exit(1)


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    (DEMO / "logs").mkdir(parents=True)
    step(1, "starting a throwaway PostgreSQL 15 (wal_level=logical) with the sample shop schema")
    with PostgresServer() as server:
        server.create_database("shop")
        import psycopg

        with psycopg.connect(server.dsn("shop"), autocommit=True) as conn:
            conn.execute((ROOT / "scripts" / "demo_shop.sql").read_text())
        print(f"    PostgreSQL on {server.host}:{server.port}, database shop: 50 customers, 400 orders")
        env = airflow_env(server)
        step(2, f"preparing Airflow: AIRFLOW_HOME={env['AIRFLOW_HOME']} (SQLite), DAGs from {ROOT / 'dags'}")
        airflow(env, "db", "migrate", log=DEMO / "logs" / "db-migrate.log")
        step(3, f"run 1 of {DAG_ID}: sense -> capture (initial snapshot) -> apply (Spark local[2]) -> commit")
        airflow(env, "dags", "test", DAG_ID, log=DEMO / "logs" / "run-1.log")
        step(4, "changing rows in the source")
        change_rows(server)
        step(5, f"run 2 of {DAG_ID}: the change window since the committed offset")
        airflow(env, "dags", "test", DAG_ID, log=DEMO / "logs" / "run-2.log")
        step(6, "what landed in Delta")
        report(server, env)


if __name__ == "__main__":
    main()
