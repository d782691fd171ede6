"""Where a stored offset is on the server now: GTID-set resume and the cheap "anything new?" check.

An offset is ``{"file", "pos", "gtids", "server_id"}``.  On the server that wrote it, the binlog
coordinates are exact.  When they are gone (the file was purged) or mean nothing (another server
after a failover), the GTID set still says which transactions were captured: reading from the
start of the newest binlog file whose preceding transactions the set covers, and skipping the
transactions already in the set, misses nothing and repeats nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_cdc.core.errors import ConfigError, ServerMisconfigured
from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql.flavour import Flavour, GtidSet

CHECKS = ("wal", "binlog", "gtid")


def gtid_start_file(
    conn: Any, flavour: Flavour, stored: GtidSet, available: list[str], source_filter: Callable[[str], bool]
) -> str | None:
    """The newest binlog file whose preceding transactions of captured GTID sources ``stored`` covers.

    One cheap query per file, newest first; None when even the oldest file starts after a
    transaction ``stored`` lacks (the binlog it was in was purged).
    """
    for file in reversed(available):
        before = client.file_start_gtids(conn, flavour, file)
        if before is not None and stored.covers(GtidSet(before), source_filter):
            return file
    return None


def changes_after(
    conn: Any, offset: dict[str, Any], check: str, source_filter: Callable[[str], bool]
) -> bool:
    """Whether the server holds changes past ``offset`` -- reads two status values, no events.

    ``check="binlog"`` (alias ``"wal"``, the sensor's default): the binlog head is past the offset's
    coordinates; any event counts (other databases, excluded GTID sources, a rotation), so it may
    over-report, never under-reports.  ``check="gtid"``: the server's GTID set has a transaction of
    a captured source (``gtid.source.*``) that the offset's set lacks; exact for transactions.
    Another server than the offset's (``server_id``) always answers yes: capture then decides.

    :raises ConfigError: an unknown ``check``.
    :raises ServerMisconfigured: ``check="gtid"`` on a server without GTIDs (MySQL ``gtid_mode=OFF``).
    """
    if check not in CHECKS:
        raise ConfigError(
            f"changes check {check!r} is not supported for MySQL; use one of {', '.join(CHECKS)}"
        )
    flavour = client.server_flavour(conn)
    server_id = int(client.query(conn, "SELECT @@GLOBAL.server_id")[0][0])
    if int(offset.get("server_id") or server_id) != server_id:
        return True
    file, pos, gtids = client.head(conn, flavour)
    if check != "gtid":
        return client.coordinate(file, pos) > client.coordinate(offset["file"], int(offset["pos"]))
    if not gtids:
        raise ServerMisconfigured(
            "changes check 'gtid' needs GTIDs, but the server has none",
            hint="enable GTIDs (MySQL: gtid_mode=ON, enforce_gtid_consistency=ON) or use check='binlog'",
        )
    return not GtidSet(offset.get("gtids") or "").covers(GtidSet(gtids), source_filter)
