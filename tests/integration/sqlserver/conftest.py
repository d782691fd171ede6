"""Fixtures for the SQL Server tests: one CDC emulator per session (on the session PostgreSQL
server), a fresh emulated database per test, and pyodbc connections through FreeTDS."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator

pyodbc = pytest.importorskip("pyodbc")


@pytest.fixture(scope="session")
def sqlserver_emulator(pg_server: Any) -> Iterator[SqlServerCdcEmulator]:
    emulator = SqlServerCdcEmulator(pg_server).start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def mssql_db(sqlserver_emulator: SqlServerCdcEmulator) -> Iterator[str]:
    """A fresh emulated database with CDC and snapshot isolation allowed; dropped afterwards."""
    name = f"ms_{uuid.uuid4().hex[:12]}"
    sqlserver_emulator.create_database(name, allow_snapshot_isolation=True)
    try:
        yield name
    finally:
        sqlserver_emulator.set_agent_running(True)
        sqlserver_emulator.drop_database(name)


@pytest.fixture
def odbc(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> Iterator[Any]:
    """A pyodbc connection (FreeTDS, autocommit) to the test's database."""
    conn = connect(sqlserver_emulator, mssql_db, autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def connect(emulator: SqlServerCdcEmulator, database: str, **kwargs: Any) -> Any:
    conn = pyodbc.connect(emulator.odbc_connection_string(database), timeout=10, **kwargs)
    add_exact_converters(conn)
    return conn


def add_exact_converters(conn: Any) -> None:
    """Read 100 ns time values exactly: pyodbc's own conversion stops at microseconds and does not
    know datetimeoffset at all.  Values come back as tuples of the ODBC structs' fields."""
    conn.add_output_converter(-155, lambda b: None if b is None else struct.unpack("<6hI2h", b))
    conn.add_output_converter(-154, lambda b: None if b is None else struct.unpack("<3H2xI", b))


@pytest.fixture
def target(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Any) -> Any:
    """The test's database as a :class:`tests.integration.sqlserver.targets.Target` (the real-server
    suite gives the same fixture over a real SQL Server)."""
    from tests.integration.sqlserver.targets import EmulatorTarget

    return EmulatorTarget(mssql_db, tmp_path / "staging", "emulator", emulator=sqlserver_emulator)
