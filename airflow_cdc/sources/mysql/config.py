"""MySQL / MariaDB connector properties (Debezium 2.x names and defaults)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, Property
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot_overrides import override_properties
from airflow_cdc.core.unchanged import skip_property
from airflow_cdc.sources.mysql.tls import check_properties

_REPLACED = {"time.precision.mode", "schema.include.list", "schema.exclude.list", "database.dbname"}

MYSQL_PROPERTIES: tuple[Property, ...] = tuple(p for p in COMMON_PROPERTIES if p.name not in _REPLACED) + (
    Property("database.include.list", "list", (), "Regexes of database names to capture."),
    Property("database.exclude.list", "list", (), "Regexes of database names not to capture."),
    Property(
        "database.server.id",
        "int",
        None,
        "Replica server id used for the binlog dump; default: derived from `name` in 5400-6399.",
        minimum=1,
    ),
    Property(
        "database.ssl.mode",
        "enum",
        "preferred",
        "TLS towards the server: `preferred` uses it when offered; `required` refuses a server without "
        "it; `verify_ca` also checks the certificate; `verify_identity` also checks the host name.",
        choices=("disabled", "preferred", "required", "verify_ca", "verify_identity"),
    ),
    Property(
        "database.ssl.truststore",
        "str",
        None,
        "CA certificates for `verify_ca`/`verify_identity` (default: the system CAs): a PKCS#12 "
        "truststore or a PEM bundle (a JKS one is refused with the `keytool` command that converts it).",
    ),
    Property(
        "database.ssl.truststore.password",
        "secret",
        None,
        "Password of a PKCS#12 `database.ssl.truststore`.",
    ),
    Property(
        "database.ssl.keystore",
        "str",
        None,
        "Client certificate and private key for accounts created `REQUIRE X509`/`SUBJECT`/`ISSUER`, "
        "sent on every connection (binlog dump included; TLS is then required even in `preferred`): a "
        "PKCS#12 keystore or a PEM file holding both (a JKS one is refused with the `keytool` command "
        "that converts it).",
    ),
    Property(
        "database.ssl.keystore.password",
        "secret",
        None,
        "Password of the PKCS#12 `database.ssl.keystore`, or of an encrypted PEM private key.",
    ),
    Property(
        "database.ssl.cert",
        "str",
        None,
        "Ours (MySQL's `--ssl-cert`): PEM client certificate (chain), instead of `database.ssl.keystore`.",
    ),
    Property(
        "database.ssl.key",
        "str",
        None,
        "Ours (MySQL's `--ssl-key`): PEM private key of `database.ssl.cert` (default: in that file).",
    ),
    Property(
        "time.precision.mode",
        "enum",
        "adaptive_time_microseconds",
        choices=("adaptive_time_microseconds", "adaptive", "connect"),
    ),
    Property(
        "bigint.unsigned.handling.mode",
        "enum",
        "long",
        "BIGINT UNSIGNED as int64 or Decimal.",
        choices=("long", "precise"),
    ),
    Property("include.query", "bool", False, "Fill `source.query` with the statement of each row event."),
    Property(
        "include.schema.changes",
        "bool",
        True,
        "Record schema change events (`ddl`, `tableChanges`) in each batch manifest.",
    ),
    Property(
        "inconsistent.schema.handling.mode",
        "enum",
        "fail",
        "A rows event whose layout does not match the known table structure: fail, warn (skip it "
        "with a warning) or skip.",
        choices=("fail", "warn", "skip"),
    ),
    Property(
        "gtid.source.includes",
        "list",
        (),
        "Regexes of GTID sources (MySQL server UUID, MariaDB domain-server) whose transactions are captured.",
    ),
    Property("gtid.source.excludes", "list", (), "Regexes of GTID sources whose transactions are skipped."),
    Property(
        "enable.time.adjuster",
        "bool",
        True,
        "Years 0000-0099 in DATE and DATETIME values: 00-69 -> 2000-2069, 70-99 -> 1970-1999.",
    ),
    skip_property("The binlog's full row images (`binlog_row_image=FULL`) always have the old row."),
    *override_properties("<databaseName>.<tableName>"),
    Property("heartbeat.action.query", "str", None, "SQL run at the start of each capture run."),
    Property(
        "read.only",
        "bool",
        False,
        "Debezium's read-only incremental snapshots: this connector writes nothing to the source either "
        "way (watermarks are binlog coordinates, signal-table rows are read from the binlog), so it "
        "captures from a read-only replica as it is; `true` also makes every connection read-only on "
        "the server, and a `heartbeat.action.query` or `database.initial.statements` that writes fails.",
    ),
    Property("converters", "list", (), "Debezium custom converter names; see `boolean.type`."),
    Property(
        "boolean.type",
        "str",
        None,
        "`io.debezium.connector.mysql.converters.TinyIntOneToBooleanConverter`: TINYINT(1) as BOOLEAN.",
    ),
    Property(
        "database.initial.statements",
        "str",
        None,
        "`;`-separated SQL run on every connection after it opens (`;;` for a `;` inside a "
        "statement); not on the binlog connection.",
    ),
)


def default_server_id(name: str) -> int:
    """Debezium picks a random id in 5400-6400; a stable one per connector name lets a restarted
    capture replace its own stale dump session on the server."""
    return 5400 + zlib.crc32(name.encode()) % 1000


def mysql_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    """Validate a MySQL/MariaDB connector configuration.

    ``database.include.list``/``database.exclude.list`` select databases (MySQL has no schemas);
    table names are ``database.table``.

    :raises ConfigError: naming the first bad property (or a client certificate that cannot be
        sent: see :func:`airflow_cdc.sources.mysql.tls.check_properties`).
    """
    values = dict(raw)
    for prop in ("schema.include.list", "schema.exclude.list", "database.dbname"):
        if prop in values:
            raise ConfigError(
                f"property {prop!r} does not apply to MySQL; use database.include.list / "
                "database.exclude.list"
            )
    config = ConnectorConfig(
        MYSQL_PROPERTIES
        + (Property("schema.include.list", "list", ()), Property("schema.exclude.list", "list", ())),
        {
            **values,
            "schema.include.list": values.get("database.include.list", ()),
            "schema.exclude.list": values.get("database.exclude.list", ()),
        },
    )
    check_properties(config)
    return config
