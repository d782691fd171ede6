"""The emulator's TDS pieces on byte fixtures: LOGIN7 password scrambling, RPC parameters,
malformed input, type specs and value encodings."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pytest

from airflow_cdc.testing.sqlserver_emulator import types as T
from airflow_cdc.testing.sqlserver_emulator import wire as W
from airflow_cdc.testing.sqlserver_emulator.server import SqlError
from airflow_cdc.testing.sqlserver_emulator.translate import split_statements, translate_select


def _scramble(text: str) -> bytes:  # what a client does ([MS-TDS] 2.2.6.4)
    return bytes((((b << 4) & 0xF0) | (b >> 4)) ^ 0xA5 for b in text.encode("utf-16-le"))


def _login7(user: str, password: str, database: str) -> bytes:
    fields = ["host", user, password, "app", "srv", "", "odbc", "", database]
    head = bytearray(94)
    struct.pack_into("<II", head, 4, W.TDS74, 4096)
    body = bytearray()
    for n, value in enumerate(fields):
        raw = _scramble(value) if n == 2 else value.encode("utf-16-le")
        struct.pack_into("<HH", head, 36 + 4 * n, 94 + len(body), len(value))
        body += raw
    return bytes(head + body)


def test_login7_fields_and_password() -> None:
    login = W.parse_login7(_login7("sa", "pä$s;}word", "shop"))
    assert (login.user, login.password, login.database, login.tds_version) == ("sa", "pä$s;}word", "shop", W.TDS74)


def _param(name: str, type_info: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name.encode("utf-16-le") + b"\x00" + type_info + value


def test_rpc_parameters_of_several_types() -> None:
    stmt = "SELECT @P1".encode("utf-16-le")
    call = struct.pack("<HHH", 0xFFFF, 10, 0)
    call += _param("", bytes((T.NVARCHAR,)) + struct.pack("<H", 8000) + T.COLLATION, struct.pack("<H", len(stmt)) + stmt)
    call += _param("@P1", bytes((T.DECIMALN, 17, 38, 2)), bytes((17, 0)) + (12345).to_bytes(16, "little"))
    call += _param("@P2", bytes((T.BIGVARBIN,)) + struct.pack("<H", 0xFFFF), struct.pack("<Q", 2) + struct.pack("<I", 2) + b"\x01\x02" + b"\x00" * 4)
    call += _param("@P3", bytes((T.DATETIME2N, 7)), bytes((8,)) + (1234567).to_bytes(5, "little") + (738885).to_bytes(3, "little"))
    (parsed,) = W.parse_rpc(call)
    assert parsed.proc == "sp_executesql"
    assert [p.value for p in parsed.params] == [
        "SELECT @P1", Decimal("-123.45"), b"\x01\x02", dt.datetime(2024, 1, 1, 0, 0, 0, 123456)]


@pytest.mark.parametrize("cut", [1, 3, 7, 12, 20])
def test_truncated_rpc_is_a_wire_error_not_a_crash(cut: int) -> None:
    call = struct.pack("<HHH", 0xFFFF, 10, 0) + _param("@P1", bytes((T.INTN, 4)), bytes((4,)) + b"\x01\x00\x00\x00")
    with pytest.raises(W.WireError):
        W.parse_rpc(call[:cut] if cut < len(call) else call[:-1])


def test_out_of_range_date_parameter_is_rejected() -> None:
    call = struct.pack("<HHH", 0xFFFF, 10, 0) + _param("@P1", bytes((T.DATEN,)), b"\x03\xff\xff\xff")
    with pytest.raises(W.WireError, match="out of range"):
        W.parse_rpc(call)


@pytest.mark.parametrize("spec", ["nvarchar(abc)", "decimal(39,2)", "decimal(5,6)", "time(8)", "geography(1)", "sql_variantx", "int(4)"])
def test_bad_type_specs(spec: str) -> None:
    with pytest.raises(T.TypeSpecError):
        T.SqlType.parse(spec)


def test_value_encodings() -> None:
    assert T.SqlType.parse("money").encode(Decimal("-0.0001")) == b"\x08" + struct.pack("<iI", -1, 0xFFFFFFFF)
    assert T.SqlType.parse("datetime").encode(dt.datetime(1900, 1, 2, 0, 0, 1)) == b"\x08" + struct.pack("<iI", 1, 300)
    assert T.SqlType.parse("time(7)").encode("00:00:00.0000001") == b"\x05" + (1).to_bytes(5, "little")
    dto = T.SqlType.parse("datetimeoffset(0)").encode("2024-01-01 01:00:00 +01:00")
    assert dto[1:4] == (0).to_bytes(3, "little") and dto[-2:] == struct.pack("<h", 60)  # UTC midnight, +60 min
    assert T.SqlType.parse("varchar(max)").encode(None) == struct.pack("<Q", T.PLP_NULL)
    assert T.SqlType.parse("nvarchar(10)").encode(None) == b"\xff\xff"


def test_statement_translation() -> None:
    dbs = {"shop": type("Db", (), {"name": "shop"})()}
    q = translate_select("SELECT TOP (5) [a]]b] FROM [shop].[dbo].[t] WHERE [x] = @P1 AND [y] LIKE N'50%'",
                         {"P1": 1}, dbs, "shop")
    assert q.database == "shop"
    assert q.sql == """SELECT "a]b" FROM "dbo"."t" WHERE "x" = %(P1)s AND "y" LIKE '50%%' LIMIT 5"""
    with pytest.raises(SqlError, match="Must declare"):
        translate_select("SELECT @nope", {}, dbs, "shop")
    with pytest.raises(SqlError, match="'other' does not exist"):
        translate_select("SELECT 1 FROM [other].[dbo].[t]", {}, dbs, "shop")
    assert split_statements("SET NOCOUNT ON; SELECT ';' ; SELECT [a;b]") == ["SET NOCOUNT ON", "SELECT ';'", "SELECT [a;b]"]
