"""The convergence test against real Vitess (vtgate + unmanaged vttablets over two MariaDB shards):
a copy-phase snapshot spread over many runs while two writers insert, update and delete through
vtgate on both shards, capture processes (committing) SIGKILLed at random points (before and after
the commit, mid-window), then drained; every published batch applied by the Spark job.  Silver equals
the rows read back through vtgate on every column, and the reference applier; ``verify`` (the live table read through vtgate) agrees,
and finds the rows changed behind silver's back.

Real vttablet's catch-up between copy chunks sends changes to rows above the last copied key (at
least once, ``uvstreamer.go``: ``shouldSendEventForTable``), so this also replays updates and deletes
of rows staged before their copy; and the positions are MariaDB GTIDs (``MariaDB/0-<server>-<seq>``).

The same cluster holds tables without a key (issue 34): ``dup`` and ``ev`` (equal rows, NULLs, on
both shards) read whole by a copy of their own and mirrored as multisets -- with writes while the
copy runs, and SIGKILLs while writers change one of several equal rows -- beside the keyed ``kv``.

Skipped unless the Vitess binaries are built (``make vitess``, part of ``make setup``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.vitess.source import VitessSource
from airflow_cdc.testing import vitess_real
from spark_jobs.cdc_apply.job import ApplySettings, apply_batches
from tests.integration.spark.support import (
    apply_backlog,
    diff,
    normalised_list,
    normalised_rows,
    semantic_names,
    silver_multiset,
    silver_rows,
)
from tests.integration.vitess import keyless_support
from tests.integration.vitess.capture_support import ORDER_COLUMNS, encode_order, order_values
from tests.support.pipeline import (
    CrashRuns,
    assert_multiset_equal,
    assert_rows_equal,
    replay,
    run_capture,
    snapshot_pending,
)

pytestmark = pytest.mark.skipif(bool(vitess_real.missing()), reason=str(vitess_real.missing()))

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
    tables = {"orders": ORDERS, "dup": keyless_support.EV, "ev": keyless_support.EV, "kv": keyless_support.KV}
    tables |= {"lone": keyless_support.EV, "lone_kv": keyless_support.KV}
    with vitess_real.RealVitessCluster(
        keyspace="conv",
        shards=("-80", "80-"),
        tables=tables,
        vindex_columns={"dup": "grp", "ev": "grp", "lone": "grp"},
        tablet_flags=flags,
    ) as vt:
        yield vt


def change_orders(cur: Any, rng: random.Random, version: int) -> None:
    """One change of a random ``orders`` key: an upsert, an update or a delete."""
    key, action = rng.randrange(1, KEYS), rng.random()
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


def vtgate_rows(cluster: vitess_real.RealVitessCluster) -> dict[tuple, dict[str, Any]]:
    """Every ``orders`` row read back through vtgate (a scatter query), encoded as staged."""
    return {(r[0],): encode_order(r) for r in cluster.execute(f"SELECT {ORDER_COLUMNS} FROM orders")}


@pytest.mark.spark
@pytest.mark.slow
def test_real_vitess_converges_with_sigkills_through_spark(cluster, spark, tmp_path: Path) -> None:
    ks = cluster.keyspace
    with cluster.connect() as conn, conn.cursor() as cur:
        cur.executemany(INSERT, [order_values(i) for i in range(1, 301)])
    props = cluster.props(
        "real_conv", tmp_path / "staging", **{"run.max.events": 60, "table.include.list": f"{ks}.orders"}
    )
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(props))
    rng = random.Random(11)
    runs = CrashRuns(
        config_path, "after_batch_write:0.25,after_state_commit:0.2,mid_window:0.1", rng, 0.3, 1.5
    )
    copy_runs = 0
    with keyless_support.Writers(cluster, change_orders, seeds=(1, 2), retried=()) as writers:
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


def _writes_during_copy(monkeypatch: pytest.MonkeyPatch, cluster: vitess_real.RealVitessCluster) -> list[str]:
    """After the first chunk of every whole read, change ``dup`` through vtgate on both shards: a
    duplicate inserted, one of several equal rows deleted and updated, a NULL row changed.  Returns
    the tables whose copies saw the writes."""
    from airflow_cdc.sources.vitess import whole
    from tests.integration.vitess.test_vtgate_shapes import keys_of

    copy_table, seen = whole.copy_table, []

    def with_writes(*args: Any) -> Any:
        for i, chunk in enumerate(copy_table(*args)):
            yield chunk
            if i == 0:
                seen.append(args[1])
                for grp in (keys_of("-80", 1)[0], keys_of("80-", 1)[0]):
                    cluster.execute("INSERT INTO dup (grp, val, qty, note) VALUES (%s, 'v1', 1, 'n')", (grp,))
                    cluster.execute("INSERT INTO dup (grp, val, qty, note) VALUES (%s, 'v1', 1, 'n')", (grp,))
                    cluster.execute("DELETE FROM dup WHERE grp = %s LIMIT 1", (grp,))
                    cluster.execute("UPDATE dup SET qty = qty + 5 WHERE grp = %s LIMIT 1", (grp,))
                    cluster.execute("UPDATE dup SET note = 'z' WHERE grp = %s AND note IS NULL", (grp,))

    monkeypatch.setattr(whole, "copy_table", with_writes)
    return seen


def _assert_mirrored(props: dict[str, Any], cluster: vitess_real.RealVitessCluster, name: str) -> None:
    table = f"{cluster.keyspace}.{name}"
    oracle = replay(props)
    assert oracle.keyless[table].mode == "multiset" and oracle.keyless[table].anomalies == 0
    assert_multiset_equal(table, keyless_support.vtgate_multiset(cluster, name), oracle.multiset(table))


def test_keyless_table_mirrored_exactly_with_writes_during_its_copy(
    cluster: vitess_real.RealVitessCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dup`` (no key: equal rows on both shards, NULLs) is captured as a multiset, its snapshot
    read whole by a copy of its own (many chunks: 600-byte packets) while writers change it: each
    change made during the copy reaches silver once -- in the copied rows of a shard not snapshotted
    yet, as a streamed event above a snapshotted shard's copy.  Then streamed changes to one of
    several equal rows, a batch published but not committed (read whole again by the next run), an
    ad hoc snapshot (read whole again, with writes), ``verify``'s read of the live table, and
    ``message.key.columns`` (the table keyed again)."""
    ks = cluster.keyspace
    table = f"{ks}.dup"
    keyless_support.fill(cluster, "dup", 400)
    cluster.execute(
        "INSERT INTO dup (grp, val, qty, note) VALUES (7, NULL, NULL, NULL), (7, NULL, NULL, NULL)"
    )
    seen = _writes_during_copy(monkeypatch, cluster)
    props = cluster.props(
        "real_dup", tmp_path / "staging", **{"table.include.list": table, "run.max.events": 40}
    )
    first = run_capture(props)
    assert seen == [table] and not snapshot_pending(props), "read whole in one run, written meanwhile"
    assert first.tables[table]["r"] >= 400
    assert list_batches(props["staging.path"], props["name"])[-1].table_info(table)["keyless"] == "multiset"
    _assert_mirrored(props, cluster, "dup")

    cluster.execute("DELETE FROM dup WHERE grp = 7 AND val IS NULL LIMIT 1")
    cluster.execute("UPDATE dup SET qty = 0 WHERE grp = 8 LIMIT 1")
    cluster.execute("INSERT INTO dup (grp, val, qty, note) VALUES (9, 'v2', 2, NULL), (9, 'v2', 2, NULL)")
    cluster.execute("DELETE FROM dup WHERE grp = 10")
    assert run_capture(props).tables[table]["d"] >= 2
    _assert_mirrored(props, cluster, "dup")

    # a batch published but never committed (applied or not): the next run reads the table whole
    # again, in a keyless round above the orphan's
    cluster.execute("DELETE FROM dup WHERE grp = 11 LIMIT 1")
    orphan = run_capture(props, commit=False)
    cluster.execute("INSERT INTO dup (grp, val, qty, note) VALUES (11, 'v4', 2, 'n')")
    after = run_capture(props)
    assert after.to_offset["keyless_round"] == orphan.to_offset["keyless_round"] + 1
    manifest = list_batches(props["staging.path"], props["name"])[-1].manifest
    assert manifest["batch_id"] == after.batch_id
    assert any(f"{table} read whole again" in n for n in manifest["vitess"]["notes"])
    run_capture(props)  # the writes made during that read: past the window's end (read before it)
    _assert_mirrored(props, cluster, "dup")

    again = run_capture(props, signals=[{"execute-snapshot": {"data-collections": [table]}}])
    assert seen == [table] * 3 and any("read whole" in n for n in again.notes)
    run_capture(props)
    _assert_mirrored(props, cluster, "dup")

    monkeypatch.undo()  # no writes from here: verify reads the live table by a copy of its own
    source = VitessSource(build_config(props))
    source.open()
    try:
        live = [row for chunk in source.encoded_chunks(table, 128) for row in chunk.to_pylist()]
    finally:
        source.close()
    assert_multiset_equal(table, keyless_support.vtgate_multiset(cluster, "dup"), live)

    keyed = dict(props, name="real_dup_keyed", **{"message.key.columns": f"{table}:grp,val,qty,note"})
    keyed["staging.path"] = str(tmp_path / "keyed")
    run_capture(keyed)
    info = list_batches(keyed["staging.path"], keyed["name"])[-1].table_info(table)
    assert info["key_columns"] == ["grp", "val", "qty", "note"] and "keyless" not in info


def test_keyless_run_after_an_uncommitted_batch_that_raised_the_epoch(
    cluster: vitess_real.RealVitessCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that requests a snapshot of a captured keyed table raises the epoch in its middle (the
    copy cannot show deletes: a truncate below it voids the old rows), after its keyless tables
    were read whole.  Its batch is published but never committed; the next run starts from the
    committed, lower epoch and reads ``lone`` whole again.  Its events must sort above the orphan's
    -- CI found them below (positions led by the raised epoch), so a multiset's apply skipped the
    whole read and then met deletes of rows it never had.  The signal is not given again: stored
    before the batch was published, the next run reads ``lone`` whole and copies ``lone_kv`` again
    (else the keys the orphan copied would be voided and never come back)."""
    ks = cluster.keyspace
    lone, kv = f"{ks}.lone", f"{ks}.lone_kv"
    keyless_support.fill(cluster, "lone", 300)
    cluster.execute("INSERT INTO lone_kv (id, v) VALUES " + ", ".join(f"({i}, 'k{i}')" for i in range(1, 41)))
    props = cluster.props("real_lone", tmp_path / "staging", **{"table.include.list": f"{lone},{kv}"})
    while snapshot_pending(props):
        run_capture(props)
    committed = run_capture(props).to_offset
    # a request the copy phase cannot run is refused before anything is stored (stored, it would
    # fail every later run)
    store = build_store(build_config(props))
    version = store.load(props["name"]).version
    bad = {"data-collections": [kv], "additional-conditions": [{"data-collection": kv, "filter": "id > 3"}]}
    with pytest.raises(ConfigError, match="additional conditions and surrogate keys are not supported"):
        run_capture(props, signals=[{"execute-snapshot": bad}])
    assert store.load(props["name"]).version == version

    from airflow_cdc.sources.vitess import whole

    copy_table = whole.copy_table

    def then_writes(*args: Any) -> Any:  # once every shard's copy of lone is read: window events
        yield from copy_table(*args)
        for grp in range(0, 30, 3):
            cluster.execute("DELETE FROM lone WHERE grp = %s LIMIT 1", (grp,))
            cluster.execute("UPDATE lone SET qty = qty + 5 WHERE grp = %s LIMIT 1", (grp + 1,))

    cluster.execute("DELETE FROM lone_kv WHERE id <= 5")
    # lone read whole at the run's start, then the request of lone_kv's copy raises the epoch, then
    # the window streams lone's changes
    signal = {"execute-snapshot": {"data-collections": [lone, kv]}}
    with monkeypatch.context() as patched:
        patched.setattr(whole, "copy_table", then_writes)
        orphan = run_capture(props, commit=False, signals=[signal])
    assert orphan.to_offset["epoch"] > committed.get("epoch", 0), "the snapshot request raises the epoch"
    assert orphan.tables[lone]["d"] >= 10 and orphan.tables[lone]["u"] >= 10, orphan.tables

    for grp in range(30, 60, 3):
        cluster.execute("DELETE FROM lone WHERE grp = %s LIMIT 1", (grp,))
    cluster.execute("INSERT INTO lone (grp, val, qty, note) VALUES (1, 'v1', 1, 'n'), (1, 'v1', 1, 'n')")
    after = run_capture(props)
    assert any(lone in n and "read whole" in n for n in after.notes), after.notes
    assert (after.to_offset["keyless_epoch"], after.to_offset["keyless_round"]) > (
        orphan.to_offset["keyless_epoch"],
        orphan.to_offset["keyless_round"],
    )
    cluster.execute("DELETE FROM lone WHERE grp = 1 LIMIT 2")
    cluster.execute("UPDATE lone SET val = 'late' WHERE grp = 2 LIMIT 1")
    while snapshot_pending(props) or run_capture(props).events:
        pass

    oracle = replay(props)
    assert oracle.keyless[lone].anomalies == 0
    assert_multiset_equal(lone, keyless_support.vtgate_multiset(cluster, "lone"), oracle.multiset(lone))
    live_kv = {(r[0],): {"id": r[0], "v": r[1]} for r in cluster.execute("SELECT id, v FROM lone_kv")}
    assert_rows_equal(kv, live_kv, oracle.rows(kv))


@pytest.mark.spark
@pytest.mark.slow
def test_keyless_converges_with_sigkills_through_spark(
    cluster: vitess_real.RealVitessCluster, spark: Any, tmp_path: Path
) -> None:
    """``ev`` (no key: 2,000 rows over 300 groups, equal rows on both shards) and the keyed ``kv``
    captured by child processes SIGKILLed at random points -- mid window, mid whole read, after
    publishing (the next run reads ``ev`` whole again: the orphan's events cannot be matched in a
    new keyless round), after the state commit -- while two writers change one of several equal
    rows through vtgate; half way an ad hoc snapshot reads ``ev`` whole again.  The replay through
    the reference applier and every published batch applied by Spark (orphans included) equal the
    live table as a multiset, and ``kv`` by key."""
    ks = cluster.keyspace
    ev, kv = f"{ks}.ev", f"{ks}.kv"
    keyless_support.fill(cluster, "ev", 2000)
    cluster.execute("INSERT INTO kv (id, v) VALUES " + ", ".join(f"({i}, 'k{i}')" for i in range(1, 301)))
    props = cluster.props(
        "real_ev", tmp_path / "staging", **{"table.include.list": f"{ev},{kv}", "run.max.events": 80}
    )
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(props))
    failpoints = "after_batch_write:0.3,after_state_commit:0.2,mid_window:0.1,whole_read:0.3"
    runs = CrashRuns(config_path, failpoints, random.Random(17), 0.35, 1.0, budget=5)
    signalled = False
    with keyless_support.Writers(cluster) as writers:
        while snapshot_pending(props) or runs.clean < 3 or runs.kills < 3:
            runs.run()
            if runs.runs >= 3 and not signalled:
                run_capture(props, signals=[{"execute-snapshot": {"data-collections": [ev]}}])
                signalled = True
    assert not writers.errors, writers.errors
    assert writers.writes > 50
    drain = dict(props, **{"run.max.events": 100_000})
    while run_capture(drain).events:
        pass
    live = keyless_support.vtgate_multiset(cluster, "ev")
    assert len(live) > len({repr(r) for r in live}), "the table should hold equal rows"
    oracle = replay(props)
    assert oracle.keyless[ev].anomalies == 0
    assert_multiset_equal(ev, live, oracle.multiset(ev))
    live_kv = {(r[0],): {"id": r[0], "v": r[1]} for r in cluster.execute("SELECT id, v FROM kv")}
    assert_rows_equal(kv, live_kv, oracle.rows(kv))

    batches = list_batches(props["staging.path"], props["name"])
    target = str(tmp_path / "delta")
    # one job over every published batch (orphans too), silver only (bronze adds nothing here)
    apply_batches(spark, [str(b.path) for b in batches], target, ApplySettings(bronze=False))
    names = semantic_names(props, ev)
    got = silver_multiset(spark, target, props, ev)
    assert_multiset_equal(ev, normalised_list(live, names), got)
    names = semantic_names(props, kv)
    got_kv = silver_rows(spark, target, props, kv, ["id"])
    assert not (problem := diff(normalised_rows(live_kv, names), got_kv)), problem
