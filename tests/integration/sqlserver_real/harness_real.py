"""The contract suite's harness against a real SQL Server (T-SQL through pyodbc throughout)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.contract.harness import BIG, Harness
from tests.contract.harness_sqlserver import SqlServerHarness
from tests.integration.sqlserver_real.server import RealSqlServer
from tests.support.pipeline import assert_rows_equal, replay

_CREATE = re.compile(r"^\s*CREATE TABLE \[(?P<name>[^\]]+)\]")
_TRUNCATE = re.compile(r"^\s*TRUNCATE TABLE (?P<table>.+?)\s*$")
_RENAME = re.compile(r"^\s*ALTER TABLE \[(?P<old>[^\]]+)\] RENAME TO \[(?P<new>[^\]]+)\]\s*$")


@dataclass
class RealDb:
    server: RealSqlServer
    name: str


class RealSqlServerHarness(Harness):
    name = "sqlserver_real"
    db: RealDb

    def config(self, **props: Any) -> dict[str, Any]:
        base = {"name": f"test_{self.db.name}", "connector": "sqlserver", "staging.path": str(self.staging),
                "snapshot.isolation.mode": "snapshot", **self.db.server.properties(self.db.name)}  # fmt: skip
        base.update({k.replace("__", "."): v for k, v in props.items()})
        return base

    table = SqlServerHarness.table
    staged = SqlServerHarness.staged
    q = SqlServerHarness.q
    items_ddl = SqlServerHarness.items_ddl

    def big_text(self, seed: int) -> str:
        md5 = f"CONVERT(nvarchar(max), CONVERT(varchar(32), HASHBYTES('MD5', '{seed}'), 2))"
        return f"REPLICATE({md5}, {BIG // 32})"

    def execute(self, *statements: str) -> None:
        server, db = self.db.server, self.db.name
        for statement in statements:
            if m := _RENAME.match(statement):
                server.execute(db, f"EXEC sp_rename N'dbo.{m['old']}', N'{m['new']}'")
                continue
            if m := _TRUNCATE.match(statement):
                statement = f"DELETE FROM {m['table']}"  # TRUNCATE fails on CDC tables (error 4711)
            server.execute(db, statement)
            if m := _CREATE.match(statement):
                server.enable_table(db, "dbo", m["name"])
        server.run_capture_job(db)

    def make_offset_unreadable(self, config: dict[str, Any]) -> None:
        self.db.server.run_cleanup(self.db.name)

    def source_rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        schema, _, name = table.partition(".")
        conn = self.db.server.connect(self.db.name)
        try:
            cur = conn.cursor().execute(f"SELECT * FROM [{schema}].[{name}]")  # noqa: S608 -- test's names
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        finally:
            conn.close()
        return {(r["id"],): r for r in rows}

    def assert_converged(self, config: dict[str, Any], tables: list[str]) -> Any:
        oracle = replay(config)
        for table in tables:
            assert_rows_equal(table, self.source_rows(table), oracle.rows(self.staged(table)))
        return _Renamed(oracle, self)


@dataclass
class _Renamed:
    oracle: Any
    harness: RealSqlServerHarness

    def rows(self, table: str) -> dict[tuple, dict[str, Any]]:
        return self.oracle.rows(self.harness.staged(table))
