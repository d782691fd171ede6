"""The Vitess source: a keyspace read through vtgate's gRPC VStream (grpcio), copy phase as snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.source import ChangeSource, SourceSpec


def _config(values: Mapping[str, Any]) -> ConnectorConfig:
    from airflow_cdc.sources.vitess.config import vitess_config

    return vitess_config(values)


def _source(config: ConnectorConfig) -> ChangeSource:
    from airflow_cdc.sources.vitess.source import VitessSource

    return VitessSource(config)


def _partitions(config: ConnectorConfig) -> list[ConnectorConfig]:
    from airflow_cdc.sources.vitess.tasks import task_partitions

    return task_partitions(config)


def _check(config: ConnectorConfig) -> str:
    from airflow_cdc.sources.vitess.checks import check_connection

    return check_connection(config)


SOURCE = SourceSpec(
    "vitess",
    {"io.debezium.connector.vitess.VitessConnector": "vitess"},
    _config,
    _source,
    partitions=_partitions,
    check_connection=_check,
)
