"""A SQL Server CDC **emulator** for tests: TDS on loopback, PostgreSQL underneath.

Not SQL Server.  See :mod:`.emulator` for what it emulates and how.
"""

from airflow_cdc.testing.sqlserver_emulator.emulator import SqlServerCdcEmulator
from airflow_cdc.testing.sqlserver_emulator.server import SqlError

__all__ = ["SqlError", "SqlServerCdcEmulator"]
