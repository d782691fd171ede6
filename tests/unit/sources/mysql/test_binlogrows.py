"""The compiled row-image decoder (``_binlogrows.c``) yields exactly the generated Python readers' values.

Row images are generated over every column type :mod:`rowcodec` handles: random bytes for the
fixed-size types (so signed extremes, zero and garbage dates, negative TIME and every fsp are hit),
valid DECIMAL groups of many precisions and signs, strings/blobs of every length-prefix size up to
their maximum, NULLs, partial row images (MINIMAL/NOBLOB present bitmaps) and UPDATE pairs whose
before and after images have different present columns.
"""

from __future__ import annotations

import random
import struct

import pytest

from airflow_cdc.core.errors import ProtocolError, SchemaError
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.flavour import _mysql_json
from airflow_cdc.sources.mysql.schema import TableDef
from airflow_cdc.sources.mysql.tables import TableState

pytestmark = pytest.mark.skipif(rc._Layout is None, reason="_binlogrows extension not built")


@pytest.fixture(autouse=True)
def _compiled_enabled(monkeypatch):
    monkeypatch.delenv(rc.ROWS_ENV, raising=False)  # a suite run with the Python path set still compares


DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
FIXED = {
    rc.T_TINY: 1,
    rc.T_SHORT: 2,
    rc.T_INT24: 3,
    rc.T_LONG: 4,
    rc.T_LONGLONG: 8,
    rc.T_FLOAT: 4,
    rc.T_DOUBLE: 8,
    rc.T_DATE: 3,
    rc.T_TIME: 3,
    rc.T_TIMESTAMP: 4,
    rc.T_DATETIME: 8,
    rc.T_YEAR: 1,
}


def _columns() -> list[rc.ColumnLayout]:
    cols = []
    for t in (rc.T_TINY, rc.T_SHORT, rc.T_INT24, rc.T_LONG, rc.T_LONGLONG):
        cols += [rc.ColumnLayout(t, 0, False), rc.ColumnLayout(t, 0, True)]
    cols += [
        rc.ColumnLayout(t, 0)
        for t in (rc.T_FLOAT, rc.T_DOUBLE, rc.T_DATE, rc.T_TIME, rc.T_TIMESTAMP, rc.T_DATETIME, rc.T_YEAR)
    ]
    for fsp in range(7):
        cols += [rc.ColumnLayout(t, fsp) for t in (rc.T_DATETIME2, rc.T_TIMESTAMP2, rc.T_TIME2)]
    for precision, scale in (
        (1, 0),
        (5, 2),
        (9, 0),
        (10, 10),
        (12, 2),
        (18, 9),
        (19, 4),
        (38, 10),
        (65, 30),
        (65, 0),
        (30, 30),
        (14, 4),
    ):
        cols.append(rc.ColumnLayout(rc.T_NEWDECIMAL, precision << 8 | scale))
    cols += [rc.ColumnLayout(rc.T_ENUM, 1), rc.ColumnLayout(rc.T_ENUM, 2)]
    cols += [rc.ColumnLayout(rc.T_SET, n) for n in (1, 2, 3, 4, 8)]
    cols += [rc.ColumnLayout(rc.T_BIT, bits) for bits in (1, 7, 8, 9, 33, 64)]
    cols += [
        rc.ColumnLayout(t, m)
        for t in (rc.T_VARCHAR, rc.T_VAR_STRING, rc.T_STRING)
        for m in (1, 255, 256, 1020)
    ]
    cols += [rc.ColumnLayout(t, m) for t in (rc.T_BLOB, rc.T_GEOMETRY, rc.T_JSON) for m in (1, 2, 3, 4)]
    cols += [rc.ColumnLayout(t, 0) for t in (rc.T_TINY_BLOB, rc.T_MEDIUM_BLOB, rc.T_LONG_BLOB)]
    return cols


def _decimal(rnd: random.Random, meta: int) -> bytes:
    precision, scale = meta >> 8, meta & 0xFF
    intg, frac = precision - scale, scale
    sizes = [(DIG2BYTES[intg % 9], intg % 9)] + [(4, 9)] * (intg // 9) + [(4, 9)] * (frac // 9)
    sizes += [(DIG2BYTES[frac % 9], frac % 9)]
    kind = rnd.random()
    b = b"".join(
        (0 if kind < 0.1 else 10**digits - 1 if kind < 0.2 else rnd.randrange(10**digits)).to_bytes(n, "big")
        for n, digits in sizes
        if n
    )
    raw = bytearray(b)
    if rnd.random() < 0.5:
        raw = bytearray(x ^ 0xFF for x in raw)
    raw[0] ^= 0x80
    return bytes(raw)


def _value(rnd: random.Random, col: rc.ColumnLayout) -> bytes:
    t, m = col.type, col.meta
    if t in FIXED:
        return (
            rnd.choice([b"\0", b"\xff", b"\x80", b"\x7f"]) * FIXED[t]
            if rnd.random() < 0.3
            else rnd.randbytes(FIXED[t])
        )
    if t in (rc.T_DATETIME2, rc.T_TIMESTAMP2, rc.T_TIME2):
        size = {rc.T_DATETIME2: 5, rc.T_TIMESTAMP2: 4, rc.T_TIME2: 3}[t] + (m + 1) // 2
        if rnd.random() < 0.2:
            return b"\x80" + b"\0" * (size - 1)  # zero date / midnight
        return rnd.randbytes(size)
    if t == rc.T_NEWDECIMAL:
        return _decimal(rnd, m)
    if t in (rc.T_ENUM, rc.T_SET):
        return rnd.randbytes(m)
    if t == rc.T_BIT:
        return rnd.randbytes((m + 7) // 8)
    if t in (rc.T_VARCHAR, rc.T_VAR_STRING, rc.T_STRING):
        prefix = 1 if m < 256 else 2
        n = rnd.choice([0, 1, min(m, 255 if prefix == 1 else m), rnd.randrange(min(m, 300) + 1)])
        return n.to_bytes(prefix, "little") + rnd.randbytes(n)
    prefix = m or 4
    top = min(2 ** (8 * prefix) - 1, 70_000)
    n = rnd.choice([0, 1, top, rnd.randrange(min(top, 300) + 1)])
    return n.to_bytes(prefix, "little") + rnd.randbytes(n)


def _image(rnd: random.Random, cols: list[rc.ColumnLayout], present: list[bool], null_rate: float) -> bytes:
    idx = [i for i, p in enumerate(present) if p]
    nulls, body = 0, b""
    for bit, i in enumerate(idx):
        if rnd.random() < null_rate:
            nulls |= 1 << bit
        else:
            body += _value(rnd, cols[i])
    return nulls.to_bytes((len(idx) + 7) // 8, "little") + body


def _same(a, b) -> bool:
    # NaN payloads of random FLOAT/DOUBLE bytes compare unequal to themselves
    return all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", range(4))
def test_every_type_decodes_as_the_python_reader(seed):
    rnd = random.Random(seed)
    cols = _columns()
    for present in (
        [True] * len(cols),
        [rnd.random() < 0.5 for _ in cols],
        [i % 7 == 0 for i in range(len(cols))],
    ):
        py, native = rc.row_reader(cols, present), rc.native_reader(cols, present)
        assert native is not None
        for null_rate in (0.0, 0.2, 1.0):
            for _ in range(40):
                data = b"\x01\x02" + _image(rnd, cols, present, null_rate)
                (row_py, end_py), (row_c, end_c) = py(data, 2), native(data, 2)
                assert end_c == end_py == len(data)
                assert _same(row_c, row_py), [
                    (c.type, c.meta, a, b) for c, a, b in zip(cols, row_c, row_py, strict=True) if a != b
                ]


def test_extremes_by_name():
    cols = [
        rc.ColumnLayout(rc.T_LONGLONG, 0),
        rc.ColumnLayout(rc.T_LONGLONG, 0, True),
        rc.ColumnLayout(rc.T_INT24, 0),
        rc.ColumnLayout(rc.T_DATETIME2, 6),
        rc.ColumnLayout(rc.T_TIME2, 6),
        rc.ColumnLayout(rc.T_TIME2, 1),
        rc.ColumnLayout(rc.T_NEWDECIMAL, 65 << 8 | 30),
        rc.ColumnLayout(rc.T_DATETIME2, 0),
    ]
    ym = 9999 * 13 + 12
    dt_max = ((ym << 5 | 31) << 17 | 23 << 12 | 59 << 6 | 59) + 0x8000000000
    neg_time = 0x800000000000 - ((838 << 12 | 59 << 6 | 59) << 24 | 999_999)
    neg_time1 = (0x800000 - (1 << 12 | 0 << 6 | 1)).to_bytes(3, "big") + bytes(
        [0x100 - 50]
    )  # -00:01:00.5 style
    data = (
        b"\0"
        + struct.pack("<q", -(2**63))
        + struct.pack("<Q", 2**64 - 1)
        + (-(2**23)).to_bytes(3, "little", signed=True)
        + dt_max.to_bytes(5, "big")
        + (999_999).to_bytes(3, "big")
        + neg_time.to_bytes(6, "big")
        + neg_time1
        + bytes([0x7F] + [0xFF] * 29)
        + b"\x80\0\0\0\0"
    )
    row_c, end_c = rc.native_reader(cols, [True] * 8)(data, 0)
    row_py, end_py = rc.row_reader(cols, [True] * 8)(data, 0)
    assert (row_c, end_c) == (row_py, end_py)
    assert row_c[:4] == (-(2**63), 2**64 - 1, -(2**23), 99991231235959_999999)
    assert row_c[4] < 0 and row_c[7] == 0 and row_c[6].startswith("-")


def _state(cols: list[rc.ColumnLayout]) -> TableState:
    tdef = TableDef("db", "t", [], [])
    return TableState("db.t", tdef, cols, [], [], [0], "sig", {})


@pytest.mark.parametrize("op", ["c", "d", "u"])
def test_rows_events_decode_alike_on_both_paths(monkeypatch, op):
    rnd = random.Random(7)
    cols = _columns()
    before = [True] * len(cols)
    after = [i % 3 != 1 for i in range(len(cols))] if op == "u" else None  # a MINIMAL/NOBLOB after image
    body = b"HDR"
    for _ in range(60):
        body += _image(rnd, cols, before, 0.1)
        if op == "u":
            body += _image(rnd, cols, after, 0.1)
    native = _state(cols).decode(body, 3, op, before, after, 4)
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    python = _state(cols).decode(body, 3, op, before, after, 4)
    assert len(native) == len(python) == 60
    for (b1, a1), (b2, a2) in zip(native, python, strict=True):
        assert (b1 is None) == (b2 is None) and (a1 is None) == (a2 is None)
        assert _same(b1 or (), b2 or ()) and _same(a1 or (), a2 or ())


def test_json_callable_applies_on_both_paths():
    binary = bytes.fromhex("0001000c000b00010005070061")  # MySQL binary JSON {"a": 7}
    cols = [rc.ColumnLayout(rc.T_JSON, 4, json=_mysql_json), rc.ColumnLayout(rc.T_JSON, 4)]
    expected = b'{"a": 7}'
    data = b"\0" + (len(binary)).to_bytes(4, "little") + binary + (3).to_bytes(4, "little") + b"raw"
    assert rc.native_reader(cols, [True, True])(data, 0) == rc.row_reader(cols, [True, True])(data, 0)
    assert rc.native_reader(cols, [True, True])(data, 0)[0] == (expected, b"raw")


def test_truncated_image_is_a_protocol_error_naming_the_table():
    cols = [rc.ColumnLayout(rc.T_LONG, 0), rc.ColumnLayout(rc.T_VARCHAR, 300)]
    body = b"\0" + struct.pack("<i", 5) + (200).to_bytes(2, "little") + b"short"
    with pytest.raises(ProtocolError, match="db.t.*at 9"):
        _state(cols).decode(body, 0, "c", [True, True], None, 9)


def test_fallbacks(monkeypatch):
    assert rc.native_reader([rc.ColumnLayout(99, 0)], [True]) is None  # unknown type: Python reader raises
    assert rc.native_reader([rc.ColumnLayout(rc.T_NEWDECIMAL, 0)], [True]) is None
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    assert rc.native_reader([rc.ColumnLayout(rc.T_LONG, 0)], [True]) is None
    monkeypatch.setattr(rc, "_Layout", None)
    monkeypatch.delenv(rc.ROWS_ENV)
    assert not rc.native_available()


@pytest.mark.parametrize(
    "etype", [p.WRITE_V1, p.UPDATE_V1, p.DELETE_V1, p.WRITE_V2, p.UPDATE_V2, p.DELETE_V2]
)
def test_whole_rows_events_v1_and_v2_on_both_paths(monkeypatch, etype):
    """A rows event as the stream hands it over (event header, MariaDB v1 / MySQL 8 v2 layout with
    extra data), decoded in place at the offset :func:`protocol.rows_body_start` finds."""
    rnd = random.Random(etype)
    cols = _columns()
    ncols, update = len(cols), p.ROWS_TYPES[etype] == "u"
    present = [True] * ncols
    after = [i % 4 != 2 for i in range(ncols)] if update else None
    bitmap = lambda bits: sum(1 << i for i, b in enumerate(bits) if b).to_bytes((ncols + 7) // 8, "little")  # noqa: E731
    body = (77).to_bytes(6, "little") + struct.pack("<H", 1)
    if etype >= p.WRITE_V2:
        body += struct.pack("<H", 2 + 4) + b"\x00\x02ab"  # extra row info (MySQL 8)
    body += bytes([ncols]) + bitmap(present) + (bitmap(after) if update else b"")
    for _ in range(25):
        body += _image(rnd, cols, present, 0.15)
        if update:
            body += _image(rnd, cols, after, 0.15)
    data = rnd.randbytes(p.HEADER_SIZE) + body
    _, _, o, got_present, got_after = p.rows_body_start(etype, memoryview(data)[p.HEADER_SIZE :])
    assert got_present == present and got_after == after
    op = p.ROWS_TYPES[etype]
    native = _state(cols).decode(data, o + p.HEADER_SIZE, op, present, after, 9)
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    python = _state(cols).decode(data, o + p.HEADER_SIZE, op, present, after, 9)
    assert len(native) == len(python) == 25
    for (b1, a1), (b2, a2) in zip(native, python, strict=True):
        assert (b1 is None) == (b2 is None) and (a1 is None) == (a2 is None)
        assert _same(b1 or (), b2 or ()) and _same(a1 or (), a2 or ())


def test_garbage_never_crashes_the_compiled_reader():
    """Random and truncated bytes: a list of images or ValueError, never a crash or a read past the end."""
    rnd = random.Random(3)
    cols = _columns()
    layouts = [rc.native_reader(cols, [True] * len(cols)), rc.native_reader(cols[:5], [True] * 5)]
    good = _image(rnd, cols, [True] * len(cols), 0.1)
    for i in range(2000):
        data = rnd.randbytes(rnd.randrange(200)) if i % 2 else good[: rnd.randrange(len(good))]
        for layout, size in zip(layouts, (len(data), 400), strict=True):
            for op in ("c", "d", "u"):
                try:
                    assert isinstance(layout.decode(data[:size], 0, op, layout), list)
                except ValueError:
                    pass


def _stream_events(images: list, op: str, key_index: list[int], info: tuple, pos: int) -> list[tuple]:
    """The model of the stream's events of one rows event (what ``WindowReader._add_all`` builds
    from decoded images): a key-changing update is a d of the old image and a c carrying both."""
    out = []
    for row, (before, after) in enumerate(images):
        if op == "u" and any(before[i] != after[i] for i in key_index):
            parts = [("d", before, None), ("c", before, after)]
        else:
            parts = [(op, before, after)]
        for event_op, b, a in parts:
            out.append((event_op, b, a, info, pos, row, None, len(out)))
    return out


@pytest.mark.parametrize("op", ["c", "d", "u"])
@pytest.mark.parametrize("key_index", [[0], [4, 9], [30, 2, 7]])
def test_compiled_events_are_the_decoded_images_as_stream_events(monkeypatch, op, key_index):
    """``Layout.events`` (the hot path: images straight into event tuples) equals the Python
    readers' images turned into events by the model, including updates that change the key (half
    of the updates here repeat their before image with the key kept, the others do not)."""
    rnd = random.Random(len(key_index) * 10 + ord(op))
    cols = _columns()
    present = [True] * len(cols)
    body = b"HDR"
    for k in range(80):
        image = _image(rnd, cols, present, 0.1)
        body += image
        if op == "u":
            body += image if k % 2 else _image(rnd, cols, present, 0.1)
    state = _state(cols)
    state.key_index = key_index
    info = (1700000000000, 7, "0-1-5", "binlog.000003", 3, 12, None)
    events = state.events(body, 3, op, present, present if op == "u" else None, 4, info)
    monkeypatch.setenv(rc.ROWS_ENV, "python")
    assert _state(cols).events(body, 3, op, present, None, 4, info) is None  # no compiled reader
    expected = _stream_events(_state(cols).decode(body, 3, op, present, None, 4), op, key_index, info, 4)
    assert len(events) == len(expected) >= 80
    for got, want in zip(events, expected, strict=True):
        assert got[0] == want[0] and got[3:] == want[3:]
        assert (got[1] is None) == (want[1] is None) and (got[2] is None) == (want[2] is None)
        assert _same(got[1] or (), want[1] or ()) and _same(got[2] or (), want[2] or ())
    if op == "u":
        ops = [e[0] for e in events]
        assert ops.count("u") >= 40 and ops.count("d") == ops.count("c") >= 30


def test_compiled_events_refuse_what_decode_refuses():
    cols = [rc.ColumnLayout(rc.T_LONG, 0), rc.ColumnLayout(rc.T_VARCHAR, 300)]
    body = b"\0" + struct.pack("<i", 5) + (200).to_bytes(2, "little") + b"short"
    with pytest.raises(ProtocolError, match="db.t.*at 9"):
        _state(cols).events(body, 0, "c", [True, True], None, 9, ())
    layout = rc.native_reader(cols, [True, True])
    with pytest.raises(IndexError):
        layout.events(b"", 0, "u", None, [5], (), 1)
    with pytest.raises(ValueError):
        layout.events(b"", 0, "x", None, [0], (), 1)
    with pytest.raises(SchemaError, match="binlog_row_image=FULL"):
        _state(cols).events(body, 0, "d", [True, False], None, 9, ())


@pytest.mark.parametrize("divisor", [1, 1000])
@pytest.mark.parametrize("zero", [None, 0])
def test_compiled_datetime_conversion_is_datetime_micros(divisor, zero):
    """``datetime_epoch`` (a column of neutral DATETIME values at once) equals ``datetime_micros``
    value by value: valid stamps of every year, zero dates, invalid months and days (Feb 29 of
    non-leap years), pre-1970 values (floor division to millis), garbage of every width the
    readers can produce, NULLs; negative values fall back to Python."""
    from airflow_cdc.sources.mysql import types as T

    rnd = random.Random(divisor + (zero or 0))
    values = [None, 0, 1, 10**6, 20240229235959_999999, 20230229000000_000000, 99991231235959_999999,
              100000101000000_000000, 19700101000000_000000, 19691231235959_999999, 10101000000_000000,
              15821004235959_000001, 20000229120000_000000, 19000229120000_000000, 24000229000000_000000,
              21000229000000_000000, 20240431000000_000000, 20241301000000_000000, 2**63, 2**64 - 1, 2**64, (2**64 - 1) * 10**6]  # fmt: skip
    for _ in range(50_000):
        k = rnd.random()
        if k < 0.3:
            values.append(rnd.getrandbits(rnd.choice([8, 20, 40, 63, 64, 67, 70, 84])))
        elif k < 0.9:
            y, m, d = rnd.randint(0, 10000), rnd.randint(0, 99), rnd.randint(0, 99)
            values.append(((y * 10000 + m * 100 + d) * 1000000 + rnd.randrange(10**6)) * 10**6 + rnd.randrange(10**6))
        else:
            values.append(None)
    expected = [
        None if v is None else m // divisor if (m := T.datetime_micros(v)) is not None else zero for v in values
    ]
    assert T._datetimes(divisor, zero)(values).to_pylist() == expected
    assert rc._Layout is not None and T._datetime_epoch([-1], divisor, zero) is None  # Python's turn
    tail = [-1, 20240101000000_000000]
    assert T._datetimes(divisor, zero)(tail).to_pylist() == [
        m // divisor if (m := T.datetime_micros(v)) is not None else zero for v in tail
    ]
