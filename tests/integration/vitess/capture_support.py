"""Helpers of the VitessSource tests: a connector config against the emulator, and the union of the
shards' rows in the form the replayed batches have."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow_cdc.testing.vitess_emulator import VtgateEmulator

SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, item VARCHAR(40), qty INT, price DECIMAL(10,2),"
    " at DATETIME(6), note TEXT, raw VARBINARY(16))",
]
_EPOCH = dt.datetime(1970, 1, 1)


def vitess_props(vtgate: VtgateEmulator, keyspace: str, staging: Path, **extra: Any) -> dict[str, Any]:
    host, port = vtgate.address.split(":")
    return {
        "name": f"vt_{keyspace}",
        "connector": "vitess",
        "staging.path": str(staging),
        "database.hostname": host,
        "database.port": int(port),
        "vitess.keyspace": keyspace,
        "vitess.window.idle.timeout": 10,
        "lease.timeout.ms": 5000,
        **extra,
    }


def order_values(i: int, version: int = 0) -> tuple:
    at = _EPOCH + dt.timedelta(days=19000 + i % 50, microseconds=i * 7919 + version)
    return (
        i,
        f"item {i}.{version}",
        i * 3 + version,
        f"{i}.{version % 100:02d}",
        at,
        "n" * (i % 5),
        bytes([i % 256, version % 256]),
    )


ORDER_COLUMNS = "id, item, qty, price, at, note, raw"


def encode_order(r: tuple) -> dict[str, Any]:
    """One ``orders`` row as read with pymysql (``ORDER_COLUMNS``), encoded as staged events encode it."""
    at = r[4]
    return {
        "id": r[0],
        "item": r[1],
        "qty": r[2],
        "price": None if r[3] is None else str(r[3]),
        "at": None if at is None else int((at - _EPOCH) / dt.timedelta(microseconds=1)),
        "note": r[5],
        "raw": None if r[6] is None else bytes(r[6]),
    }


def shard_rows(vtgate: VtgateEmulator, keyspace: str) -> dict[tuple, dict[str, Any]]:
    """Every shard's ``orders`` rows, encoded as the staged events encode them."""
    out: dict[tuple, dict[str, Any]] = {}
    for shard in vtgate.keyspace_shards(keyspace):
        for r in shard.server.execute(f"SELECT {ORDER_COLUMNS} FROM orders", database=shard.database):
            key = (r[0],)
            assert key not in out, f"key {key} on two shards"
            out[key] = encode_order(r)
    return out
