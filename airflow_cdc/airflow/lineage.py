"""OpenLineage datasets of a CDC pipeline: source tables in, bronze/silver Delta tables out.

Names follow the OpenLineage dataset naming spec: a database table is
``<scheme>://<host>:<port>`` + ``<database>.<schema>.<table>`` (PostgreSQL ``postgres``, MySQL /
MariaDB ``mysql`` with ``<database>.<table>``, SQL Server ``mssql``); a Vitess keyspace table is
``vitess://<vtgate>`` + ``<keyspace>.<table>``; a Delta table is its storage location (``file``
+ absolute path locally, ``s3://bucket`` + key path, ...).  Used by the operators'
``get_openlineage_facets_on_complete``, which the OpenLineage provider calls when installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_cdc.core.config import ConnectorConfig
from spark_jobs.cdc_apply.layout import table_path

if TYPE_CHECKING:
    from openlineage.client.event_v2 import Dataset

_SCHEMES = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql", "sqlserver": "mssql"}
_DEFAULT_PORTS = {"postgres": 5432, "mysql": 3306, "mssql": 1433, "vitess": 15991}


def _dataset(namespace: str, name: str) -> Dataset:
    from openlineage.client.event_v2 import Dataset

    return Dataset(namespace=namespace, name=name)


def source_datasets(config: ConnectorConfig, tables: Iterable[str]) -> list[Dataset]:
    """Datasets of captured source tables (names as the connector writes them: ``schema.table``,
    ``db.table``, ``db.schema.table`` or ``keyspace.table``)."""
    kind = str(config["connector"] or "postgresql")
    scheme = _SCHEMES.get(kind, kind)
    port = _value(config, "database.port") or _DEFAULT_PORTS.get(scheme, "")
    namespace = f"{scheme}://{config['database.hostname']}:{port}"
    database = _value(config, "database.dbname") if scheme == "postgres" else None
    return [_dataset(namespace, f"{database}.{t}" if database else t) for t in sorted(set(tables))]


def _value(config: ConnectorConfig, name: str) -> Any:
    try:
        return config[name]
    except KeyError:  # not a property of this connector
        return None


def delta_datasets(target: str, connector: str, tables: Iterable[str], bronze: bool) -> list[Dataset]:
    """Datasets of the Delta tables one apply writes (bronze when enabled, and silver)."""
    layers = ("bronze", "silver") if bronze else ("silver",)
    out = []
    for table in sorted(set(tables)):
        for layer in layers:
            out.append(_location(table_path(target, layer, connector, table)))
    return out


def _location(path: str) -> Dataset:
    parts = urlsplit(path)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:  # not a Windows drive
        return _dataset(f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/"))
    local = parts.path if parts.scheme == "file" else path
    return _dataset("file", os.path.abspath(local))


def operator_lineage(inputs: list[Any], outputs: list[Any]) -> Any:
    """An ``OperatorLineage`` (imported lazily: the OpenLineage provider is optional)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=inputs, outputs=outputs)
