"""What happens to a documented Debezium property that has no :class:`Property` definition.

Users paste their Debezium connector configs as they are.  Every property the Debezium docs
document (``docs/seed_properties/<connector>.txt``) is either defined by the connector's
``Property`` tuple (supported) or listed here:

* **ignored**: accepted and ignored with a warning that says why (it only concerns Kafka / Kafka
  Connect, the JVM driver, or a tuning knob whose job is done differently here);
* **refused**: :class:`~airflow_cdc.core.errors.ConfigError` naming the property and what to use
  instead, because ignoring it would silently change the data or the user's expectations.

A name matches an entry exactly, as one of its sub-properties (``key.converter.schemas.enable``
matches ``key.converter``), by prefix when the entry ends with ``.`` (``topic.``), or as a
template (``column.truncate.to.<length>.chars`` matches ``column.truncate.to.20.chars``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_KAFKA = "only concerns Kafka / Kafka Connect (no Kafka here: batches are staged as Parquet)"
_TOPIC = "Kafka topic naming; tables land in Delta as `<root>/<layer>/<name>/<table>`"
_JDBC = "a JDBC driver setting; the Python driver is configured by the `database.*` properties"
_RETRY = "restarts and retries are Airflow task retries; a failed run moves no offset"
_FETCH = "read tuning; snapshot reads are sized by `incremental.snapshot.chunk.size`"
_LOCKS = "snapshots are chunked incremental snapshots: no locks, no long transaction"
_SPI = "a Java SPI; there is no plug-in point for JVM classes"
_STARTUP = "capture runs are scheduled by Airflow; delay the DAG instead"


@dataclass(frozen=True)
class Handling:
    """How an undefined, documented property is treated: ``ignored`` or ``refused``, and why."""

    status: str
    reason: str


#: Accepted and ignored, with the reason logged.  Keys ending in "." are prefixes.
IGNORED: dict[str, str] = {
    "key.converter": _KAFKA,
    "value.converter": _KAFKA,
    "header.converter": _KAFKA,
    "transforms": _KAFKA,
    "predicates": _KAFKA,
    "producer.": _KAFKA,
    "consumer.": _KAFKA,
    "errors.": _KAFKA,
    "offset.flush.": _KAFKA,
    "offset.storage": _KAFKA,
    "schema.history.internal": "schema history lives in the staged batches and the state store",
    "tasks.max": "one capture task per connector; Airflow runs it",
    "connector.class": "the source kind is taken from it (see `connector`)",
    "max.queue.size": _KAFKA,
    "max.queue.size.in.bytes": _KAFKA,
    "max.batch.size": _KAFKA,
    "poll.interval.ms": _KAFKA,
    "tombstones.on.delete": "tombstones only serve Kafka log compaction; deletes are `d` events",
    "topic.": _TOPIC,
    "override.data.change.topic.prefix": _TOPIC,
    "transaction.topic": _TOPIC,
    "num.partitions": _TOPIC,
    "gtid.new.channel.position": "Debezium 1.x; a run resumes from the committed GTID set",
    "status.update.interval.ms": "the slot is confirmed when a batch is committed",
    "heartbeat.interval.ms": "heartbeats keep Kafka offsets moving; each run commits its end position",
    "heartbeat.topics.prefix": _TOPIC,
    "sanitize.field.names": "Avro naming; Parquet keeps the source names",
    "custom.sanitize.pattern": "Avro naming; Parquet keeps the source names",
    "field.name.adjustment.mode": "Avro naming; Parquet and Delta keep the source column names",
    "schema.name.adjustment.mode": "Avro schema naming; staged Parquet schemas carry no schema names",
    "extended.headers.enabled": "Kafka record headers",
    "plugin.path": "Kafka Connect plug-in path",
    "notification.": "Kafka/JMX notification channels; snapshot progress is in the run log and manifest",
    "source.struct.version": "the `source` block is always Debezium's current (v2) layout",
    "transaction.metadata.factory": _SPI,
    "retriable.restart.connector.wait.ms": _RETRY,
    "slot.max.retries": _RETRY,
    "slot.retry.delay.ms": _RETRY,
    "connect.timeout.ms": _RETRY,
    "binlog.net.read.timeout": _RETRY,
    "binlog.net.write.timeout": _RETRY,
    "database.query.timeout.ms": _RETRY,
    "connect.keep.alive": _RETRY,
    "use.nongraceful.disconnect": _JDBC,
    "database.autosave": _JDBC,
    "database.tcpKeepAlive": _JDBC,
    "database.sslfactory": _JDBC,
    "database.jdbc.driver": _JDBC,
    "database.protocol": _JDBC,
    "driver.": _JDBC,
    "snapshot.fetch.size": _FETCH,
    "query.fetch.size": _FETCH,
    "streaming.fetch.size": _FETCH,
    "min.row.count.to.stream.results": _FETCH,
    "binlog.buffer.size": _FETCH,
    "max.iteration.transactions": _FETCH,
    "poll.dispatch.interval.ms": _FETCH,
    "snapshot.max.threads": "one chunk reader per run; the chunk size sets the pace",
    "legacy.snapshot.max.threads": "one chunk reader per run; the chunk size sets the pace",
    "snapshot.tables.order.by.row.count": "tables are snapshotted in name order, chunk by chunk",
    "snapshot.locking.mode": _LOCKS,
    "snapshot.isolation.mode": _LOCKS,
    "snapshot.lock.timeout.ms": _LOCKS,
    "snapshot.query.mode": _LOCKS,
    "incremental.snapshot.watermarking.strategy": "windows are bounded by log positions, not signal rows",
    "incremental.snapshot.allow.schema.changes": "a schema change in a window starts a new part",
    "incremental.snapshot.option.recompile": _FETCH,
    # MySQL/MariaDB declare it (a read-only session on every connection); elsewhere only this holds
    "read.only": "windows are bounded by log positions: no watermark or signal rows are written",
    "snapshot.delay.ms": _STARTUP,
    "streaming.delay.ms": _STARTUP,
    "xmin.fetch.interval.ms": "xmin is not tracked; the slot's confirmed position is the offset",
    "schema.refresh.mode": "the schema follows the log's relation/table-map events",
    "table.ignore.builtin": "system tables are never captured",
    "ddl.parser.type": "no DDL parser: the schema is read from the server and the binlog metadata",
    "include.schema.comments": "column comments are not staged",
    "gtid.ignore.on.recovery": "recovery is a new run from the committed offset",
    "data.query.mode": "change tables are read through the CDC functions",
    "lsn.flush.mode": "the slot is confirmed only after a batch is committed (the only mode)",
    "flush.lsn.source": "the slot is confirmed only after a batch is committed (the only mode)",
    "vitess.keepalive.interval.ms": "gRPC keepalive is left to grpcio's defaults",
    "vitess.stream_keyspace_heartbeats": "heartbeats are not staged; see `vitess.heartbeat.interval`",
    "vitess.connector.generation": "reshard generations are tracked in the offset",
}

#: Refused with a ConfigError saying what to use instead.
REFUSED: dict[str, str] = {
    "slot.stream.params": "pgoutput's parameters are fixed (proto_version, publication_names, messages)",
    "database.sslcert": "a PostgreSQL property; MySQL/MariaDB take `database.ssl.keystore`",
    "database.sslkey": "a PostgreSQL property; MySQL/MariaDB take `database.ssl.keystore`",
    "database.sslrootcert": "a PostgreSQL property; MySQL/MariaDB take `database.ssl.truststore`",
    "database.sslpassword": "a PostgreSQL property; MySQL/MariaDB take `database.ssl.keystore.password`",
    "database.initial.statements": "PostgreSQL and MySQL/MariaDB only; set session defaults on the "
    "database user (SQL Server: the login's defaults)",
    "database.connection.factory.class": _SPI,
    "converters": f"{_SPI}; convert after apply (a Spark transform on the silver table)",
    "snapshot.mode.custom.name": _SPI,
    "snapshot.mode.configuration.based.": "use `snapshot.mode` (initial, initial_only, no_data, "
    "when_needed, always)",
    "snapshot.locking.mode.custom.name": _SPI,
    "snapshot.query.mode.custom.name": _SPI,
    "event.processing.failure.handling.mode": "only `fail` (the default) is supported: a bad event "
    "stops the run with nothing committed; `warn`/`skip` would drop data silently",
    "event.deserialization.failure.handling.mode": "only `fail` (the default) is supported",
    "event.converting.failure.handling.mode": "only `fail` (the default) is supported",
    "inconsistent.schema.handling.mode": "only `fail` (the default) is supported",
    "database.server.name": "renamed in Debezium 2.0; set `topic.prefix`",
    "vitess.database.user": "use `database.user` (vtgate's credentials)",
    "vitess.database.password": "use `database.password` (vtgate's credentials)",
    "offset.mismatch.strategy": "a lost or moved slot is handled by `snapshot.mode` `when_needed`",
}

#: Values accepted although the property is otherwise refused (Debezium's default behaviour).
ACCEPTED_VALUES: dict[str, frozenset[str]] = {
    "event.processing.failure.handling.mode": frozenset({"fail"}),
    "event.deserialization.failure.handling.mode": frozenset({"fail"}),
    "event.converting.failure.handling.mode": frozenset({"fail"}),
    "inconsistent.schema.handling.mode": frozenset({"fail"}),
}


def _pattern(entry: str) -> re.Pattern[str]:
    parts = re.split(r"<[a-z]+>", entry)
    body = r"[^.]+(?:\.[^.]+)*".join(re.escape(p) for p in parts)
    return re.compile(body + (".*" if entry.endswith(".") else ""))


def _lookup(table: dict[str, str], name: str) -> tuple[str, str] | None:
    best: tuple[str, str] | None = None
    for entry, reason in table.items():
        prefix = entry if entry.endswith(".") else entry + "."
        if _pattern(entry).fullmatch(name) or name.startswith(prefix):
            if best is None or len(entry) > len(best[0]):
                best = (entry, reason)
    return best


def handling(name: str) -> Handling | None:
    """Return how an undefined property ``name`` is treated, or ``None`` when nothing documents it.

    The longest matching entry wins, refused before ignored on a tie.
    """
    refused, ignored = _lookup(REFUSED, name), _lookup(IGNORED, name)
    if refused and (not ignored or len(refused[0]) >= len(ignored[0])):
        return Handling("refused", refused[1])
    if ignored:
        return Handling("ignored", ignored[1])
    return None


def accepted_value(name: str, raw: object) -> bool:
    """Whether a refused property's value is the Debezium default we do implement (``fail``)."""
    allowed = ACCEPTED_VALUES.get(name)
    return bool(allowed) and str(raw).strip().lower() in (allowed or ())
