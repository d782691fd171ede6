"""SQL Server's read locks on the emulator's MVCC backing database.

PostgreSQL readers never block writers; SQL Server's locking readers do.  Microsoft's *SET
TRANSACTION ISOLATION LEVEL (Transact-SQL)* states what each level holds, and the emulator takes
the same locks on the rows of user tables that a ``SELECT`` reads:

* ``READ UNCOMMITTED``: "don't issue shared locks to prevent other transactions from modifying data
  read by the current transaction ... also not blocked by exclusive locks" -- no locks (PostgreSQL
  has no dirty reads, so it reads committed rows).
* ``READ COMMITTED`` (``READ_COMMITTED_SNAPSHOT`` OFF, SQL Server's default): "uses shared locks to
  prevent other transactions from modifying rows while the current transaction is running a read
  operation. The shared locks also block the statement from reading rows modified by other
  transactions until the other transaction is completed ... Row locks are released before the next
  row is processed" -- the rows are locked ``FOR SHARE`` (waiting for uncommitted writers) and
  released when the statement ends: inside a transaction by rolling back to a savepoint taken
  before it, which releases the row locks taken since.
* ``REPEATABLE READ``: "Shared locks are placed on all data read by each statement in the
  transaction and are held until the transaction completes ... Other transactions can insert new
  rows that match the search conditions" -- ``FOR SHARE`` held to ``COMMIT``; each statement reads
  the latest committed rows (PostgreSQL READ COMMITTED underneath), so phantoms appear as on SQL
  Server.
* ``SERIALIZABLE``: as ``REPEATABLE READ``; its key-range locks (inserts into a read range wait)
  are not emulated.
* ``SNAPSHOT``: "SNAPSHOT transactions don't request locks when reading data" -- none (PostgreSQL
  REPEATABLE READ: one snapshot per transaction).

Rows are locked by running the statement ``FOR SHARE`` first and then reading it again: a ``FOR
SHARE`` read that waited for a writer returns the writer's new row version in the old row's place
(out of key order after a key update), which SQL Server's ordered index scans never do.

``WITH (TABLOCKX)`` -- what Debezium's ``exclusive`` mode sends (``SELECT TOP(0) * FROM ... WITH
(TABLOCKX)``) -- is PostgreSQL's ``LOCK TABLE ... IN EXCLUSIVE MODE``: it blocks writers and the
locking readers above, not plain (``SNAPSHOT``, ``READ UNCOMMITTED``) reads, as SQL Server's X
table lock leaves readers that take only schema-stability locks alone; held to ``COMMIT``.
``WITH (TABLOCK, HOLDLOCK)`` -- a shared table lock held to the end of the transaction (*Table
hints*: "TABLOCK ... if you also specify HOLDLOCK, the lock is held until the end of the
transaction", https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table; what a
whole read of a table without key columns sends) -- is ``LOCK TABLE ... IN SHARE MODE``: writers
(``ROW EXCLUSIVE``, as SQL Server writers take IX on the table) wait, readers do not, as S is
compatible with the IS of SQL Server's locking readers; held to ``COMMIT``.

``SET LOCK_TIMEOUT`` (milliseconds, ``-1`` waits forever, ``0`` not at all) becomes PostgreSQL's
``lock_timeout``; running out is error 1222, which cancels the statement and, as Microsoft's
*Customizing the Lock Time-Out* says, "Any transaction containing the statement, however, is not
rolled back".  A deadlock is error 1205: the victim's transaction is rolled back.  Reads of the
``sys`` and ``cdc`` schemas and statements PostgreSQL cannot lock (aggregates, ``DISTINCT``,
subqueries) take no locks.
"""

from __future__ import annotations

import re

from psycopg import errors as pgerr

from airflow_cdc.testing.sqlserver_emulator.server import SqlError

#: Isolation levels whose reads lock rows, and whether the locks last to the end of the transaction.
HOLD_TO_COMMIT = {"READ COMMITTED": False, "REPEATABLE READ": True, "SERIALIZABLE": True}

_SYSTEM_SCHEMAS = {"sys", "cdc", "information_schema", "pg_catalog"}
_NAME = r'(?:"(?:[^"]|"")+"|[A-Za-z_#][\w$#]*)'
_RELATION = re.compile(rf"\b(?:FROM|JOIN)\s+(?:({_NAME})\s*\.\s*)?({_NAME}|\()", re.IGNORECASE)
_UNLOCKABLE = re.compile(
    r"\b(?:GROUP\s+BY|DISTINCT|UNION|INTERSECT|EXCEPT|FOR\s+SHARE)\b"
    r"|\b(?:COUNT|SUM|MIN|MAX|AVG|OVER)\s*\(",
    re.IGNORECASE,
)
_TABLE_LOCK = re.compile(
    r"\s+WITH\s*\(\s*(TABLOCKX|TABLOCK\s*,\s*HOLDLOCK|HOLDLOCK\s*,\s*TABLOCK)\s*\)", re.IGNORECASE
)
_LOCK_TIMEOUT = re.compile(r"^SET\s+LOCK_TIMEOUT\s+(-?\d+)$", re.IGNORECASE)


def user_relations(translated: str) -> list[str] | None:
    """The relations a translated ``SELECT`` reads, when it reads only user tables and PostgreSQL
    can lock its rows; ``None`` otherwise (catalog reads, subqueries, aggregates)."""
    found = _RELATION.findall(translated)
    if not found or _UNLOCKABLE.search(translated):
        return None
    names = []
    for schema, name in found:
        if name == "(" or _unquote(schema or "").lower() in _SYSTEM_SCHEMAS:
            return None
        names.append(f"{schema}.{name}" if schema else name)
    return names


def strip_table_lock(stmt: str) -> tuple[str, str | None]:
    """``stmt`` without a table-lock hint, and the PostgreSQL lock mode the hint takes to the end
    of the transaction (``WITH (TABLOCKX)``: ``EXCLUSIVE``; ``WITH (TABLOCK, HOLDLOCK)``:
    ``SHARE``), or None without one."""
    m = _TABLE_LOCK.search(stmt)
    if m is None:
        return stmt, None
    mode = "EXCLUSIVE" if m.group(1).upper() == "TABLOCKX" else "SHARE"
    return stmt[: m.start()] + stmt[m.end() :], mode


def lock_timeout(stmt: str) -> int | None:
    """The milliseconds of a ``SET LOCK_TIMEOUT n`` statement (``None``: not one)."""
    m = _LOCK_TIMEOUT.match(stmt)
    return int(m.group(1)) if m else None


def pg_lock_timeout(ms: int) -> str:
    """PostgreSQL's ``lock_timeout`` for SQL Server's: ``-1`` (wait forever) is PostgreSQL's 0,
    SQL Server's 0 (do not wait) the shortest wait PostgreSQL has."""
    return "0" if ms < 0 else f"{max(ms, 1)}ms"


def lock_error(exc: Exception, pid: int) -> SqlError | None:
    """SQL Server's error for a lock wait that ended the statement (``None``: not one)."""
    if isinstance(exc, pgerr.LockNotAvailable):
        return SqlError(1222, "Lock request time out period exceeded.", severity=16, state=45)
    if isinstance(exc, pgerr.DeadlockDetected):
        return SqlError(
            1205,
            f"Transaction (Process ID {pid}) was deadlocked on lock resources with another process "
            "and has been chosen as the deadlock victim. Rerun the transaction.",
            severity=13,
            state=51,
        )
    return None


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name
