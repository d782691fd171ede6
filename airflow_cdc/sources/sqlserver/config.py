"""SQL Server connector properties (Debezium 2.x names and defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, Property
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot_overrides import override_properties
from airflow_cdc.core.unchanged import skip_property

#: The Debian FreeTDS ODBC driver as registered by the ``tdsodbc`` package.
FREETDS = "FreeTDS"
DEFAULT_PORT = 1433

_REPLACED = {"time.precision.mode", "database.dbname", "database.port"}

SQLSERVER_PROPERTIES: tuple[Property, ...] = tuple(
    p for p in COMMON_PROPERTIES if p.name not in _REPLACED
) + (
    Property("database.port", "int", DEFAULT_PORT, "SQL Server TCP port.", minimum=1),
    Property("database.names", "list", (), "Databases to capture (comma-separated), all on one server."),
    Property("database.instance", "str", None, "Named instance (`host\\instance`); usually a port instead."),
    Property(
        "database.encrypt",
        "bool",
        True,
        "Encrypt the connection with TLS (Debezium's default). Set false for servers without TLS.",
    ),
    Property(
        "database.trustServerCertificate",
        "bool",
        False,
        "Accept the server certificate without validating it (Microsoft's driver; FreeTDS does not "
        "validate unless given a CA file).",
    ),
    Property(
        "database.applicationIntent",
        "enum",
        "readwrite",
        "`ReadOnly` routes to a readable secondary of an availability group (case-insensitive).",
        choices=("readwrite", "readonly"),
    ),
    Property(
        "database.odbc.driver",
        "str",
        FREETDS,
        "ODBC driver name or path: `FreeTDS` (Debian's tdsodbc) or e.g. `ODBC Driver 18 for SQL Server`.",
    ),
    Property(
        "database.odbc.tds.version",
        "str",
        "7.4",
        "TDS protocol version FreeTDS asks for (7.3+ is needed for date/time2/datetimeoffset).",
    ),
    Property("database.query.timeout.ms", "int", 600_000, "Statement timeout.", minimum=0),
    Property(
        "snapshot.isolation.mode",
        "enum",
        "read_committed",
        "Isolation of each snapshot chunk's transaction (committed right after its SELECT): "
        "`read_committed` locks a row only while reading it; `repeatable_read` holds shared locks "
        "on the chunk's rows and `exclusive` also an exclusive table lock until the chunk's commit "
        "(writers wait up to one chunk read); `snapshot` (needs ALLOW_SNAPSHOT_ISOLATION) and "
        "`read_uncommitted` (dirty reads) take none. Debezium's default is `repeatable_read`.",
        choices=("snapshot", "read_committed", "repeatable_read", "read_uncommitted", "exclusive"),
    ),
    Property(
        "snapshot.lock.timeout.ms",
        "int",
        10_000,
        "How long a `repeatable_read`/`exclusive` chunk read waits for a lock held by the application "
        "(`SET LOCK_TIMEOUT`) before failing the run with SQL Server error 1222 (nothing staged).",
        minimum=0,
    ),
    Property("time.precision.mode", "enum", "adaptive", choices=("adaptive", "connect")),
    skip_property("Change tables keep the whole old row of every update (`__$operation` 3)."),
    *override_properties("<schemaName>.<tableName>"),
    Property("heartbeat.action.query", "str", None, "SQL run at the start of each capture run."),
    Property(
        "include.schema.changes",
        "bool",
        True,
        "Record schema change events (a newer capture instance taking over a table) in batch manifests.",
    ),
)


def sqlserver_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    """Validate a SQL Server connector configuration.

    ``database.names`` lists the databases; Debezium 1.x's single ``database.dbname`` is accepted
    as a one-name list.  Table names are ``database.schema.table``.

    :raises ConfigError: naming the first bad property.
    """
    values = dict(raw)
    if "database.dbname" in values:
        if values.get("database.names"):
            raise ConfigError("set database.names or the older database.dbname, not both")
        values["database.names"] = values.pop("database.dbname")
    config = ConnectorConfig(SQLSERVER_PROPERTIES, values)
    names = config["database.names"]
    if not names:
        raise ConfigError("database.names is required: the databases to capture")
    folded = [n.lower() for n in names]  # database names compare case-insensitively on SQL Server
    repeated = sorted({n for n, f in zip(names, folded, strict=True) if folded.count(f) > 1})
    if repeated:
        raise ConfigError(f"database.names lists {', '.join(repeated)} more than once")
    return config


def sqlserver_partitions(config: ConnectorConfig) -> list[ConnectorConfig]:
    """One partition per database of ``database.names`` (Debezium's per-database offsets).

    LSNs are per database, so each database is captured, committed and resumed on its own; its
    state is kept under ``<name>.<database>``.  One database: the connector is not partitioned.
    """
    names = config["database.names"]
    if len(names) == 1:
        return [config]
    return [config.for_partition(db, {"database.names": [db]}) for db in names]
