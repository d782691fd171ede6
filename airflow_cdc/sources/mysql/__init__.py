"""The MySQL / MariaDB source: the binlog read as a replica, with a schema history."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.source import ChangeSource, SourceSpec


def _config(values: Mapping[str, Any]) -> ConnectorConfig:
    from airflow_cdc.sources.mysql.config import mysql_config

    return mysql_config(values)


def _source(config: ConnectorConfig) -> ChangeSource:
    from airflow_cdc.sources.mysql.source import MySqlSource

    return MySqlSource(config)


def _check(config: ConnectorConfig) -> str:
    from airflow_cdc.sources.mysql.client import check_connection

    return check_connection(config)


#: ``connector: mariadb`` (Debezium's MariaDB connector) is served by the same package; the source
#: then labels its events ``source.connector = mariadb``.
SOURCE = SourceSpec(
    "mysql",
    {
        "io.debezium.connector.mysql.MySqlConnector": "mysql",
        "io.debezium.connector.mariadb.MariaDbConnector": "mariadb",
    },
    _config,
    _source,
    names=("mariadb",),
    check_connection=_check,
)
