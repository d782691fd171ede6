"""Column mappers end to end: the table, the rows, Debezium's expected output computed here
independently of :mod:`airflow_cdc.core.column_mappers`, and the check of every staged file.

The table ``masked`` has a key ``id`` and five character columns: ``t`` truncated to 7 characters,
``m`` masked with 5 asterisks, ``h1`` hashed (v1: Java serialization, SHA-256) with no declared
length, ``h2`` hashed (v2: UTF-8, SHA-256, a salt with a dot) and 40 characters long, so cut to 40
hex digits, and ``plain`` not mapped (the control: its values must be found in the staged files,
which proves the scan can fail).
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from airflow_cdc.core.batch import list_batches

COLUMNS = ("t", "m", "h1", "h2", "plain")
SALT1, SALT2 = "CzQMA0cB5K", "s.a.l.t"


def mapper_props(table: str) -> dict[str, str]:
    """The mapper properties for ``<table>.<column>`` (``table`` as the source qualifies it)."""
    t = re.escape(table)
    return {
        "column.truncate.to.7.chars": rf"{t}\.t",
        "column.mask.with.5.chars": rf"{t}\.m",
        f"column.mask.hash.SHA-256.with.salt.{SALT1}": rf"{t}\.h1",
        f"column.mask.hash.v2.SHA-256.with.salt.{SALT2}": rf"{t}\.H2",  # regexes ignore case
    }


def value(kind: str, column: str, tag: str) -> str | None:
    """A column value: ``ascii``, ``utf8`` (2-, 3- and 4-byte UTF-8, an emoji cut by the
    truncation), ``empty`` or ``null``; ``tag`` makes it unique."""
    return {
        "ascii": f"ascii secret {column} {tag}",
        "utf8": f"Grüße 😀 中文 {column} {tag}",
        "empty": "",
        "null": None,
    }[kind]


def row(i: int, kind: str, tag: str = "") -> dict[str, Any]:
    return {"id": i, **{c: value(kind, c, f"{i}{tag}") for c in COLUMNS}}


def java_serialized(text: str) -> bytes:
    """``ObjectOutputStream.writeObject(String)``: header, TC_STRING, length, then each UTF-16 unit
    in modified UTF-8 (surrogates as 3 bytes each, NUL as C0 80)."""
    units = text.encode("utf-16-be", "surrogatepass")
    body = b"".join(
        b"\xc0\x80" if u == 0 else chr(u).encode("utf-8", "surrogatepass")
        for (u,) in struct.iter_unpack(">H", units)
    )
    return b"\xac\xed\x00\x05\x74" + len(body).to_bytes(2, "big") + body


def expected(values: dict[str, Any] | None, h2_length: int = 40) -> dict[str, Any] | None:
    """Debezium's output for a source row (``h2_length``: the length the source knows for ``h2``,
    ``-1``: none, as Debezium's Vitess connector)."""
    if values is None:
        return None
    t, h1, h2 = values["t"], values["h1"], values["h2"]
    return {
        "id": values["id"],
        # String.substring(0, 7) in UTF-16 units; a cut surrogate pair loses its high half
        "t": None if t is None else t.encode("utf-16-be")[:14].decode("utf-16-be", errors="ignore"),
        "m": "*****",  # NULL included
        "h1": None if h1 is None else hashlib.sha256(SALT1.encode() + java_serialized(h1)).hexdigest(),
        "h2": None
        if h2 is None
        else hashlib.sha256(SALT2.encode() + h2.encode()).hexdigest()[: h2_length if h2_length > 0 else None],
        "plain": values["plain"],
    }


def staged_events(config: dict[str, Any], table: str) -> list[tuple[str, Any, Any]]:
    """(op, before, after) of every staged event of ``table``, in staging order."""
    out = []
    for batch in list_batches(config["staging.path"], config["name"]):
        for rb in batch.iter_events(table):
            out += [(r["op"], r["before"], r["after"]) for r in rb.to_pylist()]
    return out


def assert_events(
    got: list[tuple[str, Any, Any]], want: list[tuple[str, Any, Any]], h2_length: int = 40
) -> None:
    """The staged events equal the expected ones (as multisets: snapshot order is by chunk)."""

    def key(e: tuple[str, Any, Any]) -> str:
        return repr(e)

    assert sorted(map(key, got)) == sorted(
        map(key, [(op, expected(b, h2_length), expected(a, h2_length)) for op, b, a in want])
    )


def assert_no_unmapped_value(staging: Path, rows: list[dict[str, Any]]) -> None:
    """No file under ``staging`` holds an unmapped value of a mapped column: raw bytes of every
    file, and every column of every Parquet file read back; the unmapped control column's values
    are found (so the scan does see the data)."""
    secrets = {r[c] for r in rows for c in COLUMNS[:-1] if r[c]}
    controls = {r["plain"] for r in rows if r["plain"]}
    seen: set[str] = set()
    files = [p for p in staging.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files)
    for path in files:
        raw = path.read_bytes()
        leaked = [s for s in secrets if s.encode() in raw]
        assert not leaked, f"{path}: raw bytes hold unmapped {leaked}"
        if path.suffix == ".parquet":
            text = repr(pq.read_table(path).to_pylist())
            leaked = [s for s in secrets if s in text]
            assert not leaked, f"{path}: holds unmapped {leaked}"
            seen |= {c for c in controls if c in text}
    assert seen == controls, f"the control values were not all found: {controls - seen}"
