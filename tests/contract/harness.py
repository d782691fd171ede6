"""Per-source harnesses for the shared contract suite.

A harness knows how to talk to one kind of source in its own dialect (create a table, write rows,
make the stored offset unreadable, restore the server from a cold backup) and how to compare the
replayed batches with the live tables.  The contract tests are written once against this interface;
a new source joins the suite by adding a harness here and a line in ``HARNESSES``.
"""

from __future__ import annotations

import abc
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_cdc.testing.servers import PG_DEFAULT_VERSION, PG_MATRIX, MariaDbServer, PostgresServer
from tests.integration.mysql import support as my
from tests.integration.postgres import support as pg

BIG = 12_000  # characters: above PostgreSQL's TOAST threshold even after compression (random text)


class Harness(abc.ABC):
    """One source under test, bound to a fresh database."""

    name: str

    def __init__(self, db: Any, staging: Path) -> None:
        self.db, self.staging = db, staging

    @abc.abstractmethod
    def config(self, **props: Any) -> dict[str, Any]: ...

    @abc.abstractmethod
    def table(self, name: str) -> str:
        """The captured table's full name (``schema.table`` / ``db.table``)."""

    @abc.abstractmethod
    def q(self, name: str) -> str:
        """A quoted identifier."""

    @abc.abstractmethod
    def execute(self, *statements: str) -> None: ...

    @abc.abstractmethod
    def make_offset_unreadable(self, config: dict[str, Any]) -> None:
        """Lose the log after the stored offset (drop the slot / purge the binlog)."""

    @abc.abstractmethod
    def assert_converged(self, config: dict[str, Any], tables: list[str]) -> Any: ...

    def create_items(self, name: str, rows: int, first: int = 1) -> None:
        """A keyed table with a large text column (TOASTed in PostgreSQL) and ``rows`` rows."""
        self.execute(self.items_ddl(name))
        self.insert(name, range(first, first + rows))

    @abc.abstractmethod
    def items_ddl(self, name: str) -> str: ...

    def insert(self, name: str, ids: Any) -> None:
        values = ", ".join(f"({i}, 'v{i}', {i % 7}, {self.big_text(i)})" for i in ids)
        if values:
            self.execute(f"INSERT INTO {self.q(name)} (id, v, n, big) VALUES {values}")

    @abc.abstractmethod
    def big_text(self, seed: int) -> str:
        """A SQL expression of ``BIG`` characters that do not compress (so they are TOASTed)."""


class PgHarness(Harness):
    name = "postgresql"

    def config(self, **props: Any) -> dict[str, Any]:
        return pg.pipeline(self.db, self.staging, **props)

    def table(self, name: str) -> str:
        return f"public.{name}"

    def q(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def execute(self, *statements: str) -> None:
        with self.db.connect(autocommit=True) as conn:
            for s in statements:
                conn.execute(s)

    def items_ddl(self, name: str) -> str:
        return f"CREATE TABLE {self.q(name)} (id int PRIMARY KEY, v text, n int, big text)"

    def big_text(self, seed: int) -> str:
        return f"(SELECT string_agg(md5(({seed} * 1000 + g)::text), '') FROM generate_series(1, {BIG // 32}) g)"

    def make_offset_unreadable(self, config: dict[str, Any]) -> None:
        self.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{config['slot.name']}'"
        )

    def assert_converged(self, config: dict[str, Any], tables: list[str]) -> Any:
        return pg.assert_converged(config, tables)


class MariaDbHarness(Harness):
    name = "mariadb"

    def config(self, **props: Any) -> dict[str, Any]:
        return my.pipeline(self.db, self.staging, **props)

    def table(self, name: str) -> str:
        return f"{self.db.name}.{name}"

    def q(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def execute(self, *statements: str) -> None:
        my.execute(self.db, *statements)

    def items_ddl(self, name: str) -> str:
        return f"CREATE TABLE {self.q(name)} (id int PRIMARY KEY, v varchar(40), n int, big mediumtext)"

    def big_text(self, seed: int) -> str:
        return f"REPEAT(MD5({seed}), {BIG // 32})"

    def make_offset_unreadable(self, config: dict[str, Any]) -> None:
        my.purge_binlogs(self.db)

    def assert_converged(self, config: dict[str, Any], tables: list[str]) -> Any:
        return my.assert_converged(config, tables)


HARNESSES: dict[str, type[Harness]] = {"postgresql": PgHarness, "mariadb": MariaDbHarness}
DB_FIXTURES = {"postgresql": "pg_db", "mariadb": "mariadb_db"}
# The suite on every other PostgreSQL major (``postgresql`` is 15, Debian's): same harness, the
# database on that major's session server.
for _version in PG_MATRIX:
    if _version != PG_DEFAULT_VERSION:
        HARNESSES[f"postgresql-{_version}"] = PgHarness
        DB_FIXTURES[f"postgresql-{_version}"] = f"pg{_version}_db"


# -- servers of their own, for restores ----------------------------------------------------------
@dataclass
class OwnPgDb:
    name: str
    server: PostgresServer

    def connect(self, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.connect(self.server.dsn(self.name), **kwargs)


@dataclass
class OwnMariaDb:
    name: str
    server: MariaDbServer

    def connect(self, **kwargs: Any) -> Any:
        return self.server.connect(database=self.name, **kwargs)


@contextmanager
def own_server(kind: str) -> Iterator[Any]:
    """A database on a server of its own (it will be stopped and restored from a backup)."""
    if kind == "sqlserver":
        from tests.contract.harness_sqlserver import own_sqlserver

        with own_sqlserver() as db:
            yield db
    elif kind.startswith("postgresql"):
        version = int(kind.partition("-")[2] or PG_DEFAULT_VERSION)
        pserver = PostgresServer(version=version).start()
        try:
            pserver.execute("CREATE DATABASE restored")
            yield OwnPgDb("restored", pserver)
        finally:
            pserver.stop()
    else:
        mserver = MariaDbServer().start()
        try:
            mserver.create_database("restored")
            yield OwnMariaDb("restored", mserver)
        finally:
            mserver.stop()


def cold_backup(server: Any) -> Path:
    """Stop the server, copy its data directory, start it again; returns the copy."""
    server._halt()
    backup = Path(str(server.data_dir) + ".backup")
    subprocess.run(["cp", "-a", str(server.data_dir), str(backup)], check=True)  # keeps the owner
    server._launch()
    return backup


def restore_backup(server: Any, backup: Path) -> None:
    """Stop the server, replace its data directory by ``backup``, start it again."""
    server._halt()
    shutil.rmtree(server.data_dir)
    subprocess.run(["cp", "-a", str(backup), str(server.data_dir)], check=True)
    server._launch()


# Last: the SQL Server harness subclasses Harness (and imports BIG) from this module.
from tests.contract.harness_sqlserver import SqlServerHarness  # noqa: E402

HARNESSES["sqlserver"] = SqlServerHarness
DB_FIXTURES["sqlserver"] = "mssql_contract_db"
