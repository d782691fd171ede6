"""The columnar hand-over (``_binlogcols.c`` + :mod:`columnar`) stages exactly what the pure-Python
readers stage.

Rows events over a table of every captured MySQL type (each codec tag's fast buffers, and the
Python-value fallback for the others), in several handling modes, with NULLs, partial row images
(MINIMAL/NOBLOB present bitmaps), updates that keep and that change the key, and pieces ending in
the middle of a rows event, are written once through :class:`ColumnarBuffer` and once through
``AIRFLOW_CDC_MYSQL_ROWS=python`` decoding plus the stream's event tuples; the two Parquet parts
must hold the same rows, value by value.
"""

from __future__ import annotations

import random
import struct
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.core.table_sink import TableSink
from airflow_cdc.sources.mysql import columnar as col
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.schema import ColumnDef, TableDef
from airflow_cdc.sources.mysql.stream import WindowReader, expand_events
from airflow_cdc.sources.mysql.tables import TableState
from airflow_cdc.sources.mysql.types import Modes, column_codec
from tests.unit.sources.mysql.test_binlogrows import _decimal

pytestmark = pytest.mark.skipif(col._Columns is None, reason="_binlogrows extension not built")


@pytest.fixture(autouse=True)
def _compiled_enabled(monkeypatch):
    monkeypatch.delenv(rc.ROWS_ENV, raising=False)


L = rc.ColumnLayout
#: (column definition, binlog layout): the bench's seven types first, then every other kind
TABLE = [
    (ColumnDef("id", "bigint", "bigint(20)", nullable=False), L(rc.T_LONGLONG, 0)),
    (ColumnDef("qty", "int", "int(11)"), L(rc.T_LONG, 0)),
    (ColumnDef("price", "decimal", "decimal(12,2)", precision=12, scale=2), L(rc.T_NEWDECIMAL, 12 << 8 | 2)),
    (ColumnDef("name", "varchar", "varchar(64)", charset="utf8mb4"), L(rc.T_VARCHAR, 256)),
    (ColumnDef("at", "datetime", "datetime(6)", fsp=6), L(rc.T_DATETIME2, 6)),
    (ColumnDef("active", "tinyint", "tinyint(1)"), L(rc.T_TINY, 0)),
    (ColumnDef("doc", "longtext", "longtext", charset="utf8mb4"), L(rc.T_BLOB, 4)),
    (ColumnDef("u64", "bigint", "bigint(20) unsigned"), L(rc.T_LONGLONG, 0, True)),
    (ColumnDef("u32", "int", "int(10) unsigned"), L(rc.T_LONG, 0, True)),
    (ColumnDef("s16", "smallint", "smallint(6)"), L(rc.T_SHORT, 0)),
    (ColumnDef("m24", "mediumint", "mediumint(8) unsigned"), L(rc.T_INT24, 0, True)),
    (ColumnDef("i24", "mediumint", "mediumint(9)"), L(rc.T_INT24, 0)),
    (ColumnDef("t8", "tinyint", "tinyint(4)"), L(rc.T_TINY, 0)),
    (ColumnDef("flag", "tinyint", "tinyint(1)", boolean=True), L(rc.T_TINY, 0)),
    (ColumnDef("b1", "bit", "bit(1)", precision=1), L(rc.T_BIT, 1)),
    (ColumnDef("b10", "bit", "bit(10)", precision=10), L(rc.T_BIT, 10)),
    (ColumnDef("f", "float", "float"), L(rc.T_FLOAT, 4)),
    (ColumnDef("fmd", "float", "float(7,2)"), L(rc.T_FLOAT, 4)),
    (ColumnDef("d", "double", "double"), L(rc.T_DOUBLE, 8)),
    (ColumnDef("big", "decimal", "decimal(38,10)", precision=38, scale=10), L(rc.T_NEWDECIMAL, 38 << 8 | 10)),
    (ColumnDef("whole", "decimal", "decimal(5,0)", precision=5, scale=0), L(rc.T_NEWDECIMAL, 5 << 8)),
    (
        ColumnDef("frac", "decimal", "decimal(10,10)", precision=10, scale=10),
        L(rc.T_NEWDECIMAL, 10 << 8 | 10),
    ),
    (
        ColumnDef("huge", "decimal", "decimal(65,30)", precision=65, scale=30),
        L(rc.T_NEWDECIMAL, 65 << 8 | 30),
    ),
    (ColumnDef("dt0", "datetime", "datetime", nullable=False, fsp=0), L(rc.T_DATETIME2, 0)),
    (ColumnDef("dt3", "datetime", "datetime(3)", fsp=3), L(rc.T_DATETIME2, 3)),
    (ColumnDef("day", "date", "date"), L(rc.T_DATE, 0)),
    (ColumnDef("ts", "timestamp", "timestamp(3)", fsp=3), L(rc.T_TIMESTAMP2, 3)),
    (ColumnDef("tm", "time", "time(6)", fsp=6), L(rc.T_TIME2, 6)),
    (ColumnDef("yr", "year", "year(4)"), L(rc.T_YEAR, 0)),
    (ColumnDef("e", "enum", "enum('a','b','c')"), L(rc.T_ENUM, 1)),
    (ColumnDef("code", "char", "char(10)", charset="latin1"), L(rc.T_STRING, 10)),
    (ColumnDef("txt", "text", "text", charset="utf8mb4"), L(rc.T_BLOB, 2)),
    (ColumnDef("raw", "blob", "blob"), L(rc.T_BLOB, 2)),
    (ColumnDef("vb", "varbinary", "varbinary(300)"), L(rc.T_VARCHAR, 300)),
    (ColumnDef("js", "json", "json"), L(rc.T_JSON, 4)),  # MariaDB / raw JSON text
    (ColumnDef("st", "set", "set('x','y','z')"), L(rc.T_SET, 1)),
    (ColumnDef("vs", "varchar", "varchar(20)", charset="utf8"), L(rc.T_VAR_STRING, 60)),
    # the declared type's codec reads another binlog type: Python values
    (ColumnDef("olddt", "datetime", "datetime", fsp=0), L(rc.T_DATETIME, 0)),
    (ColumnDef("skew", "decimal", "decimal(12,2)", precision=12, scale=2), L(rc.T_NEWDECIMAL, 10 << 8 | 2)),
    (ColumnDef("yint", "int", "int(11)"), L(rc.T_YEAR, 0)),
]
FAST = {"id", "qty", "price", "name", "at", "active", "doc"}  # the bench's columns
MODES = [
    Modes(),
    Modes(
        decimal="string", time_precision="connect", bigint_unsigned="precise", tinyint_one_boolean=True,
        time_adjuster=False,
    ),
    Modes(decimal="double", time_precision="adaptive", binary="base64"),
]  # fmt: skip


def _state(modes: Modes, key: list[int], select: list[int] | None = None) -> TableState:
    defs = [d for d, _ in TABLE]
    select = list(range(len(TABLE))) if select is None else select
    codecs = [column_codec(defs[i], modes) for i in select]
    tdef = TableDef("db", "t", defs, [defs[k].name for k in key])
    return TableState("db.t", tdef, [lay for _, lay in TABLE], codecs, select, key, "sig", {"version": "x"})


def _text(rnd: random.Random, limit: int) -> bytes:
    kind = rnd.random()
    if kind < 0.4:
        return "".join(rnd.choice("aé€😀 z") for _ in range(rnd.randrange(limit // 4 + 1))).encode()
    if kind < 0.5:
        return b"\xff\xfe broken"
    return rnd.randbytes(rnd.randrange(limit + 1)) if kind < 0.6 else b""


def _value(rnd: random.Random, c: ColumnDef, lay: L) -> bytes:
    t, m = lay.type, lay.meta
    if t == rc.T_NEWDECIMAL:
        return _decimal(rnd, m)
    if t == rc.T_FLOAT:
        return struct.pack("<f", rnd.choice([0.0, -0.0, 1.5, -3.25e38, rnd.uniform(-1e6, 1e6)]))
    if t == rc.T_DOUBLE:
        return struct.pack("<d", rnd.choice([0.0, -0.0, 1e308, rnd.uniform(-1e9, 1e9)]))
    if t in rc.INT_TYPES:
        n = rc.INT_TYPES[t]
        return rnd.choice([b"\0" * n, b"\xff" * n, b"\x01" + b"\0" * (n - 1), rnd.randbytes(n)])
    if t == rc.T_BIT:
        return rnd.randbytes((m + 7) // 8) if m > 1 else bytes([rnd.randrange(2)])
    if t == rc.T_DATETIME2:
        size = 5 + (m + 1) // 2
        if rnd.random() < 0.3:  # zero date, or a real one (two-digit years included)
            if rnd.random() < 0.3:
                return b"\x80" + b"\0" * (size - 1)
            y, mo, d = (
                rnd.choice([rnd.randrange(1, 9999), rnd.randrange(100)]),
                rnd.randrange(13),
                rnd.randrange(32),
            )
            packed = ((y * 13 + mo) << 5 | d) << 17 | rnd.randrange(24) << 12 | rnd.randrange(60) << 6
            return (packed + 0x8000000000).to_bytes(5, "big") + rnd.randbytes(size - 5)
        return rnd.randbytes(size)
    if t in (rc.T_TIMESTAMP2, rc.T_TIME2):
        return rnd.randbytes({rc.T_TIMESTAMP2: 4, rc.T_TIME2: 3}[t] + (m + 1) // 2)
    if t == rc.T_DATE:
        return rnd.randbytes(3)
    if t == rc.T_YEAR:
        return rnd.randbytes(1)
    if t == rc.T_ENUM:
        return bytes([rnd.randrange(5)])
    if t == rc.T_SET:
        return bytes([rnd.randrange(8)])
    if t == rc.T_DATETIME:
        return rnd.randbytes(8)
    if t in (rc.T_VARCHAR, rc.T_STRING, rc.T_VAR_STRING):
        data = _text(rnd, min(m, 255))[: min(m, 255)]
        return len(data).to_bytes(1 if m < 256 else 2, "little") + data
    data = _text(rnd, 300)
    return len(data).to_bytes(m, "little") + data


def _image(rnd: random.Random, present: list[bool], null_rate: float, keep: dict | None = None) -> bytes:
    idx = [i for i, p in enumerate(present) if p]
    nulls, body = 0, b""
    for bit, i in enumerate(idx):
        if keep is not None and i in keep:
            body += keep[i]
        elif rnd.random() < null_rate and not (keep is not None and i == 0):
            nulls |= 1 << bit
        else:
            body += _value(rnd, *TABLE[i])
    return nulls.to_bytes((len(idx) + 7) // 8, "little") + body


def _events(
    rnd: random.Random, op: str, rows: int, key: list[int]
) -> tuple[bytes, list[bool], list[bool] | None]:
    n = len(TABLE)
    present = [True] * n if op != "c" else [i % 5 != 3 for i in range(n)]  # MINIMAL-like inserts
    after = [i % 3 != 1 or i in key for i in range(n)] if op == "u" else None
    body = b"HDR"
    for k in range(rows):
        if op != "u":
            body += _image(rnd, present, 0.15)
            continue
        keys = {i: _value(rnd, *TABLE[i]) for i in key}
        body += _image(rnd, present, 0.15, keys)
        body += _image(rnd, after, 0.15, keys if k % 2 else None)  # half keep their key
    return body, present, after


def _sink(tmp_path, name: str, state: TableState, piece_rows: int) -> TableSink:
    return TableSink(
        str(tmp_path / name), name, state.codecs, state.select, state.source_layout("false"), "stream",
        state.signature, piece_rows, expand=expand_events, key_columns=state.key_columns,
    )  # fmt: skip


def _rows(path) -> list[dict]:
    table = pq.read_table(path).drop_columns(["ts_ms", "ts_us", "ts_ns"])  # the write time
    return table.to_pylist()


def _write_both(tmp_path, monkeypatch, state_of, batches, piece_rows):
    """Stage ``batches`` (op, body, present, after, pos, info) through both routes; the parts' rows."""
    columnar_state, sink = state_of(), None
    sink = _sink(tmp_path, "columnar.parquet", columnar_state, piece_rows)
    columns = col.new_columns(columnar_state)
    assert columns is not None
    buffer = col.ColumnarBuffer(columnar_state, columns, lambda: sink, piece_rows)
    for op, body, present, after, pos, info in batches:
        assert buffer.add(body, 3, op, present, after, pos, info) is not None
    buffer.flush()
    sink.close()
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    python_state = state_of()
    assert col.new_columns(python_state) is None
    python = _sink(tmp_path, "python.parquet", python_state, piece_rows)
    reader = SimpleNamespace(_sink=lambda state: python)
    for op, body, present, after, pos, info in batches:
        images = python_state.decode(body, 3, op, present, after, pos)
        WindowReader._add_all(reader, python_state, op, images, info, pos)  # type: ignore[arg-type]
    python.close()
    monkeypatch.delenv(rc.ROWS_ENV)
    return _rows(tmp_path / "columnar.parquet"), _rows(tmp_path / "python.parquet")


@pytest.mark.parametrize("modes", range(len(MODES)))
@pytest.mark.parametrize("key", [[0], [0, 3], [4, 2]])
def test_columnar_pieces_equal_the_python_readers(tmp_path, monkeypatch, modes, key):
    rnd = random.Random(modes * 10 + len(key) + key[-1])
    infos = [
        (
            1700000000000 + k,
            7,
            f"0-1-{k}",
            "binlog.000003",
            3 << 32 | 3,
            12 if k % 2 else None,
            "q" if k else None,
        )
        for k in range(3)
    ]
    batches = []
    for k, op in enumerate(["c", "u", "d", "u", "c"]):
        body, present, after = _events(rnd, op, 40, key)
        batches.append((op, body, present, after, 1000 + k * 100, infos[k % 3]))
    got, want = _write_both(tmp_path, monkeypatch, lambda: _state(MODES[modes], key), batches, 57)
    assert len(got) == len(want) > 200
    for a, b in zip(got, want, strict=True):
        assert a == b
    ops = [r["op"] for r in got]
    assert ops.count("d") > ops.count("c") - 80 > 0 and ops.count("u") >= 30  # key changes: d + c


def test_bench_columns_take_the_fast_buffers():
    state = _state(Modes(), [0])
    modes = dict(zip((d.name for d, _ in TABLE), col.ColumnarBuffer(state, None, list, 1).modes, strict=True))
    assert {name for name, m in modes.items() if m[0] != col.M_OBJECT} >= FAST
    objects = ("ts", "e", "raw", "huge", "olddt", "skew", "yint", "st", "code")
    assert {modes[name] for name in objects} == {(col.M_OBJECT,)}
    assert modes["vs"] == (col.M_BYTES,)
    assert modes["at"] == (col.M_DATETIME, 1, None, True) and modes["dt0"] == (col.M_DATETIME, 1000, 0, True)


def test_selected_columns_only(tmp_path, monkeypatch):
    rnd = random.Random(5)
    select = [0, 2, 4, 16, 25, 30]
    batches = []
    for k, op in enumerate(["c", "u", "d"]):
        body, present, after = _events(rnd, op, 30, [0])
        batches.append((op, body, present, after, 50 + k, (1, 2, None, "f", 1, None, None)))
    got, want = _write_both(tmp_path, monkeypatch, lambda: _state(Modes(), [0], select), batches, 1000)
    assert got == want and len(got) >= 90


def test_malformed_images_are_protocol_errors(tmp_path):
    state = _state(Modes(), [0])
    buffer = col.ColumnarBuffer(state, col.new_columns(state), list, 100)
    body, present, _ = _events(random.Random(1), "d", 3, [0])
    for cut in (4, len(body) // 2, len(body) - 1):
        with pytest.raises(ProtocolError, match="db.t.*at 77"):
            col.ColumnarBuffer(state, col.new_columns(state), list, 100).add(
                body[:cut], 3, "d", present, None, 77, (0, 0, None, "f", 1, None, None)
            )
    rnd = random.Random(2)
    for _ in range(500):  # garbage: events or ValueError, never a crash
        garbage = b"HDR" + rnd.randbytes(rnd.randrange(400))
        try:
            buffer.add(garbage, 3, rnd.choice("cud"), present, None, 1, (0, 0, None, "f", 1, None, None))
        except ProtocolError:
            buffer = col.ColumnarBuffer(state, col.new_columns(state), list, 100)


def test_no_compiled_buffers_when_disabled(monkeypatch):
    state = _state(Modes(), [0])
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    assert col.new_columns(state) is None
    monkeypatch.delenv(rc.ROWS_ENV)
    assert col.new_columns(state) is not None
    unknown = TableState(
        "db.t", state.tdef, [L(99, 0)] + state.layout[1:], state.codecs, state.select, [0], "s", {}
    )
    assert col.new_columns(unknown) is None
