"""The convergence test against real Vitess (vtgate + unmanaged vttablets over two MariaDB shards):
a copy-phase snapshot spread over many runs while two writers insert, update and delete through
vtgate on both shards, capture processes (committing) SIGKILLed at random points (before and after
the commit, mid-window), then drained; every published batch applied by the Spark job.  Silver equals
the rows read back through vtgate on every column, and the reference applier; ``verify`` (the live table read through vtgate) agrees,
and finds the rows changed behind silver's back.

Real vttablet's catch-up between copy chunks sends changes to rows above the last copied key (at
least once, ``uvstreamer.go``: ``shouldSendEventForTable``), so this also replays updates and deletes
of rows staged before their copy; and the positions are MariaDB GTIDs (``MariaDB/0-<server>-<seq>``).

Skipped unless the Vitess binaries are built (``make vitess``, part of ``make setup``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.testing import vitess_real
from tests.integration.spark.support import apply_backlog, diff, normalised_rows, semantic_names, silver_rows
from tests.integration.vitess.capture_support import ORDER_COLUMNS, encode_order, order_values
from tests.support.pipeline import CrashRuns, WriterThreads, replay, run_capture, snapshot_pending

pytestmark = [
    pytest.mark.skipif(bool(vitess_real.missing()), reason=str(vitess_real.missing())),
    pytest.mark.spark,
    pytest.mark.slow,
]

KEYS = 400
ORDERS = (
    "id BIGINT NOT NULL PRIMARY KEY, item VARCHAR(40), qty INT, price DECIMAL(10,2), at DATETIME(6),"
    " note TEXT, raw VARBINARY(16)"
)
INSERT = f"INSERT INTO orders ({ORDER_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"


@pytest.fixture(scope="module")
def cluster() -> Iterator[vitess_real.RealVitessCluster]:
    # copy chunks of a few rows, so that the copy spreads over runs and catch-ups come between chunks
    flags = ["--vstream-dynamic-packet-size=false", "--vstream-packet-size=600"]
    with vitess_real.RealVitessCluster(
        keyspace="conv", shards=("-80", "80-"), tables={"orders": ORDERS}, tablet_flags=flags
    ) as vt:
        yield vt


class Writers(WriterThreads):
    """Two threads changing random keys through vtgate (each its own connection) until stopped."""

    def __init__(self, cluster: vitess_real.RealVitessCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.errors: list[BaseException] = []
        self.writes = 0
        self.threads = [threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in (1, 2)]

    def _run(self, seed: int) -> None:
        rng, version = random.Random(seed), 0
        try:
            with self.cluster.connect() as conn, conn.cursor() as cur:
                while not self.stop.is_set():
                    key, action, version = rng.randrange(1, KEYS), rng.random(), version + 1
                    if action < 0.4:
                        cur.execute(
                            INSERT + " ON DUPLICATE KEY UPDATE item = VALUES(item), at = VALUES(at)",
                            order_values(key, version),
                        )
                    elif action < 0.8:
                        cur.execute(
                            "UPDATE orders SET qty = qty - 1, raw = %s WHERE id = %s",
                            (bytes([version % 256]), key),
                        )
                    else:
                        cur.execute("DELETE FROM orders WHERE id = %s", (key,))
                    self.writes += 1
                    time.sleep(rng.random() * 0.01)
        except pymysql.MySQLError as e:
            self.errors.append(e)


def vtgate_rows(cluster: vitess_real.RealVitessCluster) -> dict[tuple, dict[str, Any]]:
    """Every ``orders`` row read back through vtgate (a scatter query), encoded as staged."""
    return {(r[0],): encode_order(r) for r in cluster.execute(f"SELECT {ORDER_COLUMNS} FROM orders")}


def test_real_vitess_converges_with_sigkills_through_spark(cluster, spark, tmp_path: Path) -> None:
    ks = cluster.keyspace
    with cluster.connect() as conn, conn.cursor() as cur:
        cur.executemany(INSERT, [order_values(i) for i in range(1, 301)])
    props = cluster.props("real_conv", tmp_path / "staging", **{"run.max.events": 60})
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(props))
    rng = random.Random(11)
    runs = CrashRuns(
        config_path, "after_batch_write:0.25,after_state_commit:0.2,mid_window:0.1", rng, 0.3, 1.5
    )
    copy_runs = 0
    with Writers(cluster) as writers:
        while snapshot_pending(props) or runs.clean < 3:
            copy_runs += snapshot_pending(props)
            proc = runs.start()
            runs.maybe_kill(proc)
            runs.wait(proc)
    assert not writers.errors, writers.errors
    assert writers.writes > 200
    assert runs.kills >= 5, f"only {runs.kills} kills happened"
    assert copy_runs >= 5, "the copy should be spread over many runs"
    while run_capture(props).events:
        pass
    batches = list_batches(props["staging.path"], props["name"])
    table = f"{ks}.orders"
    staged = [
        r
        for batch in batches
        if table in batch.manifest["tables"]
        for rb in batch.iter_events(table)
        for r in rb.to_pylist()
    ]
    copied_at = {}
    for i, r in enumerate(staged):
        if r["op"] == "r":
            copied_at.setdefault(r["after"]["id"], i)
    early = [r for i, r in enumerate(staged) if r["op"] in "cud" and i < copied_at.get(_key(r), -1)]
    assert early, "no change to a row above the last copied key reached us before its copy"
    assert all(g["gtid"].startswith("MariaDB/") for g in run_capture(props).to_offset["vgtid"])
    target = str(tmp_path / "delta")
    apply_backlog(spark, batches, target)
    names = semantic_names(props, table)
    got = silver_rows(spark, target, props, table, ["id"])
    expected = normalised_rows(vtgate_rows(cluster), names)
    assert len(expected) > 150
    assert not (problem := diff(expected, got)), f"silver vs vtgate: {problem}"
    oracle = normalised_rows(replay(props).rows(table), names)
    assert not (problem := diff(oracle, got)), f"silver vs reference applier: {problem}"

    # verify reads the live table through vtgate in key order (both shards merged), in chunks
    report = verify(build_config(props), target, spark=spark, chunk=64)
    assert report.ok, report.differences
    (orders,) = report.tables
    assert orders.source_rows == orders.silver_rows == len(expected)
    with cluster.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM orders ORDER BY id LIMIT 3")
        first, second, third = (r[0] for r in cur.fetchall())
        cur.execute("UPDATE orders SET qty = qty + 1000 WHERE id IN (%s, %s)", (first, third))
        cur.execute("DELETE FROM orders WHERE id = %s", (second,))
        cur.execute(INSERT, order_values(KEYS + 7))
    report = verify(build_config(props), target, spark=spark, chunk=64)
    (orders,) = report.tables
    assert sorted(orders.different) == [[first], [third]] and orders.different_count == 2
    assert orders.extra == [[second]] and orders.missing == [[KEYS + 7]]


def _key(event: dict[str, Any]) -> int:
    return (event["after"] or event["before"])["id"]
