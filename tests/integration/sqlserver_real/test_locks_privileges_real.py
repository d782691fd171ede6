"""The lock and privilege tests of ``tests/integration/sqlserver/test_source_locks_privileges.py``
against a real SQL Server: the same test functions, over a bench of T-SQL.

The least-privilege login is what Debezium's docs ask of the connector's user when the capture
instances have no gating role: a database user with SELECT on the captured tables and on the
``cdc`` schema, and no server-level permission (so no VIEW SERVER STATE).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.sqlserver.locks_bench import ROWS, App, Bench
from tests.integration.sqlserver.test_source_locks_privileges import (  # noqa: F401  (run here too)
    test_a_chunk_read_chosen_as_deadlock_victim_is_read_again,
    test_a_writer_never_waits_longer_than_one_chunk_read,
    test_connection_check_reports_the_missing_permission_as_a_warning,
    test_deadlock_victim_gets_1205_and_its_transaction_is_rolled_back,
    test_each_mode_holds_what_sql_server_holds_for_one_chunk_read,
    test_exclusive_table_lock_stops_writers_and_locking_readers_only,
    test_least_privilege_login_captures_a_table_with_a_warning,
    test_lock_timeout_cancels_the_statement_not_the_transaction,
    test_locking_levels_hold_the_rows_read_until_the_commit,
    test_read_committed_locks_a_row_only_while_reading_it,
)
from tests.integration.sqlserver_real.harness_real import RealDb
from tests.integration.sqlserver_real.server import RealSqlServer

pytestmark = pytest.mark.integration


@dataclass
class RealBench(Bench):
    server: Any = None

    def properties(self) -> dict[str, Any]:
        return self.server.properties(self.database)

    def app(self) -> App:
        conn = self.server.connect(self.database)
        conn.autocommit = False
        return App(conn, "?")

    def run_capture_job(self) -> None:
        self.server.run_capture_job(self.database)

    def least_privilege_login(self) -> tuple[str, str]:
        name, password = f"acdc_lp_{uuid.uuid4().hex[:10]}", f"Lp-{uuid.uuid4().hex}-aA1!"
        self.server.execute(
            "master", f"CREATE LOGIN [{name}] WITH PASSWORD = N'{password}', CHECK_POLICY = OFF"
        )
        self.logins.append(name)
        self.server.execute(self.database, f"CREATE USER [{name}] FOR LOGIN [{name}]",
                            f"GRANT SELECT ON SCHEMA::dbo TO [{name}]",
                            f"GRANT SELECT ON SCHEMA::cdc TO [{name}]")  # fmt: skip
        return name, password

    def drop_logins(self) -> None:
        for name in self.logins:  # pooled ODBC connections may still be logged in
            self.server.execute("master",
                                "DECLARE @kill nvarchar(max) = N'';"
                                " SELECT @kill += N'KILL ' + CAST(session_id AS nvarchar(10)) + N';'"
                                f" FROM sys.dm_exec_sessions WHERE login_name = N'{name}';"
                                f" EXEC (@kill); DROP LOGIN [{name}]")  # fmt: skip


@pytest.fixture
def bench(real_db: RealDb, tmp_path: Any) -> Iterator[RealBench]:
    server: RealSqlServer = real_db.server
    server.execute(real_db.name, "CREATE TABLE dbo.items (id int NOT NULL PRIMARY KEY, v int NOT NULL)",
                   f"INSERT INTO dbo.items (id, v) SELECT TOP ({ROWS}) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)), 0"
                   " FROM sys.all_objects a CROSS JOIN sys.all_objects b")  # fmt: skip
    server.enable_table(real_db.name, "dbo", "items")
    server.run_capture_job(real_db.name)
    bench = RealBench(real_db.name, tmp_path / "staging", server=server)
    try:
        yield bench
    finally:
        bench.drop_logins()
