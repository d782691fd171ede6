"""The seed's SQL Server type table: values read through pyodbc + FreeTDS from the emulator and
encoded by the source's codecs, per type and handling mode."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.sources.sqlserver import client
from airflow_cdc.sources.sqlserver.schema import Column
from airflow_cdc.sources.sqlserver.types import Modes, column_codec
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from airflow_cdc.testing.sqlserver_emulator.types import SqlType
from tests.integration.sqlserver.test_source_stream import config_for

# type, stored literal, (connect type, semantic name) under adaptive, value, value under connect
ROWS: list[tuple[str, str, str, str | None, Any, Any]] = [
    ("bit", "true", "boolean", None, True, True),
    ("tinyint", "255", "int16", None, 255, 255),
    ("smallint", "-32768", "int16", None, -32768, -32768),
    ("int", "2147483647", "int32", None, 2147483647, 2147483647),
    ("bigint", "-9223372036854775808", "int64", None, -9223372036854775808, -9223372036854775808),
    ("real", "3.25", "float32", None, 3.25, 3.25),
    ("float", "-1.5e300", "float64", None, -1.5e300, -1.5e300),
    ("decimal(38,10)", "1234567890123456789012345678.0123456789", "bytes", "org.apache.kafka.connect.data.Decimal",
     Decimal("1234567890123456789012345678.0123456789"), Decimal("1234567890123456789012345678.0123456789")),
    ("numeric(5,2)", "-123.45", "bytes", "org.apache.kafka.connect.data.Decimal", Decimal("-123.45"), Decimal("-123.45")),
    ("money", "-922337203685477.5808", "bytes", "org.apache.kafka.connect.data.Decimal",
     Decimal("-922337203685477.5808"), Decimal("-922337203685477.5808")),
    ("smallmoney", "-214748.3648", "bytes", "org.apache.kafka.connect.data.Decimal", Decimal("-214748.3648"),
     Decimal("-214748.3648")),
    ("char(3)", "'a'", "string", None, "a  ", "a  "),
    ("varchar(10)", "'héllo'", "string", None, "héllo", "héllo"),
    ("nchar(2)", "'Ω'", "string", None, "Ω ", "Ω "),
    ("nvarchar(20)", "'漢字😀'", "string", None, "漢字😀", "漢字😀"),
    ("ntext", "'long'", "string", None, "long", "long"),
    ("nvarchar(max)", "repeat('z', 5000)", "string", None, "z" * 5000, "z" * 5000),
    ("uniqueidentifier", "'d3b07384-d9a0-4c9b-8f0e-1f2a3b4c5d6e'", "string", None,
     "D3B07384-D9A0-4C9B-8F0E-1F2A3B4C5D6E", "D3B07384-D9A0-4C9B-8F0E-1F2A3B4C5D6E"),
    ("binary(3)", "'\\x01'", "bytes", None, b"\x01\x00\x00", b"\x01\x00\x00"),
    ("varbinary(max)", "'\\xdeadbeef'", "bytes", None, b"\xde\xad\xbe\xef", b"\xde\xad\xbe\xef"),
    ("date", "'1969-12-31'", "int32", "io.debezium.time.Date", -1, -1),
    ("time(3)", "'12:34:56.789'", "int32", "io.debezium.time.Time", 45296789, 45296789),
    ("time(6)", "'12:34:56.789012'", "int64", "io.debezium.time.MicroTime", 45296789012, 45296789),
    ("time(7)", "'23:59:59.9999999'", "int64", "io.debezium.time.NanoTime", 86399999999900, 86399999),
    ("datetime", "'2018-06-20 15:13:16.997'", "int64", "io.debezium.time.Timestamp", 1529507596997, 1529507596997),
    ("smalldatetime", "'2018-06-20 15:13:00'", "int64", "io.debezium.time.Timestamp", 1529507580000, 1529507580000),
    ("datetime2(3)", "'2018-06-20 15:13:16.945'", "int64", "io.debezium.time.Timestamp", 1529507596945,
     1529507596945),
    # the seed's own example: DATETIME2 '2018-06-20 15:13:16.945104' is MicroTimestamp 1529507596945104
    ("datetime2(6)", "'2018-06-20 15:13:16.945104'", "int64", "io.debezium.time.MicroTimestamp", 1529507596945104,
     1529507596945),
    ("datetime2(7)", "'2018-06-20 15:13:16.9451047'", "int64", "io.debezium.time.NanoTimestamp",
     1529507596945104700, 1529507596945),
    ("datetimeoffset(7)", "'2018-06-20 15:13:16.9451047 -05:30'", "string", "io.debezium.time.ZonedTimestamp",
     "2018-06-20T15:13:16.9451047-05:30", "2018-06-20T15:13:16.9451047-05:30"),
    ("datetimeoffset(0)", "'2018-06-20 15:13:16 +00:00'", "string", "io.debezium.time.ZonedTimestamp",
     "2018-06-20T15:13:16Z", "2018-06-20T15:13:16Z"),
]


@pytest.fixture
def typed_rows(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> tuple[list[Column], list[tuple]]:
    cols = [(f"c{i}", t) for i, (t, *_rest) in enumerate(ROWS)]
    sqlserver_emulator.create_table(mssql_db, "dbo.typed", [("id", "int"), *cols], primary_key=["id"])
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute(f"INSERT INTO dbo.typed VALUES (1, {', '.join(r[1] for r in ROWS)})")
        pg.execute("INSERT INTO dbo.typed (id) VALUES (2)")
    conn = client.connect(config_for(sqlserver_emulator, mssql_db), mssql_db)
    cur = conn.cursor()
    names = ", ".join(f"[{c}]" for c, _ in cols)
    rows = [tuple(r) for r in cur.execute(f"SELECT {names} FROM [dbo].[typed] ORDER BY [id]").fetchall()]
    conn.close()
    columns = []
    for n, (name, spec) in enumerate(cols, start=1):
        t = SqlType.parse(spec)
        columns.append(Column(name, n, t.name, t.max_length, t.precision, t.scale, True))
    return columns, rows


@pytest.mark.parametrize("mode", ["adaptive", "connect"])
def test_type_table(typed_rows: tuple[list[Column], list[tuple]], mode: str) -> None:
    columns, rows = typed_rows
    for i, (col, row) in enumerate(zip(columns, ROWS, strict=True)):
        spec, _, ctype, semantic, adaptive_value, connect_value = row
        codec = column_codec(col, Modes(time_precision=mode))
        meta = {k.decode(): v.decode() for k, v in (codec.field.metadata or {}).items()}
        got = codec.convert_values([rows[0][i], rows[1][i]]).to_pylist()
        expected = adaptive_value if mode == "adaptive" else connect_value
        assert got == [expected, None], spec
        if mode == "adaptive":
            assert ctype in meta.values(), (spec, meta)
            assert semantic is None or semantic in meta.values(), (spec, meta)
        elif semantic and semantic.startswith("io.debezium.time.") and "Zoned" not in semantic:
            assert any(v.startswith("org.apache.kafka.connect.data.") for v in meta.values()), (spec, meta)


def test_decimal_and_binary_handling_modes(typed_rows: tuple[list[Column], list[tuple]]) -> None:
    columns, rows = typed_rows
    dec = next(i for i, r in enumerate(ROWS) if r[0] == "numeric(5,2)")
    binary = next(i for i, r in enumerate(ROWS) if r[0] == "varbinary(max)")
    assert column_codec(columns[dec], Modes(decimal="string")).convert_values([rows[0][dec]]).to_pylist() == ["-123.45"]
    assert column_codec(columns[dec], Modes(decimal="double")).convert_values([rows[0][dec]]).to_pylist() == [-123.45]
    assert column_codec(columns[binary], Modes(binary="hex")).convert_values([rows[0][binary]]).to_pylist() == ["deadbeef"]
    assert column_codec(columns[binary], Modes(binary="base64")).convert_values([rows[0][binary]]).to_pylist() == ["3q2+7w=="]
