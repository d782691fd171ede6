"""MySQL / MariaDB character sets -> Python codecs, for decoding stored bytes exactly.

Strings arrive as the bytes stored in the column's character set: from the binlog, from the
snapshot (read ``CAST(... AS BINARY)`` so both paths decode alike) and as ENUM/SET labels in a
table map.  MySQL's names do not all match Python's, and some differ in content: MySQL's
``latin1`` is Windows-1252 whose five unassigned bytes map to the C1 controls of the same value
(``strings/ctype-latin1.cc``), and ``ucs2``/``utf16``/``utf32`` are big-endian without a BOM.
Character sets Python has no codec for (``dec8``, ``hp8``, ``keybcs2``, ``swe7``, ``armscii8``,
``geostd8``: all single-byte) are decoded with the server's own table of their 256 bytes, read
once per process by :func:`learn` (a charset never learned decodes as UTF-8 with replacements).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable
from typing import Any

from airflow_cdc.sources.mysql import client

#: MySQL character set -> Python codec (None: binary, no decoding)
PY_CHARSETS: dict[str, str | None] = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "latin1": "cp1252",
    "ascii": "ascii",
    "binary": None,
    "latin2": "iso8859_2",
    "latin5": "iso8859_9",
    "latin7": "iso8859_13",
    "greek": "iso8859_7",
    "hebrew": "iso8859_8",
    "koi8r": "koi8_r",
    "koi8u": "koi8_u",
    "macce": "mac_latin2",
    "macroman": "mac_roman",
    "tis620": "tis_620",
    "cp850": "cp850",
    "cp852": "cp852",
    "cp866": "cp866",
    "cp1250": "cp1250",
    "cp1251": "cp1251",
    "cp1256": "cp1256",
    "cp1257": "cp1257",
    "cp932": "cp932",
    "sjis": "shift_jis",
    "ujis": "euc_jp",
    "eucjpms": "euc_jp",
    "euckr": "euc_kr",
    "gb2312": "gb2312",
    "gbk": "gbk",
    "gb18030": "gb18030",
    "big5": "big5",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
}
_LATIN1_ERRORS = "airflow-cdc-mysql-latin1"


def _latin1_undefined(e: UnicodeError) -> tuple[str, int]:
    """cp1252's unassigned bytes (0x81, 0x8D, 0x8F, 0x90, 0x9D) are U+0081... in MySQL's latin1."""
    assert isinstance(e, UnicodeDecodeError)
    return "".join(chr(b) for b in e.object[e.start : e.end]), e.end


codecs.register_error(_LATIN1_ERRORS, _latin1_undefined)


#: single-byte character sets without a Python codec: byte -> character, as the server converts it
_SERVER_TABLES: dict[str, str] = {}


def learn(conn: Any, charsets: Iterable[str | None]) -> None:
    """Read the server's byte table of each character set Python cannot decode (once per process).

    One query per such character set; names that are not plain identifiers are skipped.
    """
    for cs in {c for c in charsets if c}:
        if cs in PY_CHARSETS or cs in _SERVER_TABLES or not re.fullmatch(r"[a-z0-9_]+", cs):
            continue
        try:
            codecs.lookup(cs)
            continue
        except LookupError:
            pass
        exprs = ", ".join(f"CONVERT(CONVERT(UNHEX('{b:02X}') USING {cs}) USING utf8mb4)" for b in range(256))
        row = client.query(conn, "SELECT " + exprs)[0]
        chars = [(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v or "")) for v in row]
        _SERVER_TABLES[cs] = "".join(c[:1] or "\ufffd" for c in chars)


def python_codec(charset: str | None) -> str | None:
    """The Python codec of a MySQL character set (utf8mb4 when unknown; None for binary)."""
    return PY_CHARSETS.get(charset or "utf8mb4", charset)


def decode(value: bytes, charset: str | None) -> str:
    """Stored bytes as text; bytes the character set cannot decode become U+FFFD."""
    table = _SERVER_TABLES.get(charset or "")
    if table is not None:
        return "".join([table[b] for b in value])
    py = python_codec(charset) or "utf-8"
    if py == "cp1252":
        return value.decode(py, _LATIN1_ERRORS)
    try:
        return value.decode(py, "replace")
    except LookupError:  # a character set Python has no codec for
        return value.decode("utf-8", "replace")
