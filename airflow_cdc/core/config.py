"""Connector configuration with Debezium's property names.

A connector is configured by a flat mapping of Debezium property names (``slot.name``,
``table.include.list``, ``snapshot.mode`` ...) plus a few of our own for what replaces Kafka
(``staging.path``, ``state.store``, ``run.max.events``).  A Debezium user can paste a
connector config: properties that only make sense with Kafka (converters, topic routing) are
accepted and ignored with a warning saying why, documented properties we do not implement are
refused with an error saying what to use instead (:mod:`airflow_cdc.core.property_status`), and
anything else unknown is an error with a suggestion, so a typo never silently falls back to a default.

Values may reference the environment as ``${env:NAME}`` so secrets stay out of files.
Secret values are wrapped in :class:`Secret`, whose ``repr``/``str`` never show the value.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.column_mappers import parse_mapper
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.property_status import accepted_value, handling
from airflow_cdc.core.redact import Secret as Secret  # re-exported: callers import it from here
from airflow_cdc.core.redact import redact_url

log = logging.getLogger(__name__)

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Property:
    """One supported property: name, type, default, allowed values, and what it means."""

    name: str
    kind: str  # "str" | "int" | "float" | "bool" | "enum" | "list" | "secret" | "secret_url"
    default: Any = None
    doc: str = ""
    choices: tuple[str, ...] = ()
    required: bool = False
    minimum: int | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)  # deprecated value -> canonical value
    #: validates a parsed value, given the concrete property name (templated properties)
    check: Callable[[str, Any], Any] | None = None

    @property
    def templated(self) -> bool:
        """Whether the name is a template (``column.truncate.to.<length>.chars``)."""
        return "<" in self.name

    def matches(self, name: str) -> bool:
        """Whether the concrete ``name`` is an instance of this (templated) property."""
        parts = re.split(r"<[a-z]+>", self.name)
        return re.fullmatch(r"[^.]+(?:\.[^.]+)*".join(re.escape(p) for p in parts), name) is not None

    def parse(self, raw: Any) -> Any:
        """Convert a raw value to this property's type.

        :raises ConfigError: naming the property, the bad value and what is allowed.
        """
        if raw is None:
            return None
        try:
            return _PARSERS[self.kind](self, raw)
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"property {self.name!r}: invalid value {_shown(self, raw)!r} (expected {self.kind})"
            ) from e


def _shown(prop: Property, raw: Any) -> Any:
    if prop.kind == "secret_url":
        return redact_url(str(raw))
    return "****" if prop.kind == "secret" else raw


def _parse_bool(prop: Property, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


def _parse_int(prop: Property, raw: Any) -> int:
    return _at_least(prop, _number(int, raw))


def _parse_float(prop: Property, raw: Any) -> float:
    value = _number(float, raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(raw)
    return _at_least(prop, value)


def _number(kind: Callable[[str], Any], raw: Any) -> Any:
    if isinstance(raw, bool):
        raise ValueError(raw)
    return kind(str(raw).strip())


def _at_least(prop: Property, value: Any) -> Any:
    if prop.minimum is not None and value < prop.minimum:
        raise ConfigError(f"property {prop.name!r}: {value} is below the minimum {prop.minimum}")
    return value


def _parse_enum(prop: Property, raw: Any) -> str:
    text = str(raw).strip().lower()
    if text in prop.aliases:
        log.warning("property %r: value %r is deprecated, using %r", prop.name, text, prop.aliases[text])
        text = prop.aliases[text]
    if text not in prop.choices:
        raise ConfigError(
            f"property {prop.name!r}: invalid value {raw!r}; allowed values: {', '.join(prop.choices)}"
        )
    return text


def split_list(raw: Any) -> tuple[str, ...]:
    """Split a Debezium comma-separated list (``\\,`` escapes a comma inside a regex)."""
    if isinstance(raw, (list, tuple)):
        return tuple(str(x).strip() for x in raw if str(x).strip())
    parts = re.split(r"(?<!\\),", str(raw))
    return tuple(p.replace("\\,", ",").strip() for p in parts if p.strip())


_PARSERS: dict[str, Callable[[Property, Any], Any]] = {
    "str": lambda p, raw: str(raw),
    "secret": lambda p, raw: raw if isinstance(raw, Secret) else Secret(str(raw)),
    "secret_url": lambda p, raw: raw if isinstance(raw, Secret) else Secret(str(raw), redact_url(str(raw))),
    "int": _parse_int,
    "float": _parse_float,
    "bool": _parse_bool,
    "enum": _parse_enum,
    "list": lambda p, raw: split_list(raw),
}


def _expand_env(name: str, raw: Any) -> Any:
    if not isinstance(raw, str) or "${env:" not in raw:
        return raw

    def repl(m: re.Match[str]) -> str:
        var = m.group(1)
        if var not in os.environ:
            raise ConfigError(f"property {name!r} refers to environment variable {var!r}, which is not set")
        return os.environ[var]

    return _ENV_REF.sub(repl, raw)


class ConnectorConfig:
    """Validated configuration: ``config["slot.name"]`` returns the typed value or default.

    A *partitioned* connector (several SQL Server databases, Vitess offset storage per task) is
    captured as independent partitions, each with a config of its own (:meth:`for_partition`):
    same ``name`` (its Delta tables and Assets are the connector's), but its own stored state,
    lease and staged batches, kept under :attr:`state_name`.
    """

    #: the partition this config captures; None for an unpartitioned connector
    partition: str | None = None

    def __init__(self, properties: Iterable[Property], raw: Mapping[str, Any]) -> None:
        self._props = {p.name: p for p in properties}
        self._values: dict[str, Any] = {}
        self._templated: dict[str, tuple[str, Any]] = {}  # concrete name -> (template, value)
        self.raw_names = frozenset(str(k) for k in raw)
        for key, value in raw.items():
            self._set(str(key), value)
        missing = [p.name for p in self._props.values() if p.required and self._values.get(p.name) is None]
        if missing:
            raise ConfigError(
                f"missing required propert{'y' if len(missing) == 1 else 'ies'}: {', '.join(sorted(missing))}"
            )

    def _set(self, key: str, value: Any) -> None:
        prop = self._props.get(key)
        if prop is None:
            template = next((p for p in self._props.values() if p.templated and p.matches(key)), None)
            if template is not None:
                value = template.parse(_expand_env(key, value))
                if template.check is not None:
                    template.check(key, value)
                self._templated[key] = (template.name, value)
                return
            known = handling(key)
            if known is not None and (known.status == "ignored" or accepted_value(key, value)):
                log.warning(
                    "property %r ignored: %s",
                    key,
                    known.reason if known.status == "ignored" else "its only supported value is the default",
                )
                return
            if known is not None:
                raise ConfigError(f"property {key!r} is not supported: {known.reason}")
            close = difflib.get_close_matches(key, list(self._props), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown property {key!r}{hint}")
        self._values[key] = prop.parse(_expand_env(key, value))
        if prop.check is not None:
            prop.check(key, self._values[key])

    def __getitem__(self, name: str) -> Any:
        if name not in self._props:
            raise KeyError(name)
        value = self._values.get(name)
        return self._props[name].default if value is None else value

    @property
    def state_name(self) -> str:
        """The key of the stored state, the lease and the staged batches: the connector's
        ``name``, or ``<name>.<partition>`` for one partition."""
        return self["name"] if self.partition is None else f"{self['name']}.{self.partition}"

    def for_partition(self, partition: str, overrides: Mapping[str, Any]) -> ConnectorConfig:
        """A copy of this config that captures one partition, with ``overrides`` applied.

        :raises ConfigError: an override is not a property of this connector.
        """
        part = copy.copy(self)
        part._values = dict(self._values)
        part._templated = dict(self._templated)
        for key, value in overrides.items():
            part._set(key, value)
        part.partition = partition
        return part

    def templated(self, template: str) -> list[tuple[str, Any]]:
        """The concrete properties set for a templated one, as (name, value), in config order."""
        return [(name, value) for name, (t, value) in self._templated.items() if t == template]

    def is_set(self, name: str) -> bool:
        return self._values.get(name) is not None

    def secret(self, name: str) -> str | None:
        value = self[name]
        return value.reveal() if isinstance(value, Secret) else value

    def items(self) -> list[tuple[str, Any]]:
        """All supported properties with their effective values (secrets masked)."""
        return [(n, self[n]) for n in sorted(self._props)]

    @property
    def properties(self) -> Mapping[str, Property]:
        return self._props

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._values.items()}
        return f"ConnectorConfig({shown!r})"


#: Properties every connector understands, whatever the source.
COMMON_PROPERTIES: tuple[Property, ...] = (
    Property("name", "str", required=True, doc="Unique connector name; keys the stored state."),
    Property(
        "connector",
        "str",
        doc="Source kind (also accepts `connector.class`): postgresql, mysql, mariadb, sqlserver, ...",
    ),
    Property("topic.prefix", "str", doc="Logical server name used in `source.name`; defaults to `name`."),
    Property("database.hostname", "str", "127.0.0.1", "Database server host."),
    Property("database.port", "int", None, "Database server port.", minimum=1),
    Property("database.user", "str", doc="Database user."),
    Property("database.password", "secret", doc="Password; use `${env:VAR}` or an Airflow Connection."),
    Property("database.dbname", "str", doc="Database to capture."),
    Property("schema.include.list", "list", (), "Regexes of schema names to capture."),
    Property("schema.exclude.list", "list", (), "Regexes of schema names not to capture."),
    Property("table.include.list", "list", (), "Regexes of fully-qualified table names to capture."),
    Property("table.exclude.list", "list", (), "Regexes of fully-qualified table names not to capture."),
    Property("column.include.list", "list", (), "Regexes of fully-qualified column names to keep."),
    Property("column.exclude.list", "list", (), "Regexes of fully-qualified column names to drop."),
    Property(
        "message.key.columns",
        "str",
        None,
        "`<table regex>:<col>,<col>;...` key columns for tables without (or overriding) a primary key.",
    ),
    *(
        Property(
            template,
            "list",
            (),
            doc,
            check=lambda name, value: parse_mapper(name, tuple(value)),
        )
        for template, doc in (
            (
                "column.truncate.to.<length>.chars",
                "Regexes of fully-qualified character columns whose values are cut to `<length>` "
                "characters (UTF-16 units, as Java).",
            ),
            (
                "column.mask.with.<length>.chars",
                "Regexes of fully-qualified character columns whose values (NULL included) are "
                "replaced by `<length>` asterisks.",
            ),
            (
                "column.mask.hash.<algorithm>.with.salt.<salt>",
                "Regexes of fully-qualified character columns whose values are replaced by the hex "
                "hash of salt + value, byte for byte as Debezium (`.v2.` after `hash`: hash of the "
                "UTF-8 bytes); cut to the column's length. `<algorithm>`: a Java MessageDigest name "
                "(MD5, SHA-1, SHA-256, SHA-512, SHA3-256 ...).",
            ),
        )
    ),
    Property("skipped.operations", "list", ("t",), "Operations not emitted: c, u, d, t, or none."),
    Property(
        "snapshot.mode",
        "enum",
        "initial",
        "When to snapshot (all as chunked incremental snapshots).",
        choices=("initial", "initial_only", "no_data", "when_needed", "always"),
        aliases={"never": "no_data", "schema_only": "no_data"},
    ),
    Property(
        "snapshot.include.collection.list", "list", (), "Regexes of tables the initial snapshot covers."
    ),
    Property(
        "incremental.snapshot.chunk.size",
        "int",
        1024,
        "Rows per snapshot chunk. Left unset, chunks start at 1024 rows and grow towards "
        "`incremental.snapshot.chunk.target.ms` per chunk; set, every chunk has this many rows.",
        minimum=1,
    ),
    Property(
        "incremental.snapshot.chunk.target.ms",
        "int",
        2000,
        "Ours, not Debezium's: the read time a snapshot chunk grows towards (up to 131072 rows) while "
        "`incremental.snapshot.chunk.size` is not set; `0` keeps chunks at 1024 rows.",
        minimum=0,
    ),
    Property("snapshot.max.rows.per.run", "int", 1_000_000, "Snapshot rows read per capture run.", minimum=1),
    Property(
        "column.propagate.source.type",
        "list",
        (),
        "Regexes of fully-qualified column names whose staged field carries the source type as "
        "Debezium's schema parameters (`__debezium.source.column.type`, `.length`, `.scale`), in the "
        "Parquet field metadata.",
    ),
    Property(
        "datatype.propagate.source.type",
        "list",
        (),
        "Regexes of fully-qualified type names (`<table>.<type>`, e.g. `.+\\.NUMERIC`) whose columns "
        "carry the source type parameters, as `column.propagate.source.type`.",
    ),
    Property(
        "guardrail.collections.max",
        "int",
        0,
        "Most tables the connector may capture; `0` disables the guardrail.",
        minimum=0,
    ),
    Property(
        "guardrail.collections.limit.action",
        "enum",
        "warn",
        "What exceeding `guardrail.collections.max` does: `warn` (log and note in the batch) or `fail` "
        "(the run stops before anything is stored).",
        choices=("warn", "fail"),
    ),
    Property(
        "signal.data.collection",
        "str",
        None,
        "The signal table (`schema.table`, MySQL `db.table`, SQL Server `db.schema.table`), captured like "
        "any table: rows inserted into it (columns id, type, data, in that order) are Debezium signals "
        "(`execute-snapshot`, `stop-snapshot`) read in the change window; the snapshot they ask for "
        "starts in that run (an incremental one with its first chunks, reconciled by a follow-on "
        "window; a blocking one, PostgreSQL and MySQL/MariaDB only, reads the tables whole at one log "
        "position before the run ends).",
    ),
    Property(
        "signal.enabled.channels",
        "list",
        ("source",),
        "Signal channels: `source` (the signal table). Signals in the DAG run conf, the trigger form and "
        "`airflow-cdc capture --signal` always work.",
    ),
    Property(
        "snapshot.additional.conditions.raw.sql",
        "bool",
        False,
        "Ours, not Debezium's: pass `execute-snapshot` additional-conditions to the database as raw SQL. "
        "Default false: a condition must be in the safe condition language (columns compared with "
        "literals, AND/OR/NOT), rendered with bound values.",
    ),
    Property("decimal.handling.mode", "enum", "precise", choices=("precise", "double", "string")),
    Property(
        "time.precision.mode",
        "enum",
        "adaptive",
        choices=(
            "adaptive",
            "adaptive_time_microseconds",
            "connect",
            "isostring",
            "microseconds",
            "nanoseconds",
        ),
    ),
    Property("binary.handling.mode", "enum", "bytes", choices=("bytes", "base64", "base64-url-safe", "hex")),
    Property("include.unknown.datatypes", "bool", False, "Emit unknown types as bytes instead of failing."),
    Property("provide.transaction.metadata", "bool", False, "Fill the `transaction` block of each event."),
    Property(
        "staging.path", "str", required=True, doc="Directory (or URL) where staged batches are written."
    ),
    Property(
        "state.store",
        "secret_url",
        None,
        "State backend URL: a directory/file://, sqlite:///, postgresql://, mysql://; "
        "default `<staging.path>/_state`.",
    ),
    Property(
        "run.max.events",
        "int",
        1_000_000,
        "Change events read per capture run (whole transactions).",
        minimum=1,
    ),
    Property(
        "staging.piece.rows", "int", 65_536, "Rows buffered per table before a Parquet row group.", minimum=16
    ),
    Property("staging.retention.batches", "int", 50, "Committed batches kept on disk.", minimum=0),
    Property(
        "delta.root", "str", None, "Delta root for bronze/silver tables: `<root>/<layer>/<name>/<table>`."
    ),
    Property(
        "delta.delete.mode",
        "enum",
        "delete",
        "Silver deletes: `delete` removes rows, `soft` flags them.",
        choices=("delete", "soft"),
    ),
    Property("delta.bronze.enabled", "bool", True, "Append every event to the bronze change log."),
    Property(
        "delta.bronze.file.copy",
        "bool",
        True,
        "Add the staged Parquet parts to bronze as they are (a hard link or file copy, one Delta commit) "
        "instead of re-encoding them. Bronze tables created with this on are partitioned by `__date` and "
        "`__batch_id`; a batch with new or changed columns, parts spanning two dates, column names Delta "
        "accepts only with column mapping, or a table of an earlier layout is re-encoded. Over Spark Connect "
        "(`spark.remote`) the client places the files and writes the Delta commit itself, so the Airflow "
        "worker needs write access to the Delta root; off, every Delta write stays on the server.",
    ),
    Property(
        "commit.require.applied",
        "enum",
        "auto",
        "Commit refuses a batch missing from any of its Delta tables: `auto` when a Delta root is "
        "known, `true` always (a Delta root is required), `false` for capture-only pipelines.",
        choices=("auto", "true", "false"),
    ),
    Property(
        "lease.timeout.ms",
        "int",
        120_000,
        "Lease of a running capture/apply/commit: renewed every third of this; a run that stops "
        "renewing (killed) is taken over after it, or at once when its process is gone on this host.",
        minimum=1_000,
    ),
    Property(
        "delta.rewrite.ratio",
        "float",
        0.5,
        "Rewrite a silver table (one join) instead of MERGE (two passes) when a batch has at least "
        "this many events per stored row; `0` always MERGEs. Tables with change data feed always MERGE.",
        minimum=0,
    ),
    Property(
        "delta.optimize.interval.batches",
        "int",
        100,
        "Compact each silver and tombstone table (Delta `OPTIMIZE`: bin-packs small files, purges "
        "deletion vectors hiding over 5 % of a file) after every this many batches that wrote it; "
        "`0` never compacts.",
        minimum=0,
    ),
    Property(
        "delta.deletion.vectors.enabled",
        "bool",
        True,
        "Create new silver and tombstone tables with Delta deletion vectors (`delta.enableDeletionVectors`): "
        "a MERGE writes the changed rows and a vector per touched file instead of copying whole files, in "
        "one scan of the stored keys when every written value comes from the batch, so a small batch "
        "costs the same into any size of table. Readers then need the `deletionVectors` table feature "
        "besides column mapping and type widening (Delta Lake 2.3+ on Spark). `false` creates tables "
        "without them, for readers that lack the feature, but each MERGE then copies every file it "
        "touches (a 5,000-update batch into 10M rows took 5.5x its time into 0.2M). Existing tables "
        "keep their properties and protocol either way.",
    ),
    Property(
        "delta.catalog",
        "str",
        None,
        "Register the bronze, silver and history tables in this Spark catalog namespace (`schema` or "
        "`catalog.schema`, e.g. a Unity Catalog, Glue or Hive schema) as external Delta tables over "
        "their locations, which stay as they are. Empty: locations only.",
    ),
    Property(
        "delta.catalog.table.format",
        "str",
        "{layer}_{table}",
        "Name of a registered table: `{layer}` (bronze, silver, history), `{table}` (the source "
        "table, dots as underscores), `{schema}`, `{name}`, `{connector}`.",
    ),
    Property(
        "spark.remote",
        "str",
        None,
        "A Spark Connect server (`sc://host:15002`, Spark's own URL form with `/;token=...` and other "
        "parameters) to apply batches through: the apply runs here as its client, without Java or "
        "Delta jars on this host; the server needs the Delta (and S3A/GCS/ABFS) jars and session "
        "extension. Empty: `spark-submit` to the Spark master. Secrets in the URL are masked in logs.",
    ),
    Property(
        "delta.history.enabled",
        "list",
        (),
        "SCD type 2 history tables: `true` for every keyed table, `false`, or regexes of "
        "fully-qualified table names.",
    ),
    Property(
        "delta.history.except.columns",
        "list",
        (),
        "Regexes of fully-qualified column names (`schema.table.column`) whose changes update the "
        "current history version in place instead of opening a new one (AUTO CDC's "
        "`TRACK HISTORY ON * EXCEPT`).",
    ),
    Property(
        "custom.metric.tags",
        "list",
        (),
        "Tags `k1=v1,k2=v2` added to every metric of the connector (StatsD tags, OpenTelemetry "
        "attributes, `status --json`), as Debezium appends them to its MBean names.",
        check=lambda name, value: _metric_tags(value),
    ),
    Property(
        "statistics.metrics.enabled",
        "bool",
        False,
        "Also record `MilliSecondsBehindSource` statistics over the run's events (min, max, average, "
        "P50, P95, P99), as Debezium does; reads the staged source times once more.",
    ),
    Property(
        "retained.log.max.fraction",
        "float",
        0.8,
        "The sensor fails once the log the source keeps for the connector reaches this fraction of "
        "the server's limit: PostgreSQL `max_slot_wal_keep_size`, MySQL/MariaDB binlog expiry, SQL "
        "Server CDC cleanup retention (its age); `0` turns the server-relative guard off.",
        minimum=0,
    ),
    Property(
        "retained.log.max.bytes",
        "int",
        0,
        "The sensor fails once the source keeps more than this many bytes of log for the connector "
        "(PostgreSQL slot, binlog files); `0`: no absolute byte limit.",
        minimum=0,
    ),
    Property(
        "retained.log.max.age.ms",
        "int",
        0,
        "The sensor fails once the committed position is older than this (the time the source stood "
        "there); `0`: no absolute age limit.",
        minimum=0,
    ),
)


def _metric_tags(value: Any) -> None:
    from airflow_cdc.core.metrics import parse_tags  # metrics imports this module

    parse_tags(value)


def skipped_ops(config: ConnectorConfig) -> frozenset[str]:
    """The ``skipped.operations`` set, validated (``none`` means skip nothing)."""
    ops = frozenset(o.lower() for o in config["skipped.operations"])
    if ops == {"none"}:
        return frozenset()
    bad = ops - {"c", "u", "d", "t"}
    if bad:
        raise ConfigError(
            f"property 'skipped.operations': invalid operation(s) {sorted(bad)}; allowed: c, u, d, t, none"
        )
    return ops


def signal_table(config: ConnectorConfig) -> str | None:
    """The signal table to read in change windows (``signal.data.collection`` with the ``source``
    channel enabled), validated.

    :raises ConfigError: a channel other than ``source``.
    """
    channels = {c.strip().lower() for c in config["signal.enabled.channels"]}
    other = sorted(channels - {"source"})
    if other:
        raise ConfigError(
            f"property 'signal.enabled.channels': channel(s) {', '.join(other)} are not supported; "
            "use `source` (the signal table) -- signals in the DAG run conf or `airflow-cdc capture "
            "--signal` always work"
        )
    table = config["signal.data.collection"]
    return str(table) if table and "source" in channels else None
