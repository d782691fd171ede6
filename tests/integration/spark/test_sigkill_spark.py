"""The concurrency scenario with SIGKILLed captures, replayed through Spark, for the sources whose
own directories have no such test (SQL Server; PostgreSQL and MySQL: test_convergence_spark.py and
their dirs).  A file of its own: at minutes per run it is a work unit of its own for the test
workers (``--dist loadfile``), next to test_convergence_spark.py's PostgreSQL scenario."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from tests.contract.harness import DB_FIXTURES, HARNESSES
from tests.contract.harness_sqlserver import contract_sqlserver_emulator, mssql_contract_db  # noqa: F401
from tests.integration.postgres.support import run_capture
from tests.integration.spark.support import apply_backlog, diff, normalised_rows, semantic_names, silver_rows
from tests.support.pipeline import CrashRuns, replay, snapshot_pending

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TXNS_PER_RUN = 30  # writer transactions (1-3 changes, deferred updates two events) per capture run


# -- the same scenario for every source the contract harness knows, with SIGKILLed captures -------
TYPED_DDL = {
    "sqlserver": "CREATE TABLE [typed] (id int PRIMARY KEY, v nvarchar(40), n int, price decimal(10,2), d date,"
    " ts datetime2(6), flag bit, tiny tinyint, u uniqueidentifier, bin varbinary(16), big nvarchar(max))",
}
TYPED_COLUMNS = ("id", "v", "n", "price", "d", "ts", "flag", "tiny", "u", "bin", "big")


def _typed_values(key: int, version: int) -> tuple:
    """Row ``key`` at ``version``: every column changes with the version; some values are NULL."""
    k = key * 7919 + version * 104729
    return (
        key, None if k % 11 == 0 else f"v{key}.{version}", k % 100_000 - 50_000,
        Decimal(k % 10_000_000 - 5_000_000) / 100, dt.date(1960, 1, 1) + dt.timedelta(days=k % 40_000),
        dt.datetime(1965, 3, 4, 5, 6, 7) + dt.timedelta(microseconds=k * 1_000_003), k % 2 == 0, k % 256,
        uuid.UUID(int=k * 2**64 + key), k.to_bytes(6, "big"), None if k % 5 == 0 else f"{k:x}" * (k % 400),
    )  # fmt: skip


def _staged(row: dict[str, Any]) -> dict[str, Any]:
    """A backing-database row in the staged (Debezium) encoding, written independently of the source."""
    out = dict(row)
    out["d"] = None if row["d"] is None else (row["d"] - dt.date(1970, 1, 1)).days
    out["ts"] = None if row["ts"] is None else (row["ts"] - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    out["u"] = None if row["u"] is None else str(row["u"]).upper()  # SQL Server prints GUIDs upper-case
    return out


def _typed_writer(
    h: Any, stop: threading.Event, quota: threading.Semaphore, seed: int, errors: list[BaseException]
) -> None:
    """Transactions of 1-3 inserts / updates of every column / deletes / key changes, until stopped;
    one ``quota`` permit a transaction (the test hands out permits per capture run)."""
    rng = random.Random(seed)
    insert = f"INSERT INTO typed ({', '.join(TYPED_COLUMNS)}) VALUES ({', '.join(['%s'] * len(TYPED_COLUMNS))})"
    update = f"UPDATE typed SET {', '.join(f'{c} = %s' for c in TYPED_COLUMNS[1:])} WHERE id = %s"
    try:
        with h.writer() as conn:
            version = seed * 1000
            while not stop.is_set():
                if not quota.acquire(timeout=0.2):
                    continue
                for _ in range(rng.randint(1, 3)):
                    version += 1
                    key, action = rng.randrange(1, 400), rng.random()
                    if action < 0.3:
                        conn.execute(f"{insert} ON CONFLICT (id) DO NOTHING", _typed_values(key, version))
                    elif action < 0.75:
                        conn.execute(update, (*_typed_values(key, version)[1:], key))
                    elif action < 0.9:
                        conn.execute("DELETE FROM typed WHERE id = %s", (key,))
                    else:  # a key change, when the new key is free
                        conn.execute("UPDATE typed SET id = %s WHERE id = %s AND NOT EXISTS"
                                     " (SELECT 1 FROM typed WHERE id = %s)", (key + 400, key, key + 400))
                conn.commit()
                time.sleep(0.02)
    except BaseException as e:  # surfaced by the test
        errors.append(e)


@pytest.mark.parametrize("kind", ["sqlserver"])  # PostgreSQL / MySQL: their own tests above and in their dirs
def test_sigkilled_captures_with_writers_replayed_through_spark(kind, request, spark, tmp_path):
    """Captures SIGKILLed at random points (and at failpoints) while writers change every column and
    keys (SQL Server: deferred updates too) during a chunked snapshot over many runs; every batch applied by Spark; silver == source
    on every column, and == the reference applier."""
    h = HARNESSES[kind](request.getfixturevalue(DB_FIXTURES[kind]), tmp_path / "staging")
    if kind == "sqlserver":
        # SQL Server logs key changes, and (plans, MERGE) other updates, as deferred updates: a
        # delete and an insert under one commit LSN and one seqval; here every other transaction's
        # updates are logged so, mixed with ordinary ones (3 + 4) and key changes
        h.db.emulator.db(h.db.name).capture.deferred = "mixed"
    h.execute(TYPED_DDL[kind])
    with h.writer() as conn:
        insert = f"INSERT INTO typed VALUES ({', '.join(['%s'] * len(TYPED_COLUMNS))})"
        conn.cursor().executemany(insert, [_typed_values(i, 0) for i in range(1, 301)])
        conn.commit()
    h.execute()  # the capture job catches up with the load
    # run.max.events bounds a window, so a run killed mid-window does not make the next one longer
    config = h.config(**{"incremental.snapshot.chunk.size": 20, "snapshot.max.rows.per.run": 40,
                         "run.max.events": 300})
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(config))
    stop, errors, quota = threading.Event(), [], threading.Semaphore(0)
    writers = [threading.Thread(target=_typed_writer, args=(h, stop, quota, s, errors)) for s in (1, 2)]
    # mid_window fires per staged transaction: a low rate still kills some windows
    runs = CrashRuns(
        config_path, "after_batch_write:0.1,after_state_commit:0.1,mid_window:0.002", random.Random(7), 0.3, 1.0
    )
    with h.agent():
        for w in writers:
            w.start()
        try:
            while snapshot_pending(config) or runs.clean < 3:
                # writers go on during every run, but at most TXNS_PER_RUN transactions a run: at
                # a fixed rate a slow (loaded) machine's captures fell behind, every window stopped
                # at run.max.events, and the snapshot's chunks waited for ever (they need a window
                # that reaches their watermark)
                quota.release(TXNS_PER_RUN)
                runs.run()
        finally:
            stop.set()
            for w in writers:
                w.join()
    assert not errors, errors
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    run_capture(config)
    run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) >= 8
    target = str(tmp_path / "delta")
    apply_backlog(spark, batches, target)  # as `airflow-cdc apply` does: stretches in one pass
    table = h.staged(h.table("typed"))
    names = semantic_names(config, table)
    got = silver_rows(spark, target, config, table, ["id"])
    expected = normalised_rows({k: _staged(r) for k, r in h.source_rows(h.table("typed")).items()}, names)
    assert len(expected) > 200
    oracle = normalised_rows(replay(config).rows(table), names)
    problems = {"silver vs source": diff(expected, got), "silver vs reference applier": diff(oracle, got),
                "reference applier vs source": diff(expected, oracle)}
    assert not any(problems.values()), problems
    report = verify(build_config(config), target, spark=spark, chunk=64)  # airflow-cdc verify agrees
    assert report.ok and report.tables[0].source_rows == len(expected), report.differences
    with h.writer() as conn:  # a change no capture saw: verify must point at exactly that row
        key = conn.execute("SELECT min(id) FROM typed").fetchone()[0]
        conn.execute("UPDATE typed SET n = n + 1 WHERE id = %s", (key,))
        conn.commit()
    (table_report,) = verify(build_config(config), target, spark=spark, chunk=64).tables
    assert table_report.different == [[key]] and not table_report.missing and not table_report.extra
