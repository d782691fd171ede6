"""PostgreSQL connection, server checks, slot and publication management, catalog look-ups.

Every failure becomes one of ``core.errors`` with the setting, privilege, table or slot named.
Passwords never appear in messages: we build the connection from parts and report host/port/user.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, NoReturn

import psycopg
from psycopg import sql

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    MissingPrivilege,
    SchemaError,
    ServerMisconfigured,
)
from airflow_cdc.core.filters import TableFilter, TableId
from airflow_cdc.core.session_sql import split_statements
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres import versions
from airflow_cdc.sources.postgres.types import PgTypeInfo

log = logging.getLogger(__name__)


def connect(config: ConnectorConfig, *, autocommit: bool = True) -> psycopg.Connection:
    """Open a connection with the session settings that fix every type's text output, then run
    ``database.initial.statements`` on it (committed, so a later rollback keeps them).

    :raises AuthenticationFailed: wrong user or password.
    :raises ConfigError: the database does not exist; an initial statement failed, or changed a
        setting the connector fixes.
    :raises ConnectionFailed: server unreachable.
    """
    try:
        conn = psycopg.connect(
            **connect_params(config, "airflow-cdc"), options=q.SESSION_OPTIONS, autocommit=autocommit
        )
    except psycopg.OperationalError as e:
        raise_connect_error(config, e)
    statements = split_statements(config["database.initial.statements"])
    if statements:
        try:
            run_initial_statements(conn, statements)
        except BaseException:
            conn.close()
            raise
    return conn


#: the settings :data:`q.SESSION_OPTIONS` fixes, whose text output the decoders rely on
FIXED_SETTINGS = tuple(re.findall(r"-c (\w+)=", q.SESSION_OPTIONS))
_SHOW_FIXED = "SELECT current_setting(name) FROM unnest(%s::text[]) WITH ORDINALITY AS s(name, i) ORDER BY i"


def run_initial_statements(conn: psycopg.Connection, statements: list[str]) -> None:
    """Run the operator's ``database.initial.statements`` and commit them.

    :raises ConfigError: a statement failed (named by its number and text), or one changed a
        setting whose text output the connector decodes (``DateStyle``, ``TimeZone`` ...).
    """
    fixed = [r[0] for r in conn.execute(_SHOW_FIXED, (list(FIXED_SETTINGS),)).fetchall()]
    for number, statement in enumerate(statements, 1):
        try:
            conn.execute(statement)  # the operator's own SQL, by definition
        except psycopg.Error as e:
            conn.rollback()
            raise ConfigError(
                f"database.initial.statements: statement {number} ({statement[:200]!r}) failed: "
                f"{str(e).strip()}; fix or remove it"
            ) from None
    after = [r[0] for r in conn.execute(_SHOW_FIXED, (list(FIXED_SETTINGS),)).fetchall()]
    for name, value, now in zip(FIXED_SETTINGS, fixed, after, strict=True):
        if now != value:
            raise ConfigError(
                f"database.initial.statements sets {name} to {now!r}; the connector decodes values "
                f"with {name}={value!r}: remove that statement"
            )
    conn.commit()


def connect_params(config: ConnectorConfig, application: str) -> dict[str, Any]:
    """psycopg connection arguments from the ``database.*`` properties (sync and async alike)."""
    tls = {
        key: config.secret(f"database.{key}")
        for key in ("sslcert", "sslkey", "sslrootcert", "sslpassword")
        if config.is_set(f"database.{key}")
    }
    return {
        **tls,
        "host": config["database.hostname"],
        "port": config["database.port"] or 5432,
        "user": config["database.user"],
        "password": config.secret("database.password"),
        "dbname": config["database.dbname"],
        "sslmode": config["database.sslmode"],
        "connect_timeout": 15,
        "application_name": f"{application}:{config['name']}",
    }


def raise_connect_error(config: ConnectorConfig, e: psycopg.OperationalError) -> NoReturn:
    """Map a failed connect to the product's errors, naming user@host but never the password."""
    host, port, user = config["database.hostname"], config["database.port"] or 5432, config["database.user"]
    text = str(e)
    if (
        "password authentication failed" in text
        or "no password supplied" in text
        or "role" in text
        and "does not exist" in text
    ):
        where = f"{user}@{host}:{port}/{config['database.dbname']}"
        raise AuthenticationFailed(f"PostgreSQL rejected the credentials for {where}") from None
    if "database" in text and "does not exist" in text:
        raise ConfigError(
            f"property 'database.dbname': database {config['database.dbname']!r} "
            f"does not exist on {host}:{port}"
        ) from None
    raise ConnectionFailed(
        f"cannot connect to PostgreSQL at {host}:{port}: {text.splitlines()[0] if text else type(e).__name__}"
    ) from e


def prefetch(cursor: psycopg.Cursor, size: int, depth: int = 2) -> Generator[list[Any], None, None]:
    """Yield ``cursor.fetchmany(size)`` batches until exhausted, fetched by a helper thread.

    The thread keeps up to ``depth`` batches ahead, so the server produces (and psycopg waits,
    without the GIL) while the caller decodes the previous batch: on two cores both run at once.
    Only the helper thread touches the cursor until it is done.  When the caller stops early
    (an exception, or closing the generator), the thread finishes its current fetch and exits
    before this generator returns, so the cursor can be closed safely afterwards.

    :raises: whatever ``fetchmany`` raised, in the caller's thread, after the batches before it.
    """
    batches: queue.Queue[list[Any] | BaseException | None] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            while not stop.is_set():
                batch = cursor.fetchmany(size)
                batches.put(batch or None)
                if not batch:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            batches.put(exc)

    worker = threading.Thread(target=produce, name="airflow-cdc-prefetch", daemon=True)
    worker.start()
    try:
        while (item := batches.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting for queue space
            try:
                batches.get(timeout=0.05)
            except queue.Empty:
                pass
        worker.join()


def check_server(conn: psycopg.Connection) -> dict[str, Any]:
    """Verify ``wal_level=logical`` and the REPLICATION attribute.

    :raises ServerMisconfigured: ``wal_level`` is not ``logical``.
    :raises MissingPrivilege: the user has neither REPLICATION nor superuser.
    """
    row = conn.execute(q.SERVER_CHECKS).fetchone()
    assert row is not None
    wal_level, version, can_replicate, is_super, user, dbname = row
    if wal_level != "logical":
        raise ServerMisconfigured(
            f"server setting 'wal_level' is {wal_level!r}; logical decoding needs 'logical'",
            hint="set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) "
            "and restart PostgreSQL",
        )
    if version < versions.OLDEST:
        raise ServerMisconfigured(
            f"PostgreSQL {versions.major(version)} is too old: the connector needs 13 or later "
            "(snapshot chunks use pg_current_snapshot())",
            hint="upgrade the server, or capture it with Debezium 2.x",
        )
    if not (can_replicate or is_super):
        raise MissingPrivilege(
            f"database user {user!r} lacks the REPLICATION attribute",
            hint=f"ALTER ROLE {sql.Identifier(user).as_string(conn)} REPLICATION",
        )
    standby = check_standby(conn, version)
    return {"version": version, "user": user, "dbname": dbname, "superuser": is_super, "standby": standby}


def check_standby(conn: psycopg.Connection, version: int) -> bool:
    """Whether the server is a standby; logical decoding there needs PostgreSQL 16.

    Without ``hot_standby_feedback`` the primary's vacuum may remove catalog rows the standby's
    slot still needs; recovery then invalidates the slot (a lost offset, reported as such), so it
    is only warned about.

    :raises ServerMisconfigured: a standby older than 16.
    """
    row = conn.execute(q.IN_RECOVERY).fetchone()
    assert row is not None
    standby, feedback = row
    if standby and version < versions.STANDBY_DECODING:
        raise ServerMisconfigured(
            f"the server is a standby running PostgreSQL {versions.major(version)}: logical decoding on a "
            "standby needs PostgreSQL 16 or later",
            hint="point database.hostname at the primary, or upgrade the standby cluster to 16+",
        )
    if standby and not feedback:
        log.warning(
            "capturing from a standby with hot_standby_feedback=off: the primary may remove catalog rows "
            "the slot needs, and recovery then invalidates the slot (set hot_standby_feedback=on and a "
            "physical slot, primary_slot_name)"
        )
    return bool(standby)


def check_commit_visibility(conn: psycopg.Connection) -> None:
    """Verify that snapshot chunks can see which commits wait for a synchronous standby.

    Such a commit is in the WAL (an earlier window may have captured it) but invisible to a
    chunk's snapshot; chunks wait until no backend waits on ``SyncRep``.  Other roles' wait events
    are only shown to superusers and members of ``pg_read_all_stats``: without that the wait would
    be blind and a chunk could overwrite a captured change with the row before it.

    :raises MissingPrivilege: ``synchronous_standby_names`` is set and the user cannot see them.
    """
    row = conn.execute(q.SYNC_VISIBILITY_CHECK).fetchone()
    assert row is not None
    standbys, can_see, user = row
    if standbys and not can_see:
        raise MissingPrivilege(
            f"database user {user!r} cannot see which commits wait for a synchronous standby "
            f"(synchronous_standby_names = {standbys!r}): a snapshot chunk could miss a captured change",
            hint=f"GRANT pg_read_all_stats TO {sql.Identifier(user).as_string(conn)}",
        )


@dataclass
class Column:
    name: str
    type_oid: int
    typmod: int
    not_null: bool
    type_sql: str


@dataclass
class TableMeta:
    id: TableId
    oid: int
    columns: list[Column]
    key: list[str]
    replica_identity: str

    @property
    def keyless(self) -> str | None:
        """How silver holds a table without key columns (None: it has some): ``multiset`` with
        ``REPLICA IDENTITY FULL`` (every old row is sent whole), else ``append`` (no old row:
        PostgreSQL refuses UPDATE and DELETE on such a published table)."""
        if self.key:
            return None
        return "multiset" if self.replica_identity == "f" else "append"


class Catalog:
    """Cached catalog look-ups on one connection."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self._types: dict[int, PgTypeInfo] = {}
        self._meta: dict[tuple[int, TableId], TableMeta] = {}

    def on_connection(self, conn: psycopg.Connection) -> Catalog:
        """A catalog on ``conn`` that starts from what this one has read: a snapshot reader sees
        the tables' columns as the capture run does, whatever DDL ran since."""
        other = Catalog(conn)
        other._types, other._meta = dict(self._types), dict(self._meta)
        return other

    def type_info(self, oid: int) -> PgTypeInfo:
        if oid not in self._types:
            row = self.conn.execute(q.TYPE_INFO, (oid,)).fetchone()
            if row is None:
                raise SchemaError(f"type with OID {oid} not found in pg_type")
            _, name, kind, elem, base, base_typmod, labels = row
            self._types[oid] = PgTypeInfo(
                oid=oid,
                name=name,
                kind=kind,
                element=self.type_info(elem) if elem and name.startswith("_") else None,
                base=self.type_info(base) if kind == "d" and base else None,
                base_typmod=base_typmod,
                enum_labels=tuple(labels or ()),
            )
        return self._types[oid]

    def tables(self, filters: TableFilter, via_root: bool) -> list[tuple[TableId, int, str]]:
        """Included tables as (id, oid, relkind); partitions are folded into their root when
        ``publish.via.partition.root`` is on, otherwise partitioned parents are skipped."""
        out = []
        for schema, name, oid, relkind, _ident, is_partition in self.conn.execute(q.LIST_TABLES):
            tid = TableId(schema, name)
            if (via_root and is_partition) or (not via_root and relkind == "p"):
                continue
            if filters.includes_table(tid):
                out.append((tid, oid, relkind))
        return out

    def table_meta(self, tid: TableId, oid: int, filters: TableFilter) -> TableMeta:
        """Columns and key of a table (cached for this catalog's life: one capture run).

        The key is the ``message.key.columns`` entry, else the primary key, else the
        ``REPLICA IDENTITY USING INDEX`` index (unique and NOT NULL); a table with none of them
        has no key columns (see :attr:`TableMeta.keyless`).

        :raises ConfigError: ``message.key.columns`` names a column the table lacks.
        """
        cached = self._meta.get((oid, tid))
        if cached is not None:
            return cached
        cols = [Column(*row) for row in self.conn.execute(q.TABLE_COLUMNS, (oid,))]
        ident = self.conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s", (oid,)).fetchone()
        key = filters.message_key_columns(tid) or [r[0] for r in self.conn.execute(q.PRIMARY_KEY, (oid,))]
        if not key and ident and ident[0] == "i":
            key = [r[0] for r in self.conn.execute(q.IDENTITY_INDEX, (oid,))]
        names = {c.name for c in cols}
        missing = [k for k in key if k not in names]
        if missing:
            raise ConfigError(f"property 'message.key.columns': table {tid} has no column(s) {missing}")
        meta = TableMeta(tid, oid, cols, list(key), ident[0] if ident else "d")
        self._meta[(oid, tid)] = meta
        return meta

    def check_select(self, meta: TableMeta) -> None:
        row = self.conn.execute(q.TABLE_PRIVILEGE, (meta.oid,)).fetchone()
        if not row or not row[0]:
            raise MissingPrivilege(
                f"database user lacks SELECT on table {meta.id}",
                hint=f"GRANT SELECT ON {q.qualified(meta.id.schema, meta.id.table).as_string(self.conn)} "
                "TO <connector user>",
            )


def check_connection(config: ConnectorConfig) -> str:
    """Connect and run the start-up checks of a capture (nothing is created or changed)."""
    with connect(config) as conn:
        info = check_server(conn)
        check_commit_visibility(conn)
    return (
        f"PostgreSQL {info['version']} database {info['dbname']!r}: wal_level=logical, "
        f"user {info['user']!r} may replicate"
    )
