"""A :class:`~airflow_cdc.core.state.StateStore` in a table of any SQL database reached through PEP 249.

Tested with ``sqlite3``, ``psycopg`` (3) and ``pymysql`` (MySQL/MariaDB).  The table is created on
first use when missing::

    connector  varchar(255) primary key
    version    bigint       -- 1 on first commit, +1 per commit
    state      text         -- the state as compact JSON (LONGTEXT on MySQL: TEXT stops at 64 KiB)
    updated_at varchar(40)  -- ISO-8601 UTC

Compare-and-set is a single ``UPDATE ... SET version = version + 1 ... WHERE connector = ? AND
version = ?`` whose row count tells whether it won (or an ``INSERT`` that a primary-key violation
rejects when the caller expects no state), committed before returning.  The database's row locks
make concurrent writers serialise, so exactly one of several racing runs wins.  Identifiers are
always quoted for the dialect; values are always bound parameters.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from airflow_cdc.core.errors import ConfigError, StateConflict
from airflow_cdc.core.state import (
    StateCorrupt,
    StoredState,
    check_connector,
    check_expected_version,
    decode_state,
    encode_state,
    utc_now_iso,
)

_DIALECT_ALIASES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite": "sqlite",
    "sqlite3": "sqlite",
}
_DRIVER_DIALECTS = {
    "psycopg": "postgresql",
    "psycopg2": "postgresql",
    "pg8000": "postgresql",
    "pymysql": "mysql",
    "MySQLdb": "mysql",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite3": "sqlite",
}
_CREATE = (
    "CREATE TABLE IF NOT EXISTS {t} (connector varchar(255) NOT NULL PRIMARY KEY, version bigint NOT NULL, "
    "state %s NOT NULL, updated_at varchar(40) NOT NULL)"
)
_CREATE_TABLE = {
    "postgresql": _CREATE % "text",
    "sqlite": _CREATE % "text",
    "mysql": _CREATE % "longtext" + " DEFAULT CHARSET=utf8mb4",  # TEXT would stop at 64 KiB
}


def quote_identifier(name: str, dialect: str) -> str:
    """Quote one identifier for ``dialect``, doubling embedded quote characters.

    :param name: the identifier as it should appear in the catalog.
    :param dialect: ``postgresql``, ``mysql`` or ``sqlite``.
    :raises ConfigError: for an empty name or one containing a NUL character.
    """
    if not name or "\x00" in name:
        raise ConfigError(f"invalid SQL identifier {name!r}")
    quote = "`" if dialect == "mysql" else '"'
    return quote + name.replace(quote, quote * 2) + quote


class SqlStateStore:
    """Connector states in a table reached through PEP 249 connections.

    ``connect`` is called for every operation; the store commits (or rolls back) and closes each
    connection it gets, so the store is safe to share between threads.

    :param connect: returns a new DB-API connection (autocommit off).
    :param table: table name, optionally ``schema.table`` (split at the first dot); the name is
        quoted, so it is case-sensitive and may contain any character but NUL.
    :param dialect: ``postgresql``, ``mysql`` or ``sqlite``; detected from the connection's
        driver module when ``None``.
    :param description: what :meth:`describe` returns (must not contain secrets).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        table: str = "airflow_cdc_state",
        dialect: str | None = None,
        *,
        description: str | None = None,
    ) -> None:
        if dialect is not None and dialect.lower() not in _DIALECT_ALIASES:
            raise ConfigError(f"unsupported SQL dialect {dialect!r}; use postgresql, mysql or sqlite")
        self._connect = connect
        self.table = table
        self.dialect = _DIALECT_ALIASES[dialect.lower()] if dialect else None
        self._description = description
        self._ready = False
        self._ready_lock = threading.Lock()
        self._paramstyle = "qmark"
        self._driver: ModuleType | None = None
        schema, name = table.split(".", 1) if "." in table else ("", table)
        self._schema = schema
        self._name = name
        self._leases: SqlStateStore | None = None

    def lease_store(self) -> SqlStateStore:
        """The lease records, in the table ``<table>_lease`` beside the state table."""
        if self._leases is None:
            self._leases = SqlStateStore(
                self._connect, f"{self.table}_lease", self.dialect, description=f"{self.describe()} (leases)"
            )
        return self._leases

    def describe(self) -> str:
        """Return the location: the description given, else ``<dialect> table <name>``."""
        return self._description or f"{self.dialect or 'sql'} table {self.table}"

    def __repr__(self) -> str:
        return f"SqlStateStore({self.describe()!r})"

    # -- connection handling -------------------------------------------------------------------

    def _bind_driver(self, conn: Any) -> None:
        root = type(conn).__module__.split(".")[0]
        driver = sys.modules.get(root)
        if self.dialect is None:
            if root not in _DRIVER_DIALECTS:
                raise ConfigError(f"cannot tell the SQL dialect of a {root} connection; pass dialect=")
            self.dialect = _DRIVER_DIALECTS[root]
        self._driver = driver
        self._paramstyle = getattr(driver, "paramstyle", "qmark" if self.dialect == "sqlite" else "format")
        quoted = quote_identifier(self._name, self.dialect)
        if self._schema:
            quoted = f"{quote_identifier(self._schema, self.dialect)}.{quoted}"
        self._table_sql = quoted

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """Yield a cursor in a new transaction; commit when the block succeeds, else roll back."""
        conn = self._connect()
        try:
            if self._driver is None or not self._ready:
                with self._ready_lock:
                    if self._driver is None:
                        self._bind_driver(conn)
                    if not self._ready:
                        self._ensure_table(conn)
                        self._ready = True
            cur = conn.cursor()
            try:
                yield cur
            finally:
                with contextlib.suppress(Exception):
                    cur.close()
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def _render(self, template: str, values: Sequence[Any] = ()) -> tuple[str, Any]:
        """Turn ``{t}`` into the quoted table and each ``{p}`` into the driver's placeholder."""
        pieces = template.split("{p}")
        assert len(pieces) == len(values) + 1, template
        style = self._paramstyle
        escape = values and style in ("format", "pyformat")  # only then does the driver interpret "%"
        table = self._table_sql.replace("%", "%%") if escape else self._table_sql
        marks = {"qmark": lambda i: "?", "numeric": lambda i: f":{i + 1}", "named": lambda i: f":p{i}"}.get(
            style, lambda i: "%s"
        )
        sql = pieces[0] + "".join(marks(i) + piece for i, piece in enumerate(pieces[1:]))
        params = {f"p{i}": v for i, v in enumerate(values)} if style == "named" else tuple(values)
        return sql.replace("{t}", table), params

    def _execute(self, cur: Any, template: str, values: Sequence[Any] = ()) -> Any:
        sql, params = self._render(template, values)
        if values:
            cur.execute(sql, params)
        else:
            cur.execute(sql)
        return cur

    def _ensure_table(self, conn: Any) -> None:
        """Create the table unless a probe query shows it exists (creation is retried once on a race)."""
        error = getattr(self._driver, "Error", Exception)
        cur = conn.cursor()
        try:
            try:
                self._execute(cur, "SELECT 1 FROM {t} WHERE 1 = 0").fetchall()
                conn.commit()
                return
            except error:
                conn.rollback()
            for attempt in range(2):
                try:
                    self._create_table(cur)
                    conn.commit()
                    return
                except error:
                    conn.rollback()
                    if attempt:
                        raise
        finally:
            with contextlib.suppress(Exception):
                cur.close()

    def _create_table(self, cur: Any) -> None:
        assert self.dialect is not None
        if self._schema and self.dialect == "postgresql":
            self._execute(cur, "CREATE SCHEMA IF NOT EXISTS " + quote_identifier(self._schema, self.dialect))
        self._execute(cur, _CREATE_TABLE[self.dialect])

    # -- the StateStore contract ---------------------------------------------------------------

    def load(self, connector: str) -> StoredState | None:
        """Return the committed state of ``connector`` or ``None``.

        :param connector: connector name.
        :raises StateCorrupt: when the stored row cannot be decoded.
        """
        check_connector(connector)
        with self._transaction() as cur:
            row = self._execute(
                cur, "SELECT version, state, updated_at FROM {t} WHERE connector = {p}", (connector,)
            ).fetchone()
        if row is None:
            return None
        version, text, updated_at = row
        try:
            return StoredState(
                version=int(version),
                data=decode_state(str(text), self.describe()),
                updated_at=str(updated_at),
            )
        except ValueError as exc:
            raise StateCorrupt(
                f"state of connector {connector!r} in {self.describe()} is unreadable: {exc}"
            ) from exc

    def compare_and_set(self, connector: str, expected_version: int | None, data: dict[str, Any]) -> int:
        """Commit ``data`` if the stored version is ``expected_version``; return the new version.

        :param connector: connector name.
        :param expected_version: version the caller loaded, ``None`` when it found no state.
        :param data: the new state (a JSON object).
        :raises StateConflict: when the stored version differs (another run committed first).
        """
        check_connector(connector)
        check_expected_version(expected_version)
        text, now = encode_state(data), utc_now_iso()
        if expected_version is None:
            return self._insert(connector, text, now)
        with self._transaction() as cur:
            cur = self._execute(
                cur,
                "UPDATE {t} SET version = version + 1, state = {p}, updated_at = {p}"
                " WHERE connector = {p} AND version = {p}",
                (text, now, connector, expected_version),
            )
            if cur.rowcount != 1:
                raise self._conflict(connector, expected_version)
        return expected_version + 1

    def _insert(self, connector: str, text: str, now: str) -> int:
        try:
            with self._transaction() as cur:
                self._execute(
                    cur,
                    "INSERT INTO {t} (connector, version, state, updated_at) VALUES ({p}, 1, {p}, {p})",
                    (connector, text, now),
                )
        except Exception as exc:
            integrity_error = getattr(self._driver, "IntegrityError", None)
            if integrity_error is not None and isinstance(exc, integrity_error):
                raise self._conflict(connector, None) from exc
            raise
        return 1

    def _conflict(self, connector: str, expected_version: int | None) -> StateConflict:
        return StateConflict(
            f"state of connector {connector!r} in {self.describe()} is not at version {expected_version}; "
            "another run committed first"
        )

    def delete(self, connector: str) -> None:
        """Remove the state of ``connector``; no error when it has none.

        :param connector: connector name.
        """
        check_connector(connector)
        with self._transaction() as cur:
            self._execute(cur, "DELETE FROM {t} WHERE connector = {p}", (connector,))
