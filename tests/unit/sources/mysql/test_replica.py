"""Capturing from a replica (:mod:`airflow_cdc.sources.mysql.replica`), against a scripted connection:
status rows of MariaDB and MySQL read by column name, the counters a user without ``SLAVE MONITOR``
can read, a replica without ``log_slave_updates`` refused, a stopped or lagging replica logged, and
a refused heartbeat failing the run; ``read.only`` is a declared property, not an ignored one."""

from __future__ import annotations

import logging
from typing import Any

import pymysql
import pytest

from airflow_cdc.core.errors import ConfigError, ServerMisconfigured
from airflow_cdc.sources.mysql import replica
from airflow_cdc.sources.mysql.config import mysql_config
from airflow_cdc.sources.mysql.flavour import detect

MARIADB, MYSQL = detect("10.11.19-MariaDB-log"), detect("8.0.36")
MARIA_COLUMNS = ("Connection_name", "Slave_IO_Running", "Slave_SQL_Running", "Seconds_Behind_Master",
                 "Last_IO_Error", "Last_SQL_Error", "Gtid_Slave_Pos")  # fmt: skip
MYSQL_COLUMNS = ("Replica_IO_Running", "Replica_SQL_Running", "Seconds_Behind_Source", "Last_IO_Error",
                 "Last_SQL_Error", "Executed_Gtid_Set", "Channel_Name")  # fmt: skip


class FakeConnection:
    """Answers each statement from ``answers`` (statement prefix -> (columns, rows) or an error)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.statements = answers, []

    def cursor(self) -> FakeConnection:
        return self

    def __enter__(self) -> FakeConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> None:
        self.statements.append(sql)
        answer = next(v for k, v in self.answers.items() if sql.startswith(k))
        if isinstance(answer, Exception):
            raise answer
        columns, self._rows = answer
        self.description = [(c,) for c in columns]

    def fetchall(self) -> list[tuple]:
        return list(self._rows)


def _variables(log_slave_updates: str = "ON") -> dict[str, Any]:
    return {"SHOW GLOBAL VARIABLES": (("Variable_name", "Value"), [("log_slave_updates", log_slave_updates)])}


def test_a_primary_is_not_a_replica():
    conn = FakeConnection({"SHOW ALL SLAVES STATUS": (MARIA_COLUMNS, [])})
    assert replica.check(conn, MARIADB) == []
    assert conn.statements == ["SHOW ALL SLAVES STATUS"]


def test_running_replica_logs_its_lag(caplog):
    row = ("", "Yes", "Yes", "3", "", "", "0-1-42")
    conn = FakeConnection({"SHOW ALL SLAVES STATUS": (MARIA_COLUMNS, [row]), **_variables()})
    caplog.set_level(logging.INFO)
    [link] = replica.check(conn, MARIADB)
    assert link.running and link.lag == 3 and link.applied == "0-1-42"
    assert "capturing from a replica (replication running, 3 s behind its primary)" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_far_behind_replica_is_a_warning(caplog):
    row = ("Yes", "Yes", "600", "", "", "uuid:1-9", "")
    conn = FakeConnection({"SHOW REPLICA STATUS": (MYSQL_COLUMNS, [row]), **_variables()})
    [link] = replica.check(conn, MYSQL)
    assert link.lag == 600 and link.applied == "uuid:1-9"
    assert "600 s behind its primary" in caplog.text and caplog.records[-1].levelno == logging.WARNING


def test_stopped_replica_is_a_warning_naming_the_error(caplog):
    row = ("east", "Yes", "No", None, "", "Duplicate entry '5' for key 'PRIMARY'", "0-1-7")
    conn = FakeConnection({"SHOW ALL SLAVES STATUS": (MARIA_COLUMNS, [row]), **_variables()})
    [link] = replica.check(conn, MARIADB)
    assert not link.running and link.lag is None
    text = caplog.records[-1].getMessage()
    assert caplog.records[-1].levelno == logging.WARNING
    assert "replication 'east' is stopped (I/O thread: Yes, SQL thread: No; error: Duplicate entry" in text
    assert "after GTID position 0-1-7" in text and "nothing is lost" in text


def test_without_slave_monitor_the_counters_tell(caplog):
    denied = pymysql.err.OperationalError(1227, "Access denied; you need SLAVE MONITOR")
    stopped = {
        "SHOW ALL SLAVES STATUS": denied,
        "SHOW GLOBAL STATUS": (("Variable_name", "Value"), [("Slaves_running", "0")]),
        "SELECT @@GLOBAL.gtid_slave_pos": (("a", "b"), [("0-1-9", "1")]),
        **_variables(),
    }
    [link] = replica.check(FakeConnection(stopped), MARIADB)
    assert (link.io, link.sql, link.applied) == ("?", "No", "0-1-9")
    assert "grant SLAVE MONITOR" in caplog.records[-1].getMessage()
    promoted = {**stopped, "SELECT @@GLOBAL.gtid_slave_pos": (("a", "b"), [("0-1-9", "0")])}
    assert replica.check(FakeConnection(promoted), MARIADB) == [], "a writable ex-replica is a primary"
    with pytest.raises(pymysql.err.OperationalError):
        replica.check(FakeConnection({"SHOW REPLICA STATUS": denied}), MYSQL)  # capture needs the privilege


def test_replica_without_log_slave_updates_is_refused():
    row = ("", "Yes", "Yes", "0", "", "", "0-1-1")
    conn = FakeConnection({"SHOW ALL SLAVES STATUS": (MARIA_COLUMNS, [row]), **_variables("OFF")})
    with pytest.raises(ServerMisconfigured, match="log_slave_updates is OFF") as err:
        replica.check(conn, MARIADB)
    assert "log_replica_updates" in err.value.hint


@pytest.mark.parametrize("read_only", [True, False])
def test_refused_heartbeat_fails_the_run(read_only):
    refused = pymysql.err.OperationalError(1792, "Cannot execute statement in a READ ONLY transaction")
    conn = FakeConnection({"INSERT": refused, "SELECT": (("1",), [("1",)])})
    replica.heartbeat(conn, "SELECT 1", read_only)
    with pytest.raises(ConfigError, match="'heartbeat.action.query': the server refused it") as err:
        replica.heartbeat(conn, "INSERT INTO hb VALUES (now())", read_only)
    assert ("read.only=true" in str(err.value)) is read_only
    assert err.value.__cause__ is refused
    broken = FakeConnection({"SELEC": pymysql.err.ProgrammingError(1064, "syntax")})
    with pytest.raises(pymysql.err.ProgrammingError):
        replica.heartbeat(broken, "SELEC 1", read_only)  # not a refused write: as the server said it


def test_read_only_is_a_declared_property(caplog):
    base = {"name": "m", "connector": "mariadb", "staging.path": "/tmp/x"}
    assert mysql_config(base)["read.only"] is False
    assert mysql_config({**base, "read.only": "true"})["read.only"] is True
    assert "ignored" not in caplog.text
