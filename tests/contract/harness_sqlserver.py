"""The SQL Server harness of the contract suite: the CDC emulator reached through pyodbc + FreeTDS.

The emulator keeps user tables in PostgreSQL and answers over TDS only the statements the source
sends, so writers go through its backing database (real PostgreSQL transactions), exactly as the
emulator's own tests do, and the emulated capture job runs after every write so the change tables
hold what SQL Server's Agent job would have copied by then.  The contract's statements are mapped
to their SQL Server equivalents where the dialects differ in behaviour, not just in spelling:

* ``CREATE TABLE`` creates the table with SQL Server types and enables CDC on it
  (``sys.sp_cdc_enable_table``): on SQL Server a table is captured once it has a capture instance.
* ``TRUNCATE TABLE`` becomes ``DELETE``: SQL Server refuses to truncate a CDC-enabled table
  (error 4711), so users delete instead and the change tables carry one delete per row.
* ``ALTER TABLE a RENAME TO b`` is ``sp_rename``: the object keeps its id and capture instance.
* The offset is lost by the cleanup job purging the change tables past it (``fn_cdc_get_min_lsn``
  moves up), the SQL Server way a log position becomes unreadable.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_cdc.testing.servers import PostgresServer
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.contract.harness import BIG, Harness
from tests.support.pipeline import assert_rows_equal, replay

_CREATE = re.compile(r"^\s*CREATE TABLE \[(?P<name>[^\]]+)\] \((?P<cols>.*)\)\s*$", re.S)
_COLUMN = re.compile(r"(\w+) (\w+(?:\([\w,]+\))?)( PRIMARY KEY)?")
_TRUNCATE = re.compile(r"^\s*TRUNCATE TABLE (?P<table>.+?)\s*$")
_RENAME = re.compile(r"^\s*ALTER TABLE \[(?P<old>[^\]]+)\] RENAME TO \[(?P<new>[^\]]+)\]\s*$")
_BRACKETED = re.compile(r"\[((?:[^\]]|\]\])*)\]")


@dataclass
class MssqlDb:
    """An emulated SQL Server database; ``server`` is the PostgreSQL server behind it."""

    emulator: SqlServerCdcEmulator
    name: str
    server: PostgresServer


class SqlServerHarness(Harness):
    name = "sqlserver"
    db: MssqlDb

    def config(self, **props: Any) -> dict[str, Any]:
        emu = self.db.emulator
        base = {
            "name": f"test_{self.db.name}", "connector": "sqlserver", "staging.path": str(self.staging),
            "database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
            "database.password": emu.password, "database.names": self.db.name, "database.encrypt": False,
            "snapshot.isolation.mode": "snapshot",
        }  # fmt: skip
        base.update({k.replace("__", "."): v for k, v in props.items()})
        return base

    def table(self, name: str) -> str:
        return f"dbo.{name}"  # Debezium's table.include.list form for SQL Server: schema.table

    def staged(self, table: str) -> str:
        """The staged/replayed name of ``schema.table``: ``database.schema.table``."""
        return f"{self.db.name}.{table}"

    def q(self, name: str) -> str:
        return "[" + name.replace("]", "]]") + "]"

    def items_ddl(self, name: str) -> str:
        return f"CREATE TABLE {self.q(name)} (id int PRIMARY KEY, v nvarchar(40), n int, big nvarchar(max))"

    def big_text(self, seed: int) -> str:
        # Evaluated by the writers' backing PostgreSQL (the emulator has no T-SQL DML).
        return f"repeat(md5('{seed}'), {BIG // 32})"

    def execute(self, *statements: str) -> None:
        emu, db = self.db.emulator, self.db.name
        for statement in statements:
            if m := _CREATE.match(statement):
                columns = _COLUMN.findall(m["cols"])
                table = f"dbo.{m['name']}"
                emu.create_table(
                    db, table, [(c, t) for c, t, _ in columns], [c for c, _, pk in columns if pk]
                )
                emu.enable_table(db, table)
            elif m := _RENAME.match(statement):
                emu.rename_table(db, f"dbo.{m['old']}", m["new"])
            else:
                if m := _TRUNCATE.match(statement):
                    statement = f"DELETE FROM {m['table']}"  # SQL Server: error 4711 on CDC tables
                with emu.pg_connect(db, autocommit=True) as conn:
                    conn.execute("SET search_path TO dbo")  # the login's default schema
                    conn.execute(_BRACKETED.sub(_pg_identifier, statement))
        emu.run_capture_job(db)

    def writer(self) -> Any:
        """A connection for concurrent writers: real transactions on the backing database."""
        conn = self.db.emulator.pg_connect(self.db.name)
        conn.execute("SET search_path TO dbo")
        conn.commit()
        return conn

    @contextmanager
    def agent(self, interval: float = 0.05) -> Iterator[None]:
        """The SQL Server Agent's capture job running on a timer (copies committed changes)."""
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(interval):
                self.db.emulator.run_capture_job(self.db.name)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.db.emulator.run_capture_job(self.db.name)

    def make_offset_unreadable(self, config: dict[str, Any]) -> None:
        self.db.emulator.run_cleanup(self.db.name)

    def source_rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        """The live ``schema.table`` (items layout: int and string columns, encoded as staged)."""
        schema, _, name = table.partition(".")
        with self.db.emulator.pg_connect(self.db.name) as conn:
            cur = conn.execute(f'SELECT * FROM "{schema}"."{name}"')  # noqa: S608 -- test's own names
            names = [d.name for d in cur.description or ()]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        return {(r["id"],): r for r in rows}

    def assert_converged(self, config: dict[str, Any], tables: list[str]) -> Any:
        oracle = replay(config)
        for table in tables:
            assert_rows_equal(table, self.source_rows(table), oracle.rows(self.staged(table)))
        return _Renamed(oracle, self)


@dataclass
class _Renamed:
    """The reference applier, read with the contract's ``schema.table`` names."""

    oracle: Any
    harness: SqlServerHarness

    def rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        return self.oracle.rows(self.harness.staged(table))


def _pg_identifier(m: re.Match[str]) -> str:
    return '"' + m.group(1).replace("]]", "]").replace('"', '""') + '"'


# -- fixtures (imported by tests/contract/conftest.py and the Spark convergence test) ------------
@pytest.fixture(scope="module")
def contract_sqlserver_emulator(pg_server: PostgresServer) -> Iterator[SqlServerCdcEmulator]:
    """One emulator per test module on the session PostgreSQL server."""
    pytest.importorskip("pyodbc")
    emulator = SqlServerCdcEmulator(pg_server).start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def mssql_contract_db(
    contract_sqlserver_emulator: SqlServerCdcEmulator, pg_server: PostgresServer
) -> Iterator[MssqlDb]:
    """A fresh emulated database with CDC and snapshot isolation allowed; dropped afterwards."""
    name = f"ms_{uuid.uuid4().hex[:12]}"
    contract_sqlserver_emulator.create_database(name, allow_snapshot_isolation=True)
    try:
        yield MssqlDb(contract_sqlserver_emulator, name, pg_server)
    finally:
        contract_sqlserver_emulator.drop_database(name)


@contextmanager
def own_sqlserver() -> Iterator[MssqlDb]:
    """An emulated database on a PostgreSQL server of its own (restored from a cold backup later):
    a restore rolls the database, its change tables and its log back together, like SQL Server's
    ``RESTORE DATABASE ... WITH KEEP_CDC``."""
    server = PostgresServer().start()
    emulator = SqlServerCdcEmulator(server).start()
    try:
        emulator.create_database("restored", allow_snapshot_isolation=True)
        yield MssqlDb(emulator, "restored", server)
    finally:
        emulator.stop()
        server.stop()
