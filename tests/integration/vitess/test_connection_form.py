"""The Airflow connection form's *Test* for a ``cdcvitess`` Connection (our hook built from the
Connection alone) against the VStream emulator: vtgate reached, keyspace listed, VStream answered;
an unknown keyspace, bad credentials and an unreachable vtgate say so."""

from __future__ import annotations

import json
import uuid

from airflow_cdc.testing.servers import free_port
from airflow_cdc.testing.vitess_emulator import VtgateEmulator
from tests.integration.vitess.capture_support import SCHEMA


def form_test(monkeypatch, **fields) -> tuple[bool, str]:
    from airflow.models.connection import Connection

    conn_id = f"t_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "cdcvitess", **fields}))
    return Connection(conn_id=conn_id, conn_type="cdcvitess", **fields).test_connection()


def test_vitess_connection_test(monkeypatch, vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    host, port = vtgate.address.split(":")
    ok, message = form_test(monkeypatch, host=host, port=int(port), schema=keyspace)
    assert ok, message
    assert f"keyspace {keyspace!r} has 1 table(s)" in message and "2 shard(s): -80@MySQL56/" in message
    ok, message = form_test(monkeypatch, host=host, port=int(port), schema="no_such_keyspace")
    assert not ok and "vitess.keyspace" in message
    ok, message = form_test(monkeypatch, host="127.0.0.1", port=free_port(), schema=keyspace)
    assert not ok and "127.0.0.1" in message


def test_vitess_connection_test_bad_credentials(monkeypatch, shard_servers, keyspace):
    with VtgateEmulator(users={"cdc": "s3cret"}) as secured:
        secured.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
        host, port = secured.address.split(":")
        base = {"host": host, "port": int(port), "schema": keyspace, "login": "cdc"}
        ok, message = form_test(monkeypatch, password="wrong-pw", **base)
        assert not ok and "database.password" in message and "wrong-pw" not in message
        ok, message = form_test(monkeypatch, password="s3cret", **base)
        assert ok, message
