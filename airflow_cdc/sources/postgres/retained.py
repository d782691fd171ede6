"""The WAL a PostgreSQL server keeps for the connector's replication slot (monitoring, the sensor's
guard).  Read only: one query on a connection of its own."""

from __future__ import annotations

from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.retained import RetainedLog
from airflow_cdc.sources.postgres import client

#: the head (the replay position on a standby, which has no WAL insert position of its own), the
#: slot's distances from it, and ``max_slot_wal_keep_size`` (MB; -1 unlimited).  ``wal_status``:
#: reserved / extended (within limits), unreserved (past ``max_slot_wal_keep_size``: removed at
#: the next checkpoint unless the slot catches up), lost.
RETAINED_SQL = """
SELECT pg_wal_lsn_diff(h.lsn, s.restart_lsn)::bigint,
       pg_wal_lsn_diff(h.lsn, s.confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(h.lsn, %(applied)s::pg_lsn)::bigint,
       s.wal_status,
       (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
       h.lsn::text, s.restart_lsn::text, s.confirmed_flush_lsn::text, s.slot_name IS NOT NULL
FROM (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
             ELSE pg_current_wal_lsn() END AS lsn) h
LEFT JOIN pg_replication_slots s ON s.slot_name = %(slot)s
"""


def retained_log(
    config: ConnectorConfig, offset: dict[str, Any], applied: dict[str, Any] | None
) -> RetainedLog:
    """What the server keeps for ``slot.name``: WAL from the slot's ``restart_lsn`` to the head.

    A missing slot counts as lost (the committed offset cannot be read any more).

    :raises CdcError: the server cannot be reached.
    """
    slot = config["slot.name"]
    applied_lsn = (applied or offset).get("lsn") or offset["lsn"]
    with client.connect(config) as conn:
        row = conn.execute(RETAINED_SQL, {"applied": applied_lsn, "slot": slot}).fetchone()
    assert row is not None
    retained, behind, lag, wal_status, keep_mb, head, restart, confirmed, exists = row
    if not exists:
        return RetainedLog(lag_bytes=lag, lost=True, detail=f"slot {slot!r} does not exist (head {head})")
    limit = int(keep_mb) * 1024 * 1024 if keep_mb is not None and int(keep_mb) >= 0 else None
    shown = "unlimited" if limit is None else f"{keep_mb} MB"
    return RetainedLog(
        retained_bytes=retained,
        behind_bytes=behind,
        lag_bytes=lag,
        limit_bytes=limit,
        wal_status=wal_status,
        lost=wal_status == "lost",
        detail=(
            f"slot {slot!r} restart_lsn {restart}, confirmed_flush_lsn {confirmed}, head {head}, "
            f"wal_status {wal_status}, max_slot_wal_keep_size {shown}"
        ),
    )
