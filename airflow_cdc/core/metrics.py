"""Connector metrics for batch runs: Debezium's snapshot and streaming metrics, plus ours.

Debezium publishes its metrics as JMX MBean attributes (``debezium.postgres:type=connector-metrics,
context=streaming,server=<topic.prefix>``).  Here every capture, apply and commit records the same
attribute names, valued for that run (a run is the connector's "start": ``TotalNumberOfEventsSeen``
counts the run's events), plus what a batch pipeline needs besides: the lag of silver behind the
source, the source log retained for the connector, batches staged but not applied, each step's
duration.  Names are ``airflow_cdc.<context>.<Name>`` (``airflow_cdc.streaming.MilliSecondsBehindSource``)
with the tags ``connector``, ``server``, ``context``, ``partition`` (partitioned connectors),
``table`` (per-table values) and every ``custom.metric.tags`` pair (docs/operations/monitoring.md).

A :class:`MetricsRecorder` collects one step's values; :func:`export` hands the numeric ones to a
:class:`MetricsSink` (Airflow's StatsD / OpenTelemetry backend: :mod:`airflow_cdc.airflow.metrics`);
:class:`MetricsFile` keeps each step's last values next to the connector's batches, so
``airflow-cdc status --json`` shows them without reaching any server.  Recording never fails a
run: a metric that cannot be computed is left out.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_cdc.core.batch import safe_name
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.storage import Location, open_location

log = logging.getLogger(__name__)

PREFIX = "airflow_cdc"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Metric:
    """One metric: Debezium's attribute name (or ours), its context, kind and meaning.

    :param kind: ``gauge`` (a number or boolean), ``timing`` (milliseconds, a StatsD timer / OTel
        histogram) or ``info`` (text or a list: ``status --json`` only, never exported).
    :param per_table: recorded per captured table, with the ``table`` tag.
    """

    context: str
    name: str
    kind: str
    doc: str
    per_table: bool = False


_S, _T, _C, _A, _M = "snapshot", "streaming", "capture", "apply", "commit"
_O, _L, _G = "source", "silver", "staging"

#: Every metric recorded, in the order the documentation lists them.
CATALOG: tuple[Metric, ...] = (
    Metric(_S, "LastEvent", "info", "Table and position of the last snapshot row staged."),
    Metric(_S, "MilliSecondsSinceLastEvent", "gauge", "Milliseconds since the last snapshot row was staged."),
    Metric(_S, "TotalNumberOfEventsSeen", "gauge", "Snapshot rows (`op=r`) staged by the run."),
    Metric(_S, "CapturedTables", "info", "Tables the connector captures."),
    Metric(_S, "TotalTableCount", "gauge", "Tables in the current snapshot (pending and done)."),
    Metric(_S, "RemainingTableCount", "gauge", "Tables of the snapshot not yet completely read."),
    Metric(_S, "SnapshotRunning", "gauge", "A snapshot is pending after the run (1/0)."),
    Metric(_S, "SnapshotPaused", "gauge", "Always 0: snapshots are not paused (no pause-snapshot signal)."),
    Metric(_S, "SnapshotAborted", "gauge", "A stop-snapshot signal ended a snapshot in the run (1/0)."),
    Metric(_S, "SnapshotCompleted", "gauge", "A snapshot completed and none is pending (1/0)."),
    Metric(_S, "SnapshotSkipped", "gauge", "`snapshot.mode=no_data` and no snapshot ever ran (1/0)."),
    Metric(_S, "SnapshotDurationInSeconds", "gauge", "Seconds since the current snapshot was planned."),
    Metric(_S, "SnapshotPausedDurationInSeconds", "gauge", "Always 0 (see SnapshotPaused)."),
    Metric(_S, "RowsScanned", "gauge", "Rows of the table read by the current snapshot so far.", True),
    Metric(_S, "ChunkId", "info", "The last chunk read: snapshot id and chunk number."),
    Metric(_S, "ChunkFrom", "info", "Key after which the last chunk starts (exclusive; empty: the first)."),
    Metric(_S, "ChunkTo", "info", "Last key of the last chunk."),
    Metric(_S, "TableFrom", "info", "Key after which the table's snapshot started (empty: the start)."),
    Metric(_S, "TableTo", "info", "Largest key of the table when its snapshot started."),
    Metric(_T, "LastEvent", "info", "Table and position of the last change event staged."),
    Metric(_T, "MilliSecondsSinceLastEvent", "gauge", "Milliseconds since the last change event was staged."),
    Metric(_T, "TotalNumberOfEventsSeen", "gauge", "Change events staged by the run.", True),
    Metric(_T, "TotalNumberOfCreateEventsSeen", "gauge", "Create (`c`) events staged by the run.", True),
    Metric(_T, "TotalNumberOfUpdateEventsSeen", "gauge", "Update (`u`) events staged by the run.", True),
    Metric(_T, "TotalNumberOfDeleteEventsSeen", "gauge", "Delete (`d`) events staged by the run.", True),
    Metric(
        _T,
        "NumberOfEventsFiltered",
        "gauge",
        "Events read and dropped by the include/exclude "
        "filters (0 where the server filters: publication, change tables, VStream rules).",
    ),
    Metric(_T, "CapturedTables", "info", "Tables the connector captures."),
    Metric(_T, "Connected", "gauge", "The run reached the source (1/0; live in `status`)."),
    Metric(
        _T,
        "MilliSecondsBehindSource",
        "gauge",
        "Processing time minus the source time of the "
        "last change event staged (clock differences included, as in Debezium).",
    ),
    Metric(_T, "NumberOfCommittedTransactions", "gauge", "Source transactions staged by the run."),
    Metric(_T, "SourceEventPosition", "info", "The offset the run read up to (the batch's end offset)."),
    Metric(_T, "LastTransactionId", "info", "Id of the last transaction staged, where the source has one."),
    Metric(
        _T,
        "MilliSecondsBehindSourceMinValue",
        "gauge",
        "Smallest per-event lag of the run (`statistics.metrics.enabled`).",
    ),
    Metric(
        _T,
        "MilliSecondsBehindSourceMaxValue",
        "gauge",
        "Largest per-event lag (`statistics.metrics.enabled`).",
    ),
    Metric(
        _T,
        "MilliSecondsBehindSourceAverageValue",
        "gauge",
        "Mean per-event lag (`statistics.metrics.enabled`).",
    ),
    Metric(
        _T, "MilliSecondsBehindSourceP50", "gauge", "Median per-event lag (`statistics.metrics.enabled`)."
    ),
    Metric(_T, "MilliSecondsBehindSourceP95", "gauge", "95th percentile lag (`statistics.metrics.enabled`)."),
    Metric(_T, "MilliSecondsBehindSourceP99", "gauge", "99th percentile lag (`statistics.metrics.enabled`)."),
    Metric(_C, "DurationMs", "timing", "Wall time of the capture step."),
    Metric(
        _C,
        "PositionTimeMs",
        "gauge",
        "Epoch ms at which the source stood at the batch's end offset: "
        "the run's start when it read up to the head, else the last event's source time.",
    ),
    Metric(_A, "DurationMs", "timing", "Wall time of the apply step (Spark job included)."),
    Metric(_A, "BatchesApplied", "gauge", "Batches the apply step applied."),
    Metric(_A, "EventsApplied", "gauge", "Change events and snapshot rows in them."),
    Metric(_M, "DurationMs", "timing", "Wall time of the commit step."),
    Metric(
        _L,
        "LagMs",
        "gauge",
        "Age of the source position silver reflects: now minus the "
        "PositionTimeMs of the newest applied batch (0-lag when caught up just now).",
    ),
    Metric(
        _L,
        "LagBytes",
        "gauge",
        "Source log between silver's position and the head (PostgreSQL WAL, binlog bytes; live).",
    ),
    Metric(
        _O,
        "RetainedLogBytes",
        "gauge",
        "Log the server keeps for the connector (slot restart_lsn to "
        "head; binlog from the committed file on).",
    ),
    Metric(
        _O, "RetainedLogFiles", "gauge", "Binlog files from the committed one to the head (MySQL/MariaDB)."
    ),
    Metric(_O, "BehindBytes", "gauge", "Log between the committed offset and the head."),
    Metric(_O, "PositionAgeMs", "gauge", "Age of the committed position (now minus its PositionTimeMs)."),
    Metric(_O, "RetainedLogLimitBytes", "gauge", "The byte limit the guard applies (0: none)."),
    Metric(_O, "RetainedLogLimitAgeMs", "gauge", "The age limit the guard applies (0: none)."),
    Metric(_O, "RetainedLogUsedFraction", "gauge", "The larger of bytes/limit and age/limit."),
    Metric(_O, "RetainedLogGuardTripped", "gauge", "The guard fails the sensor (1/0)."),
    Metric(_O, "WalStatus", "info", "PostgreSQL `pg_replication_slots.wal_status`."),
    Metric(_O, "RetainedLogDetail", "info", "What the server keeps, in words (LSN range, files ...)."),
    Metric(_G, "BatchesStaged", "gauge", "Published batches in the staging area."),
    Metric(_G, "BatchesNotApplied", "gauge", "Staged batches newer than the last applied and committed one."),
)
_BY_KEY = {(m.context, m.name): m for m in CATALOG}


def parse_tags(raw: Iterable[str] | str | None) -> dict[str, str]:
    """``custom.metric.tags`` (``k1=v1,k2=v2``) as a mapping, in the given order.

    :raises ConfigError: an item without ``=``, an empty key, or a key given twice.
    """
    items = [raw] if isinstance(raw, str) else list(raw or ())
    out: dict[str, str] = {}
    for part in (p.strip() for item in items for p in str(item).split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or key.strip() in out:
            raise ConfigError(
                f"property 'custom.metric.tags': {part!r} is not a new key=value pair "
                "(expected e.g. database=salesdb,env=prod)"
            )
        out[key.strip()] = value.strip()
    return out


def base_tags(config: ConnectorConfig) -> dict[str, str]:
    """The tags of every metric of ``config``'s connector (``context`` and ``table`` come per value)."""
    tags = {"connector": str(config["name"]), "server": str(config["topic.prefix"] or config["name"])}
    if config.partition is not None:
        tags["partition"] = str(config.partition)
    tags.update(parse_tags(config["custom.metric.tags"]))
    return tags


@dataclass(frozen=True)
class Point:
    """One value to export: its full name (``airflow_cdc.<context>.<Name>``), value and tags."""

    name: str
    value: float
    kind: str
    tags: dict[str, str]


class MetricsRecorder:
    """One step's values, by context, name and table (``None``: the connector's value)."""

    def __init__(self, config: ConnectorConfig) -> None:
        self.tags = base_tags(config)
        self.values: dict[tuple[str, str, str | None], Any] = {}

    def set(self, context: str, name: str, value: Any, table: str | None = None) -> None:
        """Record a value (``None`` is left out); an unknown metric is a programming error."""
        if (context, name) not in _BY_KEY:
            raise KeyError(f"unknown metric {context}.{name}")
        if value is not None:
            self.values[(context, name, table)] = value

    def get(self, context: str, name: str, table: str | None = None) -> Any:
        return self.values.get((context, name, table))

    def to_json(self) -> dict[str, Any]:
        """``{context: {Name: value, "tables": {table: {Name: value}}}}`` (JSON-able)."""
        out: dict[str, Any] = {}
        for (context, name, table), value in sorted(self.values.items(), key=lambda kv: str(kv[0])):
            section = out.setdefault(context, {})
            if table is None:
                section[name] = value
            else:
                section.setdefault("tables", {}).setdefault(table, {})[name] = value
        return out

    def merge_json(self, doc: Mapping[str, Any]) -> None:
        """Add the values of a :meth:`to_json` document (unknown names are skipped)."""
        for context, section in doc.items():
            for name, value in (section or {}).items():
                if name == "tables":
                    for table, values in value.items():
                        for tname, tvalue in values.items():
                            if (context, tname) in _BY_KEY:
                                self.set(context, tname, tvalue, table)
                elif (context, name) in _BY_KEY:
                    self.set(context, name, value)

    def points(self) -> list[Point]:
        """The exportable values: numbers and booleans (as 1/0) of gauge and timing metrics."""
        out = []
        for (context, name, table), value in self.values.items():
            metric = _BY_KEY[(context, name)]
            if metric.kind == "info" or not isinstance(value, (int, float)):
                continue
            tags = {**self.tags, "context": context, **({"table": table} if table is not None else {})}
            out.append(Point(f"{PREFIX}.{context}.{name}", float(value), metric.kind, tags))
        return out


class MetricsSink(Protocol):
    """Where exported points go (Airflow's metrics backend; a test double)."""

    def gauge(self, name: str, value: float, tags: dict[str, str]) -> None: ...

    def timing(self, name: str, ms: float, tags: dict[str, str]) -> None: ...


def export(recorder: MetricsRecorder, sink: MetricsSink) -> int:
    """Send every exportable value to ``sink``; returns how many.  A failing sink is logged."""
    sent = 0
    for point in recorder.points():
        try:
            if point.kind == "timing":
                sink.timing(point.name, point.value, point.tags)
            else:
                sink.gauge(point.name, point.value, point.tags)
            sent += 1
        except Exception as e:  # noqa: BLE001 - metrics must never fail a run
            log.warning("metric %s not exported: %s", point.name, e)
    return sent


class MetricsFile:
    """The last values of each step (``capture``, ``apply``, ``commit``, ``sensor``), kept at
    ``<staging.path>/<state name>/metrics.json``.

    Each step replaces its own section; the steps of one connector hold its lease (the sensor
    does not, and only writes its section), so a lost update costs at most one step's values.
    """

    def __init__(self, config: ConnectorConfig) -> None:
        self.location: Location = (
            open_location(config["staging.path"]) / safe_name(config.state_name) / METRICS_FILE
        )

    def load(self) -> dict[str, Any]:
        """Every step's last section; ``{}`` when nothing was recorded or the file is unreadable."""
        try:
            if not self.location.exists():
                return {}
            doc = json.loads(self.location.read_text())
        except Exception as e:  # noqa: BLE001 - a damaged file only loses metrics
            log.warning("metrics file %s not read: %s", self.location, e)
            return {}
        return doc if isinstance(doc, dict) else {}

    def save(self, step: str, recorder: MetricsRecorder, **facts: Any) -> None:
        """Replace ``step``'s section with the recorder's values (plus ``facts`` and the time)."""
        doc = self.load()
        doc[step] = {"at": time.time(), **facts, "metrics": recorder.to_json()}
        body = json.dumps(doc, indent=1, sort_keys=True, default=str).encode()
        try:
            self.location.parent.make_dirs()
            if self.location.local:  # a reader never sees half a file
                tmp = open_location(f"{self.location.path}.{os.getpid()}.tmp")
                tmp.write_bytes(body)
                os.replace(tmp.path, self.location.path)
            else:  # an object store's put is atomic
                self.location.write_bytes(body)
        except Exception as e:  # noqa: BLE001 - metrics must never fail a run
            log.warning("metrics file %s not written: %s", self.location, e)
