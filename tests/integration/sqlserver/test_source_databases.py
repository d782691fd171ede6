"""Several databases per connector (``database.names``): one partition per database, each with its
own offset, lease and staged batches, captured one after the other by the CLI and applied to the
connector's tables (``<db>.<schema>.<table>``) side by side."""

from __future__ import annotations

import contextlib
import io
import json
import random
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_cdc import cli
from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.core.errors import ConfigError, OffsetUnavailable
from airflow_cdc.core.pipeline import build_capture, build_captures, build_config, partitions
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import COLUMNS, expected_rows, ts_text
from tests.support.oracle import ReferenceApplier


@pytest.fixture
def two_dbs(sqlserver_emulator: SqlServerCdcEmulator) -> Iterator[list[str]]:
    """Two emulated databases, each with its own ``dbo.orders`` (same name, other rows)."""
    emu = sqlserver_emulator
    names = [f"ms_{uuid.uuid4().hex[:10]}_{side}" for side in "ab"]
    for n, db in enumerate(names):
        emu.create_database(db, allow_snapshot_isolation=True)
        emu.create_table(db, "dbo.orders", COLUMNS, primary_key=["id"])
        emu.enable_table(db, "dbo.orders")
        with emu.pg_connect(db) as pg, pg.cursor() as cur:
            rows = [(i, f"{db} item {i}", Decimal(i + 100 * n) / 4, ts_text(i + n)) for i in range(25 + 10 * n)]
            cur.executemany("INSERT INTO dbo.orders VALUES (%s, %s, %s, %s)", rows)
        emu.run_capture_job(db)
    try:
        yield names
    finally:
        emu.set_agent_running(True)
        for db in names:
            emu.drop_database(db)


def properties(emu: SqlServerCdcEmulator, dbs: list[str], staging: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "multi", "connector": "sqlserver", "staging.path": str(staging),
        "database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
        "database.password": emu.password, "database.names": ",".join(dbs), "database.encrypt": False,
        "incremental.snapshot.chunk.size": 6, "snapshot.max.rows.per.run": 12,
        "commit.require.applied": "false", **extra,
    }  # fmt: skip


def run_cli(pipeline: Path, *args: str) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main([args[0], "--config", str(pipeline), *args[1:]])
    return rc, json.loads(out.getvalue()) if rc == 0 else None


def replay_partition(staging: Path, state_name: str) -> ReferenceApplier:
    oracle = ReferenceApplier()
    oracle.apply_batches(list_batches(staging, state_name))
    return oracle


def write_pipeline(tmp_path: Path, props: dict[str, Any]) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(props))
    return path


def test_each_database_converges_on_its_own_offset_with_concurrent_writers(
    sqlserver_emulator: SqlServerCdcEmulator, two_dbs: list[str], tmp_path: Path
) -> None:
    emu = sqlserver_emulator
    staging = tmp_path / "staging"
    pipeline = write_pipeline(tmp_path, properties(emu, two_dbs, staging))
    config = build_config(properties(emu, two_dbs, staging))
    assert [p.partition for p in partitions(config)] == two_dbs
    assert [p.state_name for p in partitions(config)] == [f"multi.{db}" for db in two_dbs]
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(db: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with emu.pg_connect(db) as pg:
                while not stop.is_set():
                    key, action = rng.randrange(50), rng.random()
                    if action < 0.4:
                        pg.execute("INSERT INTO dbo.orders VALUES (%s, 'new', 1, %s) ON CONFLICT (id) DO UPDATE"
                                   " SET item = 'upserted'", (key, ts_text(key + seed)))
                    elif action < 0.8:
                        pg.execute("UPDATE dbo.orders SET price = price + 1 WHERE id = %s", (key,))
                    else:
                        pg.execute("DELETE FROM dbo.orders WHERE id = %s", (key,))
                    pg.commit()
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    def capture_job() -> None:
        while not stop.is_set():
            for db in two_dbs:
                emu.run_capture_job(db)

    threads = [threading.Thread(target=write, args=(db, n)) for n, db in enumerate(two_dbs)]
    threads.append(threading.Thread(target=capture_job))
    for t in threads:
        t.start()
    outputs = []
    try:
        for _ in range(4):
            rc, out = run_cli(pipeline, "capture", "--commit")
            assert rc == 0
            outputs.append(out)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    for db in two_dbs:
        emu.run_capture_job(db)
    for _ in range(8):  # drain: snapshots finish, windows empty
        rc, out = run_cli(pipeline, "capture", "--commit")
        outputs.append(out)
        runs = out["partitions"].values()
        if all(r["events"] == 0 and r["snapshot_rows"] == 0 for r in runs) and not any(
            "scheduled" in n for r in runs for n in r["notes"]
        ):
            break
    assert all(set(o["partitions"]) == set(two_dbs) for o in outputs)
    for db in two_dbs:
        staged = list_batches(staging, f"multi.{db}")
        assert staged and all(b.partition == db and b.manifest["connector"] == "multi" for b in staged)
        assert {t for b in staged for t in b.tables()} == {f"{db}.dbo.orders"}
        got = replay_partition(staging, f"multi.{db}").rows(f"{db}.dbo.orders")
        assert {k: v for k, v in got.items() if v is not None} == expected_rows(emu, db)
    rc, status = run_cli(pipeline, "status")
    offsets = {db: s["state"]["offset"] for db, s in status["partitions"].items()}
    assert set(offsets) == set(two_dbs) and all(list(o["databases"]) == [db] for db, o in offsets.items())


def test_a_purged_database_stops_only_its_own_partition(
    sqlserver_emulator: SqlServerCdcEmulator, two_dbs: list[str], tmp_path: Path
) -> None:
    emu = sqlserver_emulator
    first, second = two_dbs
    props = properties(emu, two_dbs, tmp_path, **{"snapshot.mode": "no_data", "snapshot.max.rows.per.run": 100})
    for capture in build_captures(props):
        capture.run(commit=True)
    for db in two_dbs:
        for i in range(2):
            with emu.pg_connect(db) as pg:
                pg.execute("UPDATE dbo.orders SET item = 'x' WHERE id = %s", (i,))
            emu.run_capture_job(db)
    emu.run_cleanup(second)  # purges a transaction of the second database that was never captured
    store = build_capture(props, first).store
    before = {db: store.load(f"multi.{db}") for db in two_dbs}
    with pytest.raises(OffsetUnavailable, match="cleanup job purged"):
        build_capture(props, second).run(commit=True)
    assert store.load(f"multi.{second}").version == before[second].version  # nothing moved
    result = build_capture(props, first).run(commit=True)  # the other database goes on
    assert result.events == 2
    assert store.load(f"multi.{first}").version == before[first].version + 1
    rescue = {**props, "snapshot.mode": "when_needed"}
    assert build_capture(rescue, second).run(commit=True).snapshot_rows == 35


def test_partition_misuse_is_refused(
    sqlserver_emulator: SqlServerCdcEmulator, two_dbs: list[str], tmp_path: Path
) -> None:
    emu = sqlserver_emulator
    props = properties(emu, two_dbs, tmp_path, **{"snapshot.mode": "no_data"})
    with pytest.raises(ConfigError, match="is partitioned"):
        build_capture(props)
    with pytest.raises(ConfigError, match="has no partition 'nope'"):
        build_capture(props, "nope")
    with pytest.raises(ConfigError, match="more than once"):
        build_config({**props, "database.names": f"{two_dbs[0]},{two_dbs[0].upper()}"})
    result = build_capture(props, two_dbs[0]).run()
    with pytest.raises(ConfigError, match=f"captured by partition '{two_dbs[0]}'"):
        build_capture(props, two_dbs[1]).commit(Batch(result.batch_path))
    single = build_config({**props, "database.names": two_dbs[0]})
    assert [p.state_name for p in partitions(single)] == ["multi"]  # one database: unpartitioned
