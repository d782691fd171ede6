"""Bad input: each case is a clear error naming the problem, and no offset moves."""

from __future__ import annotations

import psycopg
import pytest

from airflow_cdc.core.errors import (
    AuthenticationFailed,
    ConfigError,
    MissingPrivilege,
    OffsetUnavailable,
    ServerMisconfigured,
)
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.testing.servers import PostgresServer
from tests.integration.postgres.support import assert_converged, pipeline, run_capture


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _state(config):
    return build_store(build_config(config)).load(config["name"])


def _slot_lsn(db, slot):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
    return row[0] if row else None


@pytest.fixture
def committed(pg_db, tmp_path):
    """A connector with one committed run over a small table."""
    _exec(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    return config


def test_bad_credentials(committed):
    before = _state(committed)
    bad = dict(committed, **{"database.password": "wrong-password-xyz"})
    with pytest.raises(AuthenticationFailed) as err:
        run_capture(bad)
    assert "credentials" in str(err.value) and "wrong-password-xyz" not in str(err.value)
    assert _state(committed).version == before.version


def test_missing_replication_privilege(pg_db, committed):
    _exec(pg_db, "CREATE ROLE cdc_noreplication LOGIN PASSWORD 'pw'", "GRANT SELECT ON t TO cdc_noreplication")
    before, slot_before = _state(committed), _slot_lsn(pg_db, committed["slot.name"])
    cfg = dict(committed, **{"database.user": "cdc_noreplication", "database.password": "pw"})
    with pytest.raises(MissingPrivilege, match="REPLICATION"):
        run_capture(cfg)
    assert _state(committed).version == before.version
    assert _slot_lsn(pg_db, committed["slot.name"]) == slot_before


def test_publication_missing_with_mode_disabled(pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE t (id int PRIMARY KEY)")
    config = pipeline(pg_db, tmp_path / "s", **{"publication.autocreate.mode": "disabled",
                                                 "publication.name": "no_such_pub"})
    with pytest.raises(ServerMisconfigured, match="no_such_pub.*disabled"):
        run_capture(config)
    assert _state(config) is None


def test_table_without_primary_key(pg_db, tmp_path):
    """Captured, not refused (tests/integration/postgres/test_keyless.py); with a
    ``message.key.columns`` entry it is keyed by those columns."""
    _exec(pg_db, "CREATE TABLE nokey (a int, b text)", "INSERT INTO nokey VALUES (1, 'x')")
    config = pipeline(pg_db, tmp_path / "s")
    run_capture(config)
    assert _state(config) is not None
    keyed = {"message.key.columns": "public.nokey:a", "name": "keyed", "slot.name": f"k_{pg_db.name}"}
    ok = pipeline(pg_db, tmp_path / "k", **keyed)
    run_capture(ok)
    assert_converged(ok, ["public.nokey"])


def test_message_key_columns_naming_a_missing_column(pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE nokey (a int, b text)")
    config = pipeline(pg_db, tmp_path / "s", **{"message.key.columns": "public.nokey:zz"})
    with pytest.raises(ConfigError, match=r"message\.key\.columns.*public\.nokey.*zz"):
        run_capture(config)
    assert _state(config) is None


@pytest.mark.parametrize("prop,value,match", [
    ("snapshot.mode", "sometimes", "snapshot.mode.*allowed values"),
    ("incremental.snapshot.chunk.size", "0", "incremental.snapshot.chunk.size.*minimum"),
    ("decimal.handling.mode", "float", "decimal.handling.mode"),
    ("table.include.lst", "public.t", "did you mean 'table.include.list'"),
    ("skipped.operations", "c,x", "skipped.operations"),
    ("table.include.list", "public.(", "invalid regular expression"),
])
def test_invalid_config_value(pg_db, tmp_path, prop, value, match):
    config = pipeline(pg_db, tmp_path / "s", **{prop: value})
    with pytest.raises(ConfigError, match=match):
        run_capture(config)


def test_slot_lost_is_an_error_unless_when_needed(pg_db, committed):
    _exec(pg_db, "INSERT INTO t VALUES (1000, 'lost?')")
    before = _state(committed)
    _exec(pg_db, f"SELECT pg_drop_replication_slot('{committed['slot.name']}')")
    with pytest.raises(OffsetUnavailable, match="no longer exists"):
        run_capture(committed)
    assert _state(committed).version == before.version
    recovering = dict(committed, **{"snapshot.mode": "when_needed"})
    result = run_capture(recovering)
    assert any("snapshot" in n for n in result.notes)
    assert_converged(recovering, ["public.t"])


def test_slot_advanced_past_offset_is_detected(pg_db, committed):
    _exec(pg_db, "INSERT INTO t VALUES (2000, 'skipped')")
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (committed["slot.name"],))
    with pytest.raises(OffsetUnavailable, match="past the stored offset"):
        run_capture(committed)


def test_wal_level_not_logical(tmp_path):
    with PostgresServer(settings={"wal_level": "replica"}) as server:
        server.start()
        server.create_database("walreplica")

        class Db:
            name = "walreplica"
        Db.server = server
        config = pipeline(Db, tmp_path / "s")
        with pytest.raises(ServerMisconfigured, match="wal_level"):
            run_capture(config)
        assert _state(config) is None
