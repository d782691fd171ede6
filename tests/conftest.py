"""Shared fixtures: throwaway PostgreSQL / MariaDB servers, a fresh database per test, and a
session-scoped SparkSession with Delta (``local[2]``) for the apply tests of every source.

Servers are session-scoped and started lazily (only when a collected test asks for them).  Every
test under ``tests/integration`` or using a server fixture is marked ``integration`` automatically,
so ``pytest -m "not integration"`` runs the unit tests without starting anything.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.testing.servers import PG_DEFAULT_VERSION, PG_MATRIX, MariaDbServer, PostgresServer

REPO = Path(__file__).resolve().parents[1]
INTEGRATION_DIR = Path(__file__).parent / "integration"
#: Every PostgreSQL major the suite runs on (15: Debian's; the others: ``make pg-versions``).
PG_VERSIONS = sorted(PG_MATRIX)
SERVER_FIXTURES = frozenset(
    {"pg_server", "pg_servers", "pg_db", "mariadb_server", "mariadb_db"} | {f"pg{v}_db" for v in PG_VERSIONS}
)
_PG_BASELINE: dict[int, dict[str, str]] = {}  # settings each session server started with


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        in_dir = INTEGRATION_DIR in Path(str(item.path)).parents
        if in_dir or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``AIRFLOW_CDC_TEST_TIMELINE=<dir>``, each worker appends a line per test (its wall
    start and end, set-up and teardown included) to ``<dir>/<worker>.jsonl``: where a run's time
    went, idle workers and the tail included (``scripts/test_timeline.py`` reads them)."""
    start = time.time()
    yield
    folder = os.environ.get("AIRFLOW_CDC_TEST_TIMELINE")
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"{worker}.jsonl", "a") as out:
            out.write(json.dumps({"test": item.nodeid, "start": start, "end": time.time()}) + "\n")


@pytest.fixture(autouse=True)
def _no_store_settings_left_over() -> Iterator[None]:
    """An in-process apply leaves its Hadoop store settings in ``delta_log`` (one job a process
    in production); a later test in the same worker reading the log of another store must not
    use them (the two-host test reached an earlier test's s3proxy port that way in full runs)."""
    yield
    module = sys.modules.get("spark_jobs.cdc_apply.delta_log")
    if module is not None:
        module.use_hadoop_conf({})


def _unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@dataclass
class PgDatabase:
    """A fresh database on the session's PostgreSQL server (the ``pg_db`` fixture)."""

    name: str
    dsn: str  # superuser conninfo for this database
    server: PostgresServer

    def connect(self, **kwargs: Any) -> Any:
        """Open a psycopg connection to this database as superuser.

        :param kwargs: passed to ``psycopg.connect`` (e.g. ``autocommit=True``).
        """
        import psycopg

        return psycopg.connect(self.dsn, **kwargs)


@dataclass
class MariaDbDatabase:
    """A fresh database on the session's MariaDB server (the ``mariadb_db`` fixture)."""

    name: str
    server: MariaDbServer

    def connect(self, **kwargs: Any) -> Any:
        """Open a pymysql connection to this database as root.

        :param kwargs: passed to ``pymysql.connect``.
        """
        return self.server.connect(database=self.name, **kwargs)


@pytest.fixture(scope="session")
def pg_servers() -> Iterator[Callable[[int], PostgresServer]]:
    """``pg_servers(version)``: one server per PostgreSQL major for the whole session, started on
    first use (15: the one ``AIRFLOW_CDC_TEST_PG_DSN`` names, if set)."""
    servers: dict[int, PostgresServer] = {}

    def get(version: int) -> PostgresServer:
        if version not in servers:
            if version == PG_DEFAULT_VERSION:
                server = PostgresServer.from_env().start()
            else:
                server = PostgresServer(version=version).start()
            _PG_BASELINE[id(server)] = dict(server.settings)
            servers[version] = server
        return servers[version]

    try:
        yield get
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def pg_server(pg_servers: Callable[[int], PostgresServer]) -> PostgresServer:
    """The PostgreSQL 15 server of the session (or the one ``AIRFLOW_CDC_TEST_PG_DSN`` names)."""
    return pg_servers(PG_DEFAULT_VERSION)


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDbServer]:
    """A MariaDB server for the whole session, started on first use."""
    server = MariaDbServer(tls=True).start()  # so database.ssl.mode=preferred (the default) uses TLS
    try:
        yield server
    finally:
        server.stop()


def _ensure_running(server: PostgresServer) -> None:
    """Bring the server back with its session settings if a test left it stopped or reconfigured."""
    if server.external:
        return
    baseline = _PG_BASELINE.setdefault(id(server), dict(server.settings))
    if server.settings != baseline or not server.is_running():
        server.settings = dict(baseline)
        server.restart()


def _pg_database(server: PostgresServer) -> Iterator[PgDatabase]:
    _ensure_running(server)
    name = _unique_name("t")
    dsn = server.create_database(name)
    try:
        yield PgDatabase(name=name, dsn=dsn, server=server)
    finally:
        _ensure_running(server)
        server.drop_database(name)


@pytest.fixture
def pg_version() -> int:
    """The PostgreSQL major of ``pg_db`` (15); a module runs on every major with
    ``pytestmark = pytest.mark.parametrize("pg_version", PG_VERSIONS)``."""
    return PG_DEFAULT_VERSION


@pytest.fixture
def pg_db(pg_servers: Callable[[int], PostgresServer], pg_version: int) -> Iterator[PgDatabase]:
    """A new, uniquely named database on the ``pg_version`` server; dropped afterwards with its
    replication slots, pass or fail."""
    yield from _pg_database(pg_servers(pg_version))


def _versioned_db(version: int) -> Any:
    def fixture(pg_servers: Callable[[int], PostgresServer]) -> Iterator[PgDatabase]:
        yield from _pg_database(pg_servers(version))

    fixture.__doc__ = f"``pg_db`` on PostgreSQL {version} (the contract harness ``postgresql-{version}``)."
    return pytest.fixture(fixture, name=f"pg{version}_db")


for _version in PG_VERSIONS:
    globals()[f"pg{_version}_db"] = _versioned_db(_version)


@pytest.fixture
def mariadb_db(mariadb_server: MariaDbServer) -> Iterator[MariaDbDatabase]:
    """A new, uniquely named MariaDB database, dropped afterwards."""
    name = mariadb_server.create_database(_unique_name("t"))
    try:
        yield MariaDbDatabase(name=name, server=mariadb_server)
    finally:
        mariadb_server.drop_database(name)


def _start_spark() -> Any:
    from spark_jobs.cdc_apply import session
    from spark_jobs.cdc_apply.layout import JARS_ENV

    if not os.environ.get(JARS_ENV) and (REPO / ".jars").is_dir():
        os.environ[JARS_ENV] = str(REPO / ".jars")
    os.environ.setdefault("TZ", "UTC")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers of in-process applies
    return session.build(app_name="airflow-cdc-tests")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the Spark session before the first test when this process will run a Spark test.

    PySpark starts its JVM with a ``preexec_fn``, which makes Python ``fork()`` the whole
    process instead of ``vfork()``.  Later in a run a test worker holds gigabytes of reserved,
    untouched address space (allocators keep what they once mapped), and under the kernel's
    heuristic overcommit that ``fork()`` failed with ENOMEM while RAM was free.  Started here, the
    JVM is forked from a small process."""
    if session.config.option.collectonly or not session.items:
        return
    if not any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return
    # outside a test nothing captures the JVM's output: it goes to a file, not the test log
    log = tempfile.NamedTemporaryFile(prefix="airflow-cdc-tests-spark-", suffix=".log", delete=False)  # noqa: SIM115
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        _start_spark()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        log.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pytest.importorskip("pyspark")
    spark = _start_spark()  # the session pytest_collection_finish started, if it did
    try:
        yield spark
    finally:
        spark.stop()
