"""What differs between PostgreSQL majors (``sources/postgres/versions.py``), each on every major
of the test matrix: pgoutput's options (13: protocol 1 without logical decoding messages),
failover slots (17+: ``slot.failover``), the columns of ``pg_replication_slots`` a lost slot is
reported with (``wal_status``; 17+: ``invalidation_reason``), and ``slot.drop.on.stop``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.core.errors import ConfigError, OffsetUnavailable
from airflow_cdc.sources.postgres import versions
from tests.integration.postgres.support import assert_converged, every_version, execute, pipeline, run_capture

pytestmark = every_version


def _slot(pg_db: Any, name: str) -> dict[str, Any] | None:
    rows = execute(pg_db.dsn, f"SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = '{name}'")
    return rows[0][0] if rows else None


@pytest.mark.parametrize("reader", ["peek", "stream"])
def test_window_options_and_logical_messages(pg_db: Any, tmp_path: Any, pg_version: int, reader: str) -> None:
    """Both window readers ask each major for what its pgoutput has: 14+ protocol 2 (streaming)
    and logical decoding messages; 13 protocol 1 without the ``messages`` option (it refuses it
    with "unrecognized pgoutput option"), so a message emitted there is not staged while the
    row changes around it are."""
    num = pg_db.connect().info.server_version
    assert versions.major(num) == pg_version
    expected = [("proto_version", "2"), ("streaming", "on")] if pg_version >= 14 else [("proto_version", "1")]
    assert versions.window_options(num, streaming=True) == expected
    assert versions.with_messages(num) == (pg_version >= 14)
    execute(pg_db.dsn, "CREATE TABLE m (id int PRIMARY KEY, v text)")
    config = pipeline(pg_db, tmp_path / "staging", **{"window.reader": reader, "snapshot.mode": "no_data"})
    run_capture(config)
    execute(
        pg_db.dsn,
        "INSERT INTO m VALUES (1, 'a')",
        "SELECT pg_logical_emit_message(true, 'audit', 'in a transaction')",
        "SELECT pg_logical_emit_message(false, 'audit', 'outside')",
        "INSERT INTO m VALUES (2, 'b')",
    )
    result = run_capture(config)
    assert result.events == 2
    messages = [
        r["message"]["prefix"] for rb in Batch(result.batch_path).iter_messages() for r in rb.to_pylist()
    ]
    assert messages == (["audit", "audit"] if pg_version >= 14 else []), messages
    assert_converged(config, ["public.m"])


def test_failover_slot(pg_db: Any, tmp_path: Any, pg_version: int) -> None:
    """``slot.failover``: below 17 a ConfigError naming the property and the server's major, with
    nothing created; on 17+ the slot is created with ``failover`` (and an existing slot without
    it is altered), and capture goes on from it."""
    execute(pg_db.dsn, "CREATE TABLE f (id int PRIMARY KEY, v text)", "INSERT INTO f VALUES (1, 'a')")
    config = pipeline(pg_db, tmp_path / "staging", **{"slot.failover": True})
    if pg_version < 17:
        with pytest.raises(ConfigError, match=rf"slot.failover.*17 or later.*is {pg_version}"):
            run_capture(config)
        assert _slot(pg_db, config["slot.name"]) is None
        return
    run_capture(config)
    assert _slot(pg_db, config["slot.name"])["failover"] is True
    plain = pipeline(pg_db, tmp_path / "plain", **{"name": "plain", "slot.name": f"plain_{pg_db.name}"})
    run_capture(plain)
    assert _slot(pg_db, plain["slot.name"])["failover"] is False
    execute(pg_db.dsn, "INSERT INTO f VALUES (2, 'b')")
    run_capture({**plain, "slot.failover": True})
    assert _slot(pg_db, plain["slot.name"])["failover"] is True
    execute(pg_db.dsn, "UPDATE f SET v = 'c' WHERE id = 1")
    for c in (config, plain):
        run_capture(c)
        assert_converged(c, ["public.f"])


def test_lost_slot_names_the_reason(pg_db: Any, tmp_path: Any, pg_version: int) -> None:
    """A slot invalidated by ``max_slot_wal_keep_size`` is a lost offset named with the columns
    this major has: ``wal_status=lost`` everywhere, ``invalidation_reason=wal_removed`` on 17+;
    the stored offset does not move, and ``when_needed`` re-snapshots to the source's rows."""
    execute(
        pg_db.dsn,
        "CREATE TABLE w (id int PRIMARY KEY, v text)",
        "INSERT INTO w SELECT g, 'v' FROM generate_series(1, 50) g",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    execute(pg_db.dsn, "UPDATE w SET v = 'captured' WHERE id <= 5")
    run_capture(config)
    pg_db.server.set_config("max_slot_wal_keep_size", "1MB")  # the fixture restores the server after
    deadline = time.monotonic() + 60
    while (_slot(pg_db, config["slot.name"]) or {}).get("wal_status") != "lost":
        assert time.monotonic() < deadline, _slot(pg_db, config["slot.name"])
        execute(
            pg_db.dsn,
            "INSERT INTO w SELECT g, repeat('x', 500) FROM generate_series(1000, 3000) g",
            "DELETE FROM w WHERE id >= 1000",
            "SELECT pg_switch_wal()",
            "CHECKPOINT",
        )
    slot = _slot(pg_db, config["slot.name"])
    assert slot is not None
    assert slot.get("invalidation_reason") == ("wal_removed" if pg_version >= 17 else None)
    reason = r"invalidation_reason=wal_removed, wal_status=lost" if pg_version >= 17 else r"wal_status=lost"
    with pytest.raises(OffsetUnavailable, match=reason):
        run_capture(config)
    execute(pg_db.dsn, "DELETE FROM w WHERE id = 7")
    run_capture({**config, "snapshot.mode": "when_needed"})
    while run_capture({**config, "snapshot.mode": "when_needed"}).snapshot_rows:
        pass
    assert_converged(config, ["public.w"])


def test_slot_drop_on_stop(pg_db: Any, tmp_path: Any, pg_version: int) -> None:
    """``slot.drop.on.stop`` (Debezium: for tests only): a run's commit drops the slot; the next
    run finds none, a lost offset whose error names the property (the offset stays), and a run
    with ``when_needed`` re-snapshots to the source's rows."""
    execute(
        pg_db.dsn, "CREATE TABLE d (id int PRIMARY KEY, v text)", "INSERT INTO d VALUES (1, 'a'), (2, 'b')"
    )
    config = pipeline(pg_db, tmp_path / "staging", **{"slot.drop.on.stop": True})
    run_capture(config)
    assert _slot(pg_db, config["slot.name"]) is None
    execute(pg_db.dsn, "DELETE FROM d WHERE id = 1")
    with pytest.raises(OffsetUnavailable, match="slot.drop.on.stop=true dropped it"):
        run_capture(config)
    run_capture({**config, "snapshot.mode": "when_needed"})
    assert _slot(pg_db, config["slot.name"]) is None
    assert_converged(config, ["public.d"])
