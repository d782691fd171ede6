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

from airflow_cdc.core.capture import Capture
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.source import ChangeSource, resolve_connector, source_spec
from airflow_cdc.core.state import StateStore, open_state_store
from airflow_cdc.core.storage import is_remote


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
    """The canonical connector name of raw properties (``connector`` or ``connector.class``).

    :raises ConfigError: missing or unknown connector.
    """
    return resolve_connector(raw)[0]


def build_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    """Validate raw properties with the configuration of the source they name."""
    kind, spec = resolve_connector(raw)
    values = {k: v for k, v in raw.items() if k != "connector.class"}
    values["connector"] = kind
    return spec.build_config(values)


def build_source(config: ConnectorConfig) -> ChangeSource:
    """The change source of a validated config, from the source registry."""
    return source_spec(config).build_source(config)


def build_store(config: ConnectorConfig) -> StateStore:
    """The connector's state store.

    :raises ConfigError: ``staging.path`` is an object store and ``state.store`` is not set (the
        default, a file store under the staging path, needs a local directory with locks).
    """
    url = config.secret("state.store")
    if url is None and is_remote(config["staging.path"]):
        raise ConfigError(
            f"property 'state.store' is required when 'staging.path' is an object store "
            f"({config['staging.path']}): a sqlite:///, postgresql:// or mysql:// URL, or a local directory"
        )
    return open_state_store(url or str(Path(config["staging.path"]) / "_state"))


def partitions(config: ConnectorConfig) -> list[ConnectorConfig]:
    """The configs of a connector's partitions, in a stable order: ``[config]`` when the
    connector is not partitioned, or ``config`` is already one partition's."""
    spec = source_spec(config)
    if config.partition is not None or spec.partitions is None:
        return [config]
    return spec.partitions(config)


def partition_config(config: ConnectorConfig, partition: str | None) -> ConnectorConfig:
    """The config of one partition of ``config`` (``None``: the connector must be unpartitioned).

    :raises ConfigError: no such partition, or ``None`` for a partitioned connector.
    """
    parts = partitions(config)
    keys = [p.partition for p in parts]
    if partition is None and keys == [None]:
        return parts[0]
    for part in parts:
        if part.partition == partition:
            return part
    shown = ", ".join(str(k) for k in keys)
    if partition is None:
        raise ConfigError(f"connector {config['name']!r} is partitioned ({shown}): name the partition")
    raise ConfigError(f"connector {config['name']!r} has no partition {partition!r}; partitions: {shown}")


def build_capture(raw: Mapping[str, Any] | ConnectorConfig, partition: str | None = None) -> Capture:
    """The capture runner for a pipeline given as raw properties or a validated config (for a
    partitioned connector: of its ``partition``).

    :raises ConfigError: see :func:`partition_config`.
    """
    config = raw if isinstance(raw, ConnectorConfig) else build_config(raw)
    config = partition_config(config, partition if partition is not None else config.partition)
    return Capture(build_source(config), config, build_store(config))


def build_captures(raw: Mapping[str, Any] | ConnectorConfig) -> list[Capture]:
    """One capture runner per partition of a pipeline (one for an unpartitioned connector)."""
    config = raw if isinstance(raw, ConnectorConfig) else build_config(raw)
    return [Capture(build_source(c), c, build_store(c)) for c in partitions(config)]
