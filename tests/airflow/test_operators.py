"""Operators, sensor and trigger against a real PostgreSQL, called directly (no DAG run)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_cdc.airflow.operators.apply import CdcApplyOperator
from airflow_cdc.airflow.operators.capture import CdcCaptureOperator
from airflow_cdc.airflow.operators.commit import CdcCommitOperator
from airflow_cdc.airflow.sensors.changes import CdcChangesSensor
from airflow_cdc.airflow.triggers.changes import CdcChangesTrigger
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.pipeline import build_config, build_store
from tests.airflow.support import SHOP_TABLES, direct_props, load_shop, metastore_url
from tests.integration.postgres.support import assert_converged


def _capture(props, task_id="capture", conf=None):
    ctx = {"dag_run": type("Run", (), {"conf": conf or {}})(), "params": {}}
    return CdcCaptureOperator(task_id=task_id, pipeline=props).execute(ctx)


def _commit(props, batch_path, task_id="commit"):
    return CdcCommitOperator(task_id=task_id, pipeline=props, batch_path=batch_path).execute({})


def test_commit_race_on_metastore_table_only_one_commits(pg_db, tmp_path):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging", **{"state.store": metastore_url(pg_db)})
    first = _capture(props)
    _commit(props, first["batch_path"])
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET status = 'raced' WHERE id <= 20")
    # two runs capture from the same committed offset, then race to commit
    a, b = _capture(props, "capture_a"), _capture(props, "capture_b")
    assert a["from_offset"] == b["from_offset"] and a["batch_id"] != b["batch_id"]
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def commit(label, path):
        barrier.wait()
        try:
            results[label] = _commit(props, path, f"commit_{label}")
        except BaseException as e:  # noqa: BLE001 - collected for the assertions
            results[label] = e

    threads = [threading.Thread(target=commit, args=(k, r["batch_path"])) for k, r in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wins = [k for k, v in results.items() if isinstance(v, dict)]
    losses = [v for v in results.values() if isinstance(v, BaseException)]
    assert len(wins) == 1 and len(losses) == 1, results
    # the loser either found the lease taken (retryable: it names the holder) or, arriving after
    # the winner released it, lost the compare-and-set (final)
    held = "lease is held by commit on host" in str(losses[0])
    assert isinstance(losses[0], AirflowFailException) != held and "another run" in str(losses[0])
    winner = a if wins == ["a"] else b
    stored = build_store(build_config(props)).load(props["name"])
    assert stored is not None and stored.version == 3  # the start stored by the first capture, then one commit
    assert stored.data["last_batch"] == winner["batch_id"] and stored.data["offset"] == winner["to_offset"]
    # the next run continues from the winner's offset and converges
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("DELETE FROM public.orders WHERE id = 7")
    nxt = _capture(props)
    assert nxt["from_offset"] == winner["to_offset"]
    _commit(props, nxt["batch_path"])
    assert_converged(props, SHOP_TABLES)


def test_capture_rejects_bad_conf_without_capturing(pg_db, tmp_path):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    with pytest.raises(AirflowFailException, match="data-collections"):
        _capture(props, conf={"type": "execute-snapshot", "data": {"data-collections": []}})
    with pytest.raises(AirflowFailException, match="match no captured table"):
        _capture(props, conf={"execute-snapshot": {"data-collections": ["public.nope"]}})
    assert not (tmp_path / "staging" / props["name"] / "batches").exists() or not any(
        p.name[0] != "." for p in (tmp_path / "staging" / props["name"] / "batches").iterdir()
    )


def test_wrong_password_fails_without_retry_and_hides_secret(pg_db, tmp_path):
    props = direct_props(pg_db, tmp_path / "staging", **{"database.password": "definitely-wrong-pw"})
    with pytest.raises(AirflowFailException) as err:
        _capture(props)
    assert "a person must act first" in str(err.value) and "definitely-wrong-pw" not in str(err.value)


@pytest.mark.parametrize("check", ["wal", "slot"])
def test_sensor_pokes(pg_db, tmp_path, check, capsys):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 1000})
    sensor = CdcChangesSensor(task_id="sense", pipeline=props, check=check, deferrable=False)
    ctx = {"dag_run": type("Run", (), {"conf": {}})(), "params": {}}
    assert sensor.poke(ctx) is True  # no offset yet: the initial snapshot is due
    _commit(props, _capture(props)["batch_path"])
    if check == "slot":  # exact: nothing published past the committed offset
        assert sensor.poke(ctx) is False
        out = capsys.readouterr().out
        assert "no change past the committed offset" in out and "check slot" in out, out
    adhoc = {
        "dag_run": type("Run", (), {"conf": {"execute-snapshot": {"data-collections": ["public.orders"]}}})(),
        "params": {},
    }
    assert sensor.poke(adhoc) is True
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("INSERT INTO public.customers (id, name) VALUES (777, 'new')")
    assert sensor.poke(ctx) is True


def test_trigger_fires_on_change_without_blocking_the_loop(pg_db, tmp_path):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    _commit(props, _capture(props)["batch_path"])
    offset = build_store(build_config(props)).load(props["name"]).data["offset"]
    trigger = CdcChangesTrigger(pipeline=props, offset=offset, check="slot", poll_interval=0.2)

    def write_later():
        time.sleep(2.0)
        with pg_db.connect(autocommit=True) as conn:
            conn.execute("UPDATE public.orders SET note = 'poke' WHERE id = 1")

    async def main():
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        threading.Thread(target=write_later, daemon=True).start()
        started = time.monotonic()
        event = await asyncio.wait_for(anext(trigger.run()), timeout=60)
        done.set()
        await tick
        return event, time.monotonic() - started, gaps

    event, elapsed, gaps = asyncio.run(main())
    assert event.payload["status"] == "changes" and event.payload["polls"] > 3
    assert elapsed >= 2.0
    # each poll connects and queries PostgreSQL; the loop must keep ticking meanwhile
    assert max(gaps) < 0.25, f"event loop blocked for {max(gaps):.3f}s"


def test_trigger_reports_non_retryable_errors(tmp_path):
    props = {
        "name": "x",
        "connector": "postgresql",
        "staging.path": str(tmp_path),
        "database.port": 1,
        "bogus.property": 1,
    }
    trigger = CdcChangesTrigger(pipeline=props, offset={"lsn": "0/1"}, poll_interval=0.1)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=30))
    assert event.payload["status"] == "error" and "bogus.property" in event.payload["message"]


def test_apply_operator_builds_spark_submit_from_job_spec(pg_db, tmp_path, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    captured = _capture(props)
    seen: dict[str, object] = {}

    def fake_execute(self, context):
        seen.update(
            application=self.application,
            args=self.application_args,
            conf=self.conf,
            packages=self.packages,
            jars=self.jars,
            py_files=self.py_files,
            name=self.name,
            env=self.env_vars,
            conn_id=self._conn_id,
        )

    monkeypatch.setattr(SparkSubmitOperator, "execute", fake_execute)
    op = CdcApplyOperator(
        task_id="apply",
        batch_path=captured["batch_path"],
        target=str(tmp_path / "delta"),
        spark_conf={"spark.sql.shuffle.partitions": "3"},
        conn_id="spark_local",
        delete_mode="soft",
    )
    result = op.execute({})
    assert result == {"batch_id": captured["batch_id"], "applied": True}
    assert str(seen["application"]).endswith("spark_jobs/apply_changes.py")
    assert seen["args"][:4] == ["--batch", captured["batch_path"], "--target", str(tmp_path / "delta")]
    assert "--delete-mode" in seen["args"] and "soft" in seen["args"]
    conf = seen["conf"]
    assert isinstance(conf, dict) and conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert seen["packages"] or seen["jars"]
    assert str(seen["py_files"]).endswith(".zip") and seen["conn_id"] == "spark_local"
    assert json.dumps(result)

    # an empty batch (no changes since the commit) never starts Spark: apply is skipped; its
    # commit still stores the offset, then skips itself so that no Asset event is emitted
    _commit(props, captured["batch_path"])
    empty = _capture(props)
    seen.clear()
    with pytest.raises(AirflowSkipException, match="holds no events"):
        CdcApplyOperator(task_id="apply2", batch_path=empty["batch_path"], target="/x").execute({})
    assert seen == {}
    assert Batch(empty["batch_path"]).manifest["counts"]["events"] == 0
    with pytest.raises(AirflowSkipException, match="no Asset event"):
        _commit(props, empty["batch_path"], task_id="commit2")
    stored = build_store(build_config(props)).load(props["name"]).data
    assert stored["last_batch"] == empty["batch_id"]


def test_commit_of_missing_batch_fails_fast(tmp_path):
    with pytest.raises(AirflowFailException, match="no manifest.json"):
        _commit(
            {"name": "x", "connector": "postgresql", "staging.path": str(tmp_path)}, str(tmp_path / "nope")
        )
    assert issubclass(AirflowFailException, AirflowException)


def _mark_applied(target, batch: Batch, layers=("bronze", "silver")) -> None:
    """What the apply job's marked writes leave in each table's _delta_log (no Spark needed)."""
    from spark_jobs.cdc_apply.layout import app_id, table_path

    for table in batch.tables():
        for layer in layers:
            log = Path(table_path(str(target), layer, batch.manifest["connector"], table)) / "_delta_log"
            log.mkdir(parents=True, exist_ok=True)
            txn = {"txn": {"appId": app_id(batch.manifest["connector"], batch.batch_id), "version": 1}}
            (log / f"{0:020d}.json").write_text(json.dumps(txn) + "\n")


def test_commit_refuses_a_batch_that_never_reached_delta(pg_db, tmp_path, capsys):
    from airflow_cdc import cli

    load_shop(pg_db)
    target = tmp_path / "delta"
    props = direct_props(pg_db, tmp_path / "staging", **{"delta.root": str(target)})
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(props))
    captured = _capture(props)  # the initial snapshot: tables with snapshot rows and no change events
    batch = Batch(captured["batch_path"])
    assert batch.tables() and captured["events"] == 0
    # "mark success" on a failed apply: commit must refuse and leave the offset where it was
    with pytest.raises(AirflowFailException, match="is not applied to Delta"):
        _commit(props, captured["batch_path"])
    assert cli.main(["commit", "--config", str(pipeline), "--batch", captured["batch_path"]]) == 2
    assert f"run apply for batch {batch.batch_id}" in capsys.readouterr().err
    assert cli.main(["capture", "--config", str(pipeline), "--commit"]) == 2
    assert "capture --commit would move the offset" in capsys.readouterr().err
    stored = build_store(build_config(props)).load(props["name"])  # only the start the capture stored
    assert stored is not None and stored.version == 1 and stored.data["last_batch"] is None
    _mark_applied(target, batch, layers=("silver",))  # half applied: bronze missing
    with pytest.raises(AirflowFailException, match="bronze:public"):
        _commit(props, captured["batch_path"])
    _mark_applied(target, batch)
    assert _commit(props, captured["batch_path"])["state_version"] == 2
    # an empty batch has no table to check and commits
    empty = _capture(props)
    assert Batch(empty["batch_path"]).tables() == []
    with pytest.raises(AirflowSkipException, match="no Asset event"):  # committed, then skipped
        _commit(props, empty["batch_path"])
    assert build_store(build_config(props)).load(props["name"]).version == 3


def test_default_check_ignores_other_databases_and_guards_the_slot(pg_db, pg_server, tmp_path):
    """The default (slot) check, sync and async, stays quiet while only other databases write WAL
    (e.g. Airflow's metadata database on the same server), where ``wal`` fires; it fires for a
    published change, and when the slot is gone (a missing slot must never look like no change)."""
    from airflow_cdc.airflow.hooks.cdc import CdcHook

    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    _commit(props, _capture(props)["batch_path"])
    offset = build_store(build_config(props)).load(props["name"]).data["offset"]
    hook = CdcHook(pipeline=props)
    other = f"{pg_db.name}_other"
    with psycopg.connect(pg_server.create_database(other), autocommit=True) as conn:
        conn.execute("CREATE TABLE noise AS SELECT g FROM generate_series(1, 1000) g")
    pg_server.drop_database(other)
    assert hook.changes_after(offset, "wal") is True  # over-reports: costs an empty batch
    assert hook.changes_after(offset) is False
    assert asyncio.run(hook.achanges_after(offset)) is False
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("UPDATE public.orders SET note = 'seen' WHERE id = 1")
    assert hook.changes_after(offset) is True
    assert asyncio.run(hook.achanges_after(offset)) is True
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (build_config(props)["slot.name"],))
    assert hook.changes_after(offset) is True
    assert asyncio.run(hook.achanges_after(offset)) is True
