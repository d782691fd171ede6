"""Start-up checks of the SQL Server source, each failing with an error that says what to do."""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow_cdc.core.errors import ConfigError, MissingPrivilege, OffsetUnavailable, ServerMisconfigured
from airflow_cdc.sources.sqlserver import sql
from airflow_cdc.sources.sqlserver.client import scalar
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import CaptureInstance

log = logging.getLogger(__name__)
#: SQL Server's errors for a missing server-level permission: 300 ("VIEW SERVER STATE permission
#: was denied on object 'server', database 'master'.") and 297 ("The user does not have
#: permission to perform this action."), as the ODBC drivers print them.
_NO_SERVER_STATE = re.compile(r"\((?:297|300)\)")


def check_database(conn: Any, database: str) -> None:
    """The database exists and has CDC enabled.

    :raises ConfigError: the database does not exist.
    :raises ServerMisconfigured: CDC is not enabled on it.
    """
    cur = conn.cursor()
    rows = cur.execute(sql.database_state(database), database).fetchall()
    cur.close()
    if not rows:
        raise ConfigError(f"database {database!r} of database.names does not exist on the server")
    if not rows[0][1]:
        raise ServerMisconfigured(
            f"change data capture is not enabled on database {database!r}",
            hint=f"run `USE [{database}]; EXEC sys.sp_cdc_enable_db` and enable CDC on the tables to capture",
        )


def check_agent(conn: Any) -> str | None:
    """SQL Server Agent runs the capture job; without it no change ever reaches the change tables.

    Servers without ``sys.dm_server_services`` rows (Azure SQL Database) are not checked.  Reading
    that view needs VIEW SERVER STATE, which a least-privilege login lacks: then, as Debezium does,
    the check only warns and the capture carries on.

    :returns: ``None`` when checked, else the warning (also logged) saying what was not checked.
    :raises ServerMisconfigured: the agent service is reported as not running.
    """
    cur = conn.cursor()
    try:
        rows = cur.execute(sql.AGENT_RUNNING).fetchall()
    except Exception as e:
        if not _NO_SERVER_STATE.search(str(e)):
            raise
        warning = (
            "cannot check that SQL Server Agent is running: the login lacks the VIEW SERVER STATE "
            "permission that sys.dm_server_services needs; if the agent is stopped, the capture job "
            "writes no new changes and captures find none (grant VIEW SERVER STATE to check it)"
        )
        log.warning("%s: %s", warning, e)
        return warning
    finally:
        cur.close()
    if rows and not rows[0][0]:
        raise ServerMisconfigured(
            "SQL Server Agent is not running: the CDC capture job writes no new changes",
            hint="start the SQL Server Agent service (and make sure the cdc.<db>_capture job is enabled)",
        )
    return None


def check_permissions(conn: Any, database: str, instances: list[CaptureInstance]) -> None:
    """The login may read every captured change table.

    :raises MissingPrivilege: naming the change tables it may not read.
    """
    conn.cursor().execute(sql.use(database)).close()
    denied = [ci for ci in instances if not scalar(conn, sql.HAS_SELECT, f"cdc.{ci.name}_CT")]
    if denied:
        names = ", ".join(f"{database}.cdc.{ci.name}_CT (table {ci.table_id})" for ci in denied)
        raise MissingPrivilege(
            f"the login may not SELECT from change table(s) {names}",
            hint="grant SELECT on the cdc schema, or add the login to each capture instance's gating role",
        )


def check_offset(
    conn: Any,
    database: str,
    instances: list[CaptureInstance],
    committed: SqlServerLsn,
    known: set[str],
    starts: dict[str, SqlServerLsn] | None = None,
) -> list[str]:
    """Problems with resuming ``database`` after ``committed``: capture instances known at that
    offset whose changes right after it were purged by the cleanup job.  ``starts``: the start
    LSNs the instances had when the offset was stored; a start that has not moved purged nothing.

    :returns: one message per purged capture instance (empty: resuming is safe).
    """
    wanted = committed.increment()
    problems = []
    for ci in instances:
        if ci.name not in known:
            continue  # created after the offset: it starts where it starts
        low = SqlServerLsn.of(scalar(conn, sql.MIN_LSN, ci.name))
        if low > wanted and (starts or {}).get(ci.name) != low:
            problems.append(
                f"capture instance {database}.{ci.name} (table {ci.table_id}) starts at LSN {low}, after the "
                f"stored offset {committed}: the cleanup job purged changes not yet captured"
            )
    return problems


def raise_purged(problems: list[str], when_needed: bool) -> bool:
    """Raise for purged changes unless ``snapshot.mode`` is ``when_needed`` (then re-snapshot).

    :returns: whether a new snapshot is needed.
    :raises OffsetUnavailable: changes were purged and ``when_needed`` is off.
    """
    if not problems:
        return False
    if not when_needed:
        raise OffsetUnavailable("; ".join(problems))
    return True


def check_connection(config: Any) -> str:
    """Connect to every database of ``database.names``: it exists, has CDC enabled, and the
    SQL Server Agent runs (nothing is changed).  An agent state the login may not read is a
    warning in the summary, not a failure.

    :raises CdcError: as :func:`check_database` and :func:`check_agent`.
    """
    from airflow_cdc.sources.sqlserver.client import connect

    databases = list(config["database.names"])
    warning = None
    for n, database in enumerate(databases):
        conn = connect(config, database)
        try:
            check_database(conn, database)
            if n == 0:  # the agent is the server's: checked once
                warning = check_agent(conn)
        finally:
            conn.close()
    agent = f"warning: {warning}" if warning else "SQL Server Agent not reported stopped"
    return f"CDC enabled on {', '.join(databases)}; {agent}"
