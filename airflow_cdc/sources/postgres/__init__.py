"""The PostgreSQL source: pgoutput through a logical replication slot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.source import ChangeSource, SourceSpec


def _config(values: Mapping[str, Any]) -> ConnectorConfig:
    from airflow_cdc.sources.postgres.config import pg_config

    return pg_config(values)


def _source(config: ConnectorConfig) -> ChangeSource:
    from airflow_cdc.sources.postgres.source import PostgresSource

    return PostgresSource(config)


def _check(config: ConnectorConfig) -> str:
    from airflow_cdc.sources.postgres.client import check_connection

    return check_connection(config)


SOURCE = SourceSpec(
    "postgresql",
    {"postgres": "postgresql", "io.debezium.connector.postgresql.PostgresConnector": "postgresql"},
    _config,
    _source,
    check_connection=_check,
)
