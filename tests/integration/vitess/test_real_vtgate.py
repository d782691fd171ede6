"""The client against a real vtgate: the one given by ``AIRFLOW_CDC_VTGATE_ADDR=host:port`` and
``AIRFLOW_CDC_VTGATE_KEYSPACE`` (optional ``AIRFLOW_CDC_VTGATE_USER`` / ``_PASSWORD``), else a
throwaway real Vitess (:mod:`airflow_cdc.testing.vitess_real`, built by ``make setup``).  Read-only:
it reads the current VGTID, a copy-phase window and an empty streaming window."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.window import changes_after, read_window
from airflow_cdc.testing import vitess_real

ADDR = os.environ.get("AIRFLOW_CDC_VTGATE_ADDR")
pytestmark = pytest.mark.skipif(
    not ADDR and bool(vitess_real.missing()),
    reason=f"no real vtgate (set AIRFLOW_CDC_VTGATE_ADDR): {vitess_real.missing()}",
)


@pytest.fixture(scope="module")
def target() -> Iterator[dict[str, str]]:
    """Where the real vtgate is: the given one, or a throwaway two-shard cluster with some rows."""
    if ADDR:
        yield {
            "addr": ADDR, "keyspace": os.environ["AIRFLOW_CDC_VTGATE_KEYSPACE"],
            "user": os.environ.get("AIRFLOW_CDC_VTGATE_USER", ""),
            "password": os.environ.get("AIRFLOW_CDC_VTGATE_PASSWORD", ""),
        }  # fmt: skip
        return
    with vitess_real.RealVitessCluster(keyspace="given", shards=("-80", "80-")) as vt:
        vt.execute(
            "INSERT INTO customer (id, name) VALUES " + ",".join(f"({i}, 'c{i}')" for i in range(1, 41))
        )
        yield {"addr": vt.addr, "keyspace": vt.keyspace, "user": "", "password": ""}


@pytest.fixture
def client(target):
    host, _, port = target["addr"].rpartition(":")
    raw = {"name": "real", "staging.path": "/unused", "vitess.keyspace": target["keyspace"],
           "database.hostname": host, "database.port": int(port)}  # fmt: skip
    if target["user"]:
        raw["database.user"] = target["user"]
        raw["database.password"] = target["password"]
    c = VtgateClient(vitess_config(raw))
    yield c
    c.close()


def test_positions_copy_and_stream(client):
    keyspace = client.config["vitess.keyspace"]
    target = client.current_vgtid(keyspace)
    assert target.shard_gtids and all(g.gtid.startswith(("MySQL56/", "MariaDB/")) for g in target.shard_gtids)
    copy = read_window(client, offsets.start_vgtid(keyspace, None, ""), target, None, 10**9, idle_timeout=60)
    assert copy.copy_completed and not offsets.copying(copy.end)
    assert {c.op for t in copy.transactions if t.kind == "copy" for c in t.changes} <= {"r"}
    quiet = read_window(client, copy.end, copy.end, None, 10**9, idle_timeout=60)
    assert offsets.reached(quiet.end, copy.end)
    changes_after(client, keyspace, None, offsets.to_offset(quiet.end))


def test_capture_through_the_core(client, tmp_path):
    """VitessSource against the real vtgate: SHOW TABLES, the copy phase as the initial snapshot over
    bounded runs, then a quiet streaming run; the replay has as many rows as the copy read."""
    from airflow_cdc.core.pipeline import build_capture
    from tests.support.pipeline import replay

    props = {
        "name": "real_capture", "connector": "vitess", "staging.path": str(tmp_path),
        "vitess.keyspace": client.config["vitess.keyspace"], "database.hostname": client.where.rpartition(":")[0],
        "database.port": int(client.where.rpartition(":")[2]), "run.max.events": 5000,
        "vitess.window.idle.timeout": 60,
    }  # fmt: skip
    if client.config["database.user"]:
        props["database.user"] = client.config["database.user"]
        props["database.password"] = client.config.secret("database.password") or ""
    copied = 0
    for _ in range(1000):
        result = build_capture(props).run(commit=True)
        copied += result.snapshot_rows
        if not any(g.get("table_p_ks") for g in result.to_offset["vgtid"]):
            break
    oracle = replay(props)
    assert sum(len(oracle.rows(t)) for t in oracle.tables) <= copied + result.events
