"""Every T-SQL statement the SQL Server source sends (identifiers bracket-quoted, values bound).

Catalog reads name their database explicitly (``[db].cdc.change_tables``) so one connection
serves all of ``database.names``; LSNs are bound as ``binary(10)`` parameters.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from airflow_cdc.core.conditions import Piece, Value, pieces_to_text


def quote(name: str) -> str:
    """Bracket-quote a T-SQL identifier (``]`` doubled)."""
    return "[" + name.replace("]", "]]") + "]"


MAX_LSN = "SELECT sys.fn_cdc_get_max_lsn()"
MIN_LSN = "SELECT sys.fn_cdc_get_min_lsn(?)"
LSN_TO_TIME = "SELECT sys.fn_cdc_map_lsn_to_time(?)"
AGENT_RUNNING = (
    "SELECT CASE WHEN dss.[status] = 4 THEN 1 ELSE 0 END FROM sys.dm_server_services dss"
    " WHERE dss.[servicename] LIKE N'SQL Server Agent (%'"
)
#: ``snapshot.isolation.mode`` -> the level of a chunk's transaction; ``exclusive`` is Debezium's
#: REPEATABLE READ plus an exclusive table lock (:func:`table_lock`).
ISOLATION = {
    "snapshot": "SET TRANSACTION ISOLATION LEVEL SNAPSHOT",
    "read_committed": "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "repeatable_read": "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    "read_uncommitted": "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
    "exclusive": "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
}
#: The connection's level outside chunk reads (SQL Server's default; Debezium restores it too).
SESSION_ISOLATION = ISOLATION["read_committed"]
#: Modes whose chunk reads wait for locks while holding some: they get a lock timeout (Debezium
#: sets ``SET LOCK_TIMEOUT`` for exactly these).
LOCK_HOLDING = ("repeatable_read", "exclusive")


def use(db: str) -> str:
    return f"USE {quote(db)}"


def database_state(db: str) -> str:
    """Name, CDC flag and snapshot-isolation state of ``db``."""
    return (
        f"SELECT d.name, d.is_cdc_enabled, d.snapshot_isolation_state FROM {quote(db)}.sys.databases d"  # noqa: S608
        " WHERE d.name = ?"
    )


def capture_instances(db: str) -> str:
    """Every capture instance of ``db`` with its source table and validity start."""
    q = quote(db)
    return (
        "SELECT s.name, t.name, ct.capture_instance, ct.object_id, ct.start_lsn, ct.create_date"  # noqa: S608
        f" FROM {q}.cdc.change_tables ct JOIN {q}.sys.tables t ON t.object_id = ct.source_object_id"
        f" JOIN {q}.sys.schemas s ON s.schema_id = t.schema_id ORDER BY ct.create_date, ct.capture_instance"
    )


def captured_columns(db: str) -> str:
    """Captured columns of every capture instance with their SQL Server types, in ordinal order.

    An alias type (``CREATE TYPE dbo.Phone FROM nvarchar(20)``: ``sys.types.is_user_defined = 1``,
    not an assembly type) is reported as its base system type, the type its values have; the
    column's own ``max_length``/``precision``/``scale`` are the base type's.  CLR types
    (``is_assembly_type = 1``, all sharing ``system_type_id`` 240) keep their own name.
    """
    q = quote(db)
    return (
        "SELECT ct.object_id, cc.column_name, cc.column_ordinal, COALESCE(bt.name, ty.name), c.max_length,"  # noqa: S608
        " c.precision, c.scale, c.is_nullable, cc.is_computed"
        f" FROM {q}.cdc.change_tables ct JOIN {q}.cdc.captured_columns cc ON cc.object_id = ct.object_id"
        f" JOIN {q}.sys.columns c ON c.object_id = ct.source_object_id AND c.name = cc.column_name"
        f" JOIN {q}.sys.types ty ON ty.user_type_id = c.user_type_id"
        f" LEFT JOIN {q}.sys.types bt ON ty.is_user_defined = 1 AND ty.is_assembly_type = 0"
        " AND bt.user_type_id = c.system_type_id"
        " ORDER BY ct.object_id, cc.column_ordinal"
    )


def index_columns(db: str) -> str:
    """The key columns each capture instance identifies rows by."""
    return (
        "SELECT ic.object_id, ic.column_name, ic.index_ordinal"  # noqa: S608
        f" FROM {quote(db)}.cdc.index_columns ic ORDER BY ic.object_id, ic.index_ordinal"
    )


def all_changes(db: str, capture_instance: str, columns: Sequence[str]) -> str:
    """Changes of one capture instance between two bound LSNs, in Debezium's order."""
    cols = ", ".join(quote(c) for c in columns)
    fn = quote(f"fn_cdc_get_all_changes_{capture_instance}")
    return (
        f"SELECT [__$start_lsn], [__$seqval], [__$operation], [__$update_mask], {cols}"  # noqa: S608
        f" FROM {quote(db)}.cdc.{fn}(?, ?, N'all update old')"
        " ORDER BY [__$start_lsn], [__$seqval], [__$operation]"
    )


HAS_SELECT = "SELECT HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT')"
BEGIN = "BEGIN TRANSACTION"
COMMIT = "COMMIT TRANSACTION"
ROLLBACK = "ROLLBACK TRANSACTION"


def lock_timeout(ms: int) -> str:
    """``SET LOCK_TIMEOUT``: how long a statement waits for a lock (-1: forever, 0: not at all)."""
    return f"SET LOCK_TIMEOUT {int(ms)}"


def table_lock(db: str, schema: str, table: str) -> str:
    """Debezium's exclusive table lock (``exclusive`` mode), held to the end of the transaction."""
    target = ".".join(quote(p) for p in (db, schema, table))
    return f"SELECT TOP (0) * FROM {target} WITH (TABLOCKX)"  # noqa: S608


def table_share_lock(db: str, schema: str, table: str) -> str:
    """A shared table lock held to the end of the transaction: writers of the table wait, readers
    do not (Microsoft's *Table hints*: "TABLOCK ... The lock is held until the end of the statement.
    However, if you also specify HOLDLOCK, the lock is held until the end of the transaction",
    https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table)."""
    target = ".".join(quote(p) for p in (db, schema, table))
    return f"SELECT TOP (0) * FROM {target} WITH (TABLOCK, HOLDLOCK)"  # noqa: S608


def whole_select(db: str, schema: str, table: str, columns: Sequence[str]) -> str:
    """Every row of a table, in no order (a table without key columns read whole)."""
    target = ".".join(quote(p) for p in (db, schema, table))
    return f"SELECT {', '.join(quote(c) for c in columns)} FROM {target}"  # noqa: S608


#: The LSN of the last record in the database's log (``sys.dm_db_log_stats``, SQL Server 2016 SP2+,
#: text ``xxxxxxxx:xxxxxxxx:xxxx``; NULL on a readable secondary) and whether the database allows
#: delayed durability (``sys.databases.delayed_durability``: 0 disabled, 1 allowed, 2 forced).
LOG_END = (
    "SELECT s.log_end_lsn, d.delayed_durability FROM sys.dm_db_log_stats(DB_ID(?)) s"
    " JOIN sys.databases d ON d.database_id = s.database_id"
)
#: Harden every committed delayed durable transaction of the current database.
FLUSH_LOG = "EXEC sys.sp_flush_log"


def first_read(db: str) -> str:
    """A read of one row of a table every CDC database has: a ``SNAPSHOT`` transaction's version of
    the data is fixed by its first read (Materialize's SQL Server source reads this table for it)."""
    return f"SELECT TOP (1) ct.object_id FROM {quote(db)}.cdc.change_tables ct"  # noqa: S608


def chunk_select(
    db: str,
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    limit: int | None,
    after: bool,
    condition: str | None = None,
    upto: bool = False,
    relation: str | None = None,
) -> str:
    """One snapshot chunk in ``key`` order: the first ``limit`` rows (all without a limit), after a
    bound key and/or up to a bound value of a one-column ``key`` (``upto``), under ``condition``.

    The key predicate is the expanded row comparison ``(k1 > ?) OR (k1 = ? AND k2 > ?) ...``
    (T-SQL has no row constructors); its parameters are :func:`chunk_params` of the last key,
    then the ``upto`` value.  ``condition`` is an ad hoc snapshot's additional condition
    (:func:`condition_sql`): its parameters come after those.  ``relation``: what is read instead of
    the table (:func:`override_relation`).
    """
    cols = ", ".join(quote(c) for c in columns)
    target = ".".join(quote(p) for p in (db, schema, table)) if relation is None else relation
    where = []
    if after:
        terms = []
        for i, k in enumerate(key):
            eq = [f"{quote(p)} = ?" for p in key[:i]]
            terms.append("(" + " AND ".join([*eq, f"{quote(k)} > ?"]) + ")")
        where.append("(" + " OR ".join(terms) + ")")
    if upto:
        where.append(f"{quote(key[0])} <= ?")
    if condition:
        where.append(condition)
    clause = " WHERE " + " AND ".join(where) if where else ""
    top = f"TOP ({int(limit)}) " if limit is not None else ""
    order = ", ".join(quote(k) for k in key)
    return f"SELECT {top}{cols} FROM {target}{clause} ORDER BY {order}"  # noqa: S608


def override_relation(statement: str, columns: Sequence[str], present: set[str]) -> str:
    """A ``snapshot.select.statement.overrides`` statement as the derived table snapshot chunks read
    (:mod:`airflow_cdc.core.snapshot_overrides`): the captured columns, NULL for those the statement
    leaves out.  The statement is the operator's own SQL, on lines of its own."""
    inner = f"(\n{statement}\n) AS [snapshot_override]"
    if set(columns) <= present:
        return inner
    cols = ", ".join(quote(c) if c in present else f"NULL AS {quote(c)}" for c in columns)
    return f"(SELECT {cols} FROM {inner}) AS [snapshot_rows]"  # noqa: S608


def describe_statement(statement: str) -> str:
    """An override statement as chunks wrap it, reading no row (``TOP (0)``): its result columns."""
    return f"SELECT TOP (0) * FROM (\n{statement}\n) AS [snapshot_override]"  # noqa: S608


def _param(value: Value) -> Any:
    """A condition literal as a pyodbc parameter: dates and times as text, which SQL Server
    converts to the column's type (FreeTDS mis-encodes some date parameters), and integers beyond
    64 bits as decimals."""
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return Decimal(value)
    return value


def condition_sql(pieces: Sequence[Piece]) -> tuple[str, list[Any]]:
    """An ad hoc snapshot's additional condition, parenthesised, and its parameters: columns
    bracket-quoted, literals bound (``?``), a raw-SQL condition (opted in) as written."""
    text, args = pieces_to_text(pieces, quote, "?", value=_param)
    return f"({text})", args


def chunk_params(last_key: Sequence[object]) -> list[object]:
    """Parameters of :func:`chunk_select`'s predicate for the key after which to read."""
    out: list[object] = []
    for i in range(len(last_key)):
        out.extend(last_key[: i + 1])
    return out


def lsn_times(db: str) -> str:
    """Commit time (server-local) of every transaction with a commit LSN in a bound range; the
    capture job's filler rows (``tran_id = 0x00``) are no transactions."""
    return (
        "SELECT m.start_lsn, m.tran_end_time"  # noqa: S608
        f" FROM {quote(db)}.cdc.lsn_time_mapping m WHERE m.start_lsn BETWEEN ? AND ? AND m.tran_id <> 0x00"
    )


def max_transaction_lsn(db: str) -> str:
    """The newest commit LSN of a captured transaction (Debezium's ``getMaxTransactionLsn``)."""
    return f"SELECT MAX(m.start_lsn) FROM {quote(db)}.cdc.lsn_time_mapping m WHERE m.tran_id <> 0x00"  # noqa: S608


#: The server's local and UTC clocks now: their difference is its UTC offset.
SERVER_CLOCKS = "SELECT SYSDATETIME(), SYSUTCDATETIME()"
