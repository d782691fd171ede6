"""Column encodings against Debezium's MySQL type mapping (issue 35): POINT, TIMESTAMP(n) text,
``enable.time.adjuster``, FLOAT(M,D), BOOLEAN declared in a DDL, and ENUM/SET labels of a table
map in the column's character set."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa
import pytest

from airflow_cdc.core.filters import TableFilter
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef
from airflow_cdc.sources.mysql.tables import TableResolver
from airflow_cdc.sources.mysql.types import Modes, column_codec


def _convert(col: ColumnDef, values: list, modes: Modes | None = None) -> tuple[pa.Field, list]:
    codec = column_codec(col, modes or Modes())
    return codec.field, codec.convert(pa.array(values)).to_pylist()


def test_point_is_debeziums_point_with_x_and_y():
    """io.debezium.data.geometry.Point: {x, y, wkb, srid} (Point.createValue parses x, y from the WKB)."""
    wkb = b"\x01\x01\x00\x00\x00" + struct.pack("<dd", 1.5, -2.25)
    field, values = _convert(ColumnDef("g", "point", "point"), [(3857).to_bytes(4, "little") + wkb, None])
    assert values == [{"x": 1.5, "y": -2.25, "wkb": wkb, "srid": 3857}, None]
    assert field.metadata[b"connect.name"] == b"io.debezium.data.geometry.Point"
    assert [f.name for f in field.type] == ["x", "y", "wkb", "srid"]


@pytest.mark.parametrize(
    ("fsp", "micros", "text"),
    [
        (0, 1577836800_000000, "2020-01-01T00:00:00Z"),
        (1, 1577836800_100000, "2020-01-01T00:00:00.1Z"),  # the example
        (1, 1577836800_000000, "2020-01-01T00:00:00.0Z"),
        (2, 1577836800_120000, "2020-01-01T00:00:00.12Z"),
        (3, 1577836800_120000, "2020-01-01T00:00:00.120Z"),
        (4, 2147483647_123400, "2038-01-19T03:14:07.1234Z"),
        (6, 1577836800_100000, "2020-01-01T00:00:00.100000Z"),
    ],
)
def test_timestamp_text_has_the_column_precision(fsp, micros, text):
    """ZonedTimestamp.toIsoString formats TIMESTAMP(n) with appendFraction(NANO_OF_SECOND, n, n)."""
    col = ColumnDef("ts", "timestamp", f"timestamp({fsp})" if fsp else "timestamp", fsp=fsp)
    assert _convert(col, [micros, None])[1] == [text, None]


def _days(y: int, m: int, d: int) -> int:
    return (dt.date(y, m, d) - dt.date(1970, 1, 1)).days


def test_time_adjuster_moves_years_below_100():
    """enable.time.adjuster (default true): 0-69 -> 2000-2069, 70-99 -> 1970-1999."""
    date = ColumnDef("d", "date", "date")
    packed = [1 << 9 | 1 << 5 | 1, 69 << 9 | 12 << 5 | 31, 70 << 9 | 1 << 5 | 1, 99 << 9 | 12 << 5 | 31, 0]
    assert _convert(date, packed)[1] == [_days(2001, 1, 1), _days(2069, 12, 31), 0, _days(1999, 12, 31), None]
    assert _convert(date, packed[:1], Modes(time_adjuster=False))[1] == [_days(1, 1, 1)]
    stamp = ColumnDef("t", "datetime", "datetime(6)", fsp=6)
    neutral = 50_0601_120000 * 10**6 + 5  # 0050-06-01 12:00:00.000005
    expected = (dt.datetime(2050, 6, 1, 12) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1) + 5
    assert _convert(stamp, [neutral, 0])[1] == [expected, None]


def test_float_with_digits_is_float64():
    """FLOAT(M,D) is FLOAT64 in Debezium's MySQL type mapping; FLOAT stays FLOAT32."""
    stored = struct.unpack("<f", struct.pack("<f", 1234.567))[0]
    field, values = _convert(ColumnDef("f", "float", "float(7,3)"), [stored])
    assert field.type == pa.float64() and field.metadata[b"connect.type"] == b"float64"
    assert values == [stored]
    assert _convert(ColumnDef("f", "float", "float"), [1.5])[0].type == pa.float32()


def test_boolean_declared_in_a_ddl_is_boolean():
    """A column a captured DDL declares BOOLEAN is a JDBC BOOLEAN for Debezium (true/false)."""
    col = ColumnDef("b", "tinyint", "tinyint(1)", boolean=True)
    field, values = _convert(col, [0, 1, None])
    assert field.type == pa.bool_() and values == [False, True, None]
    assert _convert(ColumnDef("b", "tinyint", "tinyint(1)"), [1])[1] == [1]


def _table_map(labels: list[bytes], collation: int) -> bytes:
    """TABLE_MAP body of ``t (id int, e enum(labels))`` with ENUM_STR_VALUE and ENUM_AND_SET_COLUMN_CHARSET."""
    body = (1).to_bytes(6, "little") + b"\0\0" + b"\x02db\0" + b"\x01t\0" + b"\x02"
    body += bytes([rc.T_LONG, rc.T_STRING]) + b"\x02" + bytes([rc.T_ENUM, 1]) + b"\x02"
    enum = bytes([len(labels)]) + b"".join(bytes([len(v)]) + v for v in labels)
    body += b"\x06" + bytes([len(enum)]) + enum + b"\x0b\x01" + bytes([collation])
    return body


@pytest.mark.parametrize(
    ("charset", "collation", "labels", "text"),
    [("latin1", 8, [b"\x80", b"a"], "€"), ("cp1251", 51, [b"\xe6"], "ж"), ("ucs2", 35, [b"\x20\xac"], "€")],
)
def test_enum_labels_of_a_table_map_in_the_column_charset(charset, collation, labels, text):
    """The labels a table map logs are bytes in the column's character set, not UTF-8."""
    tm = p.parse_table_map(_table_map(labels, collation))
    config = build_config({"name": "t", "connector": "mysql", "database.hostname": "h", "staging.path": "/tmp"})
    resolver = TableResolver(None, TableFilter(config), Modes(), None, {}, None, "fail", {})
    resolver.charsets._by_id = {collation: charset, 8: "latin1"}
    tdef = TableDef("db", "t", [ColumnDef("id", "int", "int"), ColumnDef("e", "enum", "enum('?')")], ["id"])
    codec = resolver.build(tdef, tm).codecs[1]
    assert codec.convert(pa.array([1], pa.int64())).to_pylist() == [text]
