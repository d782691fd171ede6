"""Delta operations as SQL: what the ``DeltaTable`` builder does, for classic and Spark Connect.

Over Spark Connect the job runs as a client without a JVM of its own: ``delta.tables.DeltaTable``
needs ``delta-connect-server`` on the server (not part of Delta 4.4), and the transaction API
(``DeltaLog.startTransaction``) is not reachable at all.  Every table the job creates, merges into
or deletes from goes through SQL here instead (``CREATE TABLE IF NOT EXISTS delta.`path```,
``MERGE INTO``, ``DELETE FROM``), in both modes, so the one code path the
whole test suite runs is the one a Connect client runs.  The session confs of
:meth:`writes.Commit.conf` (``txnAppId``/``txnVersion``, ``userMetadata``) reach these commands as
they reach the builder's: Delta reads them from the session for DML too.

What Connect cannot do at all -- a commit of hand-made actions (``writes.commit_actions``: the
bronze file copy, several marks in one commit, the one-scan vector MERGE) -- the job avoids there
(:func:`connected`): bronze is re-encoded, marks land one commit each, Delta's MERGE writes the
deletion vectors.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from . import delta_log
from .frames import quoted


def connected(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client without a JVM)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def table_ref(path: str) -> str:
    """The SQL name of the Delta table at ``path``: ``delta.`<path>```."""
    return "delta." + quoted(path)


def is_delta_table(path: str) -> bool:
    """Whether a Delta table exists at ``path`` (its log has a commit), read from the log itself."""
    return delta_log.table_exists(path)


def type_ddl(data_type: T.DataType) -> str:
    """A Spark SQL type, with every nested field name quoted (``simpleString`` quotes none, so a
    source column named ``a b`` or ``x:y`` inside a struct would not parse)."""
    if isinstance(data_type, T.StructType):
        fields = ", ".join(
            f"{quoted(f.name)}: {type_ddl(f.dataType)}{'' if f.nullable else ' NOT NULL'}"
            for f in data_type.fields
        )
        return f"STRUCT<{fields}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{type_ddl(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"MAP<{type_ddl(data_type.keyType)}, {type_ddl(data_type.valueType)}>"
    return data_type.simpleString()


def columns_ddl(schema: T.StructType) -> str:
    return ", ".join(
        f"{quoted(f.name)} {type_ddl(f.dataType)}{'' if f.nullable else ' NOT NULL'}" for f in schema.fields
    )


def string_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def binary_literal(value: bytes) -> str:
    return f"X'{value.hex()}'"


def create_table(
    spark: SparkSession,
    path: str,
    schema: T.StructType,
    properties: dict[str, str],
    partition_by: list[str] | None = None,
) -> None:
    """``CREATE TABLE IF NOT EXISTS`` at ``path`` (of concurrent creators one wins; the session's
    ``spark.databricks.delta.properties.defaults.*`` apply as with the builder)."""
    sql = f"CREATE TABLE IF NOT EXISTS {table_ref(path)} ({columns_ddl(schema)}) USING delta"
    if partition_by:
        sql += f" PARTITIONED BY ({', '.join(quoted(c) for c in partition_by)})"
    if properties:
        props = ", ".join(f"{string_literal(k)} = {string_literal(v)}" for k, v in properties.items())
        sql += f" TBLPROPERTIES ({props})"
    spark.sql(sql).collect()


def delete(spark: SparkSession, path: str, condition: str) -> None:
    """``DELETE FROM`` the table at ``path`` where the SQL ``condition`` holds."""
    spark.sql(f"DELETE FROM {table_ref(path)} WHERE {condition}").collect()  # noqa: S608 - quoted; the job's own condition


class Merge:
    """``MERGE INTO`` the table at ``path`` (alias ``t``) from a DataFrame (alias ``s``), built
    clause by clause as ``DeltaTable.merge`` is; clause order is kept (the first matching
    ``WHEN`` wins).  Keys of ``set``/``values`` are target column names, quoted where needed."""

    def __init__(self, spark: SparkSession, path: str, source: DataFrame, condition: str) -> None:
        self.spark, self.path, self.source, self.condition = spark, path, source, condition
        self.clauses: list[str] = []

    def when_matched_update(self, set: dict[str, str], condition: str | None = None) -> Merge:  # noqa: A002
        assignments = ", ".join(f"{column} = {value}" for column, value in set.items())
        self.clauses.append(f"WHEN MATCHED{_and(condition)} THEN UPDATE SET {assignments}")
        return self

    def when_matched_delete(self, condition: str | None = None) -> Merge:
        self.clauses.append(f"WHEN MATCHED{_and(condition)} THEN DELETE")
        return self

    def when_not_matched_insert(self, values: dict[str, str], condition: str | None = None) -> Merge:
        columns = ", ".join(values)
        exprs = ", ".join(values.values())
        clause = f"WHEN NOT MATCHED{_and(condition)} THEN INSERT ({columns}) VALUES ({exprs})"  # noqa: S608
        self.clauses.append(clause)
        return self

    def when_not_matched_insert_all(self) -> Merge:
        self.clauses.append("WHEN NOT MATCHED THEN INSERT *")
        return self

    def sql(self, view: str) -> str:
        return (
            f"MERGE INTO {table_ref(self.path)} AS t USING {quoted(view)} AS s ON {self.condition} "
            + " ".join(self.clauses)
        )

    def execute(self) -> None:
        view = f"cdc_merge_source_{uuid.uuid4().hex}"
        self.source.createOrReplaceTempView(view)
        try:
            self.spark.sql(self.sql(view)).collect()
        finally:
            self.spark.catalog.dropTempView(view)


def _and(condition: str | None) -> str:
    return f" AND ({condition})" if condition else ""
