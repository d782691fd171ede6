"""The real-server suite: runs only when ``AIRFLOW_CDC_SQLSERVER_URL`` names a SQL Server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contract.harness import HARNESSES  # noqa: F401  (first: it registers the emulator harness)
from tests.integration.sqlserver_real.harness_real import RealDb
from tests.integration.sqlserver_real.server import URL_ENV, RealSqlServer

pytest.importorskip("pyodbc")


@pytest.fixture(scope="session")
def real_sqlserver() -> RealSqlServer:
    server = RealSqlServer.from_env()
    if server is None:
        pytest.skip(f"{URL_ENV} is not set: no real SQL Server to test against")
    return server


@pytest.fixture
def real_db(real_sqlserver: RealSqlServer) -> Iterator[RealDb]:
    name = real_sqlserver.create_database()
    try:
        yield RealDb(real_sqlserver, name)
    finally:
        real_sqlserver.drop_database(name)
