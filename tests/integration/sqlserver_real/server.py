"""A real SQL Server for the real-server suite, from ``AIRFLOW_CDC_SQLSERVER_URL``.

``mssql://user:password@host:1433/?driver=FreeTDS&encrypt=false&trustServerCertificate=true``
(query parameters are connector properties without the ``database.`` prefix).  The login must be
allowed to create databases, enable CDC (``sysadmin``) and run the CDC jobs; the server needs
SQL Server Agent.  Every test gets a database of its own (``acdc_<hex>``), dropped afterwards.

The capture job of each test database is stopped and the log scan run on demand
(``sys.sp_cdc_scan``), so a test knows when its changes reached the change tables -- what the
emulator's ``run_capture_job`` does.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

URL_ENV = "AIRFLOW_CDC_SQLSERVER_URL"


@dataclass
class RealSqlServer:
    host: str
    port: int
    user: str
    password: str
    options: dict[str, Any]

    @classmethod
    def from_env(cls) -> RealSqlServer | None:
        url = os.environ.get(URL_ENV)
        if not url:
            return None
        parts = urlsplit(url)
        options: dict[str, Any] = dict(parse_qsl(parts.query))
        for key, value in options.items():
            if value.lower() in ("true", "false"):
                options[key] = value.lower() == "true"
        return cls(parts.hostname or "localhost", parts.port or 1433, unquote(parts.username or "sa"),
                   unquote(parts.password or ""), options)  # fmt: skip

    def properties(self, database: str) -> dict[str, Any]:
        """Connector properties reaching ``database`` on this server."""
        props = {"database.hostname": self.host, "database.port": self.port, "database.user": self.user,
                 "database.password": self.password, "database.names": database}  # fmt: skip
        props.update(
            {f"database.{k}" if not k.startswith("database.") else k: v for k, v in self.options.items()}
        )
        return props

    def connect(self, database: str = "master") -> Any:
        """An autocommit pyodbc connection through the connector's own connection-string code."""
        from airflow_cdc.sources.sqlserver import client
        from airflow_cdc.sources.sqlserver.config import sqlserver_config

        config = sqlserver_config({"name": "t", "connector": "sqlserver", "staging.path": "/tmp/unused",
                                   **self.properties(database)})  # fmt: skip
        conn = client.connect(config, database)
        conn.autocommit = True
        return conn

    def execute(self, database: str, *statements: str) -> None:
        conn = self.connect(database)
        try:
            cur = conn.cursor()
            for statement in statements:
                cur.execute(statement)
                while cur.nextset():  # drain every result of a batch (errors surface here)
                    pass
        finally:
            conn.close()

    def create_database(self) -> str:
        name = f"acdc_{uuid.uuid4().hex[:12]}"
        self.execute("master", f"CREATE DATABASE [{name}]",
                     f"ALTER DATABASE [{name}] SET ALLOW_SNAPSHOT_ISOLATION ON")  # fmt: skip
        self.execute(name, "EXEC sys.sp_cdc_enable_db")
        return name

    def drop_database(self, name: str) -> None:
        self.execute(name, "IF EXISTS (SELECT 1 FROM sys.databases WHERE name = DB_NAME() AND is_cdc_enabled = 1)"
                           " EXEC sys.sp_cdc_disable_db")  # fmt: skip
        self.execute("master", f"ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE",
                     f"DROP DATABASE [{name}]")  # fmt: skip

    def enable_table(self, database: str, schema: str, table: str) -> None:
        """``sp_cdc_enable_table``; the first one creates the capture job, which is stopped again."""
        self.execute(database, f"EXEC sys.sp_cdc_enable_table @source_schema = N'{schema}',"
                               f" @source_name = N'{table}', @role_name = NULL")  # fmt: skip
        try:
            self.execute(database, "EXEC sys.sp_cdc_stop_job @job_type = N'capture'")
        except Exception:  # already stopped
            pass

    def run_capture_job(self, database: str) -> None:
        """One synchronous log scan: committed changes reach the change tables."""
        self.execute(database, "EXEC sys.sp_cdc_scan @maxtrans = 5000, @maxscans = 20, @continuous = 0")

    def run_cleanup(self, database: str) -> None:
        """Purge every change table below the current max LSN (the cleanup job, on demand)."""
        conn = self.connect(database)
        try:
            cur = conn.cursor()
            names = [r[0] for r in cur.execute("SELECT capture_instance FROM cdc.change_tables").fetchall()]
            for ci in names:
                cur.execute("DECLARE @lsn binary(10) = sys.fn_cdc_get_max_lsn();"
                            " EXEC sys.sp_cdc_cleanup_change_table @capture_instance = ?,"
                            " @low_water_mark = @lsn, @threshold = 100000", ci)  # fmt: skip
        finally:
            conn.close()
