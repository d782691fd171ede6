"""Replication slot and publication management (``slot.name``, ``publication.name``,
``publication.autocreate.mode``, ``publish.via.partition.root``).

The publication is ensured *before* the slot is created: pgoutput looks publications up in the
historic catalog, so a slot older than its publication cannot decode the WAL in between.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from airflow_cdc.core.errors import ConfigError, MissingPrivilege, ServerMisconfigured
from airflow_cdc.core.filters import TableId
from airflow_cdc.sources.postgres import sql as q
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


def slot_info(conn: psycopg.Connection, name: str) -> SlotInfo | None:
    row = conn.execute(q.SLOT_INFO, (name,)).fetchone()
    if row is None:
        return None
    slot, plugin, slot_type, database, active, confirmed, _restart, wal_status = row
    if slot_type != "logical":
        raise ConfigError(f"property 'slot.name': slot {name!r} is a physical slot, not a logical one")
    return SlotInfo(
        slot, plugin, database, active, parse_pg_lsn(confirmed) if confirmed else None, wal_status
    )


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


def create_slot(conn: psycopg.Connection, name: str) -> int:
    """Create the logical slot; returns its consistent point.  Waits for running transactions."""
    try:
        row = conn.execute(q.CREATE_SLOT, (name,)).fetchone()
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
    log.info("created replication slot %r at %s", name, row[0])
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
    except pgerr.InsufficientPrivilege as e:
        raise MissingPrivilege(
            f"cannot create or alter publication {name!r}: {e.diag.message_primary}",
            hint="create the publication as a superuser or table owner, then use "
            "publication.autocreate.mode=disabled",
        ) from e
