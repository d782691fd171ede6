"""The LSN range SQL Server's CDC change tables keep for the connector (monitoring, the sensor's
guard).  The cleanup job removes changes older than its retention (``msdb.dbo.cdc_jobs``,
minutes; 4320 by default) and raises each capture instance's start LSN.  Read only."""

from __future__ import annotations

from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.retained import RetainedLog
from airflow_cdc.sources.sqlserver import client
from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn

INSTANCES = "SELECT capture_instance, start_lsn FROM cdc.change_tables"
MAX_LSN = "SELECT sys.fn_cdc_get_max_lsn()"
#: msdb is often closed to the connector's login (and the emulator has none): then unknown
RETENTION = "SELECT retention FROM msdb.dbo.cdc_jobs WHERE database_id = DB_ID() AND job_type = N'cleanup'"


def _rows(conn: Any, query: str) -> list[tuple]:
    cur = conn.cursor()
    try:
        return [tuple(r) for r in cur.execute(query).fetchall()]
    finally:
        cur.close()


def retention_ms(conn: Any) -> int | None:
    """The cleanup job's retention in milliseconds, None when the login may not read it."""
    try:
        value = client.scalar(conn, RETENTION)
    except Exception:  # noqa: BLE001 - no access to msdb: the age limit is unknown
        return None
    return int(value) * 60_000 if value else None


def retained_log(
    config: ConnectorConfig, offset: dict[str, Any], applied: dict[str, Any] | None
) -> RetainedLog:
    """The change tables' LSN range against the committed LSN, and the cleanup retention.

    Lost when a capture instance the offset knew starts above the committed LSN with a start that
    moved since (the cleanup job removed changes the connector has not read).

    :raises CdcError: the server cannot be reached.
    """
    database = config["database.names"][0]
    conn = client.connect(config, database)
    try:
        instances = {str(ci): SqlServerLsn.of(start) for ci, start in _rows(conn, INSTANCES)}
        head = SqlServerLsn.of(client.scalar(conn, MAX_LSN))
        retention = retention_ms(conn)
    finally:
        conn.close()
    committed = SqlServerLsn.parse(offset["commit_lsn"])
    known = offset.get("capture_instance_starts") or {}
    lost = sorted(
        ci
        for ci, start in instances.items()
        if start > committed.increment() and ci in known and str(start) != known[ci]
    )
    low = min(instances.values(), default=head)
    shown = "unknown (no access to msdb.dbo.cdc_jobs)" if retention is None else f"{retention // 60_000} min"
    detail = (
        f"change tables of {database} keep LSNs {low} to {head}; committed {committed}; retention {shown}"
    )
    if lost:
        detail += f"; cleaned up past the committed LSN: {', '.join(lost)}"
    return RetainedLog(limit_age_ms=retention, lost=bool(lost), detail=detail)
