"""The PostgreSQL offset: JSON form, server identity, and when the log restarted lower.

Stored as ``{"lsn", "txId", "last_commit_lsn", "ts_usec", "epoch", "system_id", "timeline"}``
(Debezium's ``lsn``/``txId``/``ts_usec`` plus what tells a restore apart).  A stored LSN means
something only on the cluster and timeline that produced it: a new cluster (another system
identifier), a point-in-time recovery or failover (another timeline), or a restore from a backup
(same identity, but the server's WAL ends below the offset) all restart the log at LSNs that may be
lower than what was captured.  Each of those is a *lost offset* (re-snapshot under
``snapshot.mode=when_needed``) and opens a new position epoch, so the new events sort after every
old one in silver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_cdc.sources.postgres.position import format_pg_lsn, parse_pg_lsn

#: The cluster's identity and the timeline of its current WAL (file names start with the timeline).
#: A standby (recovery: ``pg_walfile_name`` and ``pg_current_wal_*`` refuse to run) gives the
#: timeline of its last restartpoint and its replayed position.
IDENTITY = (
    "SELECT (SELECT system_identifier FROM pg_control_system())::text, CASE WHEN pg_is_in_recovery() "
    "THEN (SELECT timeline_id FROM pg_control_checkpoint()) "
    "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_flush_lsn()), 1, 8))::bit(32)::int END, "
    "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_flush_lsn() END)::text"
)


@dataclass(frozen=True)
class ServerIdentity:
    system_id: str
    timeline: int
    flush_lsn: int


def server_identity(conn: psycopg.Connection) -> ServerIdentity:
    row = conn.execute(IDENTITY).fetchone()
    assert row is not None
    return ServerIdentity(str(row[0]), int(row[1]), parse_pg_lsn(row[2]))


@dataclass(frozen=True)
class PgOffset:
    """A committed PostgreSQL offset (typed); ``to_json``/``from_json`` give the stored form."""

    lsn: int
    epoch: int = 0
    txid: int | None = None
    last_commit_lsn: int | None = None
    ts_usec: int | None = None
    system_id: str | None = None
    timeline: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lsn": format_pg_lsn(self.lsn), "epoch": self.epoch}
        if self.last_commit_lsn is not None:
            out.update(
                txId=self.txid, last_commit_lsn=format_pg_lsn(self.last_commit_lsn), ts_usec=self.ts_usec
            )
        if self.system_id is not None:
            out.update(system_id=self.system_id, timeline=self.timeline)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PgOffset:
        last = data.get("last_commit_lsn")
        return cls(
            parse_pg_lsn(data["lsn"]),
            int(data.get("epoch", 0)),
            data.get("txId"),
            parse_pg_lsn(last) if last else None,
            data.get("ts_usec"),
            data.get("system_id"),
            data.get("timeline"),
        )

    def describe(self) -> str:
        return f"{format_pg_lsn(self.lsn)} (epoch {self.epoch})" if self.epoch else format_pg_lsn(self.lsn)


def restart_problem(stored: PgOffset, now: ServerIdentity) -> str | None:
    """Why the stored offset's LSNs do not belong to this server's log any more, or None."""
    if stored.system_id is not None and stored.system_id != now.system_id:
        return (
            f"the server is another cluster (system identifier {now.system_id}, the offset was taken "
            f"on {stored.system_id}): its LSNs are unrelated to the stored offset"
        )
    if stored.timeline is not None and stored.timeline != now.timeline:
        return (
            f"the server is on timeline {now.timeline}, the offset was taken on timeline {stored.timeline} "
            "(point-in-time recovery or failover): changes captured after the fork may not exist here"
        )
    if now.flush_lsn < stored.lsn:
        return (
            f"the server's WAL ends at {format_pg_lsn(now.flush_lsn)}, below the stored offset "
            f"{format_pg_lsn(stored.lsn)} (restored from a backup?)"
        )
    return None
