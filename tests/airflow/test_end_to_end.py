"""End to end with Spark: the example DAG under ``airflow dags test`` against a real PostgreSQL,
Spark local[2] and Delta in a temp folder; a failing apply; silver compared with the source."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.pipeline import build_config, build_store
from tests.airflow.conftest import pg_connection_env, write_dag
from tests.airflow.support import (
    ROOT,
    SHOP_TABLES,
    Writer,
    load_shop,
    metastore_url,
    pipeline_props,
    write_pipeline,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (ROOT / "spark_jobs" / "apply_changes.py").exists(), reason="no Spark apply job yet"
    ),
]


SMALL_SPARK = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
}


def _norm(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    return value


def assert_silver_equals_source(spark, db, target: Path, connector: str) -> dict[str, int]:
    """Every source table equals its silver Delta table (all source columns, every row)."""
    from airflow_cdc.apply.submit import silver_table_path

    counts = {}
    with db.connect() as conn:
        for table in SHOP_TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")  # noqa: S608 - fixed names
            cols = [d.name for d in cur.description]
            source = {row[0]: tuple(_norm(v) for v in row) for row in cur.fetchall()}
            df = spark.read.format("delta").load(silver_table_path(str(target), connector, table))
            silver = {r[0]: tuple(_norm(v) for v in r) for r in df.select(*cols).collect()}
            missing, extra = source.keys() - silver.keys(), silver.keys() - source.keys()
            wrong = [k for k in source.keys() & silver.keys() if source[k] != silver[k]]
            assert not missing and not extra and not wrong, (
                f"{table}: {len(missing)} missing, {len(extra)} extra, {len(wrong)} different of {len(source)}; "
                f"e.g. {sorted(missing)[:3]} {sorted(extra)[:3]} {[(source[k], silver[k]) for k in wrong[:2]]}"
            )
            counts[table] = len(source)
    return counts


def test_example_dag_end_to_end_with_concurrent_writes(pg_db, tmp_path, airflow_cli, spark):
    """The unmodified example DAG (dags/cdc_postgres.py), three runs while a writer keeps changing rows."""
    load_shop(pg_db)
    data = tmp_path / "data"
    lineage = tmp_path / "openlineage.jsonl"
    env = {
        **pg_connection_env(pg_db, "cdc_postgres_default"),
        "AIRFLOW_CDC_DATA": str(data),
        "AIRFLOW_CDC_STATE_STORE": metastore_url(pg_db),
        # OpenLineage's file transport: the events the provider emits for our operators
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(lineage), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "cdc-e2e",
    }
    if (ROOT / ".jars").is_dir():
        env["AIRFLOW_CDC_DELTA_JARS"] = str(ROOT / ".jars")
    dags = tmp_path / "dags"
    shutil.copytree(ROOT / "dags", dags)  # the example as shipped (its own folder: no other test DAGs)
    writer = Writer(pg_db, seed=1, pause=0.02)
    writer.start()
    try:
        for _ in range(2):
            airflow_cli.dags_test("cdc_postgres_shop", env=env, dags_folder=dags)
    finally:
        writer.stop()
    assert writer.ops > 50, writer.ops
    # one change after the writer stopped: on a slow machine the writer may use up its operations
    # during the second run, and the third run must still have something to pick up
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.customers SET email = 'last@example.com' WHERE id = 1")
    airflow_cli.dags_test("cdc_postgres_shop", env=env, dags_folder=dags)  # picks up the rest
    counts = assert_silver_equals_source(spark, pg_db, data / "delta", "shop")
    assert counts["public.customers"] == 50 and counts["public.orders"] > 300
    os.environ["AIRFLOW_CDC_STATE_STORE"] = metastore_url(pg_db)
    os.environ["AIRFLOW_CDC_DATA"] = str(data)
    stored = build_store(
        build_config(
            {
                "name": "shop",
                "connector": "postgresql",
                "staging.path": str(data),
                "state.store": metastore_url(pg_db),
            }
        )
    ).load("shop")
    assert stored is not None and stored.version == 4  # the start stored by the first capture, then 3 commits
    assert_lineage(lineage, pg_db, data / "delta")


def assert_lineage(path, pg_db, delta) -> None:
    """COMPLETE events: capture reads the source tables; apply reads them and writes bronze/silver."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    done = {}
    for e in events:
        if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith((".capture", ".apply")):
            done.setdefault(e["job"]["name"].rsplit(".", 1)[1], []).append(e)
    source = {(f"postgres://{pg_db.server.host}:{pg_db.server.port}", f"{pg_db.name}.public.{t}")
              for t in ("customers", "orders")}  # fmt: skip
    captured = {(d["namespace"], d["name"]) for e in done["capture"] for d in e["inputs"]}
    assert captured == source, captured
    applied = [e for e in done["apply"] if e["outputs"]]
    assert applied, "no apply COMPLETE event with outputs"
    outputs = {(d["namespace"], d["name"]) for e in applied for d in e["outputs"]}
    assert {("file", str(delta / layer / "shop" / f"public.{t}")) for layer in ("bronze", "silver")
            for t in ("customers", "orders")} <= outputs, outputs  # fmt: skip
    assert {(d["namespace"], d["name"]) for e in applied for d in e["inputs"]} <= source


def test_failed_apply_keeps_offset_and_next_run_converges(pg_db, tmp_path, airflow_cli, spark):
    load_shop(pg_db)
    staging, target = tmp_path / "staging", tmp_path / "delta"
    props = pipeline_props(pg_db, staging, **{"state.store": metastore_url(pg_db)})
    options = {
        "dag_id": f"f_{pg_db.name}",
        "cdc_conn_id": "cdc_pg_fail",
        "target": str(target),
        "retries": 0,
        "sense": False,
        "spark_conf": SMALL_SPARK,
    }
    pipeline = write_pipeline(tmp_path / "pipeline.yaml", props, options)
    dags = tmp_path / "dags"
    write_dag(dags, pipeline)
    env = pg_connection_env(pg_db, "cdc_pg_fail")
    if (ROOT / ".jars").is_dir():
        env["AIRFLOW_CDC_DELTA_JARS"] = str(ROOT / ".jars")
    airflow_cli.dags_test(options["dag_id"], env=env, dags_folder=dags)
    store = build_store(build_config(props))
    before = store.load(props["name"])
    assert before is not None

    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET status = 'refunded' WHERE id % 5 = 0")
        conn.execute("DELETE FROM public.orders WHERE id % 11 = 0")
        conn.execute("INSERT INTO public.customers (id, name) VALUES (60, 'after failure')")
    bad = {**options, "spark_conf": {**SMALL_SPARK, "spark.driver.memory": "not-a-size"}}
    write_pipeline(pipeline, props, bad)
    out = airflow_cli.dags_test(options["dag_id"], env=env, dags_folder=dags, expect="failed")
    assert (
        "task_id=commit" not in out.split("[DAG TEST] end task task_id=apply")[-1] or "upstream_failed" in out
    )
    after = store.load(props["name"])
    assert after == before, "a failed apply must not move the offset"
    with pg_db.connect() as conn:
        confirmed = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (props["slot.name"],),
        ).fetchone()[0]
    assert confirmed == before.data["offset"]["lsn"], "the slot must not be advanced past the stored offset"

    write_pipeline(pipeline, props, options)
    airflow_cli.dags_test(options["dag_id"], env=env, dags_folder=dags)
    counts = assert_silver_equals_source(spark, pg_db, target, props["name"])
    assert counts["public.customers"] == 51
    assert store.load(props["name"]).version == before.version + 1
    check_verify_operator(pg_db, props, target)


def check_verify_operator(pg_db, props, target: Path) -> None:
    """CdcVerifyOperator with the real ``airflow_cdc.apply.verify``: equal, then a source-only change."""
    import importlib.util

    if importlib.util.find_spec("airflow_cdc.apply.verify") is None:  # lands with the apply issue
        warnings.warn("airflow_cdc.apply.verify is missing: verify operator not checked", stacklevel=2)
        return
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_cdc.airflow.operators.verify import CdcVerifyOperator

    op = CdcVerifyOperator(task_id="verify", pipeline={**props, **_direct(pg_db)}, target=str(target))
    assert op.execute({})["ok"] is True
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET note = 'not applied' WHERE id = 5")
    with pytest.raises(AirflowFailException, match="differs"):
        op.execute({})


def _direct(db) -> dict[str, Any]:
    s = db.server
    return {
        "database.hostname": s.host,
        "database.port": s.port,
        "database.user": s.superuser,
        "database.password": s.password,
        "database.dbname": db.name,
    }
