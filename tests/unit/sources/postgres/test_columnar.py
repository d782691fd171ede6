"""The compiled columnar decoder against the pure-Python path, on the same byte fixtures.

Every fixture window is decoded twice -- compiled decoder on, and ``AIRFLOW_CDC_PG_DECODER=python``
-- into real staged batches, and the written rows must be identical (except the processing
timestamps ``ts_ms/us/ns``).  Malformed input must give the same ProtocolError either way and the
compiled decoder must never crash, whatever it is fed.
"""

from __future__ import annotations

import random
import struct
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.core.filters import TableId
from airflow_cdc.sources.postgres import columnar
from airflow_cdc.sources.postgres.protocol import PG_EPOCH_OFFSET_US
from airflow_cdc.sources.postgres.stream import WindowReader, WindowResult, _TxnState
from airflow_cdc.sources.postgres.tables import build_state, source_constants
from airflow_cdc.sources.postgres.types import HandlingModes, PgTypeInfo

from .test_protocol import (
    NULL,
    TOAST,
    begin_msg,
    bin_col,
    commit_msg,
    message_msg,
    relation_msg,
    text_col,
    truncate_msg,
    tupledata,
)

needs_native = pytest.mark.skipif(columnar._Decoder is None, reason="compiled decoder not built")


def test_compiled_decoder_is_built():
    """``pip install -e .`` (``make setup``) builds it; without it capture is ~3x slower."""
    assert columnar._Decoder is not None, "run pip install -e . to build airflow_cdc/sources/postgres/_pgoutput"

TYPES = {20: "int8", 25: "text", 1700: "numeric", 1184: "timestamptz", 16: "bool", 3802: "jsonb", 17: "bytea"}
NUMERIC_12_2 = ((12 << 16) | 2) + 4
ORDERS = [(1, "id", 20, -1), (0, "label", 25, -1), (0, "secret", 25, -1), (0, "price", 1700, NUMERIC_12_2),
          (0, "created", 1184, -1), (0, "active", 16, -1), (0, "attrs", 3802, -1), (0, "blob", 17, -1)]
ITEMS = [(1, "id", 20, -1), (0, "note", 25, -1)]
ORDERS_V2 = ORDERS[:2] + [(0, "extra", 25, -1)]


class _Filters:
    """Captures every column except ``secret`` (so the captured columns have a gap)."""

    def includes_column(self, tid: TableId, column: str, is_key: bool = False) -> bool:
        return column != "secret"


def _relation_state(rel):
    cols = [(c.name, c.type_oid, c.typmod) for c in rel.columns]
    return build_state(TableId(rel.namespace, rel.name), rel.name != "ignored", cols, ["id"], _Filters(),
                       HandlingModes(), lambda oid: PgTypeInfo(oid, TYPES[oid]), source_constants("t", "db"))


def change(kind: bytes, relid: int, *parts: bytes) -> bytes:
    return kind + struct.pack(">I", relid) + b"".join(parts)


def order_row(i: int, **override: bytes) -> bytes:
    cols = {"id": text_col(str(i).encode()), "label": text_col(f"label-{i}-é".encode()),
            "secret": text_col(b"s"), "price": text_col(f"{i}.{i % 100:02d}".encode()),
            "created": text_col(b"2024-01-02 03:04:05.123456+00"), "active": text_col(b"t" if i % 2 else b"f"),
            "attrs": text_col(b'{"k": 1}'), "blob": text_col(b"\\x0102ff")}
    cols.update(override)
    return tupledata(*cols.values())


def window() -> list[tuple[int, bytes]]:
    """A window exercising every row shape, interleaved tables, framing and schema change."""
    msgs = [begin_msg(500, 1_000_000, 7), relation_msg(1, "public", "orders", b"d", ORDERS),
            relation_msg(2, "public", "items", b"f", ITEMS), relation_msg(3, "public", "ignored", b"d", ITEMS)]
    for i in range(1, 12):
        msgs.append(change(b"I", 1, b"N", order_row(i, **({"label": NULL} if i == 3 else {}))))
        msgs.append(change(b"I", 2, b"N", tupledata(text_col(str(i).encode()), bin_col(b"bin"))))
        msgs.append(change(b"I", 3, b"N", tupledata(text_col(b"1"), NULL)))
    msgs.append(change(b"I", 3, b"N", b"garbage"))  # a table not captured: not even parsed
    key_only = tupledata(text_col(b"4"), *([NULL] * 7))
    msgs += [
        change(b"U", 1, b"N", order_row(1, attrs=TOAST, blob=TOAST, label=TOAST)),
        change(b"U", 1, b"K", key_only, b"N", order_row(40)),  # key change: d + c
        change(b"U", 1, b"O", order_row(5), b"N", order_row(5, price=text_col(b"NaN"))),
        # key change leaving TOAST unsent (FULL identity), and a K tuple whose key did not change
        change(b"U", 1, b"O", order_row(6), b"N", order_row(60, attrs=TOAST, blob=TOAST)),
        change(b"U", 1, b"K", key_only, b"N", order_row(4, id=TOAST, attrs=TOAST)),
        message_msg(1, 510, "app", b"payload"),
        change(b"D", 1, b"K", key_only),
        change(b"D", 2, b"O", tupledata(text_col(b"2"), TOAST)),
        truncate_msg(0, 2),
        change(b"I", 2, b"N", tupledata(text_col(b"99"), NULL)),
        commit_msg(0, 500, 600, 1_000_000),
        begin_msg(100, 5, 6),  # below the window start: skipped whole
        change(b"I", 1, b"N", order_row(1000)), change(b"I", 1, b"N", b"garbage"),
        commit_msg(0, 100, 150, 5),
        begin_msg(700, 2_000_000, 8),
        change(b"I", 1, b"N", order_row(12)),
        relation_msg(1, "public", "orders", b"d", ORDERS_V2),
        change(b"I", 1, b"N", tupledata(text_col(b"13"), text_col(b"x"), text_col(b"y"))),
        change(b"U", 1, b"N", tupledata(text_col(b"13"), TOAST, NULL)),
        commit_msg(0, 700, 800, 2_000_000),
    ]
    return [(400 + i, m) for i, m in enumerate(msgs)]


def decode(monkeypatch, folder, rows, native: bool, piece_rows: int, skipped=frozenset(), fetch: int = 5):
    """Decode ``rows`` (in fetch batches of ``fetch``) with the compiled decoder (``native``) or the
    pure-Python path into a batch published in ``folder``: ``(batch, window result, reader)``.
    A failed decode aborts the batch (nothing is published) and raises."""
    monkeypatch.setenv(columnar.DECODER_ENV, "native" if native else "python")
    writer = BatchWriter(folder, "t", piece_rows=piece_rows)
    reader = WindowReader(_relation_state, writer, None, skipped, False, lambda p: True, "t", "db")
    assert (reader.native is not None) == native
    st, res = _TxnState(), WindowResult(end_lsn=1000)
    try:
        try:
            for start in range(0, len(rows), fetch):
                reader.consume(rows[start:start + fetch], st, res, 300)
            reader.drain_all()
            reader._flush_messages()
        finally:
            reader._stop_writes()  # the helper threads, as read() and read_stream() stop them
    except BaseException:
        writer.abort()
        raise
    return Batch(writer.finish({})), res, reader


def capture(tmp_path, monkeypatch, rows, native: bool, piece_rows: int = 4, skipped=frozenset(), **kw):
    """Decode ``rows`` (in fetch batches of 5) into a published batch; return its rows per table."""
    for name, value in kw.items():
        monkeypatch.setattr(columnar, name, value)
    folder = tmp_path / ("native" if native else "python")
    batch, res, reader = decode(monkeypatch, folder, rows, native, piece_rows, skipped)
    out = {}
    for table in batch.tables() + ["\0messages"]:
        parts = batch.parts(table) if table != "\0messages" else []
        out[table] = [pq.read_table(p).drop_columns(["ts_ms", "ts_us", "ts_ns"]) for p in parts]
    out["manifest"] = {t: batch.table_info(t)["parts"] for t in batch.tables()}
    out["result"] = (res.transactions, res.last_commit_lsn, reader._events())
    return out


@needs_native
@pytest.mark.parametrize("piece_rows", [1, 4, 1000])
@pytest.mark.parametrize(
    "skipped", [frozenset(), frozenset({"d"}), frozenset({"c", "u"}), frozenset({"u"}), frozenset({"c"})]
)
def test_native_and_python_write_identical_batches(tmp_path, monkeypatch, piece_rows, skipped):
    rows = window()
    native = capture(tmp_path, monkeypatch, rows, True, piece_rows, skipped)
    python = capture(tmp_path, monkeypatch, rows, False, piece_rows, skipped)
    assert native["manifest"] == python["manifest"]
    assert native["result"] == python["result"]
    for table in ("public.orders", "public.items"):
        assert len(native[table]) == len(python[table]) > 0
        for got, want in zip(native[table], python[table], strict=True):
            assert got.schema == want.schema
            assert got.to_pylist() == want.to_pylist()


@needs_native
def test_fixture_window_has_the_expected_shape(tmp_path, monkeypatch):
    out = capture(tmp_path, monkeypatch, window(), True)
    first, second = out["public.orders"]
    ops = first.column("op").to_pylist() + second.column("op").to_pylist()
    assert ops == ["c"] * 11 + ["u", "d", "c", "u", "d", "c", "u", "d", "c", "c", "u"]
    rows = first.to_pylist()
    # a key change is Debezium's d (before = the old image as sent) then c (after = new row,
    # before null), consecutive sequence numbers; the c names the old key in __old_key
    d, c = rows[12], rows[13]
    assert d["before"]["id"] == 4 and d["after"] is None and d["__old_key"] is None
    assert c["before"] is None and c["after"]["id"] == 40 and c["__old_key"] == {"id": 4}
    assert d["source"] == c["source"]
    assert int.from_bytes(c["__position"][12:], "big") == int.from_bytes(d["__position"][12:], "big") + 1
    d, c = rows[15], rows[16]
    assert d["before"]["id"] == 6 and d["before"]["attrs"] == '{"k": 1}' and d["after"] is None
    # REPLICA IDENTITY FULL: the unchanged TOAST values come from the old image (as Debezium)
    assert c["after"]["id"] == 60 and c["__unavailable"] is None and c["__old_key"] == {"id": 6}
    assert c["after"]["attrs"] == d["before"]["attrs"] and c["after"]["blob"] == d["before"]["blob"]
    assert rows[17]["op"] == "u" and rows[17]["before"]["id"] == 4 and rows[17]["__old_key"] is None
    assert all(r["__old_key"] is None for r in rows if r["op"] != "c" or r["before"] is not None)
    row = first.slice(11, 1).to_pylist()[0]
    assert row["__unavailable"] == ["label", "attrs", "blob"]
    assert row["after"]["attrs"] == "__debezium_unavailable_value"
    # Debezium: [lastCommitLsn, lsn], null before the first commit (was "" here)
    assert row["source"]["sequence"] == '[null,"438"]' and row["source"]["txId"] == 7
    assert row["source"]["ts_us"] == 1_000_000 + PG_EPOCH_OFFSET_US
    assert "secret" not in first.schema.field("after").type.names
    assert second.column("op").to_pylist() == ["c", "u"]
    # the last commit LSN is the commit record's end (the Commit message's LSN), not its start
    assert second.slice(0, 1).to_pylist()[0]["source"]["sequence"] == '["600","456"]'
    assert out["result"] == (2, 800, 35)


@needs_native
def test_unchanged_toast_next_to_an_old_image_takes_the_old_value(tmp_path, monkeypatch):
    """REPLICA IDENTITY FULL: Debezium fills an unchanged TOAST value from the old row image
    (the compiled decoder leaves such rows to Python); a key-only old image has no value."""
    key_only = tupledata(text_col(b"41"), *([NULL] * 7))
    msgs = [begin_msg(500, 1_000_000, 7), relation_msg(1, "public", "orders", b"f", ORDERS),
            change(b"I", 1, b"N", order_row(5)),
            change(b"U", 1, b"O", order_row(6), b"N", order_row(6, attrs=TOAST, label=TOAST)),
            change(b"U", 1, b"K", key_only, b"N", order_row(42, attrs=TOAST)),
            change(b"U", 1, b"N", order_row(7, attrs=TOAST)),
            commit_msg(0, 500, 600, 1_000_000)]
    rows = [(400 + i, m) for i, m in enumerate(msgs)]
    native, python = (capture(tmp_path, monkeypatch, rows, n) for n in (True, False))
    assert [t.to_pylist() for t in native["public.orders"]] == [t.to_pylist() for t in python["public.orders"]]
    _, full, key_delete, key_change, default = [r for t in python["public.orders"] for r in t.to_pylist()]
    assert (key_delete["op"], key_change["op"]) == ("d", "c")  # a key change is Debezium's d + c
    assert full["after"]["attrs"] == '{"k": 1}' and full["after"]["label"] == "label-6-é"
    assert full["__unavailable"] is None
    assert key_change["after"]["attrs"] == "__debezium_unavailable_value" and key_change["__unavailable"] == ["attrs"]
    assert default["after"]["attrs"] == "__debezium_unavailable_value" and default["__unavailable"] == ["attrs"]


def random_window(rng: random.Random, changes: int) -> list[tuple[int, bytes]]:
    """One transaction of random inserts, updates (no old image, key-only and full old images,
    values not sent, key changes) and deletes of ``orders``."""
    msgs = [begin_msg(500, 1_000_000, 7), relation_msg(1, "public", "orders", b"d", ORDERS)]

    def new_row(i: int) -> bytes:
        over = {"attrs": TOAST} if rng.random() < 0.2 else {}
        return order_row(i, **over, **({"label": NULL} if rng.random() < 0.2 else {}))

    for _ in range(changes):
        i, shape = rng.randrange(1, 20), rng.choice("IUUKOD")
        key_only = tupledata(text_col(str(i).encode()), *([NULL] * 7))
        moved = rng.choice([i, i + 100])
        if shape == "I":
            msg = change(b"I", 1, b"N", order_row(i, **({"label": NULL} if rng.random() < 0.2 else {})))
        elif shape == "U":
            msg = change(b"U", 1, b"N", new_row(i))
        elif shape == "K":  # key-only old image: a key change when ``moved`` differs
            msg = change(b"U", 1, b"K", key_only, b"N", new_row(moved))
        elif shape == "O":  # full old image (REPLICA IDENTITY FULL)
            msg = change(b"U", 1, b"O", order_row(i), b"N", new_row(moved))
        else:
            msg = change(b"D", 1, b"K", key_only)
        msgs.append(msg)
    msgs.append(commit_msg(0, 500, 600, 1_000_000))
    return [(400 + k, m) for k, m in enumerate(msgs)]


@needs_native
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("piece_rows", [3, 7, 1000])
def test_random_row_shapes_write_identical_batches(tmp_path, monkeypatch, seed, piece_rows):
    """The compiled decoder writes an absent row image only when a later row has that image or
    the piece is taken, and keeps a TOAST bitmap only from a value not sent on: runs of every row
    shape across piece boundaries (stale bits of the previous piece) still match the Python path."""
    rows = random_window(random.Random(seed), 80)
    native, python = (capture(tmp_path, monkeypatch, rows, n, piece_rows) for n in (True, False))
    assert native["result"] == python["result"] and native["manifest"] == python["manifest"]
    got = [r for t in native["public.orders"] for r in t.to_pylist()]
    assert got == [r for t in python["public.orders"] for r in t.to_pylist()]
    assert {r["op"] for r in got} == {"c", "u", "d"}
    assert any(r["before"] is None for r in got) and any(r["after"] is None for r in got)
    assert any(r["__unavailable"] for r in got)


@needs_native
def test_small_byte_budget_splits_pieces_without_changing_rows(tmp_path, monkeypatch):
    rows = window()
    small = capture(tmp_path, monkeypatch, rows, True, 1000, MAX_PIECE_BYTES=1)
    python = capture(tmp_path, monkeypatch, rows, False, 1000)
    for table in ("public.orders", "public.items"):
        assert [t.to_pylist() for t in small[table]] == [t.to_pylist() for t in python[table]]
    assert pq.ParquetFile(next(iter((tmp_path / "native").rglob("part-00000.parquet")))).num_row_groups > 5


@needs_native
def test_invalid_utf8_is_rejected_on_both_paths(tmp_path, monkeypatch):
    rows = window()[:4] + [(450, change(b"I", 1, b"N", order_row(1, label=text_col(b"\xff"))))]
    for native in (True, False):
        with pytest.raises(Exception, match="(?i)utf-?8"):
            capture(tmp_path, monkeypatch, rows, native)


def _outcome(tmp_path, monkeypatch, rows, native):
    try:
        out = capture(tmp_path, monkeypatch, rows, native)
    except ProtocolError as e:
        return "error", str(e)
    except pa.ArrowInvalid as e:  # invalid UTF-8 text (the two paths word it differently)
        assert "utf" in str(e).lower()
        return "invalid utf-8", None
    return "ok", {t: [x.to_pylist() for x in v] for t, v in out.items() if t.startswith("public.")}


def _corruptions(data: bytes, rng: random.Random) -> list[bytes]:
    out = [data[:cut] for cut in range(len(data))]
    for _ in range(40):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return out


@needs_native
@pytest.mark.parametrize("msg", [
    change(b"I", 1, b"N", order_row(1)),
    change(b"U", 1, b"K", tupledata(text_col(b"4"), *([NULL] * 7)), b"N", order_row(4)),
    change(b"D", 1, b"O", order_row(5)),
    change(b"I", 2, b"N", tupledata(text_col(b"1"), TOAST)),
])
def test_malformed_changes_fail_alike_on_both_paths(tmp_path, monkeypatch, msg):
    rng = random.Random(len(msg))
    head = window()[:4]
    for i, bad in enumerate(_corruptions(msg, rng)):
        if bad[:1] not in (b"I", b"U", b"D") or bad[1:5] != msg[1:5]:
            continue  # another message type or table: not the compiled decoder's business
        rows = head + [(450, bad), (451, commit_msg(0, 500, 600, 0))]
        native = _outcome(tmp_path / str(i), monkeypatch, rows, True)
        python = _outcome(tmp_path / str(i), monkeypatch, rows, False)
        assert native == python, bad


@needs_native
def test_decoder_never_crashes_on_arbitrary_rows():
    rng = random.Random(7)
    dec = columnar._Decoder(3, 1 << 20, "")
    dec.register(1, [0, 2])
    dec.set_txn(True, 10, 0, 1, None, 0)
    junk = [None, (1,), (1, "text"), ("x", b"I"), (1, b""), (1, b"I"), (1 << 70, b"I\0\0\0\1N\0\0")]
    junk += [(1, bytes(rng.randrange(256) for _ in range(rng.randrange(40)))) for _ in range(3000)]
    junk += [(1, b"I\0\0\0\1N" + bytes(rng.randrange(256) for _ in range(rng.randrange(30))))
             for _ in range(3000)]
    i = 0
    while i < len(junk):
        i = dec.feed(junk, i)
        if dec.full is not None:
            assert dec.take(dec.full) is not None
        else:
            i += 1
    dec.take(1)
    assert dec.take(1) is None


@needs_native
def test_decoder_argument_checks():
    with pytest.raises(ValueError):
        columnar._Decoder(0, 1, "")
    dec = columnar._Decoder(1, 1, "")
    with pytest.raises(ValueError):
        dec.register(1, [0, 0])
    with pytest.raises(ValueError):
        dec.register(1, [-1])
    with pytest.raises(TypeError):
        dec.feed((), 0)
    dec.register(1, [0])
    dec.set_txn(True, 1, 0, 1, 5, 0)
    assert dec.feed([(1, change(b"I", 1, b"N", tupledata(text_col(b"1"))))] * 2, 0) == 1
    assert dec.full == 1
    with pytest.raises(RuntimeError):
        dec.feed([], 0)
    with pytest.raises(RuntimeError):
        dec.unregister(1)
    assert dec.take(1)[0] == 1 and dec.full is None
    assert dec.unregister(1) is True and dec.unregister(1) is False
    dec.register(3, (), True)
    ignored = [(1, change(b"I", 3, b"N", b"anything")), (2, change(b"D", 3, b"?"))]
    assert dec.feed(ignored, 0) == 2 and dec.events == 1 and dec.take(3) is None


@needs_native
def test_feed_decodes_without_the_gil_and_refuses_calls_meanwhile():
    """While ``feed`` decodes, another thread runs Python (the peek's fetching thread builds the
    next batch meanwhile), and a call that would touch the buffers is refused, not raced."""
    dec = columnar._Decoder(1 << 30, 1 << 40, "")
    dec.register(1, [0])
    dec.set_txn(True, 10, 0, 1, None, 0)
    row = (5, change(b"I", 1, b"N", tupledata(text_col(b"1"))))
    stamps: list[float] = []
    refused: list[str] = []
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            try:
                dec.unregister(99)  # not registered: False, unless the decoder is busy
            except RuntimeError as e:
                refused.append(str(e))
            stamps.append(time.perf_counter())

    rows = 250_000
    while True:
        batch = [row] * rows
        worker = threading.Thread(target=other)
        stamps.clear()
        stop.clear()
        worker.start()
        while not stamps:
            time.sleep(0.001)
        t0 = time.perf_counter()
        assert dec.feed(batch, 0) == rows
        t1 = time.perf_counter()
        stop.set()
        worker.join()
        assert dec.take(1)[0] == rows
        if t1 - t0 >= 0.05 or rows >= 16_000_000:
            break
        rows *= 2  # a fast machine: decode long enough to tell
    quarter = (t1 - t0) / 4
    middle = [s for s in stamps if t0 + quarter < s < t1 - quarter]
    assert middle, f"no Python ran in another thread during a {t1 - t0:.3f}s feed: the GIL was held"
    assert refused and all("feeding in another thread" in r for r in refused)
