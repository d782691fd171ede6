"""Delta writes shared by bronze, silver and tombstones: create, evolve, commit marks.

Every table a batch touches gets its last write of that batch marked with the Delta idempotent
transaction ``(appId, version)`` = ``(airflow-cdc:<connector>:<batch id>, 1)``: a re-run finds
the mark (``delta_log.has_applied``) and skips the table, and Delta itself drops a marked write
it has already seen.  Earlier writes of the same batch on that table are idempotent by position,
so a crash between them is repaired by simply running the batch again.  The batch id and end
offset go into every commit's ``userMetadata``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from . import delta_log, deltasql, log_commit
from .frames import SchemaChangeError, quoted
from .layout import app_id
from .types import refused, widening

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@dataclass(frozen=True)
class Commit:
    """Identity of one batch's writes."""

    connector: str
    batch_id: str
    metadata: str
    version: int = 1

    @property
    def app_id(self) -> str:
        return app_id(self.connector, self.batch_id)

    @contextmanager
    def conf(self, spark: SparkSession, txn: bool) -> Iterator[None]:
        """Session conf for one write: commit metadata, and the idempotency mark when ``txn``."""
        spark.conf.set(USER_METADATA, self.metadata)
        if txn:
            spark.conf.set(TXN_APP, self.app_id)
            spark.conf.set(TXN_VERSION, str(self.version))
        try:
            yield
        finally:
            for key in (TXN_APP, TXN_VERSION, USER_METADATA):
                spark.conf.unset(key)

    def append(self, frame: DataFrame, path: str, partition_by: list[str] | None = None) -> None:
        """Append ``frame`` to ``path`` as the batch's marked write (merging new columns)."""
        self.write(frame, path, "append", partition_by)

    def write(self, frame: DataFrame, path: str, mode: str, partition_by: list[str] | None = None) -> None:
        """Write ``frame`` to ``path`` as the batch's marked write (``append`` merges new columns;
        ``overwrite`` replaces the rows and keeps the table's schema and properties)."""
        writer = (
            frame.write.format("delta")
            .mode(mode)
            .option("txnAppId", self.app_id)
            .option("txnVersion", self.version)
            .option("userMetadata", self.metadata)
        )
        if mode == "append":
            writer = writer.option("mergeSchema", "true")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(path)


def create_table(
    spark: SparkSession,
    path: str,
    schema: T.StructType,
    properties: dict[str, str],
    partition_by: list[str] | None = None,
) -> None:
    """Create an empty Delta table at ``path`` unless one exists (concurrent creators: one wins)."""
    if deltasql.is_delta_table(path):
        return
    deltasql.create_table(spark, path, schema, properties, partition_by)


def ensure_columns(spark: SparkSession, path: str, schema: T.StructType) -> dict[str, T.DataType]:
    """Add missing columns, widen narrower ones and drop NOT NULL where ``schema`` allows NULL, so
    ``schema`` fits the table (idempotent); returns the table's column types afterwards.

    :raises SchemaChangeError: a type change Delta cannot widen.
    """
    fields = spark.read.format("delta").load(path).schema.fields
    current = {f.name: f.dataType for f in fields}
    target = deltasql.table_ref(path)
    nullable = {f.name for f in schema.fields if f.nullable}
    for f in fields:
        if not f.nullable and f.name in nullable:  # a key of a table created by an earlier version
            spark.sql(f"ALTER TABLE {target} ALTER COLUMN {quoted(f.name)} DROP NOT NULL")
    missing = [f for f in schema.fields if f.name not in current]
    if missing:
        cols = ", ".join(f"{quoted(f.name)} {deltasql.type_ddl(f.dataType)}" for f in missing)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({cols})")
    after = {**current, **{f.name: f.dataType for f in missing}}
    for f in schema.fields:
        if f.name not in current:
            continue
        if widening(current[f.name], f.dataType) == "widen":
            wide = deltasql.type_ddl(f.dataType)
            spark.sql(f"ALTER TABLE {target} ALTER COLUMN {quoted(f.name)} TYPE {wide}")
            after[f.name] = f.dataType
        elif refused(current[f.name], f.dataType):
            raise SchemaChangeError(
                f"Delta table {path}: column {f.name!r} is {current[f.name].simpleString()}, the batch has "
                f"{f.dataType.simpleString()}; Delta cannot change it in place"
            )
    return after


def commit_actions(
    spark: SparkSession, path: str, actions: list[dict[str, Any]], marks: list[Commit], info: Commit
) -> bool | None:
    """One Delta commit of ``actions`` (Delta log JSON) plus the idempotent-transaction marks of
    ``marks`` the table lacks, with ``info``'s commit metadata; False, committing nothing, when it
    has every mark already.  A commit of marks alone records batches whose rows an earlier write
    of several batches brought (``job.apply_batches``).

    Over Spark Connect (no transaction API) the commit is written from this process
    (``log_commit``) where the table allows it; where it does not, marks alone are committed one
    each (:func:`commit_marks`), and a commit with ``actions`` returns None, committing nothing
    (the caller writes its rows the Spark way)."""
    if deltasql.connected(spark):
        done = log_commit.commit(path, actions, [(c.app_id, c.version) for c in marks], info.metadata)
        if done is not None:
            return done
        return None if actions else commit_marks(spark, path, marks)
    state = delta_log.replay(path)
    if all(state.has_applied(c.app_id, c.version) for c in marks):
        # read from the log files: a transaction would first compute the new version's snapshot
        # (a Spark job, ~0.5 s after the stretch's own write recorded every mark already)
        return False
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta = jvm.org.apache.spark.sql.delta
    txn = delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()
    missing = lacking(txn, marks)
    if not missing:
        return False
    batch = jvm.java.util.ArrayList()
    for action in actions:
        batch.add(delta.actions.Action.fromJson(json.dumps(action)))
    for c in missing:
        batch.add(mark_action(jvm, c))
    operation = scala_object(jvm, "org.apache.spark.sql.delta.DeltaOperations$ManualUpdate")
    with info.conf(spark, txn=False):
        txn.commit(jvm.scala.jdk.javaapi.CollectionConverters.asScala(batch).toSeq(), operation)
    return True


def write_marked(
    spark: SparkSession,
    path: str,
    rows: DataFrame,
    marks: list[Commit],
    info: Commit,
    schema: T.StructType,
    properties: dict[str, str],
) -> bool:
    """Append ``rows`` (the table's columns, in its order) to the table at ``path`` in one commit
    that also records every mark of ``marks`` the table lacks, creating the table (``schema``,
    ``properties`` and the session's Delta defaults) when there is none: one commit where
    :func:`create_table`, :meth:`Commit.append` and :func:`commit_actions` make three.  False,
    writing nothing, when the table has every mark already.

    Over Spark Connect: the table is created first, the rows are appended as ``info``'s marked
    write, and the other marks follow in a commit of their own (:func:`commit_actions`); a crash in between
    leaves marks missing, which a re-run adds (the rows carry ``info``'s mark, so they are not
    appended twice)."""
    if deltasql.connected(spark):
        state = delta_log.replay(path)
        if all(state.has_applied(c.app_id, c.version) for c in marks):
            return False
        create_table(spark, path, schema, properties)
        if not state.has_applied(info.app_id, info.version):
            info.append(rows, path)
        commit_actions(spark, path, [], [c for c in marks if c.app_id != info.app_id], info)
        return True
    jvm = spark._jvm  # type: ignore[attr-defined]
    delta = jvm.org.apache.spark.sql.delta
    scala = jvm.scala.jdk.javaapi.CollectionConverters
    txn = delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()  # type: ignore[attr-defined]
    missing = lacking(txn, marks)
    if not missing:
        return False
    if txn.readVersion() < 0:
        metadata = {
            "id": str(uuid.uuid4()),
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema.json(),
            "partitionColumns": [],
            "configuration": properties,
            "createdTime": int(time.time() * 1000),
        }
        txn.updateMetadataForNewTable(delta.actions.Action.fromJson(json.dumps({"metaData": metadata})))
    actions = jvm.java.util.ArrayList()
    actions.addAll(scala.asJava(txn.writeFiles(rows._jdf)))
    for c in missing:
        actions.add(mark_action(jvm, c))
    none = jvm.scala.Option.empty()
    append = jvm.org.apache.spark.sql.SaveMode.Append
    operation = getattr(delta, "DeltaOperations$Write")(
        append, none, none, none, none, none, none, none, none
    )
    with info.conf(spark, txn=False):
        txn.commit(scala.asScala(actions).toSeq(), operation)
    return True


def commit_marks(spark: SparkSession, path: str, marks: list[Commit]) -> bool:
    """Record the marks of ``marks`` the table lacks without changing its rows: an empty marked
    append each (the portable way: a DataFrame write with ``txnAppId``/``txnVersion``, which
    Delta records even when the write has no rows).  False when none was missing."""
    state = delta_log.replay(path)
    missing = [c for c in marks if not state.has_applied(c.app_id, c.version)]
    if not missing:
        return False
    empty = spark.read.format("delta").load(path).limit(0)
    for commit in missing:
        commit.append(empty, path)
    return True


def lacking(txn: Any, marks: list[Commit]) -> list[Commit]:
    """The marks of ``marks`` the table a Delta transaction ``txn`` read does not have yet."""
    return [c for c in marks if txn.txnVersion(c.app_id) < c.version]


def mark_action(jvm: Any, commit: Commit) -> Any:
    """The Delta ``txn`` action of ``commit``'s idempotent-write mark (for a commit made through
    the transaction API, which the writer's ``txnAppId`` options do not reach)."""
    mark = {"appId": commit.app_id, "version": commit.version, "lastUpdated": int(time.time() * 1000)}
    return jvm.org.apache.spark.sql.delta.actions.Action.fromJson(json.dumps({"txn": mark}))


def scala_object(jvm: Any, name: str) -> Any:
    """A Scala ``object`` (its ``MODULE$``) by class name; through the JVM view, which sees the
    classes ``spark.jars`` loaded (``Class.forName`` does not)."""
    package, _, cls = name.rpartition(".")
    node = jvm
    for part in package.split("."):
        node = getattr(node, part)
    return getattr(node, cls + "$").__getattr__("MODULE$")
