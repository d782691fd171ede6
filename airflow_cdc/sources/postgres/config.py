"""PostgreSQL connector properties (Debezium names and defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, Property
from airflow_cdc.core.snapshot_overrides import override_properties
from airflow_cdc.core.unchanged import skip_property

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
    Property(
        "slot.failover",
        "bool",
        False,
        "Create the slot as a failover slot (PostgreSQL 17+), which a standby with "
        "`sync_replication_slots = on` keeps in step, so capture can go on from it after a "
        "failover. An existing slot without it is altered (ALTER_REPLICATION_SLOT). Refused below 17.",
    ),
    Property(
        "slot.drop.on.stop",
        "bool",
        False,
        "Drop the slot when a run stops gracefully (after its batch is committed). For tests only, "
        "as in Debezium: the next run finds no slot, which is a lost offset (an error, or a "
        "re-snapshot with `snapshot.mode` `when_needed`).",
    ),
    Property("publication.name", "str", "dbz_publication", "Publication read by pgoutput."),
    Property(
        "publication.autocreate.mode",
        "enum",
        "all_tables",
        "How the publication is created: all_tables, disabled, filtered, no_tables.",
        choices=("all_tables", "disabled", "filtered", "no_tables"),
    ),
    Property("publish.via.partition.root", "bool", False, "Publish partition changes as the root table."),
    Property(
        "replica.identity.autoset.values",
        "str",
        None,
        "Replica identity set on captured tables at start: comma-separated `<schema.table regex>:"
        "<identity>` pairs (DEFAULT, FULL, NOTHING, INDEX <name>), e.g. "
        "`public.orders:FULL,inv.*:INDEX inv_uk`; the first match wins, other tables are left alone. "
        "Needs the table's owner.",
    ),
    Property("hstore.handling.mode", "enum", "json", choices=("json", "map")),
    Property("interval.handling.mode", "enum", "numeric", choices=("numeric", "string")),
    Property("money.fraction.digits", "int", 2, "Scale of MONEY values.", minimum=0),
    Property(
        "unavailable.value.placeholder",
        "str",
        "__debezium_unavailable_value",
        "Stands for unchanged TOAST values the server did not send ('hex:' prefix for bytes).",
    ),
    skip_property(
        "Applies only to tables with `REPLICA IDENTITY FULL`, as in Debezium: without it PostgreSQL sends "
        "no old row to compare with, and every update is emitted. An unchanged TOAST value counts as "
        "unchanged."
    ),
    *override_properties("<schemaName>.<tableName>"),
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
