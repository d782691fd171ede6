"""The emulator's TDS bytes against witnesses that are not our own client stack.

pyodbc + FreeTDS agree with the emulator by construction (we wrote the emulator until they did), so
every test here compares with something written elsewhere:

* [MS-TDS] section 4 "Protocol Examples" (learn.microsoft.com/openspecs/windows_protocols/ms-tds):
  the exact bytes of 4.1 Pre-Login Request, 4.2 Login Request, 4.6 SQL Batch Client Request,
  4.7 SQL Batch Server Response and 4.8 RPC Client Request.
* denisenkom/pytds ``tests/unit_test.py``: a PRELOGIN and a login response captured from a real
  SQL Server 2008 (10.0.5512, TDS 7.3B; ``test_login``), its LOGIN7 (``test_login_generation``), bulk
  COLMETADATA/ROW/DONE (``test_bulk_insert``), PLP (``test_types``, ``test_varbinary_max_serializer``)
  and datetime (``test_datetime_serializer``) bytes.
* tediousjs/tedious ``test/unit/token/*-test.ts`` (token layouts with their decoded values),
  ``test/unit/data-type.ts`` (TYPE_INFO and value bytes of every parameter type) and
  ``test/unit/login7-payload-test.ts`` (password scrambling).
* tedious itself (npm ``tedious`` 18.6.2, run by ``node``): its token parser decodes what the
  emulator sends, and its PRELOGIN, LOGIN7 and RPC encoders produce what the emulator must parse.
  These tests skip when ``node`` or the package (``make setup`` puts it in ``.local/tds-check``)
  is missing.

The facts are re-typed from those sources (hex strings, decoded values); none of their code is used
here except through tedious's published package.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import struct
import subprocess
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.testing.sqlserver_emulator import tokens as K
from airflow_cdc.testing.sqlserver_emulator import types as T
from airflow_cdc.testing.sqlserver_emulator import wire as W

REPO = Path(__file__).resolve().parents[3]
UTC = dt.UTC


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def _through_socket(send: Callable[[socket.socket], None]) -> tuple[bytes, tuple[int, bytes] | None]:
    """What ``send`` put on the wire, and what :func:`wire.read_message` makes of it."""
    a, b = socket.socketpair()
    with a, b:
        send(a)
        a.shutdown(socket.SHUT_WR)
        raw = b""
        while chunk := b.recv(65536):
            raw += chunk
    c, d = socket.socketpair()
    with c, d:
        c.sendall(raw)
        c.shutdown(socket.SHUT_WR)
        return raw, W.read_message(d)


def _param(name: str, type_info: bytes, value: bytes, status: int = 0) -> bytes:
    data = name.encode("utf-16-le")
    return bytes((len(data) // 2,)) + data + bytes((status,)) + type_info + value


def _rpc_value(type_info: bytes, value: bytes) -> tuple[Any, str]:
    """Parse one unnamed parameter of an ``sp_executesql`` RPC: (value, type name)."""
    (call,) = W.parse_rpc(struct.pack("<HHH", 0xFFFF, 10, 0) + _param("", type_info, value))
    (param,) = call.params
    return param.value, param.sql_type


# -- [MS-TDS] 4 Protocol Examples -------------------------------------------------------------------
# Pages under learn.microsoft.com/openspecs/windows_protocols/ms-tds/: 4.1 9420b4a3-eb9f-4f5e-90bd-
# 3160444aa5a7, 4.2 ce5ad23f-6bf8-4fa5-9426-6b0d36e14da2, 4.6 b05b006b-3cbf-404b-bcaf-7ec584b54706,
# 4.7 d2a06235-fbef-4223-b630-a90dea24a3d7, 4.8 1469b2fa-6cab-42e9-91f9-044d358b306b.
MSTDS_4_1_PRELOGIN = """12 01 00 2F 00 00 01 00 00 00 1A 00 06 01 00 20 00 01 02 00 21 00 01 03 00 22 00 04
                        04 00 26 00 01 FF 09 00 00 00 00 00 01 00 B8 0D 00 00 01"""
MSTDS_4_2_LOGIN7 = """10 01 00 90 00 00 01 00 88 00 00 00 02 00 09 72 00 10 00 00 00 00 00 07 00 01 00 00
    00 00 00 00 E0 03 00 00 00 00 00 00 09 04 00 00 5E 00 08 00 6E 00 02 00 72 00 00 00 72 00 07 00 80 00
    00 00 80 00 00 00 80 00 04 00 88 00 00 00 88 00 00 00 00 50 8B E2 B7 8F 88 00 00 00 88 00 00 00 88 00
    00 00 00 00 00 00 73 00 6B 00 6F 00 73 00 74 00 6F 00 76 00 31 00 73 00 61 00 4F 00 53 00 51 00 4C 00
    2D 00 33 00 32 00 4F 00 44 00 42 00 43 00"""
MSTDS_4_6_SQL_BATCH = """01 01 00 5C 00 00 01 00 16 00 00 00 12 00 00 00 02 00 00 00 00 00 00 00 00 01 00 00
    00 00 0A 00 73 00 65 00 6C 00 65 00 63 00 74 00 20 00 27 00 66 00 6F 00 6F 00 27 00 20 00 61 00 73 00
    20 00 27 00 62 00 61 00 72 00 27 00 0A 00 20 00 20 00 20 00 20 00 20 00 20 00 20 00 20 00"""
MSTDS_4_7_BATCH_RESPONSE = """04 01 00 33 00 00 01 00 81 01 00 00 00 00 00 20 00 A7 03 00 09 04 D0 00 34 03
    62 00 61 00 72 00 D1 03 00 66 6F 6F FD 10 00 C1 00 01 00 00 00 00 00 00 00"""
MSTDS_4_8_RPC = """03 01 00 2F 00 00 01 00 16 00 00 00 12 00 00 00 02 00 00 00 00 00 00 00 00 01 00 00 00 00
                   04 00 66 00 6F 00 6F 00 33 00 00 00 00 02 26 02 00"""


def test_mstds_4_1_prelogin_request() -> None:
    raw = _hex(MSTDS_4_1_PRELOGIN)
    _, message = _through_socket(lambda s: s.sendall(raw))
    assert message is not None
    kind, body = message
    assert kind == W.PRELOGIN
    # VERSION 9.0.0 subbuild 0, ENCRYPTION ON, INSTOPT "" (one NUL), THREADID 0x0DB8, MARS on.
    assert W.parse_prelogin(body) == {
        0: _hex("09 00 00 00 00 00"),
        1: b"\x01",
        2: b"\x00",
        3: _hex("B8 0D 00 00"),
        4: b"\x01",
    }


def test_mstds_4_2_login_request() -> None:
    _, message = _through_socket(lambda s: s.sendall(_hex(MSTDS_4_2_LOGIN7)))
    assert message is not None and message[0] == W.LOGIN7
    assert W.parse_login7(message[1]) == W.Login(
        tds_version=0x72090002,  # TDS 7.2, sent little-endian in LOGIN7 ("02 00 09 72")
        packet_size=4096,
        user="sa",
        password="",
        app_name="OSQL-32",
        server_name="",
        database="",
        hostname="skostov1",
    )


def test_mstds_4_6_sql_batch_all_headers() -> None:
    _, message = _through_socket(lambda s: s.sendall(_hex(MSTDS_4_6_SQL_BATCH)))
    assert message is not None and message[0] == W.SQL_BATCH
    assert W.skip_all_headers(message[1]).decode("utf-16-le") == "\nselect 'foo' as 'bar'\n" + " " * 8


def test_mstds_4_7_sql_batch_response() -> None:
    """COLMETADATA (varchar(3) 'bar', SQL_Latin1_General_CP1_CI_AS), ROW 'foo', DONE count 1.

    The example's column flags are 0x0020 (fComputed, not nullable: a literal); the emulator
    describes every column as nullable with unknown updatability (0x0009), so only the flags differ.
    """
    varchar3 = T.SqlType.parse("varchar(3)")
    payload = K.colmetadata([("bar", varchar3)]) + K.rows([varchar3], [("foo",)]) + K.done(W.DONE_COUNT, 1)
    assert payload[7:9] == struct.pack("<H", 0x0009)
    raw, _ = _through_socket(lambda s: W.send_message(s, W.REPLY, payload, 4096))
    expected = bytearray(_hex(MSTDS_4_7_BATCH_RESPONSE))
    expected[8 + 7 : 8 + 9] = struct.pack("<H", 0x0009)
    assert raw == bytes(expected)


def test_mstds_4_8_rpc_request() -> None:
    """Procedure 'foo3' by name, one unnamed parameter, status fDefaultValue, smallint (INTN 2) NULL."""
    _, message = _through_socket(lambda s: s.sendall(_hex(MSTDS_4_8_RPC)))
    assert message is not None and message[0] == W.RPC
    assert W.parse_rpc(W.skip_all_headers(message[1])) == [
        W.RpcCall("foo3", [W.RpcParam("", None, "smallint", output=False)])
    ]


# -- pytds: bytes captured from a real SQL Server (tests/unit_test.py) ------------------------------
PYTDS_PRELOGIN_RESPONSE = (
    b"\x04\x01\x00+\x00\x00\x01\x00\x00\x00\x1a\x00\x06\x01\x00 \x00\x01\x02\x00!\x00\x01\x03\x00\"\x00\x00"
    b"\x04\x00\"\x00\x01\xff\n\x00\x15\x88\x00\x00\x02\x00\x00"
)
PYTDS_LOGIN_RESPONSE = (
    b"\xe3/\x00\x01\x10S\x00u\x00b\x00m\x00i\x00s\x00s\x00i\x00o\x00n\x00P\x00o\x00r\x00t\x00a\x00l\x00"
    b"\x06m\x00a\x00s\x00t\x00e\x00r\x00\xab~\x00E\x16\x00\x00\x02\x00/\x00C\x00h\x00a\x00n\x00g\x00e\x00"
    b"d\x00 \x00d\x00a\x00t\x00a\x00b\x00a\x00s\x00e\x00 \x00c\x00o\x00n\x00t\x00e\x00x\x00t\x00 \x00t\x00"
    b"o\x00 \x00'\x00S\x00u\x00b\x00m\x00i\x00s\x00s\x00i\x00o\x00n\x00P\x00o\x00r\x00t\x00a\x00l\x00'\x00"
    b".\x00\tM\x00S\x00S\x00Q\x00L\x00H\x00V\x003\x000\x00\x00\x01\x00\x00\x00\xe3\x08\x00\x07\x05\t\x04"
    b"\x00\x01\x00\x00\xe3\x17\x00\x02\nu\x00s\x00_\x00e\x00n\x00g\x00l\x00i\x00s\x00h\x00\x00\xabn\x00"
    b"G\x16\x00\x00\x01\x00'\x00C\x00h\x00a\x00n\x00g\x00e\x00d\x00 \x00l\x00a\x00n\x00g\x00u\x00a\x00g"
    b"\x00e\x00 \x00s\x00e\x00t\x00t\x00i\x00n\x00g\x00 \x00t\x00o\x00 \x00u\x00s\x00_\x00e\x00n\x00g\x00"
    b"l\x00i\x00s\x00h\x00.\x00\tM\x00S\x00S\x00Q\x00L\x00H\x00V\x003\x000\x00\x00\x01\x00\x00\x00\xad6"
    b"\x00\x01s\x0b\x00\x03\x16M\x00i\x00c\x00r\x00o\x00s\x00o\x00f\x00t\x00 \x00S\x00Q\x00L\x00 \x00S"
    b"\x00e\x00r\x00v\x00e\x00r\x00\x00\x00\x00\x00\n\x00\x15\x88\xe3\x13\x00\x04\x044\x000\x009\x006\x00"
    b"\x044\x000\x009\x006\x00\xfd\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
)


def test_prelogin_response_has_a_real_servers_layout() -> None:
    """Same options, offsets and lengths as SQL Server 10.0.5512's answer; only the version differs."""
    raw, _ = _through_socket(lambda s: W.send_message(s, W.REPLY, W.prelogin_response(W.ENCRYPT_NOT_SUP), 4096))
    ours_version = bytes((15, 0)) + struct.pack(">HH", 2000, 0)
    assert raw == PYTDS_PRELOGIN_RESPONSE.replace(_hex("0a 00 15 88 00 00"), ours_version)
    assert W.parse_prelogin(PYTDS_PRELOGIN_RESPONSE[8:])[1] == bytes((W.ENCRYPT_NOT_SUP,))


def test_login_response_tokens_rebuild_a_real_servers_bytes() -> None:
    """ENVCHANGE database/collation/language/packet size, INFO 5701/5703, LOGINACK, DONE: the real
    server's values through our token functions give its bytes exactly."""
    server = "MSSQLHV30"
    ours = (
        K.envchange_text(K.ENV_DATABASE, "SubmissionPortal", "master")
        + K.message(5701, "Changed database context to 'SubmissionPortal'.", severity=0, state=2, info=True, server=server)
        + K.envchange_bytes(K.ENV_COLLATION, _hex("09 04 00 01 00"))
        + K.envchange_text(K.ENV_LANGUAGE, "us_english")
        + K.message(5703, "Changed language setting to us_english.", severity=0, state=1, info=True, server=server)
        + K.loginack(0x730B0003, prog_name="Microsoft SQL Server\0\0", version=(10, 0, 0x15, 0x88))
        + K.envchange_text(K.ENV_PACKETSIZE, "4096", "4096")
        + K.done(cur_cmd=0)
    )
    assert ours == PYTDS_LOGIN_RESPONSE


def test_begin_transaction_envchange_matches_a_real_server() -> None:
    # pytds test_login: the answer to "USE <database>" (ENVCHANGE 8 with an 8-byte descriptor, DONE).
    real = b"\xe3\x0b\x00\x08\x08\x01\x00\x00\x00Z\x00\x00\x00\x00\xfd\x00\x00\xfd\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    assert K.envchange_bytes(K.ENV_BEGIN_TRAN, _hex("01 00 00 00 5a 00 00 00")) + K.done(cur_cmd=0xFD) == real


def test_pytds_login7_is_parsed() -> None:
    """pytds test_login_generation (TDS 7.3); ClientProgVer is pytds's version, any four bytes here."""
    offsets = (
        b"^\x00\x07\x00l\x00\x04\x00t\x00\x07\x00\x82\x00\x07\x00\x90\x00\n\x00\x00\x00\x00\x00\xa4\x00\x07"
        b"\x00\xb2\x00\x02\x00\xb6\x00\x08\x00"
    )
    data = (
        b"\xc6\x00\x00\x00" + b"\x03\x00\ns" + b"\x00\x10\x00\x00" + b"\x00\x00\x00\x00" + b"d\x00\x00\x00"
        + b"\x00\x00\x00\x00" + b"\xe0\x00\x00\x08" + b"\x10\xff\xff\xff" + b"\x04\x02\x00\x00" + offsets
        + b"\x12\x34\x56\x78\x90\xab" + b"\x00\x00\x00" + b"\x00\xc6\x00\x08\x00\xd6\x00\x00\x00\x00\x00\x00\x00"
        + "subdev1test".encode("utf-16-le") + b"\xe2\xa5\xf3\xa5\x92\xa5\xe2\xa5\xa2\xa5\xd2\xa5\xe3\xa5"
        + "appnameservernamelibraryendatabasefilepath".encode("utf-16-le")
    )
    assert W.parse_login7(data) == W.Login(0x730A0003, 4096, "test", "testpwd", "appname", "servername", "database", "subdev1")


def test_pytds_bulk_colmetadata_row_done() -> None:
    """pytds test_bulk_insert: a nullable read/write BITN column 'c1', a row with 0, DONE_FINAL."""
    bit = T.SqlType.parse("bit")
    pytds_bytes = b"\x81\x01\x00\x00\x00\x00\x00\x09\x00\x68\x01\x02c\x001\x00" + b"\xd1\x01\x00" + b"\xfd" + bytes(12)
    assert K.colmetadata([("c1", bit)]) + K.rows([bit], [(False,)]) + K.done(cur_cmd=0) == pytds_bytes


@pytest.mark.parametrize(
    ("raw", "value"),
    [  # pytds test_datetime_serializer
        (b"\xf2\x9c\x00\x00}uO\x01", dt.datetime(2010, 1, 2, 20, 21, 22, 123000)),
        (b"\x7f$-\x00\xff\x81\x8b\x01", dt.datetime(9999, 12, 31, 23, 59, 59, 997000)),
    ],
)
def test_pytds_datetime_bytes(raw: bytes, value: dt.datetime) -> None:
    assert T.SqlType.parse("datetime").encode(value) == b"\x08" + raw
    assert _rpc_value(bytes((T.DATETIMN, 8)), b"\x08" + raw) == (value, "datetime")


def test_pytds_plp_parameters_of_unknown_length() -> None:
    """pytds test_types / test_varbinary_max_serializer: PLP_UNKNOWN total, one chunk, terminator."""
    nvarchar_max = bytes((T.NVARCHAR,)) + b"\xff\xff\t\x04\x00\x01\x00"
    value = b"\xfe\xff\xff\xff\xff\xff\xff\xff\x08\x00\x00\x00t\x00e\x00s\x00t\x00\x00\x00\x00\x00"
    assert _rpc_value(nvarchar_max, value) == ("test", "nvarchar")
    varbinary_max = bytes((T.BIGVARBIN,)) + b"\xff\xff"
    assert _rpc_value(varbinary_max, b"\xfe" + b"\xff" * 7 + b"\x04\x00\x00\x00test\x00\x00\x00\x00") == (b"test", "varbinary")
    assert _rpc_value(varbinary_max, b"\xff" * 8) == (None, "varbinary")


# -- tedious test/unit/token/*-test.ts: token layouts ------------------------------------------------
def test_tedious_token_layouts() -> None:
    # loginack-token-parser-test: interface 1, TDS 0x72090002 written big-endian, 'prog', 1.2.3.4.
    body = b"\x01" + _hex("72 09 00 02") + b"\x04" + "prog".encode("utf-16-le") + b"\x01\x02\x03\x04"
    assert K.loginack(0x72090002, prog_name="prog", version=(1, 2, 3, 4)) == b"\xad" + struct.pack("<H", len(body)) + body
    # env-change-token-parser-test: database 'old' -> 'new', packet size 1024 -> 2048 (as text).
    body = b"\x01\x03" + "new".encode("utf-16-le") + b"\x03" + "old".encode("utf-16-le")
    assert K.envchange_text(K.ENV_DATABASE, "new", "old") == b"\xe3" + struct.pack("<H", len(body)) + body
    body = b"\x04\x04" + "2048".encode("utf-16-le") + b"\x04" + "1024".encode("utf-16-le")
    assert K.envchange_text(K.ENV_PACKETSIZE, "2048", "1024") == b"\xe3" + struct.pack("<H", len(body)) + body
    # done-token-parser-test: status 0x0010 (count), curCmd 1, row count 0x1200000034 (64 bits).
    assert K.done(0x0010, 0x1200000034, cur_cmd=1) == _hex("fd 1000 0100 34000000 12000000")
    # infoerror-token-parser-test: number 3, state 4, class 5, 'message', 'server', 'proc', line 6.
    body = (
        struct.pack("<IBB", 3, 4, 5) + b"\x07\x00" + "message".encode("utf-16-le") + b"\x06" + "server".encode("utf-16-le")
        + b"\x04" + "proc".encode("utf-16-le") + struct.pack("<I", 6)
    )
    info = K.message(3, "message", severity=5, state=4, info=True, proc="proc", line=6, server="server")
    assert info == b"\xab" + struct.pack("<H", len(body)) + body


def test_b_varchar_counts_utf16_code_units() -> None:
    """tedious writeBVarchar/writeUsVarchar count UCS-2 code units: a character outside the BMP is two."""
    assert K.b_varchar("a😀") == b"\x03" + "a😀".encode("utf-16-le")
    assert K.us_varchar("😀") == b"\x02\x00" + "😀".encode("utf-16-le")
    token = K.message(207, "Invalid column name '😀'.")
    assert token[9:11] == struct.pack("<H", len("Invalid column name '😀'.".encode("utf-16-le")) // 2)


@pytest.mark.parametrize(
    ("spec", "value", "raw"),
    [  # tedious test/unit/token/row-token-parser-test.ts, TYPE_VARBYTE as sent in a ROW
        ("bigint", 0, "08 0000000000000000"),
        ("bigint", -1, "08 ffffffffffffffff"),
        ("bigint", 9223372036854775807, "08 ffffffffffffff7f"),
        ("bigint", -9223372036854775808, "08 0000000000000080"),
        ("bigint", 10000, "08 1027000000000000"),
        ("bigint", None, "00"),
        ("real", 9.5, "04 00001841"),
        ("float", 9.5, "08 0000000000002340"),
        ("smallmoney", Decimal("123.456"), "04 80d61200"),
        ("money", Decimal("123.456"), "08 00000000 80d61200"),
        ("money", Decimal("123456789012345.11"), "08 f4102211 dc6ae97d"),
        ("money", None, "00"),
        ("uniqueidentifier", uuid.UUID("67452301-ab89-efcd-0123-456789abcdef"), "10 0123456789abcdef0123456789abcdef"),
        ("uniqueidentifier", None, "00"),
        ("numeric(3,1)", Decimal("9.3"), "05 01 5d000000"),
        ("numeric(3,1)", Decimal("-9.3"), "05 00 5d000000"),
        ("numeric(13,1)", Decimal(f"{2**32 + 93}e-1"), "09 01 5d000000 01000000"),
        ("numeric(23,1)", Decimal(f"{2**64 + 2 * 2**32 + 93}e-1"), "0d 01 5d000000 02000000 01000000"),
        ("numeric(33,1)", Decimal(f"{2**96 + 2 * 2**64 + 3 * 2**32 + 93}e-1"), "11 01 5d000000 03000000 02000000 01000000"),
        ("numeric(3,1)", None, "00"),
        ("datetime", dt.datetime(1900, 1, 3, 0, 0, 45), "08 02000000 bc340000"),  # 2 days, 45 * 300 ticks
        ("datetime", None, "00"),
        ("varchar(10)", "abcdé", "0500 61626364e9"),  # collation 09 04 D0 00 34 is code page 1252
        ("varchar(10)", "abcde", "0500 6162636465"),
        ("nvarchar(10)", "abc", "0600 610062006300"),
        ("varbinary(10)", b"\x12\x34", "0200 1234"),
        ("binary(2)", b"\x12\x34", "0200 1234"),
        ("varchar(max)", None, "ffffffffffffffff"),
        ("varbinary(max)", None, "ffffffffffffffff"),
    ],
)
def test_row_values_match_tedious_fixtures(spec: str, value: Any, raw: str) -> None:
    assert T.SqlType.parse(spec).encode(value) == _hex(raw)


def test_plp_value_layout_matches_tedious_fixture() -> None:
    """varcharMaxKnownLength: ULONGLONG total, chunks of ULONG length + data, ULONG 0 terminator."""
    assert T.SqlType.parse("varchar(max)").encode("abcdef") == struct.pack("<QI", 6, 6) + b"abcdef" + bytes(4)
    big = T.SqlType.parse("varbinary(max)").encode(bytes(8001))
    assert big == struct.pack("<QI", 8001, 8000) + bytes(8000) + struct.pack("<I", 1) + b"\x00" + bytes(4)


@pytest.mark.parametrize(
    ("value", "expected"),
    [  # row-token-parser-test: PLP values split in chunks; the known-length mismatch is an error there
        (_hex("0600000000000000 03000000 616263 03000000 646566 00000000"), "abcdef"),
        (_hex("feffffffffffffff 03000000 616263 03000000 646566 00000000"), "abcdef"),
        (_hex("ffffffffffffffff"), None),
    ],
)
def test_chunked_plp_parameters(value: bytes, expected: str | None) -> None:
    varchar_max = bytes((T.BIGVARCHR,)) + b"\xff\xff" + T.COLLATION
    assert _rpc_value(varchar_max, value) == (expected, "varchar")


def test_plp_whose_chunks_disagree_with_its_length_is_rejected() -> None:
    """tedious: 'Partially Length-prefixed Bytes unmatched lengths : expected 7, but got 6 bytes'."""
    varchar_max = bytes((T.BIGVARCHR,)) + b"\xff\xff" + T.COLLATION
    with pytest.raises(W.WireError, match="expected 7"):
        _rpc_value(varchar_max, _hex("0700000000000000 03000000 616263 03000000 646566 00000000"))


def test_login7_password_scrambling_matches_tedious() -> None:
    """login7-payload-test: 'pw' is sent as a2 a5 d2 a5 (nibbles swapped, then XOR 0xA5)."""
    head = bytearray(94)
    struct.pack_into("<II", head, 4, W.TDS74, 4096)
    struct.pack_into("<HH", head, 36 + 8, 94, 2)
    assert W.parse_login7(bytes(head) + _hex("a2 a5 d2 a5")).password == "pw"


# -- tedious test/unit/data-type.ts: TYPE_INFO and parameter bytes -----------------------------------
_NO_COLLATION = bytes(5)  # tedious's fixtures pass no collation: five zero bytes


@pytest.mark.parametrize(
    ("spec", "type_info"),
    [
        ("bigint", "26 08"), ("int", "26 04"), ("smallint", "26 02"), ("tinyint", "26 01"), ("bit", "68 01"),
        ("float", "6d 08"), ("real", "6d 04"), ("money", "6e 08"), ("smallmoney", "6e 04"),
        ("datetime", "6f 08"), ("smalldatetime", "6f 04"), ("date", "28"), ("time(1)", "29 01"),
        ("datetime2(1)", "2a 01"), ("datetimeoffset(1)", "2b 01"), ("uniqueidentifier", "24 10"),
        ("binary(1)", "ad 0100"), ("varbinary(1)", "a5 0100"), ("varbinary(max)", "a5 ffff"),
        ("char(1)", "af 0100 0000000000"), ("nchar(1)", "ef 0200 0000000000"),
        ("nvarchar(1)", "e7 0200 0000000000"), ("nvarchar(max)", "e7 ffff 0000000000"),
        ("decimal(1,1)", "6a 05 01 01"), ("decimal(15,1)", "6a 09 0f 01"), ("decimal(20,1)", "6a 0d 14 01"),
        ("decimal(30,1)", "6a 11 1e 01"), ("numeric(1,1)", "6c 05 01 01"), ("numeric(15,1)", "6c 09 0f 01"),
        ("numeric(20,1)", "6c 0d 14 01"), ("numeric(30,1)", "6c 11 1e 01"),
    ],
)
def test_type_info_matches_tedious(spec: str, type_info: str) -> None:
    ours = T.SqlType.parse(spec).type_info()
    expected = _hex(type_info)
    if expected.endswith(_NO_COLLATION):
        expected = expected[:-5] + T.COLLATION
    assert ours == expected


def test_text_type_info_has_a_four_byte_length_and_collation() -> None:
    """tedious Text: 23, a ULONG length (theirs 1, a column's 0x7FFFFFFF), collation."""
    assert T.SqlType.parse("text").type_info() == b"\x23" + struct.pack("<I", 0x7FFFFFFF) + T.COLLATION
    assert T.SqlType.parse("ntext").type_info() == b"\x63" + struct.pack("<I", 0x7FFFFFFF) + T.COLLATION


@pytest.mark.parametrize(
    ("type_info", "value", "expected", "name"),
    [  # generateTypeInfo + generateParameterLength + generateParameterData of tedious's fixtures
        ("26 08", "08 15cd5b0700000000", 123456789, "bigint"),
        ("26 04", "04 d2040000", 1234, "int"),
        ("26 02", "02 0200", 2, "smallint"),
        ("26 01", "01 01", 1, "tinyint"),
        ("26 04", "00", None, "int"),
        ("26 02", "00", None, "smallint"),
        ("68 01", "01 01", True, "bit"),
        ("6d 08", "08 8d976e1283c0f33f", 1.2345, "float"),
        ("6d 04", "04 fa3ef642", struct.unpack("<f", _hex("fa3ef642"))[0], "real"),
        ("6d 04", "00", None, "real"),
        ("6e 08", "08 00000000204bbc00", Decimal("1234.0000"), "money"),
        ("6e 04", "04 204e0000", Decimal("2.0000"), "smallmoney"),
        ("6e 04", "00", None, "smallmoney"),
        ("6f 04", "00", None, "smalldatetime"),
        ("28", "03 163a0b", dt.date(2015, 6, 18), "date"),
        ("2a 00", "06 7f5101163a0b", dt.datetime(2015, 6, 18, 23, 59, 59), "datetime2(0)"),
        ("2b 00", "08 20fd00 2d380b 0000", dt.datetime(2014, 2, 14, 18, 0, 0, tzinfo=UTC), "datetimeoffset(0)"),
        ("29 07", "05 68fc624b91", dt.time(17, 20, 3, 503626), "time(7)"),  # 17:20:03.5036264
        ("29 07", "05 c422ceb80c", dt.time(1, 31, 4, 12461), "time(7)"),  # 01:31:04.0124612
        ("24 10", "10 34ae62e0e56df3478ba329d25f77e71a", uuid.UUID("e062ae34-6de5-47f3-8ba3-29d25f77e71a"), "uniqueidentifier"),
        ("6a 05 01 00", "05 0101000000", Decimal(1), "decimal(1,0)"),
        ("6a 09 0f 00", "09 010100000000000000", Decimal(1), "decimal(15,0)"),
        ("6a 0d 19 00", "0d 01010000000000000000000000", Decimal(1), "decimal(25,0)"),
        ("6a 11 1e 00", "11 0101000000000000000000000000000000", Decimal(1), "decimal(30,0)"),
        ("a7 0b00 0904d00034", "0b00 68656c6c6f20776f726c64", "hello world", "varchar"),
        ("a7 ffff 0904d00034", "feffffffffffffff 0b000000 68656c6c6f20776f726c64 00000000", "hello world", "varchar"),
        ("e7 ffff 0904d00034", "feffffffffffffff 02000000 ffff 00000000", "\uffff", "nvarchar"),
        ("a5 0100", "ffff", None, "varbinary"),
        ("a5 ffff", "ffffffffffffffff", None, "varbinary"),
        ("ad 0400", "0400 12340000", b"\x12\x34\x00\x00", "binary"),
        ("23 01000000 0904d00034", "0b000000 48656c6c6f20576f726c64", "Hello World", "text"),
    ],
)
def test_tedious_parameter_fixtures_are_parsed(type_info: str, value: str, expected: Any, name: str) -> None:
    assert _rpc_value(_hex(type_info), _hex(value)) == (expected, name)


# == tedious itself, through node ====================================================================
_BRIDGE = r"""
'use strict';
// Feeds bytes to tedious's own parsers and asks its encoders for bytes; JSON in on stdin, out on stdout.
const lib = process.env.TEDIOUS_LIB;
const Parser = require(lib + '/token/stream-parser');
const Debug = require(lib + '/debug');
const PreloginPayload = require(lib + '/prelogin-payload');
const Login7Payload = require(lib + '/login7-payload');
const RpcRequestPayload = require(lib + '/rpcrequest-payload');
const { TYPES } = require(lib + '/data-type');
const { Collation } = require(lib + '/collation');

function plain(v) {
  if (v === null || v === undefined) return null;
  if (Buffer.isBuffer(v)) return { hex: v.toString('hex') };
  if (v instanceof Date) return { date: v.toISOString(), ns: v.nanosecondsDelta === undefined ? null : v.nanosecondsDelta };
  if (typeof v === 'bigint') return v.toString();
  if (Array.isArray(v)) return v.map(plain);
  if (typeof v === 'object') {
    const out = {};
    for (const [k, x] of Object.entries(v)) {
      if (k === 'type') out.type = x && x.name;
      else if (k === 'collation' && x) out.collation = { lcid: x.lcid, codepage: x.codepage, sortId: x.sortId };
      else if (typeof x !== 'function') out[k] = plain(x);
    }
    return out;
  }
  return v;
}

async function tokens(job) {
  const options = { useUTC: true, lowerCaseGuids: true, tdsVersion: '7_4', useColumnNames: false, camelCaseColumns: false };
  const out = [];
  for await (const token of Parser.parseTokens([Buffer.from(job.hex, 'hex')], new Debug(), options)) {
    if (token === undefined) continue;
    const t = plain(token);
    t.name = token.name;
    if (token.name === 'ROW') t.columns = token.columns.map((c) => plain(c.value));
    out.push(t);
  }
  return out;
}

function prelogin(job) {
  const p = new PreloginPayload(Buffer.from(job.hex, 'hex'));
  return { version: p.version, encryption: p.encryptionString, instance: p.instance, threadId: p.threadId ?? null, mars: p.marsString };
}

function preloginClient(job) {
  return new PreloginPayload({ encrypt: job.encrypt, version: job.version }).data.toString('hex');
}

function login7(job) {
  const p = new Login7Payload(job.options);
  Object.assign(p, job.fields);
  return p.toBuffer().toString('hex');
}

function parameter(p, collation) {
  const type = TYPES[p.type];
  let v = p.value;
  if (v !== null && p.kind === 'date') { v = new Date(v); if (p.ns) v.nanosecondDelta = p.ns; }
  if (v !== null && p.kind === 'buffer') v = Buffer.from(v, 'hex');
  return { ...p, type, value: type.validate(v, collation) };
}

function rpc(job) {
  const collation = Collation.fromBuffer(Buffer.from(job.collation, 'hex'));
  const params = job.params.map((p) => parameter(p, collation));
  const payload = new RpcRequestPayload(job.proc, params, Buffer.alloc(8), { tdsVersion: '7_4', useUTC: true }, collation);
  return Buffer.concat([...payload]).toString('hex');
}

async function main() {
  const jobs = JSON.parse(require('fs').readFileSync(0, 'utf8'));
  const ops = { tokens, prelogin, preloginClient, login7, rpc };
  const out = [];
  for (const job of jobs) {
    try { out.push({ ok: await ops[job.op](job) }); } catch (e) { out.push({ error: String((e && e.stack) || e) }); }
  }
  process.stdout.write(JSON.stringify(out));
}
main();
"""

TediousRun = Callable[..., list[Any]]


@pytest.fixture(scope="module")
def tedious(tmp_path_factory: pytest.TempPathFactory) -> TediousRun:
    """Run jobs through tedious's parsers/encoders in one ``node`` process; skip when unavailable."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: tedious cannot be run (apt-get install nodejs)")
    package = Path(os.environ.get("TDS_CHECK_TEDIOUS", REPO / ".local/tds-check/node_modules/tedious"))
    if not (package / "lib/token/stream-parser.js").is_file():
        pytest.skip(f"tedious is not installed at {package} (make setup installs it with npm)")
    script = tmp_path_factory.mktemp("tedious") / "bridge.js"
    script.write_text(_BRIDGE)

    def run(jobs: list[dict[str, Any]], tz: str = "UTC") -> list[Any]:
        env = {**os.environ, "TEDIOUS_LIB": str(package / "lib"), "TZ": tz}
        done = subprocess.run(
            [node, str(script)], input=json.dumps(jobs), capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        errors = [r["error"] for r in results if "error" in r]
        assert not errors, errors[0]
        return [r["ok"] for r in results]

    return run


def _date(value: dict[str, Any]) -> tuple[dt.datetime, int]:
    """tedious's Date (UTC, milliseconds) plus its nanosecondsDelta, as (datetime, 100 ns remainder)."""
    when = dt.datetime.fromisoformat(value["date"].replace("Z", "+00:00"))
    return when, round((value["ns"] or 0) * 10**7)


# Every column type the emulator emits: (spec, value, tedious type, dataLength, what tedious decodes).
_COLUMNS: list[tuple[str, Any, str, int | None, Any]] = [
    ("tinyint", 255, "IntN", 1, 255),
    ("smallint", -32768, "IntN", 2, -32768),
    ("int", -2147483648, "IntN", 4, -2147483648),
    ("bigint", 9223372036854775807, "IntN", 8, "9223372036854775807"),
    ("bit", True, "BitN", 1, True),
    ("decimal(10,2)", Decimal("-12.34"), "DecimalN", 9, -12.34),
    ("decimal(5,0)", Decimal("99999"), "DecimalN", 5, 99999),
    ("numeric(38,10)", Decimal("1234567890123456789012345678.0123456789"), "NumericN", 17, 1.2345678901234568e27),
    ("numeric(28,4)", Decimal("-0.0001"), "NumericN", 13, -0.0001),
    ("float", 1.5e300, "FloatN", 8, 1.5e300),
    ("real", 0.5, "FloatN", 4, 0.5),
    ("money", Decimal("-12345.6789"), "MoneyN", 8, -12345.6789),
    ("smallmoney", Decimal("-214748.3648"), "MoneyN", 4, -214748.3648),
    ("date", dt.date(1, 1, 1), "Date", None, ("0001-01-01T00:00:00.000Z", 0)),
    ("date", dt.date(9999, 12, 31), "Date", None, ("9999-12-31T00:00:00.000Z", 0)),
    ("datetime", dt.datetime(1753, 1, 1), "DateTimeN", 8, ("1753-01-01T00:00:00.000Z", 0)),
    ("datetime", dt.datetime(9999, 12, 31, 23, 59, 59, 997000), "DateTimeN", 8, ("9999-12-31T23:59:59.997Z", 0)),
    ("datetime", dt.datetime(2024, 2, 28, 23, 59, 59, 999000), "DateTimeN", 8, ("2024-02-29T00:00:00.000Z", 0)),
    ("smalldatetime", dt.datetime(2079, 6, 6, 23, 59), "DateTimeN", 4, ("2079-06-06T23:59:00.000Z", 0)),
    ("time(7)", "23:59:59.9999999", "Time", None, ("1970-01-01T23:59:59.999Z", 9999)),
    ("time(0)", dt.time(12, 34, 56), "Time", None, ("1970-01-01T12:34:56.000Z", 0)),
    ("time(3)", dt.time(1, 2, 3, 456000), "Time", None, ("1970-01-01T01:02:03.456Z", 0)),
    ("datetime2(7)", "0001-01-01 00:00:00.0000001", "DateTime2", None, ("0001-01-01T00:00:00.000Z", 1)),
    ("datetime2(3)", dt.datetime(2024, 2, 29, 13, 14, 15, 678000), "DateTime2", None, ("2024-02-29T13:14:15.678Z", 0)),
    ("datetimeoffset(7)", "2024-01-01 01:00:00.1234567 +05:30", "DateTimeOffset", None, ("2023-12-31T19:30:00.123Z", 4567)),
    ("datetimeoffset(0)", "2024-06-30 23:30:00 -08:00", "DateTimeOffset", None, ("2024-07-01T07:30:00.000Z", 0)),
    ("uniqueidentifier", uuid.UUID("e062ae34-6de5-47f3-8ba3-29d25f77e71a"), "UniqueIdentifier", 16, "e062ae34-6de5-47f3-8ba3-29d25f77e71a"),
    ("char(5)", "ab", "Char", 5, "ab   "),
    ("varchar(10)", "café", "VarChar", 10, "café"),
    ("nchar(3)", "日本", "NChar", 6, "日本 "),
    ("nvarchar(10)", "żółw😀", "NVarChar", 20, "żółw😀"),
    ("varchar(max)", "x" * 20000, "VarChar", 0xFFFF, "x" * 20000),
    ("nvarchar(max)", "", "NVarChar", 0xFFFF, ""),
    ("binary(4)", b"\x01", "Binary", 4, {"hex": "01000000"}),
    ("varbinary(5)", b"", "VarBinary", 5, {"hex": ""}),
    ("varbinary(max)", bytes(range(256)) * 40, "VarBinary", 0xFFFF, {"hex": (bytes(range(256)) * 40).hex()}),
    ("ntext", "ñ😀", "NText", 0x7FFFFFFF, "ñ😀"),
    ("text", "é", "Text", 0x7FFFFFFF, "é"),
]


def test_tedious_decodes_every_column_type(tedious: TediousRun) -> None:
    columns = [(f"c{i}_ä😀", T.SqlType.parse(spec)) for i, (spec, *_rest) in enumerate(_COLUMNS)]
    types = [t for _, t in columns]
    stream = (
        K.colmetadata(columns)
        + K.rows(types, [[value for _, value, *_rest in _COLUMNS], [None] * len(_COLUMNS)])
        + K.done(W.DONE_MORE | W.DONE_COUNT, 2)
    )
    meta, row, nulls, done = tedious([{"op": "tokens", "hex": stream.hex()}])[0]
    assert [meta["name"], row["name"], nulls["name"], done["name"]] == ["COLMETADATA", "ROW", "ROW", "DONE"]
    assert nulls["columns"] == [None] * len(_COLUMNS)
    assert (done["more"], done["rowCount"], done["curCmd"]) == (True, 2, 0xC1)
    for (spec, _value, type_name, length, decoded), (name, sql_type), column, got in zip(
        _COLUMNS, columns, meta["columns"], row["columns"], strict=True
    ):
        assert (column["colName"], column["type"], column["flags"]) == (name, type_name, 9)
        if length is not None:
            assert column["dataLength"] == length, spec
        if spec.startswith(("decimal", "numeric")):
            assert (column["precision"], column["scale"]) == (sql_type.precision, sql_type.scale)
        if spec.startswith(("time", "datetime2", "datetimeoffset")):
            assert column["scale"] == sql_type.scale
        if column["collation"] is not None:
            assert column["collation"] == {"lcid": 0x0409, "codepage": "CP1252", "sortId": 52}
        if isinstance(decoded, tuple):
            when, ticks = _date(got)
            assert (when.isoformat(timespec="milliseconds").replace("+00:00", "Z"), ticks) == decoded, spec
        elif isinstance(decoded, float):
            assert got == pytest.approx(decoded, rel=1e-15), spec
        else:
            assert got == decoded, spec


def test_tedious_reads_login_error_and_rpc_responses(tedious: TediousRun) -> None:
    """The token sequences server.py sends: login, an error, a transaction, an RPC with a handle."""
    descriptor = _hex("01 00 00 00 00 00 00 00")
    stream = (
        K.envchange_text(K.ENV_DATABASE, "shop", "master")
        + K.message(5701, "Changed database context to 'shop'.", severity=0, info=True)
        + K.envchange_bytes(K.ENV_COLLATION, T.COLLATION)
        + K.envchange_text(K.ENV_LANGUAGE, "us_english")
        + K.loginack(W.TDS74)
        + K.envchange_text(K.ENV_PACKETSIZE, "8192", "4096")
        + K.done()
        + K.message(208, "Invalid object name 'nope😀'.", state=1, line=3)
        + K.done(W.DONE_ERROR | W.DONE_INXACT)
        + K.envchange_bytes(K.ENV_BEGIN_TRAN, descriptor)
        + K.envchange_bytes(K.ENV_COMMIT_TRAN, b"", descriptor)
        + K.envchange_bytes(K.ENV_ROLLBACK_TRAN, b"", descriptor)
        + K.done(W.DONE_ATTN)
        + K.done(W.DONE_COUNT, 3, K.DONEINPROC)
        + K.return_status(-6)
        + K.return_value_int(0, "@handle", 42)
        + K.done(0, 0, K.DONEPROC)
    )
    got = tedious([{"op": "tokens", "hex": stream.hex()}])[0]
    assert [t["name"] for t in got] == [
        "ENVCHANGE", "INFO", "ENVCHANGE", "ENVCHANGE", "LOGINACK", "ENVCHANGE", "DONE", "ERROR", "DONE",
        "ENVCHANGE", "ENVCHANGE", "ENVCHANGE", "DONE", "DONEINPROC", "RETURNSTATUS", "RETURNVALUE", "DONEPROC",
    ]  # fmt: skip
    db, info, collation, language, ack, packet, _, error, failed, begin, commit, rollback, attn, inproc, status, ret, proc = got
    assert (db["handlerName"], db["newValue"], db["oldValue"]) == ("onDatabaseChange", "shop", "master")
    assert (info["number"], info["class"], info["state"], info["serverName"]) == (5701, 0, 1, K.SERVER_NAME)
    assert (collation["handlerName"], collation["newValue"]["lcid"], collation["newValue"]["sortId"]) == ("onSqlCollationChange", 0x0409, 52)
    assert collation["newValue"]["codepage"] == "CP1252"
    assert (language["handlerName"], language["newValue"], language["oldValue"]) == ("onLanguageChange", "us_english", "")
    assert (ack["interface"], ack["tdsVersion"], ack["progName"]) == ("SQL_TSQL", "7_4", "Microsoft SQL Server")
    assert ack["progVersion"] == {"major": 15, "minor": 0, "buildNumHi": 7, "buildNumLow": 208}
    assert (packet["handlerName"], packet["newValue"], packet["oldValue"]) == ("onPacketSizeChange", 8192, 4096)
    assert (error["number"], error["class"], error["message"], error["lineNumber"]) == (208, 16, "Invalid object name 'nope😀'.", 3)
    assert (failed["sqlError"], failed["more"]) == (True, False)
    assert (begin["handlerName"], begin["newValue"]) == ("onBeginTransaction", {"hex": descriptor.hex()})
    assert (commit["handlerName"], commit["oldValue"]) == ("onCommitTransaction", {"hex": descriptor.hex()})
    assert (rollback["handlerName"], rollback["oldValue"]) == ("onRollbackTransaction", {"hex": descriptor.hex()})
    assert attn["attention"] is True
    assert (inproc["rowCount"], proc["rowCount"]) == (3, None)
    assert status["value"] == -6
    assert (ret["paramOrdinal"], ret["paramName"], ret["value"], ret["metadata"]["type"]) == (0, "handle", 42, "IntN")


def test_tedious_reads_our_prelogin_response(tedious: TediousRun) -> None:
    got = tedious([{"op": "prelogin", "hex": W.prelogin_response(W.ENCRYPT_NOT_SUP).hex()}])[0]
    assert got == {
        "version": {"major": 15, "minor": 0, "build": 2000, "subbuild": 0},
        "encryption": "NOT_SUP",
        "instance": 0,
        "threadId": None,  # THREADID has length 0 in a server's answer, as a real server sends it
        "mars": "OFF",
    }


def test_our_parsers_read_tedious_prelogin_and_login7(tedious: TediousRun) -> None:
    version = {"major": 18, "minor": 6, "build": 2, "subbuild": 0}
    login_options = {
        "tdsVersion": W.TDS74, "packetSize": 8192, "clientProgVer": 0, "clientPid": 4321,
        "connectionId": 0, "clientTimeZone": 0, "clientLcid": 0x0409,
    }  # fmt: skip
    fields = {
        "hostname": "worker-1", "userName": "cdc_reader", "password": "pä$s;}wörd😀", "appName": "tedious",
        "serverName": "127.0.0.1", "language": "us_english", "database": "shop", "libraryName": "Tedious",
    }  # fmt: skip
    on, off, login = tedious([
        {"op": "preloginClient", "encrypt": True, "version": version},
        {"op": "preloginClient", "encrypt": False, "version": version},
        {"op": "login7", "options": login_options, "fields": fields},
    ])  # fmt: skip
    assert W.parse_prelogin(bytes.fromhex(on))[1] == bytes((W.ENCRYPT_ON,))
    options = W.parse_prelogin(bytes.fromhex(off))
    assert options[0] == bytes((18, 6)) + struct.pack(">HH", 2, 0)
    assert options[1] == bytes((W.ENCRYPT_NOT_SUP,))
    assert W.parse_login7(bytes.fromhex(login)) == W.Login(
        tds_version=W.TDS74, packet_size=8192, user="cdc_reader", password="pä$s;}wörd😀", app_name="tedious",
        server_name="127.0.0.1", database="shop", hostname="worker-1",
    )  # fmt: skip


# tedious parameter → (what our RPC parser must return, the type name it reports).
_PARAMS: list[tuple[dict[str, Any], Any, str]] = [
    ({"type": "TinyInt", "value": 255}, 255, "tinyint"),
    ({"type": "SmallInt", "value": -32768}, -32768, "smallint"),
    ({"type": "Int", "value": -2147483648}, -2147483648, "int"),
    ({"type": "BigInt", "value": "-9223372036854775808"}, -9223372036854775808, "bigint"),
    ({"type": "Int", "value": None}, None, "int"),
    ({"type": "Bit", "value": True}, True, "bit"),
    ({"type": "Float", "value": -1.5e-300}, -1.5e-300, "float"),
    ({"type": "Real", "value": 0.25}, 0.25, "real"),
    ({"type": "Money", "value": -214748.3649}, Decimal("-214748.3649"), "money"),  # high word -1
    ({"type": "Money", "value": 123456789012.3456}, Decimal("123456789012.3456"), "money"),
    ({"type": "SmallMoney", "value": -214748.3648}, Decimal("-214748.3648"), "smallmoney"),
    ({"type": "Decimal", "value": -12.34, "precision": 10, "scale": 2}, Decimal("-12.34"), "decimal(10,2)"),
    ({"type": "Numeric", "value": 99999.5, "precision": 28, "scale": 1}, Decimal("99999.5"), "decimal(28,1)"),
    ({"type": "UniqueIdentifier", "value": "e062ae34-6de5-47f3-8ba3-29d25f77e71a"}, uuid.UUID("e062ae34-6de5-47f3-8ba3-29d25f77e71a"), "uniqueidentifier"),
    ({"type": "Date", "value": "9999-12-31T00:00:00Z", "kind": "date"}, dt.date(9999, 12, 31), "date"),
    ({"type": "DateTime", "value": "2024-02-28T23:59:59.999Z", "kind": "date"}, dt.datetime(2024, 2, 29), "datetime"),
    ({"type": "DateTime", "value": "1753-01-01T00:00:00.003Z", "kind": "date"}, dt.datetime(1753, 1, 1, 0, 0, 0, 3000), "datetime"),
    ({"type": "SmallDateTime", "value": "2079-06-06T23:59:00Z", "kind": "date"}, dt.datetime(2079, 6, 6, 23, 59), "smalldatetime"),
    ({"type": "Time", "value": "1970-01-01T17:20:03.503Z", "kind": "date", "ns": 0.0006264, "scale": 7}, dt.time(17, 20, 3, 503626), "time(7)"),
    ({"type": "Time", "value": "1970-01-01T01:02:03Z", "kind": "date", "scale": 0}, dt.time(1, 2, 3), "time(0)"),
    ({"type": "DateTime2", "value": "0001-01-01T00:00:00.001Z", "kind": "date", "scale": 3}, dt.datetime(1, 1, 1, 0, 0, 0, 1000), "datetime2(3)"),
    ({"type": "DateTime2", "value": "2024-02-29T12:00:00.123Z", "kind": "date", "ns": 0.0004567, "scale": 7}, dt.datetime(2024, 2, 29, 12, 0, 0, 123456), "datetime2(7)"),
    ({"type": "DateTimeOffset", "value": "2024-01-01T00:00:00.5Z", "kind": "date", "scale": 1}, dt.datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=UTC), "datetimeoffset(1)"),
    ({"type": "VarChar", "value": "café", "length": 10}, "café", "varchar"),
    ({"type": "VarChar", "value": "x" * 9000, "length": 9000}, "x" * 9000, "varchar"),
    ({"type": "Char", "value": "ab", "length": 2}, "ab", "char"),
    ({"type": "NVarChar", "value": "żółw😀", "length": 10}, "żółw😀", "nvarchar"),
    ({"type": "NVarChar", "value": "日" * 5000}, "日" * 5000, "nvarchar"),
    ({"type": "NVarChar", "value": None, "length": 10}, None, "nvarchar"),
    ({"type": "NChar", "value": "ñ", "length": 1}, "ñ", "nchar"),
    ({"type": "VarBinary", "value": "00ff10", "kind": "buffer", "length": 3}, b"\x00\xff\x10", "varbinary"),
    ({"type": "VarBinary", "value": "ab" * 9000, "kind": "buffer"}, b"\xab" * 9000, "varbinary"),
    ({"type": "Binary", "value": "0102", "kind": "buffer", "length": 2}, b"\x01\x02", "binary"),
    ({"type": "Text", "value": "Hello World"}, "Hello World", "text"),
    ({"type": "NText", "value": "ñ"}, "ñ", "ntext"),
]


def test_our_rpc_parser_reads_tedious_parameters(tedious: TediousRun) -> None:
    params = [{"name": f"P{i}", **spec} for i, (spec, _, _) in enumerate(_PARAMS)]
    params.insert(0, {"name": "handle", "type": "Int", "value": None, "output": True})
    (raw,) = tedious([{"op": "rpc", "proc": 10, "collation": T.COLLATION.hex(), "params": params}])
    (call,) = W.parse_rpc(W.skip_all_headers(bytes.fromhex(raw)))
    assert call.proc == "sp_executesql"
    handle, *rest = call.params
    assert (handle.name, handle.value, handle.output) == ("@handle", None, True)
    for (spec, value, name), param in zip(_PARAMS, rest, strict=True):
        assert (param.value, param.sql_type, param.output) == (value, name, False), spec


# (our column type, our value, tedious's parameter for the same value): TYPE_INFO + TYPE_VARBYTE share
# one grammar in COLMETADATA/ROW and in RPC parameters, so the bytes must be equal.
_SAME_BYTES: list[tuple[str, Any, dict[str, Any]]] = [
    ("tinyint", 255, {"type": "TinyInt", "value": 255}),
    ("smallint", -2, {"type": "SmallInt", "value": -2}),
    ("int", 1234, {"type": "Int", "value": 1234}),
    ("bigint", -9223372036854775808, {"type": "BigInt", "value": "-9223372036854775808"}),
    ("int", None, {"type": "Int", "value": None}),
    ("bit", False, {"type": "Bit", "value": False}),
    ("float", -1.2345, {"type": "Float", "value": -1.2345}),
    ("real", 0.1, {"type": "Real", "value": 0.1}),
    ("money", Decimal("-214748.3649"), {"type": "Money", "value": -214748.3649}),
    ("smallmoney", Decimal("2"), {"type": "SmallMoney", "value": 2}),
    ("decimal(1,0)", Decimal("7"), {"type": "Decimal", "value": 7, "precision": 1, "scale": 0}),
    ("decimal(10,2)", Decimal("-12.34"), {"type": "Decimal", "value": -12.34, "precision": 10, "scale": 2}),
    ("numeric(25,3)", Decimal("1.5"), {"type": "Numeric", "value": 1.5, "precision": 25, "scale": 3}),
    ("numeric(38,10)", Decimal("-1.5"), {"type": "Numeric", "value": -1.5, "precision": 38, "scale": 10}),
    ("uniqueidentifier", uuid.UUID("e062ae34-6de5-47f3-8ba3-29d25f77e71a"), {"type": "UniqueIdentifier", "value": "e062ae34-6de5-47f3-8ba3-29d25f77e71a"}),
    ("date", dt.date(1, 1, 1), {"type": "Date", "value": "0001-01-01T00:00:00Z", "kind": "date"}),
    ("date", dt.date(2015, 6, 18), {"type": "Date", "value": "2015-06-18T00:00:00Z", "kind": "date"}),
    ("datetime", dt.datetime(1753, 1, 1, 0, 0, 0, 3000), {"type": "DateTime", "value": "1753-01-01T00:00:00.003Z", "kind": "date"}),
    ("datetime", dt.datetime(2010, 1, 2, 20, 21, 22, 123000), {"type": "DateTime", "value": "2010-01-02T20:21:22.123Z", "kind": "date"}),
    ("datetime", dt.datetime(2024, 2, 28, 23, 59, 59, 999000), {"type": "DateTime", "value": "2024-02-28T23:59:59.999Z", "kind": "date"}),
    ("smalldatetime", dt.datetime(2079, 6, 6, 23, 59), {"type": "SmallDateTime", "value": "2079-06-06T23:59:00Z", "kind": "date"}),
    ("time(0)", "23:59:59", {"type": "Time", "value": "1970-01-01T23:59:59Z", "kind": "date", "scale": 0}),
    ("time(3)", "01:02:03.456", {"type": "Time", "value": "1970-01-01T01:02:03.456Z", "kind": "date", "scale": 3}),
    ("time(7)", "17:20:03.5036264", {"type": "Time", "value": "1970-01-01T17:20:03.503Z", "kind": "date", "scale": 7, "ns": 0.0006264}),
    ("datetime2(0)", "2015-06-18 23:59:59", {"type": "DateTime2", "value": "2015-06-18T23:59:59Z", "kind": "date", "scale": 0}),
    ("datetime2(4)", "9999-12-31 23:59:59.9999", {"type": "DateTime2", "value": "9999-12-31T23:59:59.999Z", "kind": "date", "scale": 4, "ns": 0.0009}),
    ("datetime2(7)", "2024-02-29 12:00:00.1234567", {"type": "DateTime2", "value": "2024-02-29T12:00:00.123Z", "kind": "date", "scale": 7, "ns": 0.0004567}),
    ("datetimeoffset(2)", "2014-02-14 17:59:59.99 +00:00", {"type": "DateTimeOffset", "value": "2014-02-14T17:59:59.990Z", "kind": "date", "scale": 2}),
    ("datetimeoffset(7)", None, {"type": "DateTimeOffset", "value": None, "scale": 7}),
    ("char(5)", "ab   ", {"type": "Char", "value": "ab   ", "length": 5}),
    ("varchar(10)", "café", {"type": "VarChar", "value": "café", "length": 10}),
    ("varchar(10)", None, {"type": "VarChar", "value": None, "length": 10}),
    ("nchar(3)", "日本 ", {"type": "NChar", "value": "日本 ", "length": 3}),
    ("nvarchar(10)", "żółw😀", {"type": "NVarChar", "value": "żółw😀", "length": 10}),
    ("binary(4)", b"\x01\x00\x00\x00", {"type": "Binary", "value": "01000000", "kind": "buffer", "length": 4}),
    ("varbinary(5)", b"", {"type": "VarBinary", "value": "", "kind": "buffer", "length": 5}),
    ("varchar(max)", "x" * 100, {"type": "VarChar", "value": "x" * 100, "length": 9000}),
    ("nvarchar(max)", "ñ", {"type": "NVarChar", "value": "ñ", "length": 5000}),
    ("varbinary(max)", b"\xab" * 7999, {"type": "VarBinary", "value": "ab" * 7999, "kind": "buffer", "length": 9000}),
    ("varbinary(max)", None, {"type": "VarBinary", "value": None, "length": 9000}),
]


def _tedious_value_bytes(tedious: TediousRun, params: list[dict[str, Any]], tz: str = "UTC") -> list[bytes]:
    """TYPE_INFO + TYPE_VARBYTE of each parameter as tedious's RPC encoder writes them."""
    jobs = [{"op": "rpc", "proc": 10, "collation": T.COLLATION.hex(), "params": [{"name": "", **p}]} for p in params]
    # after ALL_HEADERS: FFFF, ProcID, OptionFlags (6 bytes), an empty name and the status (2)
    return [W.skip_all_headers(bytes.fromhex(raw))[8:] for raw in tedious(jobs, tz=tz)]


def test_value_bytes_match_tedious_encoder(tedious: TediousRun) -> None:
    theirs = _tedious_value_bytes(tedious, [p for _, _, p in _SAME_BYTES])
    for (spec, value, _param), their in zip(_SAME_BYTES, theirs, strict=True):
        sql_type = T.SqlType.parse(spec)
        ours = sql_type.type_info() + sql_type.encode(value)
        if sql_type.is_plp and value is not None:  # tedious streams PLP: total PLP_UNKNOWN
            assert their[len(sql_type.type_info()) :][:8] == b"\xfe" + b"\xff" * 7
            their = their[: len(sql_type.type_info())] + struct.pack("<Q", len(sql_type._payload(value))) + their[len(sql_type.type_info()) + 8 :]
        assert ours.hex() == their.hex(), (spec, value)


@pytest.mark.parametrize(
    ("tz", "local"),
    [("Asia/Kolkata", "2024-01-01 05:30:00 +05:30"), ("America/St_Johns", "2023-12-31 20:30:00 -03:30")],
)
def test_datetimeoffset_offset_bytes_match_tedious(tedious: TediousRun, tz: str, local: str) -> None:
    """tedious writes the UTC date/time, then the client zone's offset in minutes (node's TZ)."""
    param = {"type": "DateTimeOffset", "value": "2024-01-01T00:00:00Z", "kind": "date", "scale": 0}
    (their,) = _tedious_value_bytes(tedious, [param], tz=tz)
    sql_type = T.SqlType.parse("datetimeoffset(0)")
    assert sql_type.type_info() + sql_type.encode(local) == their


def test_datetimeoffset_parameter_keeps_its_offset(tedious: TediousRun) -> None:
    """tedious sends the client zone's offset (node's TZ); UTC+05:30 here."""
    param = {"name": "P1", "type": "DateTimeOffset", "value": "2024-01-01T00:00:00Z", "kind": "date", "scale": 0}
    (raw,) = tedious([{"op": "rpc", "proc": "p", "collation": T.COLLATION.hex(), "params": [param]}], tz="Asia/Kolkata")
    (call,) = W.parse_rpc(W.skip_all_headers(bytes.fromhex(raw)))
    value = call.params[0].value
    assert value == dt.datetime(2024, 1, 1, tzinfo=UTC)
    assert value.utcoffset() == dt.timedelta(hours=5, minutes=30)
