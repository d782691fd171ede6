"""Bad input: each case is a clear error naming the setting/privilege/table, and no offset moves."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    MissingPrivilege,
    OffsetUnavailable,
    SchemaError,
    ServerMisconfigured,
)
from airflow_cdc.testing.servers import MariaDbServer
from tests.integration.mysql.support import (
    assert_converged,
    execute,
    pipeline,
    purge_binlogs,
    run_capture,
    state,
)


@pytest.fixture
def committed(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t VALUES " + ", ".join(f"({i}, 'v')" for i in range(1, 51)),
    )
    config = pipeline(mariadb_db, tmp_path / "staging")
    run_capture(config)
    return config


def test_bad_credentials(committed):
    before = state(committed)
    with pytest.raises(AuthenticationFailed) as err:
        run_capture(dict(committed, **{"database.password": "wrong-password-xyz"}))
    assert "credentials" in str(err.value) and "wrong-password-xyz" not in str(err.value)
    assert state(committed).version == before.version


@pytest.mark.parametrize(
    "grants,missing",
    [
        ("SELECT ON *.*", "REPLICATION SLAVE"),
        ("SELECT, REPLICATION SLAVE ON *.*", "BINLOG MONITOR"),
    ],
)
def test_missing_privileges(mariadb_db, committed, grants, missing):
    user = f"cdc_{len(grants)}"
    execute(mariadb_db, f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'", f"GRANT {grants} TO '{user}'@'%'")
    try:
        before = state(committed)
        with pytest.raises(MissingPrivilege, match=missing):
            run_capture(dict(committed, **{"database.user": user, "database.password": "pw"}))
        assert state(committed).version == before.version
    finally:
        execute(mariadb_db, f"DROP USER '{user}'@'%'")


@pytest.mark.parametrize("variable,value", [("binlog_format", "STATEMENT"), ("binlog_row_image", "MINIMAL")])
def test_binlog_settings(mariadb_db, committed, variable, value):
    before = state(committed)
    execute(mariadb_db, f"SET GLOBAL {variable} = '{value}'")
    try:
        with pytest.raises(ServerMisconfigured, match=f"{variable} is '{value}'"):
            run_capture(committed)
    finally:
        execute(mariadb_db, f"SET GLOBAL {variable} = '{'ROW' if variable == 'binlog_format' else 'FULL'}'")
    assert state(committed).version == before.version


def test_log_bin_off(tmp_path):
    with MariaDbServer(settings={"skip-log-bin": ""}) as server:
        server.start()
        server.create_database("nolog")

        class Db:
            name = "nolog"

        Db.server = server
        config = pipeline(Db, tmp_path / "s")
        with pytest.raises(ServerMisconfigured, match="log_bin"):
            run_capture(config)
        assert state(config) is None
        # this server offers no TLS: preferred falls back, required refuses
        with pytest.raises(ConnectionFailed, match="database.ssl.mode=required"):
            run_capture(dict(config, **{"database.ssl.mode": "required"}))


def test_table_without_primary_key(mariadb_db, tmp_path):
    """Captured, not refused (tests/integration/mysql/test_keyless.py); with a
    ``message.key.columns`` entry it is keyed by those columns, one naming a missing column fails."""
    execute(mariadb_db, "CREATE TABLE nokey (a int, b text)", "INSERT INTO nokey VALUES (1, 'x')")
    config = pipeline(mariadb_db, tmp_path / "s")
    run_capture(config)
    assert state(config) is not None
    wrong = pipeline(
        mariadb_db, tmp_path / "w", name="wrong", **{"message.key.columns": f"{mariadb_db.name}.nokey:zz"}
    )
    with pytest.raises(SchemaError, match=rf"{mariadb_db.name}\.nokey.*zz.*message\.key\.columns"):
        run_capture(wrong)
    assert state(wrong) is None
    ok = pipeline(
        mariadb_db, tmp_path / "k", name="keyed", **{"message.key.columns": f"{mariadb_db.name}.nokey:a"}
    )
    run_capture(ok)
    assert_converged(ok, [f"{mariadb_db.name}.nokey"])


@pytest.mark.parametrize(
    "prop,value,match",
    [
        ("snapshot.mode", "sometimes", "snapshot.mode.*allowed values"),
        ("bigint.unsigned.handling.mode", "huge", "bigint.unsigned.handling.mode"),
        ("time.precision.mode", "nanoseconds", "time.precision.mode"),
        ("inconsistent.schema.handling.mode", "ignore", "inconsistent.schema.handling.mode"),
        ("database.dbname", "x", "does not apply to MySQL"),
        ("database.include.lst", "x", "did you mean 'database.include.list'"),
    ],
)
def test_invalid_config_value(mariadb_db, tmp_path, prop, value, match):
    with pytest.raises(ConfigError, match=match):
        run_capture(pipeline(mariadb_db, tmp_path / "s", **{prop: value}))


def test_purged_binlog_is_an_error_unless_when_needed(mariadb_db, committed):
    execute(mariadb_db, "INSERT INTO t VALUES (1000, 'lost?')")
    before = state(committed)
    assert before.data["offset"]["file"] not in purge_binlogs(mariadb_db)
    with pytest.raises(OffsetUnavailable, match="purged"):
        run_capture(committed)
    assert state(committed).version == before.version
    recovering = dict(committed, **{"snapshot.mode": "when_needed"})
    result = run_capture(recovering)
    assert any("snapshot" in n for n in result.notes)
    assert_converged(recovering, [f"{mariadb_db.name}.t"])
