"""Our client against real Vitess (vtgate + unmanaged vttablets over two MariaDB shards).

Skipped unless the Vitess binaries are built (``make vitess``, part of ``make setup``); see
:mod:`airflow_cdc.testing.vitess_real`.  The shards are MariaDB, so vtgate's positions read
``MariaDB/<domain>-<server>-<seq>``, which :class:`~airflow_cdc.sources.vitess.offsets.GtidSet`
orders per domain by sequence number.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from airflow_cdc.sources.vitess import offsets, position
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.window import read_window
from airflow_cdc.testing import vitess_real

pytestmark = pytest.mark.skipif(bool(vitess_real.missing()), reason=str(vitess_real.missing()))


@pytest.fixture(scope="module")
def cluster() -> Iterator[vitess_real.RealVitessCluster]:
    began = time.monotonic()
    with vitess_real.RealVitessCluster(keyspace="ks", shards=("-80", "80-")) as vt:
        vt.execute(
            "INSERT INTO customer (id, name) VALUES " + ",".join(f"({i}, 'n{i}')" for i in range(1, 21))
        )
        print(f"\nreal Vitess up in {time.monotonic() - began:.1f}s {vt.timings}; RSS KiB {vt.memory_kib()}")
        yield vt


@pytest.fixture
def client(cluster: vitess_real.RealVitessCluster) -> Iterator[VtgateClient]:
    raw = {"name": "real_smoke", "staging.path": "/unused", "vitess.keyspace": cluster.keyspace,
           "database.hostname": cluster.host, "database.port": cluster.grpc_port}  # fmt: skip
    c = VtgateClient(vitess_config(raw))
    yield c
    c.close()


def _ids(window, kind: str, op: str) -> set[int]:  # type: ignore[no-untyped-def]
    return {
        int((c.after or c.before or {})["id"])
        for t in window.transactions
        if t.kind == kind
        for c in t.changes
        if c.op == op
    }


def test_cluster_routes_to_both_shards(cluster: vitess_real.RealVitessCluster, client: VtgateClient) -> None:
    per_shard = {
        s: cluster.execute_on_shard(s, "SELECT COUNT(*) FROM customer")[0][0] for s in cluster.shards
    }
    assert sum(per_shard.values()) == 20 and all(per_shard.values()), per_shard
    vgtid = client.current_vgtid(cluster.keyspace)
    assert {g.shard for g in vgtid.shard_gtids} == {"-80", "80-"}
    assert all(g.gtid.startswith("MariaDB/") for g in vgtid.shard_gtids), vgtid
    assert {g.shard: g.gtid for g in vgtid.shard_gtids} == {s: cluster.shard_gtid(s) for s in cluster.shards}
    assert "customer" in client.list_tables(cluster.keyspace)


def test_copy_then_streamed_change(cluster: vitess_real.RealVitessCluster, client: VtgateClient) -> None:
    keyspace = cluster.keyspace
    expected = {int(r[0]) for r in cluster.execute("SELECT id FROM customer")}
    target = client.current_vgtid(keyspace)
    copy = read_window(client, offsets.start_vgtid(keyspace, None, ""), target, None, 10**9, idle_timeout=60)
    assert copy.copy_completed and not offsets.copying(copy.end)
    assert {s for _, s in copy.shards_copied} == {"-80", "80-"}
    copied = [c for t in copy.transactions for c in t.changes]
    assert sorted(int(c.after["id"]) for c in copied if c.after) == sorted(expected)
    assert offsets.reached(copy.end, target)

    cluster.execute("INSERT INTO customer (id, name) VALUES (1001, 'new'), (1002, 'newer')")
    cluster.execute("UPDATE customer SET name = 'changed' WHERE id = 1")
    cluster.execute("DELETE FROM customer WHERE id = 2")
    cluster.execute_on_shard("80-", "INSERT INTO customer (id, name) VALUES (5000, 'direct')")
    after = client.current_vgtid(keyspace)
    stream = read_window(client, copy.end, after, None, 10**9, idle_timeout=60)
    assert offsets.reached(stream.end, after)
    assert _ids(stream, "commit", "c") == {1001, 1002, 5000}
    assert _ids(stream, "commit", "u") == {1}
    assert _ids(stream, "commit", "d") == {2}
    # a shard's transaction count only grows
    for before, now in zip(copy.end.shard_gtids, stream.end.shard_gtids, strict=True):
        assert position.transactions_in(now.gtid) > position.transactions_in(before.gtid)


def test_copy_rows_are_snapshot_reads(cluster: vitess_real.RealVitessCluster, client: VtgateClient) -> None:
    keyspace = cluster.keyspace
    target = client.current_vgtid(keyspace)
    copy = read_window(client, offsets.start_vgtid(keyspace, None, ""), target, None, 10**9, idle_timeout=60)
    assert copy.copy_chunks >= len(cluster.shards)
    assert {c.op for t in copy.transactions for c in t.changes} == {"r"}
    assert _ids(copy, "copy", "r") == {int(r[0]) for r in cluster.execute("SELECT id FROM customer")}
    assert all(t.kind == "copy" for t in copy.transactions if t.changes)


def test_source_parses_mariadb_positions(
    cluster: vitess_real.RealVitessCluster, client: VtgateClient
) -> None:
    vgtid = client.current_vgtid(cluster.keyspace)
    assert offsets.reached(vgtid, vgtid)
    assert all(position.transactions_in(g.gtid) > 0 for g in vgtid.shard_gtids)
    cluster.execute_on_shard("-80", "INSERT INTO customer (id, name) VALUES (7001, 'later')")
    later = client.current_vgtid(cluster.keyspace)
    assert offsets.reached(later, vgtid) and not offsets.reached(vgtid, later)
    assert position.VitessCoord(vgtid) < position.VitessCoord(later)
