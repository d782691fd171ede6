"""The event model: Debezium's envelope as Arrow columns, one row per change event.

Every staged table file has these columns (SPEC §4):

``op``            ``c`` create, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate
                  (``m`` logical messages live in the batch's ``messages`` files).
``ts_ms/us/ns``   when the connector processed the event.
``before/after``  row images as structs of the captured columns, values encoded per Debezium's
                  type tables (each field's Arrow metadata carries the Connect type, semantic
                  name and parameters).
``source``        the connector's ``source`` block (fields exactly as Debezium documents them).
``transaction``   ``{id, total_order, data_collection_order}`` when
                  ``provide.transaction.metadata`` is on, else null.
``__position``    fixed-width bytes whose byte order is the event order (see ``core.source``).
``__unavailable`` names of ``after`` columns whose value the source did not send (PostgreSQL
                  unchanged TOAST); the column holds ``unavailable.value.placeholder`` where
                  its type can, and apply must keep the stored value.
``__old_key``     on the ``c`` event of a primary-key change (Debezium's ``__debezium.oldkey``
                  header): the old key's columns, so apply can fill the new row's unchanged-TOAST
                  columns from the old key's value; null on every other event.  Only tables
                  with key columns have it.
"""

from __future__ import annotations

import time

import pyarrow as pa

OP_CREATE, OP_UPDATE, OP_DELETE, OP_READ, OP_TRUNCATE, OP_MESSAGE = "c", "u", "d", "r", "t", "m"

TRANSACTION_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("total_order", pa.int64()),
        pa.field("data_collection_order", pa.int64()),
    ]
)

MESSAGE_TYPE = pa.struct([pa.field("prefix", pa.string()), pa.field("content", pa.binary())])

POSITION_COLUMN = "__position"
UNAVAILABLE_COLUMN = "__unavailable"
OLD_KEY_COLUMN = "__old_key"


def row_struct(fields: list[pa.Field]) -> pa.StructType:
    """The ``before``/``after`` struct type for a table's captured columns."""
    return pa.struct(fields)


def envelope_schema(
    columns: list[pa.Field],
    source_type: pa.StructType,
    metadata: dict[bytes, bytes] | None = None,
    key_columns: list[str] | None = None,
) -> pa.Schema:
    """Arrow schema of one staged table file (with ``__old_key`` when ``key_columns`` are given)."""
    row = row_struct(columns)
    by_name = {f.name: f for f in columns}
    key_fields = [by_name[k] for k in key_columns or () if k in by_name]
    old_key = [pa.field(OLD_KEY_COLUMN, pa.struct(key_fields))] if key_fields else []
    return pa.schema(
        [
            pa.field("op", pa.string(), nullable=False),
            pa.field("ts_ms", pa.int64(), nullable=False),
            pa.field("ts_us", pa.int64(), nullable=False),
            pa.field("ts_ns", pa.int64(), nullable=False),
            pa.field("before", row),
            pa.field("after", row),
            pa.field("source", source_type, nullable=False),
            pa.field("transaction", TRANSACTION_TYPE),
            pa.field(POSITION_COLUMN, pa.binary(), nullable=False),
            pa.field(UNAVAILABLE_COLUMN, pa.list_(pa.string())),
            *old_key,
        ],
        metadata=metadata,
    )


def message_schema(source_type: pa.StructType) -> pa.Schema:
    """Arrow schema of the batch's logical-message files (``op = m``)."""
    return pa.schema(
        [
            pa.field("op", pa.string(), nullable=False),
            pa.field("ts_ms", pa.int64(), nullable=False),
            pa.field("ts_us", pa.int64(), nullable=False),
            pa.field("ts_ns", pa.int64(), nullable=False),
            pa.field("source", source_type, nullable=False),
            pa.field("message", MESSAGE_TYPE, nullable=False),
            pa.field("transaction", TRANSACTION_TYPE),
            pa.field(POSITION_COLUMN, pa.binary(), nullable=False),
        ]
    )


def now_us() -> int:
    return time.time_ns() // 1000
