"""The binlog a MySQL/MariaDB server keeps for the connector (monitoring, the sensor's guard).

The server keeps whole binlog files and purges a file once its last write is older than the
binlog expiry (``binlog_expire_logs_seconds``, else ``expire_logs_days``).  Read only: two queries
on a connection of its own.
"""

from __future__ import annotations

from typing import Any

import pymysql

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.retained import RetainedLog
from airflow_cdc.sources.mysql import client


def expiry_ms(conn: Any) -> int | None:
    """The server's binlog expiry in milliseconds (None: binlogs never expire)."""
    try:
        seconds = int(client.query(conn, "SELECT @@GLOBAL.binlog_expire_logs_seconds")[0][0] or 0)
    except pymysql.err.OperationalError:  # MariaDB before 10.6, MySQL 5.7: days only
        seconds = 0
    if not seconds:
        days = float(client.query(conn, "SELECT @@GLOBAL.expire_logs_days")[0][0] or 0)
        seconds = int(days * 86400)
    return seconds * 1000 or None


def _from(files: list[tuple[str, int]], file: str, pos: int) -> tuple[int, int, int] | None:
    """(bytes of the files from ``file`` on, bytes past ``file:pos``, files) or None when purged."""
    names = [f for f, _ in files]
    if file not in names:
        return None
    kept = files[names.index(file) :]
    total = sum(size for _, size in kept)
    return total, max(0, total - pos), len(kept)


def retained_log(
    config: ConnectorConfig, offset: dict[str, Any], applied: dict[str, Any] | None
) -> RetainedLog:
    """What the server keeps from the committed offset's binlog file on, and its expiry.

    The committed file no longer listed counts as lost (``snapshot.mode=when_needed`` or GTIDs
    may still resume).

    :raises CdcError: the server cannot be reached.
    """
    conn = client.connect(config, initial=False)
    try:
        files = [(str(r[0]), int(r[1])) for r in client.query(conn, "SHOW BINARY LOGS")]
        expiry = expiry_ms(conn)
    finally:
        conn.close()
    here = _from(files, str(offset.get("file")), int(offset.get("pos") or 0))
    at = applied or offset
    lag = _from(files, str(at.get("file")), int(at.get("pos") or 0))
    head = f"{files[-1][0]}:{files[-1][1]}" if files else "(no binlog)"
    shown = "never" if expiry is None else f"{expiry // 1000} s"
    if here is None:
        return RetainedLog(
            lag_bytes=lag[1] if lag else None,
            limit_age_ms=expiry,
            lost=True,
            detail=f"binlog {offset.get('file')} of the committed offset is purged "
            f"(head {head}, expiry {shown})",
        )
    retained, behind, count = here
    return RetainedLog(
        retained_bytes=retained,
        behind_bytes=behind,
        lag_bytes=lag[1] if lag else None,
        files=count,
        limit_age_ms=expiry,
        detail=f"{count} binlog file(s) from {offset.get('file')}:{offset.get('pos')} to {head}, "
        f"expiry {shown}",
    )
