"""Load a pipeline file and build its source, state store and capture runner.

A pipeline file is YAML (or JSON) holding one flat mapping of Debezium property names, e.g.::

    name: inventory
    connector: postgresql
    database.hostname: 127.0.0.1
    database.port: 5432
    database.user: cdc
    database.password: ${env:CDC_PASSWORD}
    database.dbname: shop
    table.include.list: public.orders,public.customers
    staging.path: /var/lib/airflow-cdc/staging
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from airflow_cdc.core.capture import Capture, ChangeSource
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.state import StateStore, open_state_store

SOURCES = ("postgresql", "mysql")
_CLASS_ALIASES = {
    "io.debezium.connector.postgresql.PostgresConnector": "postgresql",
    "postgres": "postgresql",
    "io.debezium.connector.mysql.MySqlConnector": "mysql",
    "io.debezium.connector.mariadb.MariaDbConnector": "mysql",
    "mariadb": "mysql",
}


def read_pipeline_file(path: str | Path) -> dict[str, Any]:
    """Parse a pipeline file into a flat property mapping.

    :raises ConfigError: unreadable file or not a mapping.
    """
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read pipeline file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"pipeline file {path} is not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"pipeline file {path} must hold a mapping of property names to values")
    if isinstance(doc.get("config"), dict):  # Kafka Connect REST shape: {"name": ..., "config": {...}}
        doc = {"name": doc.get("name"), **doc["config"]}
    return doc


def source_kind(raw: Mapping[str, Any]) -> str:
    kind = str(raw.get("connector") or raw.get("connector.class") or "")
    kind = _CLASS_ALIASES.get(kind, kind).lower()
    if kind not in SOURCES:
        raise ConfigError(
            f"property 'connector': {kind or '(missing)'!r} is not a supported source; "
            f"supported: {', '.join(SOURCES)}"
        )
    return kind


def build_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    kind = source_kind(raw)
    values = {k: v for k, v in raw.items() if k != "connector.class"}
    values["connector"] = kind
    if kind == "postgresql":
        from airflow_cdc.sources.postgres.config import pg_config

        return pg_config(values)
    if kind == "mysql":
        from airflow_cdc.sources.mysql.config import mysql_config

        return mysql_config(values)
    raise AssertionError(kind)


def build_source(config: ConnectorConfig) -> ChangeSource:
    if config["connector"] == "postgresql":
        from airflow_cdc.sources.postgres.source import PostgresSource

        return PostgresSource(config)
    if config["connector"] == "mysql":
        from airflow_cdc.sources.mysql.source import MySqlSource

        return MySqlSource(config)
    raise ConfigError(f"no source for connector {config['connector']!r}")


def build_store(config: ConnectorConfig) -> StateStore:
    url = config.secret("state.store") or str(Path(config["staging.path"]) / "_state")
    return open_state_store(url)


def build_capture(raw: Mapping[str, Any] | ConnectorConfig) -> Capture:
    """The capture runner for a pipeline given as raw properties or a validated config."""
    config = raw if isinstance(raw, ConnectorConfig) else build_config(raw)
    return Capture(build_source(config), config, build_store(config))
