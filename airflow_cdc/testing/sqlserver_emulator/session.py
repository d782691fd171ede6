"""One client session of the emulator: current database, isolation level, transactions, statements.

Statements are routed, not interpreted: ``USE``, ``SET``, transaction statements and the ODBC
driver's ``sp_datatype_info_100`` are handled here; ``SELECT`` statements are translated from the
T-SQL the SQL Server source sends into PostgreSQL (:mod:`.translate`) and run on the backing
database inside the session's PostgreSQL transaction, so isolation levels are real: ``SNAPSHOT``
runs as PostgreSQL REPEATABLE READ, the others as READ COMMITTED with SQL Server's read locks on user
tables (:mod:`.locks`).  A login without VIEW SERVER STATE (:class:`EmulatedLogin`) is refused
``sys.dm_server_services`` as SQL Server refuses it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from airflow_cdc.testing.sqlserver_emulator import catalog as C
from airflow_cdc.testing.sqlserver_emulator import locks
from airflow_cdc.testing.sqlserver_emulator.server import Result, SqlError
from airflow_cdc.testing.sqlserver_emulator.translate import split_statements, translate_select
from airflow_cdc.testing.sqlserver_emulator.types import SqlType

if TYPE_CHECKING:
    from airflow_cdc.testing.sqlserver_emulator.emulator import SqlServerCdcEmulator

_USE = re.compile(r"^USE\s+(?:\[((?:[^\]]|\]\])+)\]|(\w+))$", re.IGNORECASE)
_ISOLATION = re.compile(
    r"^SET\s+TRANSACTION\s+ISOLATION\s+LEVEL\s+(READ\s+UNCOMMITTED|READ\s+COMMITTED|"
    r"REPEATABLE\s+READ|SNAPSHOT|SERIALIZABLE)$",
    re.IGNORECASE,
)
_BEGIN = re.compile(r"^BEGIN\s+TRAN(SACTION)?$", re.IGNORECASE)
_END = re.compile(r"^(?:IF\s+@@TRANCOUNT\s*>\s*0\s+)?(COMMIT|ROLLBACK)(\s+TRAN(SACTION)?)?$", re.IGNORECASE)
# SQL Server's locking levels read the latest committed rows at each statement (PostgreSQL READ
# COMMITTED) and keep them stable with locks (.locks); SNAPSHOT reads one snapshot per transaction.
_PG_ISOLATION = {
    "READ UNCOMMITTED": psycopg.IsolationLevel.READ_COMMITTED,  # PostgreSQL has no dirty reads
    "READ COMMITTED": psycopg.IsolationLevel.READ_COMMITTED,
    "REPEATABLE READ": psycopg.IsolationLevel.READ_COMMITTED,
    "SNAPSHOT": psycopg.IsolationLevel.REPEATABLE_READ,
    "SERIALIZABLE": psycopg.IsolationLevel.READ_COMMITTED,
}
#: Views a login without VIEW SERVER STATE is refused (their references' *Permissions*).
_SERVER_STATE = re.compile(r"\b(?:dm_server_services|dm_db_log_stats)\b", re.IGNORECASE)
#: ``sys.sp_flush_log`` (hardens delayed durable commits): the emulated log end (the WAL's insert
#: position, ``sys.dm_db_log_stats``) already covers every committed transaction, so it is counted.
_FLUSH_LOG = re.compile(r"^EXEC(?:UTE)?\s+(?:sys\.)?sp_flush_log$", re.IGNORECASE)
_SAVEPOINT = "__emulator_statement"
_OID_TYPES = {
    16: SqlType("bit"),
    20: SqlType("bigint"),
    21: SqlType("smallint"),
    23: SqlType("int"),
    25: SqlType("nvarchar", 4000),
    19: C.SYSNAME,
    1043: SqlType("nvarchar", 4000),
    17: SqlType("varbinary", -1),
    700: SqlType("real"),
    701: SqlType("float"),
    1700: SqlType("decimal", precision=38, scale=10),
    1082: SqlType("date"),
    1114: SqlType("datetime2", scale=6),
    1083: SqlType("time", scale=6),
    2950: SqlType("uniqueidentifier"),
    26: SqlType("int"),
    705: SqlType("nvarchar", 4000),
}


@dataclass(frozen=True)
class EmulatedLogin:
    """A SQL Server login: ``view_server_state`` false is a least-privilege login (a database user
    with SELECT on the captured tables and the ``cdc`` schema, no server-level permission)."""

    name: str
    password: str
    view_server_state: bool = True


class TypeRegistry:
    """SQL Server types of PostgreSQL table columns, by (database, table oid, attnum)."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, int, int], SqlType] = {}
        self._by_name: dict[tuple[str, int, str], SqlType] = {}
        self._lock = threading.Lock()

    def register(
        self, conn: psycopg.Connection, database: str, qualified: str, columns: dict[str, SqlType]
    ) -> int:
        rows = conn.execute(
            "SELECT %s::regclass::oid::int, attname, attnum FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (qualified, qualified),
        ).fetchall()
        with self._lock:
            for oid, name, attnum in rows:
                if name in columns:
                    self._types[(database.lower(), oid, attnum)] = columns[name]
                    self._by_name[(database.lower(), oid, name)] = columns[name]
        return int(rows[0][0])

    def lookup(self, database: str, oid: int, attnum: int) -> SqlType | None:
        return self._types.get((database.lower(), oid, attnum))

    def column_type(self, database: str, oid: int, column: str) -> SqlType:
        """The registered type of ``column`` of table ``oid``."""
        return self._by_name[(database.lower(), oid, column)]

    def forget(self, database: str) -> None:
        with self._lock:
            self._types = {k: v for k, v in self._types.items() if k[0] != database.lower()}
            self._by_name = {k: v for k, v in self._by_name.items() if k[0] != database.lower()}


class EmulatorSession:
    """State of one TDS connection; every method may raise :class:`SqlError`."""

    def __init__(
        self, emulator: SqlServerCdcEmulator, database: str, login: EmulatedLogin | None = None
    ) -> None:
        self.emu, self.database = emulator, database
        self.login = login or EmulatedLogin(emulator.user, emulator.password)
        self.in_transaction = False
        self.isolation = "READ COMMITTED"
        self.lock_timeout_ms = -1  # SET LOCK_TIMEOUT: wait forever, SQL Server's default
        self._conns: dict[str, psycopg.Connection] = {}
        self._timeouts: dict[str, int] = {}  # lock timeout applied to each backing connection
        self._savepoint = False  # a statement's savepoint is open (see _read)

    # -- transactions -------------------------------------------------------------------
    def begin(self) -> None:
        self.in_transaction = True

    def commit(self) -> None:
        for conn in self._conns.values():
            conn.commit()
        self.in_transaction = False

    def rollback(self) -> None:
        for conn in self._conns.values():
            conn.rollback()
        self.in_transaction = False
        self._timeouts.clear()  # a setting made in the transaction is undone with it

    def close(self) -> None:
        for conn in self._conns.values():
            try:
                conn.close()
            except Exception:  # the backing database may already be dropped
                pass
        self._conns.clear()

    # -- statements --------------------------------------------------------------------------
    def execute(self, text: str, params: dict[str, Any]) -> list[Result]:
        return [self._one(stmt, params) for stmt in split_statements(text)]

    def _one(self, stmt: str, params: dict[str, Any]) -> Result:
        if m := _USE.match(stmt):
            name = (m.group(1) or m.group(2)).replace("]]", "]")
            self.database = self.emu.db(name).name
            return Result()
        if m := _ISOLATION.match(stmt):
            self.isolation = " ".join(m.group(1).upper().split())
            return Result()
        if (timeout := locks.lock_timeout(stmt)) is not None:
            self.lock_timeout_ms = timeout
            return Result()
        if _BEGIN.match(stmt):
            self.in_transaction = True
            return Result()
        if m := _END.match(stmt):
            (self.commit if m.group(1).upper() == "COMMIT" else self.rollback)()
            return Result()
        if re.match(r"^SET\s+\w+", stmt, re.IGNORECASE):
            return Result()  # NOCOUNT, TEXTSIZE ...: no effect on the emulation
        if _FLUSH_LOG.match(stmt):
            self.emu.db(self.database).log_flushes += 1
            return Result()
        if m := re.match(r"^(?:EXEC(?:UTE)?\s+)?sp_datatype_info(?:_100)?\s+(-?\d+)", stmt, re.IGNORECASE):
            return _type_info(int(m.group(1)))
        if re.match(r"^(SELECT|WITH)\b", stmt, re.IGNORECASE):
            return self._select(stmt, params)
        word = stmt.split(None, 1)[0] if stmt.strip() else ""
        raise SqlError(
            102,
            f"Incorrect syntax near '{word}'. (statement not supported by the SQL Server CDC "
            f"emulator: {stmt[:200]!r})",
            severity=15,
        )

    def _conn(self, database: str) -> psycopg.Connection:
        key = database.lower()
        conn = self._conns.get(key)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.emu.db(database).dsn)
            self._conns[key] = conn
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            if self.isolation == "SNAPSHOT" and not self.emu.db(database).allow_snapshot:
                raise SqlError(
                    3952,
                    f"Snapshot isolation transaction failed accessing database '{database}' "
                    "because snapshot isolation is not allowed in this database. Use ALTER "
                    "DATABASE to allow snapshot isolation.",
                )
            conn.isolation_level = _PG_ISOLATION[self.isolation]
        return conn

    def _select(self, stmt: str, params: dict[str, Any]) -> Result:
        if self.database == "master":
            raise SqlError(208, "Invalid object name (the emulator's master database has no objects).")
        if not self.login.view_server_state and _SERVER_STATE.search(stmt):
            raise _server_state_denied()
        stmt, table_lock = locks.strip_table_lock(stmt)
        query = translate_select(stmt, params, self.emu.databases, self.database)
        database = query.database or self.database
        conn = self._conn(database)
        try:
            self._apply_lock_timeout(conn, database)
            if query.capture_instance is not None:
                captured = _captured(conn, query.capture_instance)
                lo, hi, _ = query.change_args
                conn.execute(
                    f"SELECT sys.fn_cdc_check_range(%(__ci)s, {lo}, {hi})",
                    {**query.params, "__ci": query.capture_instance},
                )
                query = query.with_change_function(captured)
            cur = self._read(conn, query.sql, query.params, table_lock)
            rows = cur.fetchall() if cur.description else []
            columns = self._columns(database, cur) if cur.description else None
            count = cur.rowcount
        except psycopg.Error as exc:
            raise self._failed(conn, exc, stmt) from exc
        except SqlError:
            self._timeouts.pop(database.lower(), None)
            raise
        if not self.in_transaction:
            conn.commit()
        return Result(columns, rows, count)

    def _read(self, conn: psycopg.Connection, text: str, params: dict[str, Any], lock: str | None) -> Any:
        """Run a translated SELECT with the read locks of the session's isolation level (:mod:`.locks`).

        Inside a transaction the locking steps run under a savepoint: rolling back to it ends a
        lock wait that timed out without ending the transaction, and releases the row locks of a
        READ COMMITTED statement once it has read its rows.
        """
        relations = locks.user_relations(text)
        hold = locks.HOLD_TO_COMMIT.get(self.isolation)
        if relations is None or (hold is None and lock is None):
            return conn.execute(sql.SQL(text), params)  # type: ignore[arg-type]
        if self.in_transaction:
            conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            self._savepoint = True
        if lock:  # a table lock hint lasts to the end of the transaction in every level
            for relation in relations:
                conn.execute(sql.SQL("LOCK TABLE {} IN {} MODE").format(sql.SQL(relation), sql.SQL(lock)))
        else:
            try:
                conn.execute(sql.SQL(text + " FOR SHARE"), params)  # type: ignore[arg-type]
            except pgerr.FeatureNotSupported:  # e.g. an outer join: read it without locks
                self._undo_statement(conn)
        cur = conn.execute(sql.SQL(text), params)  # type: ignore[arg-type]
        if self.in_transaction:
            if hold is False and lock is None:  # READ COMMITTED: the locks end with the statement
                conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            self._savepoint = False
        return cur

    def _undo_statement(self, conn: psycopg.Connection) -> None:
        if self.in_transaction:
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        else:
            conn.rollback()
            self._timeouts.clear()

    def _failed(self, conn: psycopg.Connection, exc: psycopg.Error, stmt: str) -> SqlError:
        """Undo a failed statement as SQL Server does: a lock timeout (1222) inside a transaction
        cancels the statement only; any other error ends the transaction."""
        error = locks.lock_error(exc, conn.info.backend_pid) or _sql_error(exc, stmt)
        savepoint, self._savepoint = self._savepoint, False
        if error.number == 1222 and self.in_transaction and savepoint:
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            return error
        self.rollback()
        return error

    def _apply_lock_timeout(self, conn: psycopg.Connection, database: str) -> None:
        key = database.lower()
        if self._timeouts.get(key, -1) != self.lock_timeout_ms:
            value = locks.pg_lock_timeout(self.lock_timeout_ms)
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (value,))
            self._timeouts[key] = self.lock_timeout_ms

    def _columns(self, database: str, cur: psycopg.Cursor) -> list[tuple[str, SqlType]]:
        res = cur.pgresult
        out = []
        for i, col in enumerate(cur.description or ()):
            found = None
            if res is not None and res.ftable(i):
                found = self.emu.types.lookup(database, res.ftable(i), res.ftablecol(i))
            found = found or C.FUNCTION_TYPES.get(col.name) or _OID_TYPES.get(col.type_code)
            if found is None:
                raise SqlError(50000, f"emulator: no SQL Server type for result column {col.name!r}")
            out.append(("" if col.name in C.FUNCTION_TYPES or col.name == "?column?" else col.name, found))
        return out


# What the ODBC driver's SQLGetTypeInfo asks at connect; pyodbc sizes string, binary and timestamp
# parameters from COLUMN_SIZE (with no row it would send datetimes without fractional seconds).
_TYPE_INFO = {
    12: ("varchar", 8000),
    -9: ("nvarchar", 4000),
    -3: ("varbinary", 8000),
    93: ("datetime2", 27),
    -2: ("binary", 8000),
    1: ("char", 8000),
    -8: ("nchar", 4000),
    91: ("date", 10),
}


def _type_info(odbc_type: int) -> Result:
    columns = [("TYPE_NAME", C.SYSNAME), ("DATA_TYPE", SqlType("smallint")), ("PRECISION", SqlType("int"))]
    row = _TYPE_INFO.get(odbc_type)
    return Result(columns, [(row[0], odbc_type, row[1])] if row else [])


def _captured(conn: psycopg.Connection, capture_instance: str) -> list[str]:
    rows = conn.execute(
        "SELECT cc.column_name FROM cdc.captured_columns cc JOIN cdc.change_tables ct"
        " ON ct.object_id = cc.object_id WHERE ct.capture_instance = %s"
        " ORDER BY cc.column_ordinal",
        (capture_instance,),
    ).fetchall()
    if not rows:
        conn.rollback()
        raise SqlError(208, f"Invalid object name 'cdc.fn_cdc_get_all_changes_{capture_instance}'.")
    return [r[0] for r in rows]


def _server_state_denied() -> SqlError:
    """What SQL Server answers a login without VIEW SERVER STATE reading a server-state view."""
    return SqlError(
        300,
        "VIEW SERVER STATE permission was denied on object 'server', database 'master'.",
        severity=14,
        more=(SqlError(297, "The user does not have permission to perform this action."),),
    )


def _sql_error(exc: psycopg.Error, stmt: str) -> SqlError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, pgerr.RaiseException) and "313:" in text:
        return SqlError(313, text.split("313:", 1)[1].strip())
    if isinstance(exc, pgerr.UndefinedTable):
        return SqlError(208, f"Invalid object name ({text}).")
    if isinstance(exc, pgerr.UndefinedColumn):
        return SqlError(207, f"Invalid column name ({text}).")
    if isinstance(exc, pgerr.SerializationFailure):
        return SqlError(3960, "Snapshot isolation transaction aborted due to update conflict.")
    if isinstance(exc, pgerr.SyntaxError):
        return SqlError(102, f"Incorrect syntax ({text}) in {stmt[:200]!r}", severity=15)
    return SqlError(50000, f"emulator: {text}")
