"""Vitess connector properties (Debezium's Vitess connector names and defaults).

vtgate's address and credentials are Debezium's ``database.hostname`` / ``database.port`` (15991) /
``database.user`` / ``database.password``; ``vitess.vtgate.host`` / ``.port`` / ``.user`` /
``.password`` are accepted as aliases.  TLS towards vtgate (``vitess.grpc.tls*``) is ours:
Debezium's connector has no TLS settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, Property
from airflow_cdc.core.errors import ConfigError

_NOT_VITESS = {"database.dbname", "schema.include.list", "schema.exclude.list"}
_ALIASES = {
    "vitess.vtgate.host": "database.hostname",
    "vitess.vtgate.port": "database.port",
    "vitess.vtgate.user": "database.user",
    "vitess.vtgate.password": "database.password",
}
TABLET_TYPES = ("master", "primary", "replica", "rdonly")
DEFAULT_PORT = 15991

VITESS_PROPERTIES: tuple[Property, ...] = tuple(p for p in COMMON_PROPERTIES if p.name not in _NOT_VITESS) + (
    Property("vitess.keyspace", "str", required=True, doc="Keyspace to capture (Vitess's database)."),
    Property(
        "vitess.shard",
        "str",
        None,
        "One shard to capture (e.g. `-80`); default: every shard of the keyspace, which also follows "
        "reshards.",
    ),
    Property(
        "vitess.gtid",
        "str",
        "current",
        "Start position when there is no stored offset: `current`, or the shard's GTID set "
        "(`MySQL56/<uuid>:1-<n>`, or `MariaDB/<domain>-<server>-<seq>` for MariaDB shards; needs "
        "`vitess.shard`), or a VGTID JSON list "
        '(`[{"keyspace":..,"shard":..,"gtid":..}]`).',
    ),
    Property(
        "vitess.tablet.type",
        "enum",
        "master",
        "Tablet type to stream from: MASTER (= PRIMARY), REPLICA or RDONLY.",
        choices=TABLET_TYPES,
    ),
    Property(
        "vitess.stop_on_reshard",
        "bool",
        False,
        "Stop at a reshard (VStream flag stop_on_reshard) instead of following the new shards; "
        "the window then ends at the journal and the next run continues from the new shards.",
    ),
    Property("vitess.grpc.headers", "list", (), "gRPC call metadata `key:value` pairs sent with VStream."),
    Property(
        "vitess.grpc.max_inbound_message_size",
        "int",
        4 * 1024 * 1024,
        "Largest gRPC message accepted from vtgate, bytes.",
        minimum=1024,
    ),
    Property("vitess.grpc.tls", "bool", False, "Connect to vtgate over TLS."),
    Property(
        "vitess.grpc.tls.ca", "str", None, "PEM file of CA certificates for vtgate's (default: system CAs)."
    ),
    Property(
        "vitess.grpc.tls.server.name",
        "str",
        None,
        "Name vtgate's certificate must carry, when it is not `database.hostname`.",
    ),
    Property(
        "bigint.unsigned.handling.mode",
        "enum",
        "string",
        "BIGINT UNSIGNED as its decimal text (`string`), an exact Decimal (`precise`) or an int64 "
        "(`long`: a value above 2^63-1 stops the run, as Debezium cannot convert it to a Java long).",
        choices=("string", "long", "precise"),
    ),
    Property(
        "vitess.heartbeat.interval",
        "int",
        0,
        "Seconds between vtgate heartbeats on an idle stream (VStream flag heartbeat_interval); 0: none.",
        minimum=0,
    ),
    Property(
        "tasks.max",
        "int",
        1,
        "With vitess.offset.storage.per.task: mapped capture tasks the shards are dealt over.",
        minimum=1,
    ),
    Property(
        "vitess.offset.storage.per.task",
        "bool",
        False,
        "One stored offset per task (`task<i>_<tasks>_<gen>`), each over a round-robin share of the shards.",
    ),
    Property(
        "vitess.offset.storage.task.key.gen",
        "int",
        -1,
        "Generation of the task parallelism; raise it (with vitess.prev.num.tasks) when tasks.max changes.",
    ),
    Property(
        "vitess.prev.num.tasks",
        "int",
        -1,
        "Tasks of the previous generation, whose offsets a new generation takes its shards' positions from.",
    ),
    Property(
        "vitess.window.idle.timeout",
        "float",
        30.0,
        "Seconds a window waits for a shard to reach the position read at the start of the run.",
        minimum=0,
    ),
)


def vitess_config(raw: Mapping[str, Any]) -> ConnectorConfig:
    """Validate a Vitess connector configuration.

    :raises ConfigError: naming the first bad property (an alias given together with its
        Debezium name, a MySQL-only property, ``vitess.gtid`` set to a GTID without ``vitess.shard``).
    """
    values = dict(raw)
    for alias, name in _ALIASES.items():
        if alias in values:
            if name in values:
                raise ConfigError(f"property {alias!r} is an alias of {name!r}; set only one of them")
            values[name] = values.pop(alias)
    for prop in sorted(_NOT_VITESS & set(values)):
        raise ConfigError(
            f"property {prop!r} does not apply to Vitess; use vitess.keyspace / table.include.list"
        )
    values.setdefault("database.port", DEFAULT_PORT)
    config = ConnectorConfig(VITESS_PROPERTIES, values)
    gtid = str(config["vitess.gtid"]).strip()
    if gtid not in ("current", "") and not gtid.startswith("[") and not config["vitess.shard"]:
        raise ConfigError(
            "property 'vitess.gtid': a shard GTID position needs 'vitess.shard' (or give a VGTID list)"
        )
    if config["vitess.offset.storage.per.task"]:
        _check_per_task(config)
    for header in config["vitess.grpc.headers"]:
        if ":" not in header:
            raise ConfigError(f"property 'vitess.grpc.headers': {header!r} is not a key:value pair")
    return config


def _check_per_task(config: ConnectorConfig) -> None:
    """:raises ConfigError: a setting offset storage per task cannot honour (see :mod:`.tasks`)."""
    if config["vitess.offset.storage.task.key.gen"] < 0 or config["vitess.prev.num.tasks"] < 1:
        raise ConfigError(
            "vitess.offset.storage.per.task needs vitess.offset.storage.task.key.gen (>= 0) and "
            "vitess.prev.num.tasks (>= 1)"
        )
    if config["vitess.shard"]:
        raise ConfigError(
            "vitess.offset.storage.per.task deals the keyspace's shards over the tasks: unset vitess.shard"
        )
    if config["snapshot.mode"] in ("always", "when_needed"):
        raise ConfigError(
            f"property 'snapshot.mode': {config['snapshot.mode']} re-snapshots captured tables, which "
            "vitess.offset.storage.per.task cannot do (a task cannot void only its own shards' rows); "
            "use initial, initial_only or no_data"
        )
