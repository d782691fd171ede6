"""The SQL Server CDC emulator through the real client stack (pyodbc + unixODBC + FreeTDS): login,
what FreeTDS sends on the wire, every column type round-tripping exactly through TDS."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.conftest import connect, pyodbc

# (column, SQL Server type, PostgreSQL literal written by the writer, value pyodbc must return)
TYPE_ROWS: list[tuple[str, str, str, Any]] = [
    ("c_bit", "bit", "true", True),
    ("c_tiny", "tinyint", "255", 255),
    ("c_small", "smallint", "-32768", -32768),
    ("c_int", "int", "-2147483648", -2147483648),
    ("c_big", "bigint", "-9223372036854775808", -9223372036854775808),
    ("c_dec", "decimal(38,10)", "-1234567890123456789012345678.0123456789",
     Decimal("-1234567890123456789012345678.0123456789")),
    ("c_num", "numeric(5,2)", "123.45", Decimal("123.45")),
    ("c_dec0", "decimal(19,0)", "9999999999999999999", Decimal("9999999999999999999")),
    ("c_float", "float", "1.5e300", 1.5e300),
    ("c_real", "real", "3.25", 3.25),
    ("c_money", "money", "-922337203685477.5808", Decimal("-922337203685477.5808")),
    ("c_smoney", "smallmoney", "214748.3647", Decimal("214748.3647")),
    ("c_char", "char(5)", "'ab'", "ab   "),
    ("c_varchar", "varchar(20)", "'héllo'", "héllo"),
    ("c_nchar", "nchar(4)", "'ñ'", "ñ   "),
    ("c_nvarchar", "nvarchar(30)", "'Ω漢字😀'", "Ω漢字😀"),
    ("c_ntext", "ntext", "'ntext ✓'", "ntext ✓"),
    ("c_nvmax", "nvarchar(max)", "repeat('x✓', 9000)", "x✓" * 9000),
    ("c_vmax", "varchar(max)", "repeat('y', 20000)", "y" * 20000),
    ("c_bin", "binary(4)", "'\\x0102'", b"\x01\x02\x00\x00"),
    ("c_varbin", "varbinary(10)", "'\\x00ff'", b"\x00\xff"),
    ("c_vbmax", "varbinary(max)", "decode(repeat('ab', 20000), 'hex')", b"\xab" * 20000),
    ("c_date", "date", "'0001-01-01'", dt.date(1, 1, 1)),
    ("c_date2", "date", "'9999-12-31'", dt.date(9999, 12, 31)),
    ("c_time7", "time(7)", "'23:59:59.9999999'", (23, 59, 59, 999999900)),
    ("c_time3", "time(3)", "'12:34:56.789'", (12, 34, 56, 789000000)),
    ("c_time0", "time(0)", "'01:02:03'", (1, 2, 3, 0)),
    ("c_dt", "datetime", "'2024-02-29 12:34:56.997'", dt.datetime(2024, 2, 29, 12, 34, 56, 997000)),
    ("c_sdt", "smalldatetime", "'2024-02-29 12:35:00'", dt.datetime(2024, 2, 29, 12, 35)),
    ("c_dt2_3", "datetime2(3)", "'2024-01-01 00:00:00.123'", dt.datetime(2024, 1, 1, 0, 0, 0, 123000)),
    ("c_dt2_6", "datetime2(6)", "'1900-01-01 00:00:00.000001'", dt.datetime(1900, 1, 1, 0, 0, 0, 1)),
    ("c_dto", "datetimeoffset(7)", "'2024-06-01 10:00:00.1234567 +05:30'", (2024, 6, 1, 10, 0, 0, 123456700, 5, 30)),
    ("c_dto_neg", "datetimeoffset(3)", "'2024-01-01 00:30:00.500 -08:00'", (2024, 1, 1, 0, 30, 0, 500000000, -8, 0)),
    ("c_guid", "uniqueidentifier", "'d3b07384-d9a0-4c9b-8f0e-1f2a3b4c5d6e'",
     "D3B07384-D9A0-4C9B-8F0E-1F2A3B4C5D6E"),
]


def test_login_with_good_credentials_opens_the_database(odbc: Any, mssql_db: str) -> None:
    assert odbc.cursor().execute("SELECT DB_NAME()").fetchone()[0] == mssql_db
    assert odbc.getinfo(pyodbc.SQL_DBMS_NAME) == "Microsoft SQL Server"


def test_bad_password_fails_with_login_failed_18456(sqlserver_emulator: SqlServerCdcEmulator,
                                                   mssql_db: str) -> None:
    bad = sqlserver_emulator.odbc_connection_string(mssql_db, password="wrong")
    with pytest.raises(pyodbc.Error, match=r"Login failed for user 'sa'.*18456"):
        pyodbc.connect(bad, timeout=10)
    unknown_user = sqlserver_emulator.odbc_connection_string(mssql_db, user="nobody")
    with pytest.raises(pyodbc.Error, match="18456"):
        pyodbc.connect(unknown_user, timeout=10)


def test_unknown_database_fails_with_4060(sqlserver_emulator: SqlServerCdcEmulator) -> None:
    with pytest.raises(pyodbc.Error, match=r"Cannot open database \"nope\".*4060"):
        pyodbc.connect(sqlserver_emulator.odbc_connection_string("nope"), timeout=10)


def test_freetds_wire_traffic(pg_server: Any) -> None:
    """What FreeTDS sends: TDS 7.4 LOGIN7, encryption off in PRELOGIN, parameterised statements as
    ``sp_prepexec`` RPCs with ``@P1``-style declarations, autocommit-off as TM requests."""
    emu = SqlServerCdcEmulator(pg_server, trace=True).start()
    name = f"ms_wire_{uuid.uuid4().hex[:8]}"
    try:
        emu.create_database(name)
        conn = connect(emu, name)
        conn.cursor().execute("SELECT ? AS a, ? AS b", 5, "x").fetchall()
        conn.commit()
        conn.close()
        log = emu.wire_log
        prelogin = next(d for k, d in log if k == "prelogin")
        assert prelogin[1] == "00"  # ENCRYPT_OFF
        login = next(d for k, d in log if k == "login7")
        assert login["tds_version"] == "0x74000004"
        rpc = next(d for k, d in log if k == "rpc")
        assert rpc[0] == "sp_prepexec"
        assert [p[1] for p in rpc[1]] == ["int", "ntext", "ntext", "int", "nvarchar"]
        assert rpc[1][1][2].startswith("@P1 INT,@P2 NVARCHAR(")
        assert rpc[1][2][2] == "SELECT @P1 AS a, @P2 AS b"
        # TM_BEGIN_XACT after login, TM_COMMIT_XACT (with "begin a new one"), TM_ROLLBACK_XACT at close
        assert [d for k, d in log if k == "transaction"] == [5, 7, 8]
    finally:
        emu.stop()
        emu.drop_database(name)


@pytest.fixture
def all_types(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    cols = [("id", "int")] + [(c, t) for c, t, _, _ in TYPE_ROWS]
    sqlserver_emulator.create_table(mssql_db, "dbo.all_types", cols, primary_key=["id"])
    with sqlserver_emulator.pg_connect(mssql_db) as conn:
        literals = ", ".join(lit for _, _, lit, _ in TYPE_ROWS)
        conn.execute(f"INSERT INTO dbo.all_types VALUES (1, {literals})")
        conn.execute("INSERT INTO dbo.all_types (id) VALUES (2)")
    return mssql_db


def test_every_type_round_trips_exactly(odbc: Any, all_types: str) -> None:
    cur = odbc.cursor()
    rows = cur.execute("SELECT * FROM [dbo].[all_types] ORDER BY [id]").fetchall()
    assert [d[0] for d in cur.description] == ["id"] + [c for c, _, _, _ in TYPE_ROWS]
    got = dict(zip([d[0] for d in cur.description], rows[0], strict=True))
    for column, sql_type, _, expected in TYPE_ROWS:
        value = got[column]
        value = bytes(value) if isinstance(value, bytearray) else value
        assert value == expected, f"{column} {sql_type}: {value!r} != {expected!r}"
        assert type(value) is type(expected), f"{column} {sql_type}: {type(value)}"
    assert list(rows[1]) == [2] + [None] * len(TYPE_ROWS)


def test_datetime2_7_keeps_100ns_on_the_wire(odbc: Any, sqlserver_emulator: SqlServerCdcEmulator,
                                             mssql_db: str) -> None:
    import struct

    sqlserver_emulator.create_table(mssql_db, "dbo.t", [("id", "int"), ("v", "datetime2(7)")], ["id"])
    with sqlserver_emulator.pg_connect(mssql_db) as conn:
        conn.execute("INSERT INTO dbo.t VALUES (1, '9999-12-31 23:59:59.9999999'), (2, '0001-01-01 00:00:00.0000001')")
    odbc.add_output_converter(93, lambda b: struct.unpack("<6hI", b))
    rows = odbc.cursor().execute("SELECT [v] FROM [dbo].[t] ORDER BY [id]").fetchall()
    assert [r[0] for r in rows] == [(9999, 12, 31, 23, 59, 59, 999999900), (1, 1, 1, 0, 0, 0, 100)]


def test_parameters_of_every_kind_bind_exactly(odbc: Any, all_types: str) -> None:
    by_col = {c: v for c, _, _, v in TYPE_ROWS}
    checks = [("c_dec", by_col["c_dec"]), ("c_big", by_col["c_big"]), ("c_float", by_col["c_float"]),
              ("c_nvarchar", by_col["c_nvarchar"]), ("c_varbin", by_col["c_varbin"]),
              ("c_guid", uuid.UUID(str(by_col["c_guid"]))), ("c_dt2_3", by_col["c_dt2_3"]),
              ("c_date2", by_col["c_date2"]), ("c_bit", True), ("c_vbmax", by_col["c_vbmax"]),
              ("c_nvmax", by_col["c_nvmax"])]
    cur = odbc.cursor()
    for column, value in checks:
        row = cur.execute(f"SELECT [id] FROM [dbo].[all_types] WHERE [{column}] = ?", value).fetchall()
        assert [r[0] for r in row] == [1], column


def test_freetds_mis_encodes_early_date_parameters(odbc: Any) -> None:
    """FreeTDS 1.3 sends 0001-01-01 as day 0xFFFFFF (SQL Server rejects the stream: 8016) and some
    pre-1900 dates a day early, so the SQL Server source binds temporal values as text."""
    cur = odbc.cursor()
    with pytest.raises(pyodbc.Error, match=r"\(8016\)"):
        cur.execute("SELECT ?", dt.date(1, 1, 1)).fetchall()
    assert cur.execute("SELECT ?", dt.date(1899, 12, 31)).fetchone()[0] == dt.date(1899, 12, 31)


def test_unknown_statements_and_objects_get_sql_server_errors(odbc: Any) -> None:
    cur = odbc.cursor()
    with pytest.raises(pyodbc.Error, match=r"not supported by the SQL Server CDC emulator.*\(102\)"):
        cur.execute("DELETE FROM dbo.anything")
    with pytest.raises(pyodbc.Error, match=r"Invalid object name.*\(208\)"):
        cur.execute("SELECT * FROM [dbo].[missing]")
    with pytest.raises(pyodbc.Error, match=r"Must declare the scalar variable \"@x\".*\(137\)"):
        cur.execute("SELECT @x")
    assert cur.execute("SELECT 1").fetchone()[0] == 1  # the session survives errors
