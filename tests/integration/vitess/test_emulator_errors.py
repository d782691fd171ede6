"""Bad VStream requests get vtgate's gRPC status codes and messages from the emulator."""

from __future__ import annotations

import time

import grpc
import pytest

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.testing.vitess_emulator import VtgateEmulator
from tests.integration.vitess.support import Drain, last_vgtid, request, rows_of


def _error(address: str, req, metadata=None) -> grpc.RpcError:
    with Drain(address, req, metadata) as drain:
        drain.until(lambda ev: False, timeout=20)
    assert drain.error is not None, "the call did not fail"
    return drain.error


@pytest.fixture
def ks(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-": shard_servers[0]}, ["CREATE TABLE t (id INT PRIMARY KEY)"])
    return keyspace


def test_unknown_keyspace(vtgate):
    error = _error(vtgate.address, request("no_such_ks"))
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert (
        error.details()
        == "keyspace no_such_ks fetch error: node doesn't exist: keyspaces/no_such_ks/SrvKeyspace"
    )


def test_empty_vgtid_and_bad_gtid_for_all_shards(vtgate, ks):
    error = _error(vtgate.address, request(ks, vgtid=b.VGtid()))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "at least one value" in error.details()
    error = _error(vtgate.address, request(ks, gtid="MySQL56/x:1-3"))
    assert (
        error.code() == grpc.StatusCode.INVALID_ARGUMENT and "must be 'current' or empty" in error.details()
    )


def test_unknown_shard(vtgate, ks):
    error = _error(vtgate.address, request(ks, shard="-40", gtid="current"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error.details() == f"target: {ks}.-40.primary: no healthy tablet available"


def test_positions_the_shard_cannot_serve(vtgate, ks):
    shard = vtgate.route(ks)
    other = "MySQL56/00000000-0000-0000-0000-000000000001:1-5"
    error = _error(vtgate.address, request(ks, shard="-", gtid=other))
    assert error.code() == grpc.StatusCode.UNKNOWN and error.details().startswith("could not decode position")
    ahead = shard.position(shard.seq() + 100)
    error = _error(vtgate.address, request(ks, shard="-", gtid=ahead))
    assert error.code() == grpc.StatusCode.UNKNOWN and error.details().startswith("GTIDSet Mismatch")


def test_purged_position(vtgate, ks):
    shard = vtgate.route(ks)
    with Drain(vtgate.address, request(ks)) as drain:
        old = last_vgtid(drain.until(lambda ev: b.OTHER in [e.type for e in ev]))
    vtgate.execute(ks, "INSERT INTO t VALUES (1)")
    shard.server.execute("FLUSH BINARY LOGS")
    newest = shard.server.execute("SHOW BINARY LOGS")[-1][0]
    for _ in range(100):  # a file stays until the binlog checkpoint and any dump thread leave it
        shard.server.execute(f"PURGE BINARY LOGS TO '{newest}'")
        if len(shard.server.execute("SHOW BINARY LOGS")) == 1:
            break
        time.sleep(0.1)
    assert shard.server.execute("SHOW BINARY LOGS")[0][0] == newest
    error = _error(vtgate.address, request(ks, vgtid=old))
    assert error.code() == grpc.StatusCode.UNKNOWN
    details = error.details()
    assert details.startswith("vttablet: rpc error: code = Unknown desc = stream (at source tablet) error @ ")
    assert old.shard_gtids[0].gtid in details and details.endswith("(errno 1236) (sqlstate HY000)")


def test_static_auth(shard_servers, keyspace):
    with VtgateEmulator(users={"cdc": "s3cret"}) as emulator:
        emulator.add_keyspace(keyspace, {"-": shard_servers[0]}, ["CREATE TABLE t (id INT PRIMARY KEY)"])
        error = _error(emulator.address, request(keyspace))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.UNAUTHENTICATED, "username and password must be provided",
        )  # fmt: skip
        error = _error(emulator.address, request(keyspace), [("username", "cdc"), ("password", "wrong")])
        assert (error.code(), error.details()) == (
            grpc.StatusCode.PERMISSION_DENIED, 'auth failure: caller "cdc" provided invalid credentials',
        )  # fmt: skip
        with Drain(emulator.address, request(keyspace), [("username", "cdc"), ("password", "s3cret")]) as ok:
            ok.until(lambda ev: b.OTHER in [e.type for e in ev])
            emulator.execute(keyspace, "INSERT INTO t VALUES (1)")
            assert rows_of(ok.until(lambda ev: len(rows_of(ev)) == 1)) == [(None, [b"1"])]
