"""``SqlServerCdcEmulator``: a SQL Server CDC *emulator* for tests, reachable over real TDS.

No SQL Server runs on our test machines, so the SQL Server source is tested against this
emulator: a TDS server on loopback (:mod:`.server`) that pyodbc + FreeTDS connect to, backed by one
PostgreSQL database per emulated SQL Server database.  Writers change user tables with ordinary
PostgreSQL transactions (:meth:`SqlServerCdcEmulator.pg_connect`); the emulated capture job
(:meth:`run_capture_job`, or a background poller) copies committed changes into SQL Server-shaped
change tables; the cleanup job (:meth:`run_cleanup`) purges old LSNs.  Only the statements the
SQL Server source sends are understood (:mod:`.session`); anything else gets a SQL Server error.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

import psycopg
from psycopg import sql

from airflow_cdc.testing.sqlserver_emulator import catalog as C
from airflow_cdc.testing.sqlserver_emulator.capture import PENDING_DDL, CaptureJob, lsn_bytes
from airflow_cdc.testing.sqlserver_emulator.server import SqlError, TdsServer
from airflow_cdc.testing.sqlserver_emulator.session import EmulatedLogin, EmulatorSession, TypeRegistry
from airflow_cdc.testing.sqlserver_emulator.types import SqlType
from airflow_cdc.testing.sqlserver_emulator.wire import Login

log = logging.getLogger(__name__)

DEFAULT_PASSWORD = "Emulator-Passw0rd!"
#: The emulated server's time zone: a real server's clock (and ``cdc.lsn_time_mapping``) is local
#: time, rarely UTC; a half-hour offset without daylight saving keeps every test honest about it.
DEFAULT_TIMEZONE = "Asia/Kolkata"


@dataclass
class EmulatedDatabase:
    name: str
    dsn: str
    database_id: int
    capture: CaptureJob
    allow_snapshot: bool = False
    log_flushes: int = 0  # ``sys.sp_flush_log`` calls (nothing to flush: see session._FLUSH_LOG)


class SqlServerCdcEmulator:
    """Emulated SQL Server with CDC; every database lives on ``pg_server`` (a PostgresServer)."""

    def __init__(
        self,
        pg_server: Any,
        *,
        user: str = "sa",
        password: str = DEFAULT_PASSWORD,
        trace: bool = False,
        timezone: str = DEFAULT_TIMEZONE,
    ) -> None:
        self.pg, self.user, self.password, self.timezone = pg_server, user, password, timezone
        self.types = TypeRegistry()
        self.databases: dict[str, EmulatedDatabase] = {}
        self.logins: dict[str, EmulatedLogin] = {}  # besides ``user`` (sysadmin): add_login
        self.agent_running = True
        self._tds = TdsServer(self, trace=trace)
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    # -- life cycle ---------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self._tds.port

    @property
    def wire_log(self) -> list[tuple[str, Any]]:
        return self._tds.wire_log

    def start(self, capture_poll_seconds: float | None = None) -> Self:
        """Listen for TDS clients; with ``capture_poll_seconds`` also run the capture job on a timer."""
        self._tds.start()
        if capture_poll_seconds:
            self._poller = threading.Thread(target=self._poll, args=(capture_poll_seconds,), daemon=True)
            self._poller.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._tds.stop()

    def _poll(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            for db in list(self.databases.values()):
                try:
                    self.run_capture_job(db.name)
                except Exception:  # a dropped database mid-run; the next tick carries on
                    log.warning("capture job of %s failed; retried next tick", db.name, exc_info=True)

    def add_login(self, name: str, password: str, *, view_server_state: bool = False) -> EmulatedLogin:
        """``CREATE LOGIN`` + a user in every database: by default a least-privilege login, which
        reads what the sysadmin reads except server state (``sys.dm_server_services``: error 300)."""
        self.logins[name] = EmulatedLogin(name, password, view_server_state)
        return self.logins[name]

    def login(self, login: Login) -> EmulatorSession:
        known = self.logins.get(login.user)
        if login.user == self.user:
            known = EmulatedLogin(self.user, self.password)
        if known is None or login.password != known.password:
            raise SqlError(18456, f"Login failed for user '{login.user}'.", severity=14, state=1)
        database = login.database or "master"
        if database != "master" and database.lower() not in self.databases:
            raise SqlError(
                4060,
                f'Cannot open database "{database}" requested by the login. The login failed.',
                severity=11,
                state=1,
            )
        return EmulatorSession(self, database if database == "master" else self.db(database).name, known)

    def db(self, name: str) -> EmulatedDatabase:
        try:
            return self.databases[name.lower()]
        except KeyError:
            raise SqlError(
                911, f"Database '{name}' does not exist. Make sure that the name is entered correctly."
            ) from None

    def odbc_connection_string(
        self,
        database: str | None = None,
        *,
        driver: str = "FreeTDS",
        user: str | None = None,
        password: str | None = None,
    ) -> str:
        parts = [
            f"DRIVER={{{driver}}}",
            f"SERVER={self.host}",
            f"PORT={self.port}",
            f"UID={user or self.user}",
            f"PWD={{{password or self.password}}}",
            "TDS_Version=7.4",
        ]
        if database:
            parts.append(f"DATABASE={database}")
        return ";".join(parts)

    # -- databases and tables -------------------------------------------------------------
    def create_database(
        self, name: str, *, allow_snapshot_isolation: bool = False, deferred_updates: str = "key"
    ) -> EmulatedDatabase:
        """Create a PostgreSQL database for ``name`` with CDC enabled (``sys.sp_cdc_enable_db``).

        :param deferred_updates: ``"key"``: updates of primary-key or unique-index columns are
            logged as delete + insert under one seqval, as SQL Server does; ``"all"``: every update
            is (MERGE and some plans); ``"mixed"``: every other transaction's updates are.
        """
        dsn = self.pg.create_database(name)
        with self._lock:
            job = CaptureJob(dsn, name, self.timezone, deferred_updates)
            db = EmulatedDatabase(name, dsn, 5 + len(self.databases), job, allow_snapshot_isolation)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(C.SETUP_DDL)
            conn.execute(PENDING_DDL)
            # SYSDATETIME() is the server's local clock, SYSUTCDATETIME() UTC (datetime2(7) on SQL
            # Server; PostgreSQL keeps microseconds)
            zone = self.timezone.replace("'", "''")
            conn.execute(
                "CREATE FUNCTION public.sysdatetime() RETURNS timestamp LANGUAGE sql STABLE AS"
                f" $$ SELECT (clock_timestamp() AT TIME ZONE '{zone}')::timestamp $$;"
                " CREATE FUNCTION public.sysutcdatetime() RETURNS timestamp LANGUAGE sql STABLE AS"
                " $$ SELECT (clock_timestamp() AT TIME ZONE 'UTC')::timestamp $$"
            )
            conn.execute(
                "INSERT INTO sys.databases VALUES (%s, %s, 1, %s, 0)",
                (name, db.database_id, 1 if allow_snapshot_isolation else 0),
            )
            conn.execute(
                "INSERT INTO sys.types SELECT k, v, v FROM unnest(%s::text[], %s::int[]) AS t(k, v)",
                (list(C.TYPE_IDS), list(C.TYPE_IDS.values())),
            )
            conn.execute(
                "INSERT INTO sys.dm_server_services VALUES ('SQL Server (MSSQLSERVER)', 4, 'Running'),"
                " ('SQL Server Agent (MSSQLSERVER)', %s, %s)",
                _agent_row(self.agent_running),
            )
            for (schema, table), columns in C.CATALOG_TYPES.items():
                self.types.register(conn, name, f"{schema}.{table}", columns)
            db.capture.create_slot(conn)
        self.databases[name.lower()] = db
        return db

    def drop_database(self, name: str) -> None:
        self.databases.pop(name.lower(), None)
        self.types.forget(name)
        self.pg.drop_database(name)

    def pg_connect(self, database: str, **kwargs: Any) -> psycopg.Connection:
        """A PostgreSQL connection to the backing database, for writers (real transactions)."""
        return psycopg.connect(self.db(database).dsn, **kwargs)

    def create_table(
        self,
        database: str,
        table: str,
        columns: Sequence[tuple[str, str]],
        primary_key: Sequence[str] = (),
        not_null: Sequence[str] = (),
        computed: dict[str, str] | None = None,
        unique: Sequence[Sequence[str]] = (),
    ) -> int:
        """Create ``schema.table`` with SQL Server column types; return its object_id.

        :param computed: computed columns: name -> a PostgreSQL expression over the other columns
            (a stored generated column, which PostgreSQL's log does not carry either).
        :param unique: column lists of unique indexes (an update of one is a deferred update).
        """
        schema, name = _split(table)
        types = [(c, SqlType.parse(t)) for c, t in columns]
        computed = computed or {}
        defs = [
            sql.SQL("{} {}{}{}").format(
                sql.Identifier(c),
                sql.SQL(t.pg_storage),
                sql.SQL(f" GENERATED ALWAYS AS ({computed[c]}) STORED" if c in computed else ""),
                sql.SQL(" NOT NULL" if c in not_null or c in primary_key else ""),
            )
            for c, t in types
        ]
        defs += [sql.SQL("UNIQUE ({})").format(sql.SQL(", ").join(map(sql.Identifier, u))) for u in unique]
        if primary_key:
            defs.append(
                sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, primary_key)))
            )
        with self.pg_connect(database, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL("CREATE TABLE {}.{} ({})").format(
                    sql.Identifier(schema), sql.Identifier(name), sql.SQL(", ").join(defs)
                )
            )
            oid = self.types.register(conn, database, _qualified(schema, name), dict(types))
            conn.execute(
                "INSERT INTO sys.tables SELECT %s, %s, %s::regnamespace::oid::int, 0",
                (oid, name, _quote(schema)),
            )
            self._sys_columns(conn, oid, types, set(not_null) | set(primary_key), start=1)
        return oid

    def add_column(self, database: str, table: str, column: str, type_spec: str) -> None:
        """``ALTER TABLE ... ADD column`` (nullable), as a schema change for capture-instance tests."""
        schema, name = _split(table)
        t = SqlType.parse(type_spec)
        with self.pg_connect(database, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} ADD COLUMN {} {}").format(
                    sql.Identifier(schema),
                    sql.Identifier(name),
                    sql.Identifier(column),
                    sql.SQL(t.pg_storage),
                )
            )
            oid = self.types.register(conn, database, _qualified(schema, name), {column: t})
            start = conn.execute(
                "SELECT COALESCE(max(column_id), 0) + 1 FROM sys.columns WHERE object_id = %s", (oid,)
            ).fetchone()
            self._sys_columns(conn, oid, [(column, t)], set(), start=start[0] if start else 1)

    def rename_table(self, database: str, table: str, new_name: str) -> None:
        """``sp_rename 'schema.table', 'new_name'``: the object keeps its id, so its capture
        instances (named after the old table) follow it, as on SQL Server."""
        schema, name = _split(table)
        with self.pg_connect(database, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} RENAME TO {}").format(
                    sql.Identifier(schema), sql.Identifier(name), sql.Identifier(new_name)
                )
            )
            conn.execute(
                "UPDATE sys.tables SET name = %s WHERE object_id = %s::regclass::oid::int",
                (new_name, _qualified(schema, new_name)),
            )

    def _sys_columns(
        self,
        conn: psycopg.Connection,
        oid: int,
        types: Sequence[tuple[str, SqlType]],
        not_null: set[str],
        start: int,
    ) -> None:
        for n, (c, t) in enumerate(types, start=start):
            tid = C.TYPE_IDS[t.name]
            conn.execute(
                "INSERT INTO sys.columns VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    oid,
                    c,
                    n,
                    tid,
                    tid,
                    t.max_length,
                    t.precision or _PRECISION.get(t.name, 0),
                    t.scale,
                    0 if c in not_null else 1,
                ),
            )

    # -- CDC administration ---------------------------------------------------------------
    def enable_table(
        self,
        database: str,
        table: str,
        *,
        capture_instance: str | None = None,
        captured_columns: Sequence[str] | None = None,
        role_name: str | None = None,
    ) -> str:
        """``sys.sp_cdc_enable_table``: a new capture instance and its ``cdc.<ci>_CT`` table.

        A table may have two capture instances (SQL Server's limit); a third raises error 22962.
        """
        from airflow_cdc.testing.sqlserver_emulator import admin

        return admin.enable_table(self, database, table, capture_instance, captured_columns, role_name)

    def disable_table(self, database: str, table: str, capture_instance: str = "all") -> None:
        """``sys.sp_cdc_disable_table``: drop the capture instance(s) and their change tables."""
        from airflow_cdc.testing.sqlserver_emulator import admin

        admin.disable_table(self, database, table, capture_instance)

    def run_capture_job(self, database: str | None = None) -> int:
        """Run the capture job once (all databases when none named); return change rows written.

        Does nothing while the emulated SQL Server Agent is stopped, like the real capture job.
        """
        if not self.agent_running:
            return 0
        names = [database] if database else [d.name for d in self.databases.values()]
        return sum(self.db(n).capture.run() for n in names)

    def run_cleanup(self, database: str, low_water_lsn: bytes | None = None) -> bytes:
        """The cleanup job: purge change rows below ``low_water_lsn`` (default: below the max LSN).

        Moves every capture instance's ``start_lsn`` (what ``fn_cdc_get_min_lsn`` returns) up to the
        new low water mark; returns it.
        """
        with self.pg_connect(database) as conn:
            if low_water_lsn is None:
                row = conn.execute("SELECT sys.fn_cdc_get_max_lsn()").fetchone()
                low_water_lsn = bytes(row[0]) if row else C.ZERO_LSN
            cis = conn.execute("SELECT capture_instance FROM cdc.change_tables").fetchall()
            for (ci,) in cis:
                conn.execute(
                    sql.SQL("DELETE FROM cdc.{} WHERE {} < %s").format(
                        sql.Identifier(ci + "_CT"), sql.Identifier("__$start_lsn")
                    ),
                    (low_water_lsn,),
                )
            conn.execute(
                "UPDATE cdc.change_tables SET start_lsn = %s WHERE start_lsn < %s",
                (low_water_lsn, low_water_lsn),
            )
            conn.execute("DELETE FROM cdc.lsn_time_mapping WHERE start_lsn < %s", (low_water_lsn,))
        return low_water_lsn

    def set_agent_running(self, running: bool) -> None:
        """Start/stop the emulated SQL Server Agent (a stopped agent runs no capture job)."""
        self.agent_running = running
        for db in self.databases.values():
            with self.pg_connect(db.name, autocommit=True) as conn:
                conn.execute(
                    "UPDATE sys.dm_server_services SET status = %s, status_desc = %s"
                    " WHERE servicename LIKE 'SQL Server Agent%%'",
                    _agent_row(running),
                )

    def deny_select(self, database: str, object_name: str) -> None:
        """``DENY SELECT`` on an object for the login: ``HAS_PERMS_BY_NAME`` and reads fail."""
        with self.pg_connect(database, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO sys.database_permissions VALUES (%s, 1) ON CONFLICT DO NOTHING", (object_name,)
            )

    def current_lsn(self, database: str) -> bytes:
        """The PostgreSQL WAL position now, as a 10-byte LSN (what a capture instance starts at)."""
        with self.pg_connect(database) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        return lsn_bytes(int(row[0]) if row else 0)


# sys.columns.precision of the types whose precision is implied by the type.
_PRECISION = {
    "tinyint": 3,
    "smallint": 5,
    "int": 10,
    "bigint": 19,
    "bit": 1,
    "real": 24,
    "float": 53,
    "money": 19,
    "smallmoney": 10,
    "date": 10,
    "datetime": 23,
    "smalldatetime": 16,
}


def _agent_row(running: bool) -> tuple[int, str]:
    return (4, "Running") if running else (1, "Stopped")


def _split(table: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return schema or "dbo", name


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _qualified(schema: str, name: str) -> str:
    return f"{_quote(schema)}.{_quote(name)}"


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
