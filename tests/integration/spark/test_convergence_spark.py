"""The foundation's concurrency scenario replayed through Spark: silver == source == oracle,
and ``verify`` agrees (then notices a change that was never captured).  It runs with
``staging.path`` and ``delta.root`` on an S3 server (s3proxy): capture publishes there, Spark
reads the staged parts and writes Delta through S3A, ``verify`` and the oracle read it back
(local staging is what every other Spark test runs on)."""

from __future__ import annotations

import time

import psycopg
import pytest

from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.testing.s3proxy import S3ProxyServer, configure_spark, s3proxy_jar
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from tests.integration.postgres import toast_scenario
from tests.integration.postgres.support import run_capture
from tests.integration.postgres.test_convergence import (
    ODD,
    TABLES,
    Writers,
    _setup,
    config_of,
    toast_scenario_run,
)
from tests.integration.spark.support import apply_backlog
from tests.integration.spark.test_apply_basic import assert_silver_matches
from tests.support.pipeline import snapshot_pending

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def s3_server():
    """s3proxy for this module; None without its jar (the scenario then runs on local disk)."""
    if s3proxy_jar() is None:
        yield None
        return
    with S3ProxyServer() as server:
        yield server


def test_concurrent_capture_replayed_through_spark(spark, pg_db, tmp_path, s3_server, monkeypatch):
    config = _setup(pg_db, tmp_path)
    config["snapshot.max.rows.per.run"] = 30_000  # fewer, larger batches: Spark pays per batch
    target = str(tmp_path / "delta")
    if s3_server is not None:
        for key, value in s3_server.env().items():  # what a deployment's environment gives
            monkeypatch.setenv(key, value)
        configure_spark(spark, s3_server)
        bucket = s3_server.make_bucket()
        config["staging.path"] = f"s3a://{bucket}/staging"
        config["state.store"] = str(tmp_path / "state")  # required beside object-store staging
        target = f"s3a://{bucket}/delta"
    runs = 0
    with Writers(pg_db.dsn) as writers:
        while snapshot_pending(config) or runs < 3:
            run_capture(config)
            runs += 1
        writers.free_moves.set()  # TOASTed rows change keys too once the snapshot is done
        time.sleep(0.5)
        run_capture(config)
    run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) >= 5
    assert s3_server is None or str(batches[0].path).startswith("s3://")
    apply_backlog(spark, batches, target)
    assert_silver_matches(spark, config, target, TABLES[0], ["id"])
    assert_silver_matches(spark, config, target, TABLES[1], ["k1", "k 2"])
    report = verify(build_config(config), target, spark=spark, chunk=40_000)
    assert report.ok, report.differences
    assert {t.table: t.source_rows > 0 for t in report.tables} == {t: True for t in TABLES}
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        # differences in every verify chunk: counted in full, sampled for the printed examples
        changed = conn.execute("UPDATE items SET qty = qty + 100 WHERE id % 450 = 5 RETURNING id").fetchall()
        conn.execute("DELETE FROM items WHERE id = 7")
        conn.execute(f"INSERT INTO {ODD} VALUES (999999, 'new', 'v', 1)")
    report = verify(build_config(config), target, spark=spark, chunk=40_000)
    items, odd = (next(t for t in report.tables if t.table == name) for name in TABLES)
    assert len(changed) > 150 and items.different_count == len(changed)
    assert len(items.different) == 20 and {k[0] for k in items.different} <= {r[0] for r in changed}
    assert items.extra == [[7]] and items.extra_count == 1 and not items.missing and not items.missing_count
    assert odd.missing == [[999999, "new"]] and odd.missing_count == 1 and not odd.different_count
    assert report.to_json()["tables"][TABLES[0]]["different"] == len(changed)


@pytest.mark.parametrize(("identity", "ratio"), [("default", 0), ("full", 1e-9)])
def test_unchanged_toast_scenario_through_spark(spark, pg_db, tmp_path, monkeypatch, identity, ratio):
    """The deterministic TOAST scenario (dropped chunk rows, chained key changes leaving text and
    bytea unchanged) applied by the Spark job: silver equals the source on every column, through
    MERGE (ratio 0) and through the rewrite path."""
    toast_scenario_run(pg_db, tmp_path, monkeypatch, identity)
    config = config_of(tmp_path)
    target = str(tmp_path / "delta")
    for batch in list_batches(config["staging.path"], config["name"]):
        apply_batch(spark, str(batch.path), target, ApplySettings(rewrite_ratio=ratio))
    for table in toast_scenario.TABLES:
        assert_silver_matches(spark, config, target, table, toast_scenario.KEYS[table])


@pytest.mark.parametrize("when", ["before the parts", "before the manifest"])
def test_store_stopped_mid_capture_then_converges(spark, pg_db, tmp_path, s3_server, monkeypatch, when):
    """The S3 server stops in the middle of a capture run (as a part is closed, or after every
    part and before the manifest): the run fails with a retryable error naming the store,
    publishes nothing, moves neither the offset nor the slot; after a restart the next runs
    stage the same changes once and silver (on S3 too) equals the source."""
    if s3_server is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    from airflow_cdc.core.batch import BatchWriter
    from airflow_cdc.core.errors import StorageUnavailable
    from tests.integration.postgres.support import pipeline

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    configure_spark(spark, s3_server)
    bucket = s3_server.make_bucket()
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text, n numeric(10, 2))")
        conn.execute("INSERT INTO s SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, 300) g")
    config = pipeline(pg_db, f"s3a://{bucket}/staging", state__store=str(tmp_path / "state"))
    run_capture(config)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE s SET v = 'changed' WHERE id <= 100")
        conn.execute("DELETE FROM s WHERE id > 250")
        conn.execute("INSERT INTO s SELECT g, 'new', 1 FROM generate_series(1000, 1050) g")

    def slot_lsn() -> str:
        with psycopg.connect(pg_db.dsn) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (config["slot.name"],),
            ).fetchone()
        return str(row[0]) if row else ""

    from airflow_cdc.core.pipeline import build_store

    def offsets() -> dict:
        stored = build_store(build_config(config)).load(config["name"])
        assert stored is not None
        return {k: v for k, v in stored.data.items() if k != "lease"}

    state_before = offsets()
    lsn_before, published = slot_lsn(), len(list_batches(config["staging.path"], config["name"]))
    method = "close_table" if when == "before the parts" else "finish"
    original = getattr(BatchWriter, method)

    def stop_then(self, *args, **kwargs):
        s3_server.stop()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BatchWriter, method, stop_then)
    try:
        with pytest.raises(StorageUnavailable) as failed:
            run_capture(config)
    finally:
        monkeypatch.setattr(BatchWriter, method, original)
        s3_server.start()
    assert failed.value.retryable and f"127.0.0.1:{s3_server.port}" in str(failed.value)
    assert slot_lsn() == lsn_before
    assert offsets() == state_before  # the lease changed hands; offset and snapshot state did not
    assert len(list_batches(config["staging.path"], config["name"])) == published
    run_capture(config)
    run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) > published
    target = f"s3a://{bucket}/delta"
    apply_backlog(spark, batches, target)
    assert_silver_matches(spark, config, target, "public.s", ["id"])
    events = sum(b.manifest["counts"].get("events", 0) for b in batches)
    assert events == 100 + 50 + 51, f"changes staged {events} times, not once each"
