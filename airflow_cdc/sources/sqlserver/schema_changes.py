"""Debezium-shaped schema change events for SQL Server.

SQL Server evolves a captured schema by a second capture instance: the table's structure, as the
connector sees it, changes where the newer instance starts.  Debezium then emits a schema change
event (``ddl`` null: the change tables carry no DDL text) whose ``tableChanges`` entry describes
the newer instance's captured columns.  Like the MySQL source, the events go into the batch
manifest (``schema_changes``) when ``include.schema.changes`` is on.
"""

from __future__ import annotations

from typing import Any

from airflow_cdc.sources.sqlserver.offsets import SqlServerLsn
from airflow_cdc.sources.sqlserver.schema import CaptureInstance, Column

# java.sql.Types codes of the SQL Server types (what the Microsoft JDBC driver reports).
_JDBC = {
    "bit": -7, "tinyint": -6, "smallint": 5, "int": 4, "bigint": -5, "real": 7, "float": 8,
    "decimal": 3, "numeric": 2, "money": 3, "smallmoney": 3, "char": 1, "varchar": 12, "text": -1,
    "nchar": -15, "nvarchar": -9, "ntext": -16, "binary": -2, "varbinary": -3, "image": -4,
    "date": 91, "time": 92, "datetime": 93, "smalldatetime": 93, "datetime2": 93,
    "datetimeoffset": -155, "uniqueidentifier": 1, "xml": -16, "timestamp": -2, "rowversion": -2,
    # microsoft.sql.Types of the types Debezium does not map (staged only with include.unknown.datatypes)
    "sql_variant": -156, "geometry": -157, "geography": -158,
}  # fmt: skip
_WITH_SCALE = frozenset({"decimal", "numeric", "money", "smallmoney", "time", "datetime2", "datetimeoffset"})


def table_change(ci: CaptureInstance, kind: str) -> dict[str, Any]:
    """Debezium's ``tableChanges`` entry for the capture instance's captured columns."""
    return {
        "type": kind,
        "id": f'"{ci.database}"."{ci.schema}"."{ci.table}"',
        "table": {
            "defaultCharsetName": None,
            "primaryKeyColumnNames": list(ci.key),
            "columns": [_column(c, n) for n, c in enumerate(ci.columns, start=1)],
            "attributes": [],
        },
    }


def _column(c: Column, position: int) -> dict[str, Any]:
    t = c.type_name.lower()
    length = c.precision if t in _WITH_SCALE or c.precision else c.max_length
    if t in ("nchar", "nvarchar") and c.max_length > 0:
        length = c.max_length // 2  # sys.columns counts bytes; Debezium reports characters
    return {
        "name": c.name,
        "jdbcType": _JDBC.get(t, 1111),
        "nativeType": None,
        "typeName": t,
        "typeExpression": t,
        "charsetName": None,
        "length": length,
        "scale": c.scale if t in _WITH_SCALE else None,
        "position": position,
        "optional": c.nullable,
        "autoIncremented": False,
        "generated": False,
    }


def switch_events(
    instances: list[CaptureInstance],
    low: SqlServerLsn,
    high: SqlServerLsn,
    constants: dict[str, dict[str, Any]],
    ts_ms: int,
) -> list[dict[str, Any]]:
    """One schema change event per capture-instance switch whose start LSN is in ``[low, high]``.

    :param constants: the ``source`` constants (version, connector, name) per table id.
    """
    by_table: dict[str, list[CaptureInstance]] = {}
    for ci in instances:
        by_table.setdefault(ci.table_id, []).append(ci)
    out: list[tuple[SqlServerLsn, dict[str, Any]]] = []
    for table, group in by_table.items():
        group.sort(key=lambda c: (c.start_lsn, c.create_date))
        for newer in group[1:]:
            if low <= newer.start_lsn <= high:
                source = dict(
                    constants.get(table, {}), ts_ms=ts_ms, snapshot="false", db=newer.database,
                    schema=newer.schema, table=newer.table, change_lsn=None,
                    commit_lsn=str(newer.start_lsn), event_serial_no=None,
                )  # fmt: skip
                event = {
                    "source": source,
                    "databaseName": newer.database,
                    "schemaName": newer.schema,
                    "ddl": None,  # SQL Server's change tables carry no DDL text
                    "tableChanges": [table_change(newer, "ALTER")],
                }
                out.append((newer.start_lsn, event))
    out.sort(key=lambda e: e[0])
    return [event for _, event in out]
