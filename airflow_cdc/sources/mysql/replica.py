"""Capturing from a replica: what is checked and logged at each run's start, and the heartbeat query.

The connector writes nothing to the source (chunk watermarks are binlog coordinates read inside each
chunk's consistent snapshot, signal-table rows are read from the binlog, offsets live in the state
store), so a read-only replica is captured like any server -- from its own binlog, which holds what it
replicated only with ``log_slave_updates`` (MySQL 8.0.26+: ``log_replica_updates``).  Without it the
replicated tables would be snapshotted and then never seen changing: a replicating server without it
is refused at start.

A replica that lags, or whose replication stopped, loses nothing: chunks and windows read the
replica as it is, and the primary's later changes reach its binlog -- and the runs after -- once
replication catches up.  What the capture cannot see yet is logged at each run's start: replication
stopped (with the server's error), or the lag.  Reading them takes ``SLAVE MONITOR`` on MariaDB
(``REPLICATION CLIENT`` on MySQL, which capture needs anyway); without it a MariaDB replica is seen
through the counters every user may read (``Slaves_running``, ``gtid_slave_pos``), without lag or
error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_cdc.core.errors import ConfigError, ServerMisconfigured
from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql.flavour import Flavour

log = logging.getLogger(__name__)

#: a replica at least this far behind its primary is logged as a warning (below: info)
LAG_WARNING_SECONDS = 60
#: server errors that refuse a write: read-only transaction / server, command or database denied
_WRITE_REFUSED = frozenset({1792, 1290, 1142, 1044, 1227})
_UNKNOWN = "?"


@dataclass(frozen=True)
class Replication:
    """One replication connection of the server (a MariaDB connection name, a MySQL channel).

    ``io``/``sql``: the threads' states as the server says them (``Yes``, ``No``, ``Connecting``;
    ``?`` when the status cannot be read); ``lag``: seconds behind the primary (None: unknown or
    stopped); ``applied``: the GTID position it applied.
    """

    name: str
    io: str
    sql: str
    lag: int | None
    error: str
    applied: str

    @property
    def running(self) -> bool:
        return self.sql == "Yes" and self.io in ("Yes", _UNKNOWN)

    def describe(self) -> str:
        """``replication 'name'`` (the default connection has no name)."""
        return f"replication {self.name!r}" if self.name else "replication"


def _column(row: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` present in a status row (MySQL renamed Slave/Master to Replica/Source)."""
    for name in names:
        if name in row:
            return row[name]
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else "" if value is None else str(value)


def _parse(row: Mapping[str, Any]) -> Replication:
    lag = _text(_column(row, "Seconds_Behind_Master", "Seconds_Behind_Source"))
    errors = [_text(row.get(k)) for k in ("Last_IO_Error", "Last_SQL_Error")]
    return Replication(
        name=_text(_column(row, "Connection_name", "Channel_Name", "Channel_name")),
        io=_text(_column(row, "Slave_IO_Running", "Replica_IO_Running")),
        sql=_text(_column(row, "Slave_SQL_Running", "Replica_SQL_Running")),
        lag=int(lag) if lag.isdigit() else None,
        error="; ".join(e for e in errors if e),
        applied=_text(_column(row, "Gtid_Slave_Pos", "Executed_Gtid_Set")).replace("\n", ""),
    )


def connections(conn: Any, flavour: Flavour) -> list[Replication]:
    """The server's replication connections; ``[]`` when it replicates from no primary.

    Without the privilege to read the replica status (MariaDB ``SLAVE MONITOR``), from the
    counters: a running SQL thread, or an applied GTID position on a ``read_only`` server, is one
    connection whose I/O thread, lag and error are unknown.
    """
    try:
        with conn.cursor() as cur:
            cur.execute(flavour.replica_status_sql)
            names = [str(d[0]) for d in cur.description or ()]
            rows = list(cur.fetchall())
    except pymysql.err.OperationalError as e:
        if not e.args or e.args[0] not in (1227, 1142) or not flavour.is_mariadb:
            raise
        return _from_counters(conn)
    return [_parse(dict(zip(names, row, strict=True))) for row in rows]


def _from_counters(conn: Any) -> list[Replication]:
    status = dict(client.query(conn, "SHOW GLOBAL STATUS WHERE Variable_name = 'Slaves_running'"))
    running = int(_text(status.get("Slaves_running")) or 0) > 0
    applied, read_only = (
        _text(v) for v in client.query(conn, "SELECT @@GLOBAL.gtid_slave_pos, @@GLOBAL.read_only")[0]
    )
    if not running and not (applied and read_only in ("1", "ON")):
        return []
    return [Replication("", _UNKNOWN, "Yes" if running else "No", None, "", applied)]


def check(conn: Any, flavour: Flavour) -> list[Replication]:
    """Refuse a replica whose binlog lacks what it replicates; log how far it is (each run's start).

    :raises ServerMisconfigured: the server replicates with ``log_slave_updates`` off.
    """
    links = connections(conn, flavour)
    if not links:
        return links
    names = ("log_slave_updates", "log_replica_updates")
    logged = client.query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN (%s, %s)", names)
    if not any(_text(v).upper() in ("ON", "1") for _, v in logged):
        raise ServerMisconfigured(
            "this server is a replica whose binlog does not hold what it replicates "
            "(log_slave_updates is OFF): the primary's changes would never reach the capture",
            hint="set log_slave_updates=ON (MySQL 8.0.26+: log_replica_updates) on the replica and "
            "restart it, or capture from the primary",
        )
    for link in links:
        _log(link)
    return links


def _log(link: Replication) -> None:
    if not link.running:
        log.warning(
            "capturing from a replica whose %s is stopped (I/O thread: %s, SQL thread: %s%s): the "
            "primary's changes after GTID position %s reach this capture only once it runs again; "
            "nothing is lost meanwhile (snapshot chunks and windows read this replica as it is)%s",
            link.describe(),
            link.io,
            link.sql,
            f"; error: {link.error}" if link.error else "",
            link.applied or "(none)",
            "; grant SLAVE MONITOR to the connector user to see why" if link.io == _UNKNOWN else "",
        )
    elif link.lag is not None and link.lag >= LAG_WARNING_SECONDS:
        log.warning(
            "capturing from a replica %d s behind its primary (%s): this run captures the primary's "
            "changes up to there, later ones come with later runs",
            link.lag,
            link.describe(),
        )
    else:
        lag = "lag unknown" if link.lag is None else f"{link.lag} s behind its primary"
        log.info("capturing from a replica (%s running, %s)", link.describe(), lag)


def heartbeat(conn: Any, sql: str, read_only: bool) -> None:
    """Run ``heartbeat.action.query`` (the operator's own SQL).

    A write the server refuses -- a read-only replica, a missing privilege, or any write under
    ``read.only`` (a read-only session) -- fails the run: Debezium stops the same way on a refused
    heartbeat (SQLSTATE 42000), and a heartbeat that silently does nothing would hide it.

    :raises ConfigError: the server refused the query as a write.
    """
    try:
        client.query(conn, sql)
    except pymysql.err.MySQLError as e:
        code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
        if code not in _WRITE_REFUSED:
            raise
        why = (
            "read.only=true makes every connection of the connector read-only"
            if read_only
            else "the server is read-only, or the connector user may not write"
        )
        raise ConfigError(
            f"property 'heartbeat.action.query': the server refused it ({code}: "
            f"{e.args[1] if len(e.args) > 1 else e}); {why}",
            hint="a read-only replica cannot run a writing heartbeat: remove heartbeat.action.query "
            "(or make it a SELECT), or run the heartbeat against the primary",
        ) from e
