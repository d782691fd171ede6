"""Compare silver Delta tables with the live source: row counts and per-row hashes, by key range.

The source side is read in key order, in chunks of about ``chunk_bytes`` (at most ``chunk`` rows;
the row count comes from the width of the table's first rows), encoded exactly like captured
rows, converted with the apply job's own Debezium -> Spark conversions and cast to the silver
column types; each chunk is compared with the silver rows in the same key range by a hash of
the row.  So a silver table passes when it equals what a fresh snapshot would produce now.
Run it when writers are quiet (or accept differences for rows changed since the last apply).
Memory stays bounded by the chunk size: a chunk reaches Spark as a scratch Parquet file with small
row groups, never as one in-memory DataFrame.  Needs pyspark with Delta (local mode is fine).

A table without key columns mirrored as a multiset (``keyless: multiset``) is compared as one:
its rows, read in one consistent pass in no order, are counted per whole-row image on both sides
(``spark_jobs.cdc_apply.compare_multiset``); images held more often by the source are missing,
more often by silver extra.  An append-only log (``keyless: append``) cannot equal the table it
logs: it is reported as not compared.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_cdc.apply.submit import ApplyOptions, remote_conf
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_source, partitions
from airflow_cdc.core.storage import open_location
from spark_jobs.cdc_apply.layout import table_path

log = logging.getLogger(__name__)


SAMPLE = 20  # example keys kept per kind of difference (the counts cover every difference)
BY_KEY, AS_MULTISET, NOT_COMPARED = "by key", "as a multiset", "not compared"
APPEND_LOG = (
    "silver is an append-only log of the row events (keyless: append; no old row images to match "
    "deletes and updates by), not a copy of the table: give the table a key or, on PostgreSQL, "
    "REPLICA IDENTITY FULL and snapshot it again"
)


@dataclass
class TableReport:
    """One table's comparison: counts of every difference, and up to :data:`SAMPLE` example keys
    (compared as a multiset: example images, ``{"row": ..., "source": copies, "silver": copies}``)."""

    table: str
    compared: str = BY_KEY  # or AS_MULTISET, or NOT_COMPARED (``note`` says why)
    note: str = ""
    source_rows: int = 0
    silver_rows: int = 0
    missing: list[Any] = field(default_factory=list)  # keys in the source, not in silver
    extra: list[Any] = field(default_factory=list)  # keys in silver, not in the source
    different: list[Any] = field(default_factory=list)  # same key, different values
    missing_count: int = 0
    extra_count: int = 0
    different_count: int = 0

    @property
    def ok(self) -> bool:
        counted = self.missing_count or self.extra_count or self.different_count
        return not counted and self.source_rows == self.silver_rows

    def add_sample(self, kind: str, keys: list[Any]) -> None:
        sample: list[Any] = getattr(self, kind)
        sample += keys[: max(0, SAMPLE - len(sample))]


@dataclass
class VerifyReport:
    tables: list[TableReport]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables)

    @property
    def differences(self) -> dict[str, dict[str, Any]]:
        return {
            t.table: {
                "missing": t.missing,
                "extra": t.extra,
                "different": t.different,
                "source_rows": t.source_rows,
                "silver_rows": t.silver_rows,
                "counts": {
                    "missing": t.missing_count,
                    "extra": t.extra_count,
                    "different": t.different_count,
                },
            }
            for t in self.tables
            if not t.ok
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": self.seconds,
            "tables": {
                t.table: {
                    "ok": t.ok,
                    "compared": t.compared,
                    **({"note": t.note} if t.note else {}),
                    "source_rows": t.source_rows,
                    "silver_rows": t.silver_rows,
                    "missing": t.missing_count,
                    "extra": t.extra_count,
                    "different": t.different_count,
                }
                for t in self.tables
            },
            "differences": self.differences,
        }


PROBE_ROWS = 256  # rows read first to size the chunks of a table


def _source_chunks(source: Any, table: str, chunk: int) -> Iterator[pa.Table]:
    try:
        return source.encoded_chunks(table, chunk)  # type: ignore[no-any-return]
    except NotImplementedError as e:
        raise ConfigError(f"verify does not support the {source.kind} source yet") from e


def chunk_rows(source: Any, table: str, chunk: int, chunk_bytes: int) -> int:
    """Rows per chunk: about ``chunk_bytes`` of encoded rows as wide as the table's first
    :data:`PROBE_ROWS`, at most ``chunk``, at least 16."""
    chunks = _source_chunks(source, table, min(chunk, PROBE_ROWS))
    try:
        first = next(iter(chunks), None)
    finally:
        getattr(chunks, "close", lambda: None)()
    if first is None or first.num_rows == 0:
        return chunk
    width = max(1, first.nbytes // first.num_rows)
    return max(16, min(chunk, chunk_bytes // width))


def verify(
    config: ConnectorConfig,
    target: str,
    spark: Any = None,
    tables: list[str] | None = None,
    chunk: int = 50_000,
    chunk_bytes: int = 64 << 20,
    conf: dict[str, str] | None = None,
) -> VerifyReport:
    """Compare every captured table (or ``tables``) with its silver table under ``target``.

    :param chunk: at most this many source rows per comparison.
    :param chunk_bytes: about this many bytes of source rows per comparison (see :func:`chunk_rows`).
    :param conf: Spark conf of the session started here (when ``spark`` is not given).
    """
    from spark_jobs.cdc_apply import session

    if spark is None and config["spark.remote"]:  # the Connect server compares; nothing runs here
        spark = session.remote(config["spark.remote"], remote_conf(conf or {}))
    spark = spark or session.build(app_name="airflow-cdc-verify", **(conf or {}))
    started = time.monotonic()
    reports = []
    for part in partitions(config):  # each partition's source serves its own tables
        source = build_source(part)
        source.open()
        try:
            mine = source.tables()
            chosen = mine if tables is None else [t for t in tables if t in mine]
            for t in chosen:
                reports += _verify_table(spark, source, config, target, t, chunk, chunk_bytes)
        finally:
            source.close()
    unknown = sorted(set(tables or ()) - {r.table for r in reports})
    if unknown:
        shown = ", ".join(unknown)
        raise ConfigError(f"verify: table(s) {shown} not captured by connector {config['name']!r}")
    return VerifyReport(reports, round(time.monotonic() - started, 3))


def _verify_table(
    spark: Any, source: Any, config: ConnectorConfig, target: str, table: str, chunk: int, chunk_bytes: int
) -> list[TableReport]:
    """Silver's report, and when the table keeps SCD type 2 history (``delta.history.enabled``)
    one for the history's current versions (named ``<table> (history)``): both must equal the
    source.  One read of the source serves both."""
    from spark_jobs.cdc_apply import compare

    keys = source.table_state(table).key_columns
    if not keys:
        return [_verify_keyless(spark, source, config, target, table, chunk)]
    silver = compare.load_silver(spark, table_path(target, "silver", config["name"], table))
    targets = [(TableReport(table), silver)]
    if _has_history(config, table):
        path = table_path(target, "history", config["name"], table)
        targets.append((TableReport(f"{table} (history)"), compare.load_history_current(spark, path)))
    with _scratch(spark, config) as scratch:
        rows_per_chunk = chunk_rows(source, table, chunk, chunk_bytes)
        for i, rows in enumerate(_source_chunks(source, table, rows_per_chunk)):
            for j, (report, frame) in enumerate(targets):
                result = compare.compare_chunk(
                    spark, frame, rows, keys, f"{scratch}/keys-{j}", f"{scratch}/chunk-{i}.parquet"
                )
                _add_chunk(report, rows.num_rows, result)
        for j, (report, frame) in enumerate(targets):
            count, sample, report.silver_rows = compare.extra_keys(
                spark, frame, keys, f"{scratch}/keys-{j}", report.source_rows > 0
            )
            report.extra_count = count
            report.add_sample("extra", sample)
    return [report for report, _ in targets]


def _verify_keyless(
    spark: Any, source: Any, config: ConnectorConfig, target: str, table: str, chunk: int
) -> TableReport:
    """A table without key columns: compared as a multiset when silver mirrors it as one, else
    reported as not compared (an append-only log).  The source's pieces are its own (bounded:
    16 MB of values on PostgreSQL, 2,048 rows on MySQL/MariaDB), at most ``chunk`` rows."""
    from spark_jobs.cdc_apply import compare, compare_multiset

    # as the apply job reads the manifest: no mode recorded means an append-only log
    if (source.table_state(table).table_info().get("keyless") or "append") != "multiset":
        log.warning("verify: %s is not compared: %s", table, APPEND_LOG)
        return TableReport(table, compared=NOT_COMPARED, note=APPEND_LOG)
    report = TableReport(table, compared=AS_MULTISET)
    silver = compare.load_silver(spark, table_path(target, "silver", config["name"], table))
    with _scratch(spark, config) as scratch:
        rows = f"{scratch}/source.parquet"
        schema = compare_multiset.stage_rows(_source_chunks(source, table, chunk), rows)
        result = compare_multiset.compare_multiset(spark, silver, schema, rows)
    report.source_rows, report.silver_rows = result.source_rows, result.silver_rows
    report.missing_count, report.extra_count = result.missing_count, result.extra_count
    report.add_sample("missing", result.missing)
    report.add_sample("extra", result.extra)
    log.info(
        "verify %s (as a multiset): %d source rows, %d silver rows, %d missing, %d extra",
        table,
        report.source_rows,
        report.silver_rows,
        report.missing_count,
        report.extra_count,
    )
    return report


@contextlib.contextmanager
def _scratch(spark: Any, config: ConnectorConfig) -> Iterator[str]:
    """Where source chunks go for Spark to read them: a local temporary directory, or with a
    Spark Connect session (whose server may be another host) a folder under ``staging.path``
    (``<staging>/<connector>/_verify/<id>``), removed afterwards."""
    from spark_jobs.cdc_apply import deltasql

    if not deltasql.connected(spark):
        with tempfile.TemporaryDirectory(prefix="airflow-cdc-verify-") as local:
            yield local
        return
    where = open_location(config["staging.path"]) / config["name"] / "_verify" / uuid.uuid4().hex
    try:
        yield where.url  # compare gives Spark its Hadoop name (s3a://)
    finally:
        where.delete_tree()


def _add_chunk(report: TableReport, rows: int, result: Any) -> None:
    report.source_rows += rows
    report.missing_count += result.missing_count
    report.different_count += result.different_count
    report.add_sample("missing", result.missing)
    report.add_sample("different", result.different)
    log.info(
        "verify %s: %d source rows compared, %d missing, %d different so far",
        report.table,
        report.source_rows,
        report.missing_count,
        report.different_count,
    )


def _has_history(config: ConnectorConfig, table: str) -> bool:
    patterns = ApplyOptions.from_config(config).history_tables()
    return any(re.fullmatch(p, table, re.IGNORECASE) for p in patterns)
