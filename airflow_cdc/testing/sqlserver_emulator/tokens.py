"""Response tokens ([MS-TDS] 2.2.7): LOGINACK, ENVCHANGE, COLMETADATA, ROW, DONE, ERROR, INFO."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_cdc.testing.sqlserver_emulator.types import SqlType

LOGINACK, ENVCHANGE, COLMETADATA, ROW, DONE, DONEPROC, DONEINPROC = 0xAD, 0xE3, 0x81, 0xD1, 0xFD, 0xFE, 0xFF
ERROR, INFO, RETURNSTATUS, RETURNVALUE = 0xAA, 0xAB, 0x79, 0xAC
SERVER_NAME = "SQLSERVER-CDC-EMULATOR"
#: LOGINACK's ProgName and ProgVersion: SQL Server 2019 RTM, 15.0.2000 (build 2000 = 0x07D0).
#: A real server pads the name with two NULs ("Microsoft SQL Server\0\0"); clients ignore them.
PROG_NAME, PROG_VERSION = "Microsoft SQL Server", (15, 0, 7, 208)
ENV_DATABASE, ENV_LANGUAGE, ENV_PACKETSIZE, ENV_COLLATION = 1, 2, 4, 7
ENV_BEGIN_TRAN, ENV_COMMIT_TRAN, ENV_ROLLBACK_TRAN = 8, 9, 10


def b_varchar(text: str) -> bytes:
    """B_VARCHAR: a length in UTF-16 code units (a character outside the BMP counts two), then UCS-2."""
    data = text.encode("utf-16-le")
    return bytes((len(data) // 2,)) + data


def us_varchar(text: str) -> bytes:
    """US_VARCHAR: as :func:`b_varchar` with a two-byte length."""
    data = text.encode("utf-16-le")
    return struct.pack("<H", len(data) // 2) + data


def loginack(
    tds_version: int, *, prog_name: str = PROG_NAME, version: tuple[int, int, int, int] = PROG_VERSION
) -> bytes:
    """LOGINACK ([MS-TDS] 2.2.7.14): interface SQL_TSQL, the TDS version big-endian, name, version."""
    body = b"\x01" + struct.pack(">I", tds_version) + b_varchar(prog_name) + bytes(version)
    return bytes((LOGINACK,)) + struct.pack("<H", len(body)) + body


def envchange_text(kind: int, new: str, old: str = "") -> bytes:
    body = bytes((kind,)) + b_varchar(new) + b_varchar(old)
    return bytes((ENVCHANGE,)) + struct.pack("<H", len(body)) + body


def envchange_bytes(kind: int, new: bytes, old: bytes = b"") -> bytes:
    body = bytes((kind, len(new))) + new + bytes((len(old),)) + old
    return bytes((ENVCHANGE,)) + struct.pack("<H", len(body)) + body


def done(status: int = 0, rows: int = 0, token: int = DONE, cur_cmd: int = 0xC1) -> bytes:
    return struct.pack("<BHHQ", token, status, cur_cmd, rows)


def message(
    number: int,
    text: str,
    *,
    severity: int = 16,
    state: int = 1,
    info: bool = False,
    proc: str = "",
    line: int = 1,
    server: str = SERVER_NAME,
) -> bytes:
    """An ERROR (or INFO, severity <= 10) token carrying a SQL Server message number."""
    body = (
        struct.pack("<iBB", number, state, severity)
        + us_varchar(text)
        + b_varchar(server)
        + b_varchar(proc)
        + struct.pack("<i", line)
    )
    return bytes((INFO if info else ERROR,)) + struct.pack("<H", len(body)) + body


def colmetadata(columns: Sequence[tuple[str, SqlType]]) -> bytes:
    out = bytearray((COLMETADATA,)) + struct.pack("<H", len(columns))
    for name, sql_type in columns:
        out += struct.pack("<IH", 0, 0x0001 | 0x0008)  # user type; nullable, read/write unknown
        out += sql_type.type_info()
        if sql_type.name in ("ntext", "text", "image"):
            out += b"\x00"  # NumParts of the table name: none
        out += b_varchar(name)
    return bytes(out)


def rows(types: Sequence[SqlType], values: Iterable[Sequence[Any]]) -> bytes:
    out = bytearray()
    for row in values:
        out.append(ROW)
        for sql_type, value in zip(types, row, strict=True):
            out += sql_type.encode(value)
    return bytes(out)


def return_status(value: int) -> bytes:
    return struct.pack("<Bi", RETURNSTATUS, value)


def return_value_int(ordinal: int, name: str, value: int) -> bytes:
    """RETURNVALUE for an int OUTPUT parameter (the sp_prepare/sp_prepexec handle)."""
    return (
        struct.pack("<BH", RETURNVALUE, ordinal)
        + b_varchar(name)
        + b"\x01"
        + struct.pack("<IH", 0, 0x0001)
        + bytes((0x26, 4, 4))
        + struct.pack("<i", value)
    )
