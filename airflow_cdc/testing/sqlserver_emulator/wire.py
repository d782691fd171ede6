"""TDS wire format for the emulator: packets, PRELOGIN, LOGIN7, RPC requests and response tokens.

Layouts from [MS-TDS] (2.2.3 packet header, 2.2.6 requests, 2.2.7 tokens).  Only what a
pyodbc + FreeTDS/msodbcsql client sends for login, SQL batches, RPCs and transaction requests
is implemented; anything else is rejected with :class:`WireError`.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from decimal import Context, Decimal
from typing import Any

from airflow_cdc.testing.sqlserver_emulator import types as T

# Packet types (2.2.3.1.1).
SQL_BATCH, PRE_TDS7_LOGIN, RPC, REPLY, ATTENTION, TRANSACTION_MANAGER, LOGIN7, PRELOGIN = (
    1,
    2,
    3,
    4,
    6,
    14,
    16,
    18,
)
HEADER = struct.Struct(">BBHHBB")
EOM = 0x01
DONE_FINAL, DONE_MORE, DONE_ERROR, DONE_INXACT, DONE_COUNT, DONE_ATTN = 0, 1, 2, 4, 0x10, 0x20
TDS74 = 0x74000004
TDS73B = 0x730B0003


class WireError(Exception):
    """The client sent something this emulator does not understand."""


def read_message(sock: socket.socket) -> tuple[int, bytes] | None:
    """Read one TDS message (packets up to EOM); ``None`` when the client closed the socket."""
    parts: list[bytes] = []
    kind = 0
    while True:
        head = _recv_exact(sock, HEADER.size)
        if head is None:
            return None
        kind, status, length, _spid, _pid, _win = HEADER.unpack(head)
        body = _recv_exact(sock, length - HEADER.size)
        if body is None:
            return None
        parts.append(body)
        if status & EOM:
            return kind, b"".join(parts)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def send_message(sock: socket.socket, kind: int, payload: bytes, packet_size: int) -> None:
    """Split ``payload`` into packets of at most ``packet_size`` bytes and send them."""
    room = packet_size - HEADER.size
    pieces = [payload[i : i + room] for i in range(0, len(payload), room)] or [b""]
    out = bytearray()
    for n, piece in enumerate(pieces):
        status = EOM if n == len(pieces) - 1 else 0
        out += HEADER.pack(kind, status, len(piece) + HEADER.size, 0, (n + 1) % 256, 0) + piece
    sock.sendall(out)


# -- PRELOGIN (2.2.6.5) ----------------------------------------------------------------------
ENCRYPT_OFF, ENCRYPT_ON, ENCRYPT_NOT_SUP, ENCRYPT_REQ = 0, 1, 2, 3


def parse_prelogin(data: bytes) -> dict[int, bytes]:
    """Option token -> option bytes."""
    options: dict[int, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0xFF:
        token, offset, length = struct.unpack_from(">BHH", data, pos)
        options[token] = data[offset : offset + length]
        pos += 5
    return options


def prelogin_response(encryption: int) -> bytes:
    """VERSION, ENCRYPTION, INSTOPT, THREADID, MARS; SQL Server 2019 (15.0.2000) as version."""
    opts = [
        (0, bytes((15, 0)) + struct.pack(">HH", 2000, 0)),
        (1, bytes((encryption,))),
        (2, b"\x00"),
        (3, b""),
        (4, b"\x00"),
    ]
    head_len = 5 * len(opts) + 1
    head, body = bytearray(), bytearray()
    for token, value in opts:
        head += struct.pack(">BHH", token, head_len + len(body), len(value))
        body += value
    return bytes(head) + b"\xff" + bytes(body)


# -- LOGIN7 (2.2.6.4) --------------------------------------------------------------------------
@dataclass
class Login:
    tds_version: int
    packet_size: int
    user: str
    password: str
    app_name: str
    server_name: str
    database: str
    hostname: str


def _unscramble(raw: bytes) -> str:
    return bytes(((x << 4) & 0xF0 | (x >> 4)) for x in (b ^ 0xA5 for b in raw)).decode("utf-16-le")


def parse_login7(data: bytes) -> Login:
    tds_version, packet_size = struct.unpack_from("<II", data, 4)
    fields = []
    for n in range(9):  # HostName UserName Password AppName ServerName Extension CltIntName Language Database
        off, count = struct.unpack_from("<HH", data, 36 + 4 * n)
        fields.append(data[off : off + 2 * count])
    return Login(
        tds_version=tds_version,
        packet_size=packet_size,
        hostname=fields[0].decode("utf-16-le"),
        user=fields[1].decode("utf-16-le"),
        password=_unscramble(fields[2]),
        app_name=fields[3].decode("utf-16-le"),
        server_name=fields[4].decode("utf-16-le"),
        database=fields[8].decode("utf-16-le"),
    )


# -- requests ------------------------------------------------------------------------------------
def skip_all_headers(data: bytes) -> bytes:
    """Drop the ALL_HEADERS block (2.2.5.3) TDS 7.2+ puts in front of batches and RPCs."""
    total = struct.unpack_from("<I", data)[0]
    return data[total:]


@dataclass
class RpcParam:
    name: str
    value: Any
    sql_type: str
    output: bool = False


@dataclass
class RpcCall:
    proc: str | int  # name, or the well-known ProcID (10 sp_executesql, 13 sp_prepexec ...)
    params: list[RpcParam] = field(default_factory=list)


PROC_IDS = {
    1: "sp_cursor",
    2: "sp_cursoropen",
    3: "sp_cursorprepare",
    4: "sp_cursorexecute",
    9: "sp_cursorclose",
    10: "sp_executesql",
    11: "sp_prepare",
    12: "sp_execute",
    13: "sp_prepexec",
    14: "sp_prepexecrpc",
    15: "sp_unprepare",
}


def parse_rpc(data: bytes) -> list[RpcCall]:
    """Parse an RPC request (after ALL_HEADERS): one or more calls separated by 0x80/0xFF."""
    calls: list[RpcCall] = []
    r = _Reader(data)
    while not r.done():
        n = r.u16()
        proc: str | int = PROC_IDS.get(r.u16(), "?") if n == 0xFFFF else r.text(n)
        r.u16()  # option flags
        call = RpcCall(proc)
        while not r.done() and r.peek() not in (0x80, 0xFF, 0xFE):
            name = r.text(r.u8())
            status = r.u8()
            value, sql_type = read_typed_value(r)
            call.params.append(RpcParam(name, value, sql_type, bool(status & 1)))
        calls.append(call)
        if not r.done():
            r.u8()  # batch separator
    return calls


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def peek(self) -> int:
        return self.data[self.pos]

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise WireError("RPC request truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("<H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def text(self, chars: int) -> str:
        return self.take(2 * chars).decode("utf-16-le")


def read_typed_value(r: _Reader) -> tuple[Any, str]:  # noqa: C901 - one branch per TDS type
    """Read TYPE_INFO then the value of one RPC parameter; returns (value, SQL type name)."""
    tok = r.u8()
    if tok in (T.INTN, T.BITN, T.FLTN, T.MONEYN, T.DATETIMN, T.GUIDTYPE):
        size = r.u8()  # max length: names the type of a NULL ([MS-TDS] 4.8: INTN 2 is a smallint)
        n = r.u8()
        raw = r.take(n)
        if n == 0:
            return None, _SIZED_NAMES.get((tok, size), _FIXED_NAMES[tok])
        if tok == T.INTN:
            return int.from_bytes(raw, "little", signed=n != 1), {
                1: "tinyint",
                2: "smallint",
                4: "int",
                8: "bigint",
            }[n]
        if tok == T.BITN:
            return raw != b"\x00", "bit"
        if tok == T.FLTN:
            return struct.unpack("<d" if n == 8 else "<f", raw)[0], "float" if n == 8 else "real"
        if tok == T.GUIDTYPE:
            import uuid

            return uuid.UUID(bytes_le=raw), "uniqueidentifier"
        if tok == T.MONEYN:
            units = (
                struct.unpack("<i", raw)[0]
                if n == 4
                else ((struct.unpack_from("<i", raw)[0] << 32) | struct.unpack_from("<I", raw, 4)[0])
            )
            return Decimal(units).scaleb(-4), "money" if n == 8 else "smallmoney"
        import datetime as dt

        if n == 4:
            days, minutes = struct.unpack("<HH", raw)
            return dt.datetime(1900, 1, 1) + dt.timedelta(days=days, minutes=minutes), "smalldatetime"
        days, ticks = struct.unpack("<iI", raw)
        return dt.datetime(1900, 1, 1) + dt.timedelta(
            days=days, milliseconds=round(ticks * 10 / 3)
        ), "datetime"
    if tok in (T.DECIMALN, T.NUMERICN):
        r.u8()
        prec, scale = r.u8(), r.u8()
        n = r.u8()
        if n == 0:
            return None, f"decimal({prec},{scale})"
        raw = r.take(n)
        units = int.from_bytes(raw[1:], "little") * (1 if raw[0] else -1)
        return Decimal(units).scaleb(-scale, context=Context(prec=80)), f"decimal({prec},{scale})"
    if tok in (T.BIGVARCHR, T.BIGCHAR, T.NVARCHAR, T.NCHAR, T.BIGVARBIN, T.BIGBINARY):
        maxlen = r.u16()
        if tok in (T.BIGVARCHR, T.BIGCHAR, T.NVARCHAR, T.NCHAR):
            r.take(5)
        data = _read_plp(r) if maxlen == 0xFFFF else _read_short(r)
        return _decode_string(tok, data), _VAR_NAMES[tok]
    if tok in (T.NTEXT, T.TEXT):
        r.u32()
        r.take(5)
        n = r.u32()
        text = None if n == 0xFFFFFFFF else r.take(n)
        return _decode_string(T.NVARCHAR if tok == T.NTEXT else T.BIGVARCHR, text), _VAR_NAMES[tok]
    if tok in (T.DATEN, T.TIMEN, T.DATETIME2N, T.DATETIMEOFFSETN):
        return _read_clock(r, tok)
    raise WireError(f"unsupported RPC parameter type 0x{tok:02x}")


_FIXED_NAMES = {
    T.INTN: "int",
    T.BITN: "bit",
    T.FLTN: "float",
    T.MONEYN: "money",
    T.DATETIMN: "datetime",
    T.GUIDTYPE: "uniqueidentifier",
}
_SIZED_NAMES = {
    (T.INTN, 1): "tinyint",
    (T.INTN, 2): "smallint",
    (T.INTN, 8): "bigint",
    (T.FLTN, 4): "real",
    (T.MONEYN, 4): "smallmoney",
    (T.DATETIMN, 4): "smalldatetime",
}
_VAR_NAMES = {
    T.BIGVARCHR: "varchar",
    T.BIGCHAR: "char",
    T.NVARCHAR: "nvarchar",
    T.NCHAR: "nchar",
    T.BIGVARBIN: "varbinary",
    T.BIGBINARY: "binary",
    T.NTEXT: "ntext",
    T.TEXT: "text",
}


def _read_short(r: _Reader) -> bytes | None:
    n = r.u16()
    return None if n == 0xFFFF else r.take(n)


_PLP_UNKNOWN = 0xFFFFFFFFFFFFFFFE  # a streamed PLP: the total is not sent


def _read_plp(r: _Reader) -> bytes | None:
    """PLP_BODY ([MS-TDS] 2.2.5.2.3): total length (or PLP_UNKNOWN), chunks, a zero terminator;
    chunks that disagree with a known total are a malformed stream (tedious's parser rejects them too)."""
    total = struct.unpack("<Q", r.take(8))[0]
    if total == T.PLP_NULL:
        return None
    out = bytearray()
    while (n := r.u32()) != 0:
        out += r.take(n)
    if total != _PLP_UNKNOWN and len(out) != total:
        raise WireError(f"PLP parameter's chunks hold {len(out)} bytes, expected {total}")
    return bytes(out)


def _decode_string(tok: int, raw: bytes | None) -> Any:
    if raw is None:
        return None
    if tok in (T.NVARCHAR, T.NCHAR):
        return raw.decode("utf-16-le")
    if tok in (T.BIGVARCHR, T.BIGCHAR):
        return raw.decode(T.VARCHAR_CODEC)
    return raw


_MAX_DAY = 3652058  # 9999-12-31


def _day(raw: bytes) -> Any:
    """Days since 0001-01-01; SQL Server rejects anything past 9999-12-31 as a malformed stream."""
    import datetime as dt

    days = int.from_bytes(raw, "little")
    if days > _MAX_DAY:
        raise WireError(f"date parameter of {days} days since 0001-01-01 is out of range (0x{raw.hex()})")
    return dt.date(1, 1, 1) + dt.timedelta(days=days)


def _read_clock(r: _Reader, tok: int) -> tuple[Any, str]:
    import datetime as dt

    scale = 0 if tok == T.DATEN else r.u8()
    n = r.u8()
    name = {T.DATEN: "date", T.TIMEN: "time", T.DATETIME2N: "datetime2", T.DATETIMEOFFSETN: "datetimeoffset"}[
        tok
    ]
    if n == 0:
        return None, name
    raw = r.take(n)
    if tok == T.DATEN:
        return _day(raw), "date"
    tsize = n - {T.TIMEN: 0, T.DATETIME2N: 3, T.DATETIMEOFFSETN: 5}[tok]
    ticks7 = int.from_bytes(raw[:tsize], "little") * 10 ** (7 - scale)
    clock = dt.timedelta(microseconds=ticks7 // 10)
    if tok == T.TIMEN:
        return (dt.datetime.min + clock).time(), f"time({scale})"
    day = dt.datetime.combine(_day(raw[tsize : tsize + 3]), dt.time()) + clock
    if tok == T.DATETIME2N:
        return day, f"datetime2({scale})"
    offset = struct.unpack("<h", raw[tsize + 3 : tsize + 5])[0]
    tz = dt.timezone(dt.timedelta(minutes=offset))
    return day.replace(tzinfo=dt.UTC).astimezone(tz), f"datetimeoffset({scale})"
