"""``source.origin`` / ``origin_lsn`` (Debezium 3.6): set by pgoutput's Origin message for the
transaction it follows, null otherwise; the compiled decoder and the pure-Python path alike, and
a streamed (protocol 2) transaction keeps its Origin message."""

from __future__ import annotations

import random
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.connect_json import connect_schema
from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.postgres import columnar, streamed
from airflow_cdc.sources.postgres.tables import SOURCE_TYPE

from .test_columnar import ITEMS, ORDERS, change, decode, needs_native, order_row
from .test_protocol import (
    begin_msg,
    commit_msg,
    cstr,
    message_msg,
    relation_msg,
    text_col,
    truncate_msg,
    tupledata,
)


def origin_msg(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


def item(i: int) -> bytes:
    return change(b"I", 2, b"N", tupledata(text_col(str(i).encode()), text_col(b"n")))


def window() -> list[tuple[int, bytes]]:
    """Transactions with and without an origin, rows of both kinds within one piece either way
    round, a key change, a truncate and a transactional message in an origin's transaction."""
    key_only = tupledata(text_col(b"2"), *([b"n"] * 7))
    msgs = [
        begin_msg(500, 1_000, 7),
        origin_msg(0x12345, "node_a"),
        relation_msg(1, "public", "orders", b"d", ORDERS),
        relation_msg(2, "public", "items", b"f", ITEMS),
        change(b"I", 1, b"N", order_row(1)),
        change(b"I", 1, b"N", order_row(2)),
        item(1),
        change(b"U", 1, b"K", key_only, b"N", order_row(20)),  # key change: d + c
        message_msg(1, 505, "app", b"in origin"),
        truncate_msg(0, 2),
        commit_msg(0, 500, 510, 1_000),
        begin_msg(600, 2_000, 8),  # no origin: nothing carried over
        change(b"I", 1, b"N", order_row(3)),
        item(2),
        commit_msg(0, 600, 610, 2_000),
        begin_msg(100, 5, 6),
        origin_msg(1, "skipped"),  # below the window start: skipped whole
        change(b"I", 1, b"N", order_row(1000)),
        commit_msg(0, 100, 150, 5),
        begin_msg(700, 3_000, 9),
        origin_msg(0, "node_b"),  # origin LSN 0: session setup only
        change(b"I", 1, b"N", order_row(4)),
        item(3),
        message_msg(0, 705, "app", b"non-transactional"),
        commit_msg(0, 700, 710, 3_000),
    ]
    return [(400 + i, m) for i, m in enumerate(msgs)]


def capture(tmp_path, monkeypatch, rows, native: bool, piece_rows: int = 1000, skipped=frozenset()) -> dict:
    """Decode ``rows`` (fetch batches of 3) into a batch; every staged event and message by table."""
    folder = tmp_path / f"{'native' if native else 'python'}-{piece_rows}"
    batch, _, _ = decode(monkeypatch, folder, rows, native, piece_rows, skipped, fetch=3)
    out = {
        t: [
            r
            for p in batch.parts(t)
            for r in pq.read_table(p).drop_columns(["ts_ms", "ts_us", "ts_ns"]).to_pylist()
        ]
        for t in batch.tables()
    }
    out["messages"] = [
        r for rb in batch.iter_messages() for r in rb.drop_columns(["ts_ms", "ts_us", "ts_ns"]).to_pylist()
    ]
    return out


def _origins(rows: list[dict]) -> list[tuple]:
    return [(r["op"], r["source"]["origin"], r["source"]["origin_lsn"]) for r in rows]


def test_source_block_ends_with_origin_fields_as_debezium():
    """PostgresSourceInfoStructMaker (Debezium 3.6): ... txId, lsn, xmin, then ``origin``
    (OPTIONAL_STRING_SCHEMA) and ``origin_lsn`` (OPTIONAL_INT64_SCHEMA), as Connect JSON renders them."""
    names = [f.name for f in SOURCE_TYPE]
    assert names[-5:] == ["txId", "lsn", "xmin", "origin", "origin_lsn"]
    assert connect_schema(pa.field("source", SOURCE_TYPE))["fields"][-2:] == [
        {"type": "string", "optional": True, "field": "origin"},
        {"type": "int64", "optional": True, "field": "origin_lsn"},
    ]


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False], ids=["native", "python"])
def test_events_carry_their_transactions_origin(tmp_path, monkeypatch, native):
    out = capture(tmp_path, monkeypatch, window(), native)
    a = ("node_a", 0x12345)
    assert _origins(out["public.orders"]) == [
        ("c", *a),
        ("c", *a),
        ("d", *a),
        ("c", *a),
        ("c", None, None),
        ("c", "node_b", 0),
    ]
    assert _origins(out["public.items"]) == [("c", *a), ("t", *a), ("c", None, None), ("c", "node_b", 0)]
    messages = {m["message"]["content"]: m["source"] for m in out["messages"]}
    assert (messages[b"in origin"]["origin"], messages[b"in origin"]["origin_lsn"]) == a
    # a non-transactional message belongs to no transaction, so to no origin
    assert messages[b"non-transactional"]["origin"] is None
    assert messages[b"non-transactional"]["origin_lsn"] is None


@needs_native
@pytest.mark.parametrize("piece_rows", [1, 2, 3, 1000])
def test_native_and_python_stage_the_same_origins(tmp_path, monkeypatch, piece_rows):
    """Pieces that start with rows without an origin and go on with some (and the other way
    round) hold the same rows as the Python path, whatever the piece size."""
    rows = window()
    native = capture(tmp_path, monkeypatch, rows, True, piece_rows)
    python = capture(tmp_path, monkeypatch, rows, False, piece_rows)
    for table in ("public.orders", "public.items", "messages"):
        assert native[table] == python[table]


@needs_native
def test_decoder_hands_over_origin_buffers_only_when_a_row_has_one():
    dec = columnar._Decoder(100, 1 << 20, "")
    dec.register(1, [0])
    insert = (1, change(b"I", 1, b"N", tupledata(text_col(b"1"))))
    dec.set_txn(True, 10, 0, 1, None, 0)
    assert dec.feed([insert] * 2, 0) == 2
    assert dec.take(1)[-1] is None
    dec.set_txn(True, 10, 0, 1, None, 0, None, 0)
    dec.feed([insert], 0)
    dec.set_txn(True, 20, 0, 2, None, 0, "é", 7)
    dec.feed([insert], 0)
    piece = columnar.to_piece(dec.take(1))
    assert piece.source["origin"].to_pylist() == [None, "é"]
    assert piece.source["origin_lsn"].to_pylist() == [None, 7]
    with pytest.raises(TypeError):
        dec.set_txn(True, 10, 0, 1, None, 0, b"bytes", 0)


def test_malformed_origin_message_is_a_protocol_error(tmp_path, monkeypatch):
    rows = window()
    rows[1] = (401, rows[1][1][:-1])  # the name's terminating NUL cut
    for native in (True, False) if columnar._Decoder is not None else (False,):
        with pytest.raises(ProtocolError):
            capture(tmp_path / str(native), monkeypatch, rows, native)


def test_streamed_transaction_keeps_its_origin_message():
    """Protocol 2: the Origin message follows the first Stream Start without an xid; it comes back
    right after the Begin, as protocol 1 sends it."""
    origin = origin_msg(0, "node_a")
    insert = b"I" + struct.pack(">I", 10) + struct.pack(">I", 1) + b"N" + tupledata(text_col(b"1"))
    script = [
        (1100, b"S" + struct.pack(">IB", 10, 1)),
        (1100, origin),
        (1101, insert),
        (1102, b"E"),
        (1210, b"c" + struct.pack(">IBqqq", 10, 0, 1200, 1210, 77)),
    ]
    out = [m for batch in streamed.unstream(iter([script]), lambda: 3, 10) for m in batch]
    assert out == [
        (1210, b"B" + struct.pack(">qqI", 1200, 77, 10)),
        (1100, origin),
        (1101, insert[:1] + insert[5:]),
        (1210, b"C" + struct.pack(">Bqqq", 0, 1200, 1210, 77)),
    ]


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_random_windows_stage_the_same_origins(tmp_path, monkeypatch, seed):
    """Transactions with and without origins in random order and sizes, key changes (two rows
    at once, or one with ``d`` skipped), rows the compiled decoder leaves to Python (unchanged
    TOAST next to an old image), and random piece sizes: both paths stage the same rows."""
    rng = random.Random(seed)
    msgs = [
        relation_msg(1, "public", "orders", b"f", ORDERS),
        relation_msg(2, "public", "items", b"f", ITEMS),
    ]
    lsn = 500
    for t in range(rng.randint(5, 30)):
        msgs.append(begin_msg(lsn, t, 100 + t))
        if rng.random() < 0.5:
            msgs.append(origin_msg(rng.randrange(1 << 40), rng.choice(["a", "bé", "c" * 60])))
        for _ in range(rng.randint(0, 8)):
            i = rng.randrange(50)
            kind = rng.choice(["insert", "item", "key change", "toast"])
            if kind == "insert":
                msgs.append(change(b"I", 1, b"N", order_row(i)))
            elif kind == "item":
                msgs.append(item(i))
            elif kind == "key change":
                msgs.append(change(b"U", 1, b"O", order_row(i), b"N", order_row(i + 100)))
            else:
                msgs.append(change(b"U", 1, b"O", order_row(i), b"N", order_row(i, attrs=b"u")))
        msgs.append(commit_msg(0, lsn, lsn + 5, t))
        lsn += 10
    rows = [(400 + i, m) for i, m in enumerate(msgs)]
    piece_rows = rng.choice([1, 2, 3, 7, 1000])
    skipped = rng.choice([frozenset(), frozenset({"d"})])
    native = capture(tmp_path, monkeypatch, rows, True, piece_rows, skipped)
    python = capture(tmp_path, monkeypatch, rows, False, piece_rows, skipped)
    assert native == python
