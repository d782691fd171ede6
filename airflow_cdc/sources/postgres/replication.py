"""Replication slot and publication management (``slot.name``, ``publication.name``,
``publication.autocreate.mode``, ``publish.via.partition.root``).

The publication is ensured *before* the slot is created: pgoutput looks publications up in the
historic catalog, so a slot older than its publication cannot decode the WAL in between.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from airflow_cdc.core.errors import ConfigError, MissingPrivilege, ServerMisconfigured
from airflow_cdc.core.filters import TableId
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres import versions
from airflow_cdc.sources.postgres.position import format_pg_lsn, parse_pg_lsn

log = logging.getLogger(__name__)


@dataclass
class SlotInfo:
    name: str
    plugin: str
    database: str
    active: bool
    confirmed_flush: int | None
    wal_status: str | None
    conflicting: bool | None = None  # 16+
    failover: bool | None = None  # 17+
    invalidation_reason: str | None = None  # 17+

    def lost(self) -> str | None:
        """Why the slot cannot be read any more (None: it can).  ``wal_status`` says so on every
        version; 16 adds ``conflicting`` (a standby's slot invalidated by recovery conflicts) and 17
        ``invalidation_reason`` (wal_removed, rows_removed, wal_level_insufficient, idle_timeout)."""
        status = f"wal_status={self.wal_status}"
        if self.invalidation_reason:
            return f"it was invalidated (invalidation_reason={self.invalidation_reason}, {status})"
        if self.conflicting:
            return f"it was invalidated by a recovery conflict (conflicting=true, {status})"
        if self.wal_status == "lost":
            return "it has lost required WAL (wal_status=lost)"
        return None


def slot_info(conn: psycopg.Connection, name: str) -> SlotInfo | None:
    row = conn.execute(q.slot_info_query(conn.info.server_version), (name,)).fetchone()  # type: ignore[arg-type]
    if row is None:
        return None
    slot, plugin, slot_type, database, active, confirmed, _restart, wal_status, *newer = row
    if slot_type != "logical":
        raise ConfigError(f"property 'slot.name': slot {name!r} is a physical slot, not a logical one")
    confirmed_lsn = parse_pg_lsn(confirmed) if confirmed else None
    return SlotInfo(slot, plugin, database, active, confirmed_lsn, wal_status, *newer)


def check_failover(conn: psycopg.Connection, failover: bool, *, standby: bool = False) -> None:
    """Refuse ``slot.failover`` below PostgreSQL 17 (failover slots are new in 17) and on a
    standby (PostgreSQL refuses failover slots there: they are synchronised *to* standbys).

    :raises ConfigError: naming the property and the server's version.
    """
    version = conn.info.server_version
    if failover and standby:
        raise ConfigError(
            "property 'slot.failover': the server is a standby, where PostgreSQL allows no failover slots",
            hint="set slot.failover=false, or capture from the primary",
        )
    if failover and version < versions.FAILOVER_SLOTS:
        raise ConfigError(
            f"property 'slot.failover': failover slots need PostgreSQL 17 or later; this server is "
            f"{versions.major(version)}",
            hint="set slot.failover=false (and keep a standby's slot with an external tool), or upgrade",
        )


def make_failover(config: Any, name: str) -> None:
    """Turn an existing slot into a failover slot (``slot.failover`` on a slot created without it):
    ``ALTER_REPLICATION_SLOT`` is a replication-protocol command, sent on a connection of its own.

    :raises MissingPrivilege: the server refused the command.
    """
    from airflow_cdc.sources.postgres import client

    params = client.connect_params(config, "airflow-cdc")
    with psycopg.connect(**params, replication="database", autocommit=True) as rconn:
        ident = '"' + name.replace('"', '""') + '"'
        res = rconn.pgconn.exec_(f"ALTER_REPLICATION_SLOT {ident} ( FAILOVER true )".encode())
        if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
            message = res.error_message.decode(errors="replace").strip()
            raise MissingPrivilege(
                f"property 'slot.failover': cannot make slot {name!r} a failover slot: {message}",
                hint=f"drop the slot and let the connector create it, or run ALTER_REPLICATION_SLOT "
                f"{ident} (FAILOVER true) on a replication connection",
            )
    log.info("replication slot %r is a failover slot now (slot.failover)", name)


def check_slot(info: SlotInfo, dbname: str) -> None:
    """:raises ConfigError: the slot belongs to another database or uses another plugin."""
    if info.database != dbname:
        raise ConfigError(
            f"property 'slot.name': slot {info.name!r} belongs to database {info.database!r}, not {dbname!r}"
        )
    if info.plugin != "pgoutput":
        raise ConfigError(
            f"property 'slot.name': slot {info.name!r} uses plugin {info.plugin!r}; "
            "only pgoutput is supported (plugin.name=pgoutput)"
        )


def create_slot(conn: psycopg.Connection, name: str, *, failover: bool = False) -> int:
    """Create the logical slot; returns its consistent point.  Waits for running transactions.

    :param failover: a failover slot (``slot.failover``, PostgreSQL 17+: synchronised to standbys
        that set ``sync_replication_slots``).
    """
    if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
        log.info(
            "creating replication slot %r on a standby: it waits for the primary to log its running "
            "transactions (every 15 s while it writes; SELECT pg_log_standby_snapshot() on the primary "
            "does it at once)",
            name,
        )
    try:
        row = conn.execute(q.CREATE_FAILOVER_SLOT if failover else q.CREATE_SLOT, (name,)).fetchone()
    except pgerr.InsufficientPrivilege as e:
        raise MissingPrivilege(f"cannot create replication slot {name!r}: {e.diag.message_primary}") from e
    except pgerr.ObjectNotInPrerequisiteState as e:
        raise ServerMisconfigured(
            f"cannot create replication slot {name!r}: {e.diag.message_primary}",
            hint="check wal_level=logical and max_replication_slots",
        ) from e
    except pgerr.ConfigurationLimitExceeded as e:
        raise ServerMisconfigured(
            f"cannot create replication slot {name!r}: {e.diag.message_primary}",
            hint="raise max_replication_slots or drop unused slots",
        ) from e
    assert row is not None
    log.info("created replication slot %r at %s%s", name, row[0], " (failover)" if failover else "")
    return parse_pg_lsn(row[0])


def wait_slot_free(conn: psycopg.Connection, name: str, application_name: str, timeout: float = 60.0) -> None:
    """Wait until no backend holds the slot.  A backend left by a killed run of this same connector
    (same ``application_name``) is terminated: the caller holds the connector's lease
    (:mod:`airflow_cdc.core.lease`, taken before the source is opened), so such a backend belongs
    to a run whose lease has ended (killed, or fenced out) and that can never publish or commit.

    :raises ServerMisconfigured: another consumer keeps the slot busy past ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT s.active_pid, a.application_name FROM pg_replication_slots s "
            "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = %s",
            (name,),
        ).fetchone()
        if row is None or row[0] is None:
            return
        pid, app = row
        if app == application_name:
            log.warning("terminating orphaned backend %s of an earlier run still holding slot %r", pid, name)
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if time.monotonic() > deadline:
            raise ServerMisconfigured(
                f"replication slot {name!r} is in use by backend {pid} ({app!r})",
                hint="make sure only one consumer uses the slot (slot.name)",
            )
        time.sleep(0.1)


def wait_slot_released(conn: psycopg.Connection, name: str, pid: int, timeout: float = 10.0) -> None:
    """Wait until backend ``pid`` (our own walsender, whose connection was just closed) no longer
    holds the slot, so the commit that follows does not take it for an orphan.  Gives up quietly
    after ``timeout``: :func:`wait_slot_free` still handles a backend that lingers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(q.SLOT_HOLDER, (name,)).fetchone()
        if row is None or row[0] != pid:
            return
        time.sleep(0.005)


def drop_slot(conn: psycopg.Connection, name: str) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,)
    )


def advance_slot(conn: psycopg.Connection, name: str, lsn: int) -> None:
    """Move the slot's confirmed position to ``lsn`` (never backward) so the server frees WAL."""
    info = slot_info(conn, name)
    if info is None or info.confirmed_flush is None or info.confirmed_flush >= lsn:
        return
    conn.execute(q.ADVANCE_SLOT, (name, format_pg_lsn(lsn)))


def ensure_publication(
    conn: psycopg.Connection, name: str, mode: str, tables: list[TableId], via_root: bool
) -> None:
    """Create or align the publication according to ``publication.autocreate.mode``.

    Does nothing when the publication already matches.  Raises :class:`ServerMisconfigured` if
    it is missing with mode ``disabled``, :class:`MissingPrivilege` if the user may not create it.
    """
    if mode == "filtered" and not tables:
        raise ConfigError(
            "publication.autocreate.mode=filtered but no table matches the "
            "table/schema include and exclude lists"
        )
    row = conn.execute(q.PUBLICATION_INFO, (name,)).fetchone()
    ident = sql.Identifier(name)
    option = sql.SQL(" WITH (publish_via_partition_root = {})").format(
        sql.SQL("true" if via_root else "false")
    )
    table_list = sql.SQL(", ").join(q.qualified(t.schema, t.table) for t in tables)
    try:
        if row is None:
            if mode == "disabled":
                raise ServerMisconfigured(
                    f"publication {name!r} does not exist and publication.autocreate.mode is 'disabled'",
                    hint=f"create it (CREATE PUBLICATION {ident.as_string(conn)} FOR TABLE ...) or set "
                    "publication.autocreate.mode to all_tables or filtered",
                )
            body = {
                "all_tables": sql.SQL(" FOR ALL TABLES"),
                "no_tables": sql.SQL(""),
                "filtered": sql.SQL(" FOR TABLE ") + table_list,
            }[mode]
            conn.execute(sql.SQL("CREATE PUBLICATION {}").format(ident) + body + option)
            log.info("created publication %r (mode %s)", name, mode)
            return
        all_tables, pub_via_root = row
        if mode == "filtered" and not all_tables:
            published = {TableId(s, t) for s, t in conn.execute(q.PUBLICATION_TABLES, (name,))}
            if published != set(tables):
                conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE ").format(ident) + table_list)
                log.info("publication %r now publishes %d table(s)", name, len(tables))
        if mode != "disabled" and bool(pub_via_root) != via_root:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = {})").format(
                    ident, sql.SQL("true" if via_root else "false")
                )
            )
    except pgerr.ReadOnlySqlTransaction as e:
        raise ServerMisconfigured(
            f"publication {name!r} must be created or changed, and the server is a standby "
            f"(publication.autocreate.mode={mode}): {e.diag.message_primary}",
            hint="create or alter the publication on the primary (it replicates to the standby), then use "
            "publication.autocreate.mode=disabled",
        ) from e
    except pgerr.InsufficientPrivilege as e:
        raise MissingPrivilege(
            f"cannot create or alter publication {name!r}: {e.diag.message_primary}",
            hint="create the publication as a superuser or table owner, then use "
            "publication.autocreate.mode=disabled",
        ) from e
