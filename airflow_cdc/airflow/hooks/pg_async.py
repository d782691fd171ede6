"""The PostgreSQL change check on psycopg's ``AsyncConnection`` (for triggers: never blocks the loop)."""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.sources.postgres.client import connect_params, raise_connect_error
from airflow_cdc.sources.postgres.source import changes_query


async def pg_changes_after(config: ConnectorConfig, offset: dict[str, Any], check: str) -> bool:
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
    async with conn:
        query, args = changes_query(check, config["slot.name"], config["publication.name"], offset["lsn"])
        cur = await conn.execute(query, args)
        row = await cur.fetchone()
        return bool(row and row[0])
