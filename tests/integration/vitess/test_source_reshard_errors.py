"""VitessSource through the capture core across a reshard (1 -> 2 shards) with and without
``vitess.stop_on_reshard``, and bad inputs: clear errors naming the setting, no offset moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import AuthenticationFailed, ConfigError, ConnectionFailed, OffsetUnavailable
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.testing.servers import free_port
from airflow_cdc.testing.vitess_emulator import VtgateEmulator
from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.support.pipeline import assert_rows_equal, replay, run_capture

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


@pytest.fixture
def unsharded(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    for i in range(1, 21):
        vtgate.execute(keyspace, INSERT, order_values(i))
    return keyspace


def _drain(props: dict) -> list:
    results = [run_capture(props)]
    while results[-1].events:
        results.append(run_capture(props))
    return results


def _stream_ops(props: dict, table: str) -> list[tuple[str, int]]:
    out = []
    for batch in list_batches(props["staging.path"], props["name"]):
        if table in batch.tables():
            for rb in batch.iter_events(table):
                for r in rb.to_pylist():
                    if r["op"] != "r":
                        out.append((r["op"], (r["after"] or r["before"])["id"]))
    return out


@pytest.mark.parametrize("stop_on_reshard", [False, True])
def test_reshard_mid_window_keeps_every_event_once(
    vtgate, shard_servers, unsharded, tmp_path: Path, stop_on_reshard
):
    ks = unsharded
    props = vitess_props(vtgate, ks, tmp_path, **{"vitess.stop_on_reshard": stop_on_reshard})
    assert run_capture(props).snapshot_rows == 20
    for i in range(1, 6):
        vtgate.execute(ks, "UPDATE orders SET qty = -1 WHERE id = %s", (i,))
    vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
    for i in range(21, 41):
        vtgate.execute(ks, INSERT, order_values(i), key=i)
    for i in range(6, 11):
        vtgate.execute(ks, "DELETE FROM orders WHERE id = %s", (i,), key=i)
    results = _drain(props)
    offset = results[-1].to_offset
    assert sorted(g["shard"] for g in offset["vgtid"]) == ["-80", "80-"] and offset["generation"] == 1
    journals = [
        b.manifest.get("vitess", {}).get("journal")
        for b in list_batches(props["staging.path"], props["name"])
    ]
    assert any(journals) == stop_on_reshard
    ops = _stream_ops(props, f"{ks}.orders")
    expected = (
        [("u", i) for i in range(1, 6)] + [("c", i) for i in range(21, 41)] + [("d", i) for i in range(6, 11)]
    )
    assert sorted(ops) == sorted(expected), "every change exactly once"
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))


def test_bad_inputs_name_the_setting_and_move_nothing(vtgate, shard_servers, unsharded, tmp_path: Path):
    ks = unsharded
    with pytest.raises(ConnectionFailed, match=r"127\.0\.0\.1"):
        run_capture(vitess_props(vtgate, ks, tmp_path / "a", **{"database.port": free_port()}))
    with pytest.raises(ConfigError, match="vitess.keyspace"):
        run_capture(vitess_props(vtgate, "no_such_keyspace", tmp_path / "b"))
    with VtgateEmulator(users={"cdc": "s3cret"}) as secured:
        secured.add_keyspace(ks + "s", {"0": shard_servers[0]}, SCHEMA)
        props = vitess_props(
            secured, ks + "s", tmp_path / "c", **{"database.user": "cdc", "database.password": "wrong"}
        )
        with pytest.raises(AuthenticationFailed, match="database.password") as info:
            run_capture(props)
        assert "wrong" not in str(info.value)
        secured.execute(ks + "s", INSERT, order_values(1))
        props["database.password"] = "s3cret"
        assert run_capture(props).snapshot_rows == 1
    for name in ("a", "b", "c"):
        if name != "c":
            assert (
                build_store(build_config(vitess_props(vtgate, ks, tmp_path / name))).load(f"vt_{ks}") is None
            )


def test_lost_vgtid_fails_then_when_needed_recopies(vtgate, unsharded, tmp_path: Path):
    ks = unsharded
    props = vitess_props(vtgate, ks, tmp_path)
    run_capture(props)
    store = build_store(build_config(props))
    stored = store.load(props["name"])
    lost = dict(stored.data)
    lost["offset"] = dict(lost["offset"], vgtid=[
        {"keyspace": ks, "shard": "0", "gtid": "MySQL56/00000000-0000-0000-0000-000000000001:1-5"}
    ])  # fmt: skip
    version = store.compare_and_set(props["name"], stored.version, lost)
    vtgate.execute(ks, "DELETE FROM orders WHERE id = 1")
    with pytest.raises(OffsetUnavailable, match="stored position"):
        run_capture(props)
    assert store.load(props["name"]).version == version, "no offset moved"
    vtgate.execute(ks, "DELETE FROM orders WHERE id = 2")
    result = run_capture(dict(props, **{"snapshot.mode": "when_needed"}))
    assert result.snapshot_rows == 18 and result.to_offset["epoch"] == 1
    assert any("void" in n for n in result.notes)
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))
