"""The Vitess client (config, VtgateClient, Assembler, read_window) against the emulator: windows up
to the run's start positions, whole transactions, a copy phase spread over bounded runs with writes
in between, a reshard mid-window, and vtgate's errors mapped to the product's."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import AuthenticationFailed, ConfigError, ConnectionFailed, OffsetUnavailable
from airflow_cdc.sources.vitess import offsets, snapshots
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.window import changes_after, read_window
from airflow_cdc.testing.servers import free_port
from airflow_cdc.testing.vitess_emulator import VtgateEmulator

SCHEMA = ["CREATE TABLE t1 (id BIGINT PRIMARY KEY, v VARCHAR(10), d DATETIME(6), f DOUBLE)"]


def client_for(address: str, keyspace: str, **extra) -> VtgateClient:
    host, port = address.split(":")
    config = vitess_config(
        {"name": "v", "staging.path": "/tmp/unused", "vitess.keyspace": keyspace, "database.hostname": host,
         "database.port": int(port), **extra}
    )  # fmt: skip
    return VtgateClient(config)


def model_of(windows) -> dict:
    rows: dict = {}
    for w in windows:
        for txn in w.transactions:
            for c in txn.changes:
                if c.before is not None:
                    rows.pop(c.before["id"], None)
                if c.after is not None:
                    rows[c.after["id"]] = c.after
    return rows


def table_rows(vtgate, keyspace) -> dict:
    out = {}
    for shard in vtgate.keyspace_shards(keyspace):
        conn = shard.server.connect(database=shard.database)
        with conn.cursor() as cur:
            cur.execute("SELECT id, v, d, f FROM t1")
            for r in cur.fetchall():
                out[r[0]] = {"id": r[0], "v": r[1], "d": None if r[2] is None else str(r[2]), "f": r[3]}
        conn.close()
    return out


@pytest.fixture
def ks(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    return keyspace


def test_window_stops_at_the_runs_start_position(vtgate, ks):
    client = client_for(vtgate.address, ks)
    try:
        start = client.current_vgtid(ks)
        vtgate.execute(ks, "INSERT INTO t1 VALUES (1, 'a', '2024-01-02 03:04:05.5', 1.25)")
        vtgate.execute(ks, "UPDATE t1 SET v = 'b' WHERE id = 1")
        target = client.current_vgtid(ks)
        vtgate.execute(ks, "DELETE FROM t1 WHERE id = 1")  # after the target: next run's
        window = read_window(client, start, target, None, 1000, idle_timeout=10)
        changes = [c for t in window.transactions for c in t.changes]
        assert [c.op for c in changes] == ["c", "u"]
        assert changes[0].after == {"id": 1, "v": "a", "d": "2024-01-02 03:04:05.500000", "f": 1.25}
        assert changes[1].before["v"] == "a" and changes[1].after["v"] == "b"
        assert (
            offsets.reached(window.end, target)
            and window.end.shard_gtids[0].gtid == target.shard_gtids[0].gtid
        )
        nxt = read_window(client, window.end, client.current_vgtid(ks), None, 1000, idle_timeout=10)
        assert [c.op for t in nxt.transactions for c in t.changes] == ["d"]
    finally:
        client.close()


def test_copy_phase_over_bounded_runs_with_writes(vtgate, ks):
    for i in range(1, 11):
        vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, %s, NULL, %s)", (i, f"v{i}", i / 4))
    client = client_for(vtgate.address, ks)
    windows, start, runs = [], offsets.start_vgtid(ks, None, ""), 0
    try:
        while True:
            runs += 1
            target = client.current_vgtid(ks)
            window = read_window(client, start, target, None, 3, idle_timeout=10)
            windows.append(window)
            start = offsets.from_offset(offsets.to_offset(window.end))  # stored and read back
            vtgate.execute(ks, "UPDATE t1 SET v = CONCAT(v, '+') WHERE id = %s", (runs,))
            vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, 'new', NULL, NULL)", (100 + runs,))
            if window.copy_completed:
                break
            assert window.bounded and offsets.copying(window.end), "a bounded copy run keeps table_p_ks"
            assert runs < 20
        final = read_window(client, start, client.current_vgtid(ks), None, 1000, idle_timeout=10)
        windows.append(final)
    finally:
        client.close()
    assert runs >= 3
    reads = [c for w in windows for t in w.transactions if t.kind == "copy" for c in t.changes]
    assert reads and {c.op for c in reads} == {"r"}
    assert model_of(windows) == table_rows(vtgate, ks)


def test_reshard_inside_a_window(vtgate, shard_servers, ks):
    client = client_for(vtgate.address, ks)
    try:
        start = client.current_vgtid(ks)
        for i in range(1, 6):
            vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, 'x', NULL, NULL)", (i,))
        vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        for i in range(6, 16):
            vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, 'y', NULL, NULL)", (i,), key=i)
        first = read_window(client, start, client.current_vgtid(ks), None, 1000, idle_timeout=10)
        second = read_window(client, first.end, client.current_vgtid(ks), None, 1000, idle_timeout=10)
    finally:
        client.close()
    assert sorted(g.shard for g in second.end.shard_gtids) == ["-80", "80-"]
    ids = [c.after["id"] for w in (first, second) for t in w.transactions for c in t.changes]
    assert sorted(ids) == list(range(1, 16))


def test_reshard_during_an_unfinished_copy(vtgate, shard_servers, ks):
    """The journal retires a shard whose copy is unfinished: the window still ends (at the new
    shards, without a COPY_COMPLETED for the abandoned copy), the table is requested again on the
    new shards, and that re-copy reads every row the keyspace holds then."""
    for i in range(1, 21):
        vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, 'a', NULL, NULL)", (i,))
    client = client_for(vtgate.address, ks)
    try:
        first = read_window(client, offsets.start_vgtid(ks, None, ""), client.current_vgtid(ks), None, 3, 10)
        assert first.bounded and offsets.copying(first.end), "one chunk of the copy, not all of it"
        retired = {offsets.shard_key(g): g for g in first.end.shard_gtids}
        vtgate.execute(ks, "DELETE FROM t1 WHERE id IN (2, 15)")
        vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        for i in (30, 31, 32):
            vtgate.execute(ks, "INSERT INTO t1 VALUES (%s, 'b', NULL, NULL)", (i,), key=i)
        second = read_window(client, first.end, client.current_vgtid(ks), None, 1000, idle_timeout=10)
        assert not second.copy_completed and second.journal is None
        assert sorted(g.shard for g in second.end.shard_gtids) == ["-80", "80-"]
        assert not offsets.copying(second.end), "vtgate's new shards carry no table_p_ks"
        end = b.VGtid()
        end.CopyFrom(second.end)
        assert snapshots.carry_over_retired(end, retired) == {"t1"}
        assert all(snapshots.listed(g) == {"t1"} for g in end.shard_gtids)
        recopy = []
        while True:
            window = read_window(client, end, client.current_vgtid(ks), None, 1000, idle_timeout=10)
            recopy += [c.after for t in window.transactions if t.kind == "copy" for c in t.changes]
            end = window.end
            if not offsets.copying(end):
                break
    finally:
        client.close()
    assert (
        sorted(r["id"] for r in recopy)
        == sorted(table_rows(vtgate, ks))
        == [*[i for i in range(1, 21) if i not in (2, 15)], 30, 31, 32]
    )


def test_stop_on_reshard_ends_the_window_at_the_journal(vtgate, shard_servers, ks):
    client = client_for(vtgate.address, ks, **{"vitess.stop_on_reshard": True})
    try:
        start = client.current_vgtid(ks)
        vtgate.execute(ks, "INSERT INTO t1 VALUES (1, 'x', NULL, NULL)")
        vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        vtgate.execute(ks, "INSERT INTO t1 VALUES (2, 'y', NULL, NULL)", key=2)
        target = client.current_vgtid(ks)
        first = read_window(client, start, target, None, 1000, idle_timeout=10)
        assert first.journal is not None
        assert sorted(g.shard for g in first.end.shard_gtids) == ["-80", "80-"]
        second = read_window(client, first.end, target, None, 1000, idle_timeout=10)
    finally:
        client.close()
    ids = [c.after["id"] for w in (first, second) for t in w.transactions for c in t.changes]
    assert ids == [1, 2]


def test_errors_are_mapped(vtgate, shard_servers, ks):
    client = client_for(vtgate.address, "no_such_keyspace")
    with pytest.raises(ConfigError, match="vitess.keyspace"):
        client.current_vgtid("no_such_keyspace")
    client.close()
    client = client_for(f"127.0.0.1:{free_port()}", ks)
    with pytest.raises(ConnectionFailed):
        client.current_vgtid(ks, timeout=5)
    client.close()
    with VtgateEmulator(users={"cdc": "pw"}) as secured:
        secured.add_keyspace(ks + "s", {"-": shard_servers[0]}, SCHEMA)
        bad = client_for(secured.address, ks + "s", **{"database.user": "cdc", "database.password": "nope"})
        with pytest.raises(AuthenticationFailed) as info:
            bad.current_vgtid(ks + "s")
        assert "nope" not in str(info.value)
        bad.close()
    client = client_for(vtgate.address, ks)
    gone = offsets.vgtid_from_json(
        [{"keyspace": ks, "shard": "0", "gtid": "MySQL56/00000000-0000-0000-0000-000000000009:1-3"}]
    )
    with pytest.raises(OffsetUnavailable):
        read_window(client, gone, gone, None, 10, idle_timeout=5)
    client.close()


def test_changes_after_for_the_sensor(vtgate, ks):
    client = client_for(vtgate.address, ks)
    try:
        assert changes_after(client, ks, None, None)
        offset = offsets.to_offset(client.current_vgtid(ks))
        assert not changes_after(client, ks, None, offset)
        vtgate.execute(ks, "INSERT INTO t1 VALUES (1, 'x', NULL, NULL)")
        assert changes_after(client, ks, None, offset)
        window = read_window(client, offsets.from_offset(offset), client.current_vgtid(ks), None, 100, 10)
        assert not changes_after(client, ks, None, offsets.to_offset(window.end))
        assert changes_after(client, ks, None, offsets.to_offset(offsets.start_vgtid(ks, "0", "")))
    finally:
        client.close()
