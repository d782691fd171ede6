"""The PostgreSQL change check on psycopg's ``AsyncConnection`` (for triggers: never blocks the loop)."""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import AuthenticationFailed, ConnectionFailed
from airflow_cdc.sources.postgres.source import changes_query


async def pg_changes_after(config: ConnectorConfig, offset: dict[str, Any], check: str) -> bool:
    """Async twin of ``PostgresSource.changes_after`` (same SQL, one short-lived connection).

    :raises AuthenticationFailed: wrong credentials (the message names user@host, never the password).
    :raises ConnectionFailed: server unreachable (retryable: the trigger keeps polling).
    """
    host, port, user = config["database.hostname"], config["database.port"] or 5432, config["database.user"]
    try:
        conn = await psycopg.AsyncConnection.connect(
            host=host,
            port=port,
            user=user,
            password=config.secret("database.password"),
            dbname=config["database.dbname"],
            sslmode=config["database.sslmode"],
            autocommit=True,
            connect_timeout=15,
            application_name=f"airflow-cdc-sensor:{config['name']}",
        )
    except psycopg.OperationalError as e:
        if "password authentication failed" in str(e):
            raise AuthenticationFailed(
                f"PostgreSQL rejected the credentials for {user}@{host}:{port}"
            ) from None
        raise ConnectionFailed(f"cannot connect to PostgreSQL at {host}:{port}") from e
    async with conn:
        query, args = changes_query(check, config["slot.name"], config["publication.name"], offset["lsn"])
        cur = await conn.execute(query, args)
        row = await cur.fetchone()
        return bool(row and row[0])
