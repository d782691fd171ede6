"""The PostgreSQL change check on psycopg's ``AsyncConnection`` (for triggers: never blocks the loop)."""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.client import connect_params, raise_connect_error
from airflow_cdc.sources.postgres.position import parse_pg_lsn
from airflow_cdc.sources.postgres.source import changes_query


async def pg_changes_after(config: ConnectorConfig, offset: dict[str, Any], check: str | None) -> bool:
    """Async twin of ``PostgresSource.changes_after`` (same SQL, one short-lived connection).

    :raises AuthenticationFailed: wrong credentials (the message names user@host, never the password).
    :raises ConfigError: the database does not exist.
    :raises ConnectionFailed: server unreachable (retryable: the trigger keeps polling).
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            **connect_params(config, "airflow-cdc-sensor"), autocommit=True
        )
    except psycopg.OperationalError as e:
        raise_connect_error(config, e)
    check = check or "slot"
    async with conn:
        if check == "slot":
            # as the sync check: a slot missing or left behind the offset would be peeked from
            # below it, and the one change looked at could be one the offset covers
            cur = await conn.execute(q.slot_info_query(conn.info.server_version), (config["slot.name"],))  # type: ignore[arg-type]
            slot = await cur.fetchone()
            if slot is None or slot[5] is None or parse_pg_lsn(slot[5]) < parse_pg_lsn(offset["lsn"]):
                return True
        query, args = changes_query(check, config["slot.name"], config["publication.name"], offset["lsn"])
        cur = await conn.execute(query, args)
        row = await cur.fetchone()
        return bool(row and row[0])
