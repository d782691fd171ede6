"""The provider against a real PostgreSQL and a real Airflow (``airflow dags test``), without Spark:
ad hoc snapshots through run conf and the trigger form, the Variable state backend in real tasks,
the deferrable sensor's trigger inside a DAG run."""

from __future__ import annotations

import json
import threading
import time

from airflow_cdc.core.batch import list_batches
from tests.airflow.conftest import pg_connection_env, write_dag
from tests.airflow.support import batch_rows, load_shop, newest_batch, pipeline_props, write_pipeline

CONN = "cdc_pg_test"


def _setup(pg_db, tmp_path, **airflow):
    load_shop(pg_db)
    staging = tmp_path / "staging"
    props = pipeline_props(pg_db, staging, **{"state.store": "airflow-variable://?prefix=cdc_test."})
    options = {
        "dag_id": f"t_{pg_db.name}",
        "cdc_conn_id": CONN,
        "apply": False,
        "retries": 0,
        "deferrable": True,
        "poke_interval": 1,
        **airflow,
    }
    pipeline = write_pipeline(tmp_path / "pipeline.yaml", props, options)
    dags = tmp_path / "dags"
    write_dag(dags, pipeline)
    env = pg_connection_env(pg_db, CONN)
    return props, staging, dags, env, options["dag_id"]


def test_adhoc_snapshot_through_run_conf_and_form(pg_db, tmp_path, airflow_cli):
    props, staging, dags, env, dag_id = _setup(pg_db, tmp_path)
    name = props["name"]
    airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)  # initial snapshot
    first = newest_batch(staging, name)
    assert first.manifest["counts"]["snapshot_rows"] == 450

    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET note = 'changed' WHERE id = 10")
    conf = {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["public.orders"],
            "type": "incremental",
            "additional-conditions": [
                {"data-collection": "public.orders", "filter": "id <= 3 OR status = 'x'"}
            ],
        },
    }
    out = airflow_cli.dags_test(dag_id, conf, env=env, dags_folder=dags)
    assert "ad hoc snapshot" in out
    batch = newest_batch(staging, name)
    orders = batch_rows(batch, "public.orders")
    snap = [r for r in orders if r["op"] == "r"]
    assert sorted(r["after"]["id"] for r in snap) == [1, 2, 3]
    assert all(r["source"]["snapshot"] == "incremental" for r in snap)
    assert [(r["op"], r["after"]["id"]) for r in orders if r["op"] != "r"] == [
        ("u", 10)
    ]  # the log still flows
    assert batch_rows(batch, "public.customers") == []

    # the trigger form's fields (what the UI puts into the conf)
    form = {
        "snapshot_tables": "public.customers",
        "snapshot_filter": "id > 48",
        "surrogate_key": "",
        "stop_snapshot": False,
    }
    airflow_cli.dags_test(dag_id, form, env=env, dags_folder=dags)
    batch = newest_batch(staging, name)
    assert sorted(r["after"]["id"] for r in batch_rows(batch, "public.customers")) == [49, 50]
    assert batch_rows(batch, "public.orders") == []

    # the offset lives in one Airflow Variable per connector, written by the commit tasks
    proc = airflow_cli.run("variables", "get", f"cdc_test.{name}", env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(
        proc.stdout.strip().splitlines()[-1] if not proc.stdout.strip().startswith("{") else proc.stdout
    )
    assert record["connector"] == name and record["version"] == 4  # the first run stores its start, then 3 commits
    assert record["state"]["last_batch"] == batch.batch_id
    assert record["state"]["offset"] == batch.manifest["to_offset"]


def test_deferred_sensor_waits_in_trigger_until_changes(pg_db, tmp_path, airflow_cli):
    props, staging, dags, env, dag_id = _setup(pg_db, tmp_path, check="slot")
    airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)
    assert len(list_batches(staging, props["name"])) == 1
    proc = airflow_cli.popen_dags_test(dag_id, env=env, dags_folder=dags)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout or []:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any("running trigger in line" in line for line in list(lines)):  # sense deferred
            assert proc.poll() is None, "".join(lines)[-5000:]
            assert time.monotonic() < deadline, "the sensor never deferred:\n" + "".join(lines)[-5000:]
            time.sleep(0.5)
        time.sleep(3)  # the trigger polls (every second) and finds nothing
        assert proc.poll() is None, "the run should be waiting for changes:\n" + "".join(lines)[-5000:]
        assert len(list_batches(staging, props["name"])) == 1
        with pg_db.connect(autocommit=True) as conn:
            conn.execute("INSERT INTO public.orders VALUES (9999, 1, 'new', 1.5, 'late')")
        proc.wait(timeout=300)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert "state=success" in out, out[-5000:]
    assert "Trigger completed" in out
    batch = newest_batch(staging, props["name"])
    assert [(r["op"], r["after"]["id"]) for r in batch_rows(batch, "public.orders")] == [("c", 9999)]


def test_mysql_pipeline_through_airflow(mariadb_db, tmp_path, airflow_cli):
    """The MySQL/MariaDB source behind a ``cdcmysql`` Connection: snapshot run, then a change run."""
    with mariadb_db.connect(autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, status VARCHAR(20) NOT NULL)")
        cur.execute("INSERT INTO orders VALUES (1, 'new'), (2, 'paid'), (3, 'new')")
    server, staging = mariadb_db.server, tmp_path / "staging"
    props = {
        "name": f"my_{mariadb_db.name}",
        "connector": "mysql",
        "table.include.list": f"{mariadb_db.name}.orders",
        "staging.path": str(staging),
        "state.store": "airflow-variable://?prefix=cdc_test.",
    }
    options = {
        "dag_id": f"m_{mariadb_db.name}",
        "cdc_conn_id": "cdc_my_test",
        "apply": False,
        "retries": 0,
        "deferrable": True,
        "poke_interval": 1,
    }
    pipeline = write_pipeline(tmp_path / "pipeline.yaml", props, options)
    dags = tmp_path / "dags"
    write_dag(dags, pipeline)
    conn = {
        "conn_type": "cdcmysql",
        "host": server.host,
        "port": server.port,
        "login": server.superuser,
        "password": server.password,
        "schema": mariadb_db.name,
        "extra": {"server_id": 5999},
    }
    env = {"AIRFLOW_CONN_CDC_MY_TEST": json.dumps(conn)}
    airflow_cli.dags_test(options["dag_id"], env=env, dags_folder=dags)
    table = f"{mariadb_db.name}.orders"
    first = newest_batch(staging, props["name"])
    assert sorted(r["after"]["id"] for r in batch_rows(first, table) if r["op"] == "r") == [1, 2, 3]
    with mariadb_db.connect(autocommit=True) as c, c.cursor() as cur:
        cur.execute("UPDATE orders SET status = 'shipped' WHERE id = 2")
    airflow_cli.dags_test(options["dag_id"], env=env, dags_folder=dags)
    second = newest_batch(staging, props["name"])
    assert [(r["op"], r["after"]["status"]) for r in batch_rows(second, table)] == [("u", "shipped")]
    assert second.manifest["from_offset"] == first.manifest["to_offset"]
