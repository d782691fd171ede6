"""The SQL Server source: CDC change tables read through pyodbc (FreeTDS or Microsoft's driver)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.source import ChangeSource, SourceSpec


def _config(values: Mapping[str, Any]) -> ConnectorConfig:
    from airflow_cdc.sources.sqlserver.config import sqlserver_config

    return sqlserver_config(values)


def _source(config: ConnectorConfig) -> ChangeSource:
    from airflow_cdc.sources.sqlserver.source import SqlServerSource

    return SqlServerSource(config)


def _partitions(config: ConnectorConfig) -> list[ConnectorConfig]:
    from airflow_cdc.sources.sqlserver.config import sqlserver_partitions

    return sqlserver_partitions(config)


def _check(config: ConnectorConfig) -> str:
    from airflow_cdc.sources.sqlserver.checks import check_connection

    return check_connection(config)


SOURCE = SourceSpec(
    "sqlserver",
    {"io.debezium.connector.sqlserver.SqlServerConnector": "sqlserver"},
    _config,
    _source,
    partitions=_partitions,
    check_connection=_check,
)
