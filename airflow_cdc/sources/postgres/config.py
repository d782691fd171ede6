"""PostgreSQL connector properties (Debezium names and defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, Property

PG_PROPERTIES: tuple[Property, ...] = COMMON_PROPERTIES + (
    Property("plugin.name", "enum", "pgoutput", "Logical decoding plugin.", choices=("pgoutput",)),
    Property(
        "database.sslmode",
        "enum",
        "prefer",
        "libpq sslmode.",
        choices=("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    ),
    Property("database.sslcert", "str", None, "Client certificate file (libpq sslcert)."),
    Property("database.sslkey", "str", None, "Client private key file (libpq sslkey)."),
    Property("database.sslrootcert", "str", None, "CA certificates checked by `verify-ca`/`verify-full`."),
    Property("database.sslpassword", "secret", None, "Password of an encrypted `database.sslkey`."),
    Property("slot.name", "str", "debezium", "Logical replication slot."),
    Property("publication.name", "str", "dbz_publication", "Publication read by pgoutput."),
    Property(
        "publication.autocreate.mode",
        "enum",
        "all_tables",
        "How the publication is created: all_tables, disabled, filtered, no_tables.",
        choices=("all_tables", "disabled", "filtered", "no_tables"),
    ),
    Property("publish.via.partition.root", "bool", False, "Publish partition changes as the root table."),
    Property("hstore.handling.mode", "enum", "json", choices=("json", "map")),
    Property("interval.handling.mode", "enum", "numeric", choices=("numeric", "string")),
    Property("money.fraction.digits", "int", 2, "Scale of MONEY values.", minimum=0),
    Property(
        "unavailable.value.placeholder",
        "str",
        "__debezium_unavailable_value",
        "Stands for unchanged TOAST values the server did not send ('hex:' prefix for bytes).",
    ),
    Property("heartbeat.action.query", "str", None, "SQL run at the start of each capture run."),
    Property(
        "database.initial.statements",
        "str",
        None,
        "`;`-separated SQL run on every connection the connector opens for queries (catalog, "
        "snapshot chunks, the peek window reader), after it opens; `;;` for a `;` inside a "
        "statement. Not run on the replication connection (`window.reader: stream`). For session "
        "parameters: a statement that changes DateStyle, IntervalStyle, TimeZone, "
        "extra_float_digits, bytea_output or client_encoding is refused.",
    ),
    Property("message.prefix.include.list", "list", (), "Regexes of logical-message prefixes to capture."),
    Property("message.prefix.exclude.list", "list", (), "Regexes of logical-message prefixes to skip."),
    Property(
        "window.reader",
        "enum",
        "peek",
        "How the change window is read: 'peek' (pg_logical_slot_peek_binary_changes, the faster "
        "here) or 'stream' (the streaming replication protocol, START_REPLICATION ... LOGICAL, as "
        "Debezium: nothing materialised on the server, no open transaction).",
        choices=("stream", "peek"),
    ),
    Property(
        "snapshot.max.threads",
        "int",
        1,
        "Connections that read a run's snapshot rows side by side: above 1, the pending tables "
        "are read in key ranges of incremental.snapshot.chunk.size rows (131072 when not set) "
        "handed out to that many readers, each on a connection of its own.",
        minimum=1,
    ),
)


def pg_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    """Validate a PostgreSQL connector configuration.

    :raises ConfigError: naming the first bad property.
    """
    return ConnectorConfig(PG_PROPERTIES, raw)
