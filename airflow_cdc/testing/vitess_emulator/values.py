"""Column types and values the way vttablet's vstreamer puts them on the wire.

* Column types: MySQL protocol type + flags + collation -> ``query.Type`` (the rule of Vitess's
  ``sqltypes.MySQLToType`` and ``modifyType``: unsigned integers become ``UINT*``, the BINARY flag
  (128: the binary character set, and a ``_bin`` collation of a character column) turns
  ``TEXT``/``VARCHAR``/``CHAR`` into ``BLOB``/``VARBINARY``/``BINARY``, the ENUM/SET flags on a
  ``CHAR`` make ``ENUM``/``SET``).
* Values: MySQL text-protocol bytes.  Binlog row images arrive as the neutral Python values of
  :mod:`airflow_cdc.sources.mysql.rowcodec` and are turned back into text here, as vstreamer does
  when it parses a row image (FLOAT/DOUBLE in Go's ``%E`` shortest form, ``1.5E+00``; temporal
  values with the column's fractional digits; ENUM/SET as their labels; BIT as big-endian bytes;
  BINARY(n) padded with zero bytes to n).  Copy-phase rows come from a SELECT and are already text.
* ``query.Row``: the values concatenated, their lengths alongside, -1 for NULL.
* The ``hash`` vindex: the keyspace id of a BIGINT key is its 8 big-endian bytes encrypted with
  3DES under an all-zero key.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable, Sequence
from typing import Any

from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.vitess.proto import query_pb2 as q

BINARY_COLLATION = 63
_ENUM_FLAG, _SET_FLAG, _UNSIGNED_FLAG, _BINARY_FLAG = 256, 2048, 32, 128
_BY_PROTOCOL = {
    0: q.DECIMAL, 1: q.INT8, 2: q.INT16, 3: q.INT32, 4: q.FLOAT32, 5: q.FLOAT64, 6: q.NULL_TYPE,
    7: q.TIMESTAMP, 8: q.INT64, 9: q.INT24, 10: q.DATE, 11: q.TIME, 12: q.DATETIME, 13: q.YEAR,
    14: q.DATE, 15: q.VARCHAR, 16: q.BIT, 17: q.TIMESTAMP, 18: q.DATETIME, 19: q.TIME, 245: q.JSON,
    246: q.DECIMAL, 247: q.ENUM, 248: q.SET, 249: q.TEXT, 250: q.TEXT, 251: q.TEXT, 252: q.TEXT,
    253: q.VARCHAR, 254: q.CHAR, 255: q.GEOMETRY,
}  # fmt: skip
_UNSIGNED = {q.INT8: q.UINT8, q.INT16: q.UINT16, q.INT24: q.UINT24, q.INT32: q.UINT32, q.INT64: q.UINT64}
_BINARY = {q.TEXT: q.BLOB, q.VARCHAR: q.VARBINARY, q.CHAR: q.BINARY}
_EPOCH = dt.datetime(1970, 1, 1)


def vitess_type(protocol_type: int, flags: int, collation: int) -> q.Type:
    """The ``query.Type`` of a column described by the MySQL protocol (type code, flags, collation id)."""
    t = _BY_PROTOCOL.get(protocol_type, q.VARBINARY)
    if flags & _UNSIGNED_FLAG and t in _UNSIGNED:
        t = _UNSIGNED[t]
    if t == q.CHAR and flags & _ENUM_FLAG:
        return q.ENUM
    if t == q.CHAR and flags & _SET_FLAG:
        return q.SET
    if flags & _BINARY_FLAG and t in _BINARY:
        # the BINARY flag, which a binary collation of a character column (utf8mb4_bin) sets too:
        # such a VARCHAR is VARBINARY on the wire, its column_type still varchar(n)
        t = _BINARY[t]
    return t


def go_float(value: float, bits: int) -> bytes:
    """Go's ``strconv.FormatFloat(v, 'E', -1, bits)``: the shortest digits that read back as the
    same float32/float64, in ``d.dddE±dd`` form."""
    if value != value or value in (float("inf"), float("-inf")):
        return {"nan": b"NaN", "inf": b"+Inf", "-inf": b"-Inf"}[str(value)]
    fmt = "<f" if bits == 32 else "<d"
    target = struct.pack(fmt, value)
    for digits in range(1, 18):
        text = f"{value:.{digits - 1}E}"
        if struct.pack(fmt, float(text)) == target:
            break
    mantissa, exponent = text.split("E")
    sign, number = exponent[0], exponent[1:].lstrip("0").rjust(2, "0")
    return f"{mantissa}E{sign}{number}".encode()


def _fraction(micros: int, fsp: int) -> str:
    return f".{micros:06d}"[: fsp + 1] if fsp else ""


def _datetime_text(stamp: int, fsp: int) -> bytes:
    whole, micros = divmod(stamp, 1_000_000)
    text = f"{whole:014d}"
    date, clock = f"{text[:4]}-{text[4:6]}-{text[6:8]}", f"{text[8:10]}:{text[10:12]}:{text[12:14]}"
    return f"{date} {clock}{_fraction(micros, fsp)}".encode()


def _timestamp_text(micros: int, fsp: int) -> bytes:
    if micros == 0:
        return f"0000-00-00 00:00:00{_fraction(0, fsp)}".encode()
    when = _EPOCH + dt.timedelta(microseconds=micros)
    return (when.strftime("%Y-%m-%d %H:%M:%S") + _fraction(when.microsecond, fsp)).encode()


def _time_text(micros: int, fsp: int) -> bytes:
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    seconds, frac = divmod(micros, 1_000_000)
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{sign}{clock}{_fraction(frac, fsp)}".encode()


def _date_text(packed: int) -> bytes:
    return f"{packed >> 9:04d}-{packed >> 5 & 15:02d}-{packed & 31:02d}".encode()


def _labels(values: Sequence[str], mask: int) -> bytes:
    return ",".join(v for i, v in enumerate(values) if mask >> i & 1).encode()


def text_converter(
    binlog_type: int, meta: int, enum_values: Sequence[str] = (), binary: bool = False
) -> Callable[[Any], bytes]:
    """A function from a rowcodec neutral value (not None) of one column to its text bytes.

    :param enum_values: the labels of an ENUM/SET column (from the table map's full metadata).
    :param binary: a BINARY(n) column (``binlog_type`` STRING, binary collation): pad to ``meta`` bytes.
    """
    if binlog_type in rc.INT_TYPES:
        return lambda v: str(v).encode()
    if binlog_type == rc.T_FLOAT:
        return lambda v: go_float(v, 32)
    if binlog_type == rc.T_DOUBLE:
        return lambda v: go_float(v, 64)
    if binlog_type in (rc.T_NEWDECIMAL, rc.T_DECIMAL):
        return lambda v: str(v).encode()
    if binlog_type == rc.T_YEAR:
        return lambda v: f"{v:04d}".encode()
    if binlog_type in (rc.T_DATE, rc.T_NEWDATE):
        return _date_text
    if binlog_type in (rc.T_DATETIME2, rc.T_DATETIME):
        fsp = meta if binlog_type == rc.T_DATETIME2 else 0
        return lambda v: _datetime_text(v, fsp)
    if binlog_type in (rc.T_TIMESTAMP2, rc.T_TIMESTAMP):
        fsp = meta if binlog_type == rc.T_TIMESTAMP2 else 0
        return lambda v: _timestamp_text(v, fsp)
    if binlog_type in (rc.T_TIME2, rc.T_TIME):
        fsp = meta if binlog_type == rc.T_TIME2 else 0
        return lambda v: _time_text(v, fsp)
    if binlog_type == rc.T_ENUM:
        return lambda v: enum_values[v - 1].encode() if 0 < v <= len(enum_values) else b""
    if binlog_type == rc.T_SET:
        return lambda v: _labels(enum_values, v)
    if binlog_type == rc.T_BIT:
        size = (meta + 7) // 8
        return lambda v: v.to_bytes(size, "big")
    if binary and binlog_type == rc.T_STRING:
        return lambda v: bytes(v).ljust(meta, b"\x00")
    return bytes


def make_row(values: Sequence[bytes | None]) -> q.Row:
    """A ``query.Row`` of text values (None = NULL, length -1)."""
    return q.Row(
        lengths=[-1 if v is None else len(v) for v in values],
        values=b"".join(v for v in values if v is not None),
    )


def row_values(row: q.Row) -> list[bytes | None]:
    """The values of a ``query.Row`` (None for NULL)."""
    out: list[bytes | None] = []
    offset = 0
    for length in row.lengths:
        if length < 0:
            out.append(None)
            continue
        out.append(row.values[offset : offset + length])
        offset += length
    return out


def _des() -> Any:
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    return Cipher(TripleDES(b"\x00" * 24), modes.ECB())


def keyspace_id(key: int) -> bytes:
    """The keyspace id the ``hash`` vindex gives an integer key (its uint64 bytes, 3DES, zero key)."""
    encryptor = _des().encryptor()
    return encryptor.update(struct.pack(">Q", key & 0xFFFF_FFFF_FFFF_FFFF)) + encryptor.finalize()


def key_range(shard: str) -> tuple[bytes, bytes]:
    """``[start, end)`` keyspace ids of a shard name (``-``/``0`` is everything; an empty end is
    unbounded and returned as ``b""``)."""
    if shard in ("-", "0", ""):
        return b"", b""
    start, _, end = shard.partition("-")
    return bytes.fromhex(start), bytes.fromhex(end)


def in_range(kid: bytes, shard: str) -> bool:
    start, end = key_range(shard)
    return kid >= start and (not end or kid < end)
