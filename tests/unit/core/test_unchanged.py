"""``skip.messages.without.change``: the rule per value, its row-wise and column-wise forms agree, and
table sinks drop unchanged updates from buffered events and columnar pieces alike."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.core.table_sink import NOT_SENT, ColumnarPiece, RowImages, SourceLayout, text_array
from airflow_cdc.core.unchanged import column_same, drop_unchanged_piece, unchanged_row, values_same


class Marker:
    """A source's "value not sent" object (PostgreSQL's unchanged TOAST)."""


TOAST = Marker()


class TextCodec:
    def __init__(self, name: str) -> None:
        self.field, self.placeholder = pa.field(name, pa.string()), pa.scalar("__unavailable")

    def convert(self, text: pa.Array) -> pa.Array:
        return text


class IntValues:
    """A codec that takes decoded values (as the binlog's)."""

    def __init__(self, name: str) -> None:
        self.field, self.placeholder = pa.field(name, pa.int64()), None

    def convert_values(self, values: list) -> pa.Array:
        return pa.array(values, pa.int64())

    def convert(self, values: pa.Array) -> pa.Array:
        return self.convert_values(values.to_pylist())


LAYOUT = SourceLayout(pa.struct([pa.field("lsn", pa.int64())]), {}, ("lsn",))


def test_rule() -> None:
    assert unchanged_row(("1", "a", None), ("1", "a", None), [0, 1, 2])
    assert not unchanged_row(("1", "a"), ("1", "b"), [0, 1])
    assert unchanged_row(("1", "a", "x"), ("1", "a", "y"), [0, 1]), "only the captured columns count"
    assert not unchanged_row(("1", None), ("1", ""), [0, 1])
    assert unchanged_row(("1", "a"), ("1", TOAST), [0, 1], (TOAST,)), "not sent in the new row: unchanged"
    assert not unchanged_row(("1", TOAST), ("1", "a"), [0, 1], (TOAST,)), "unknown old value: changed"
    assert unchanged_row(("1", TOAST), ("1", TOAST), [0, 1], (TOAST,))
    assert not unchanged_row(None, ("1", "a"), [0, 1]), "no old row: never unchanged (Debezium)"


VALUES = [None, "a", "b", "", TOAST]


def test_column_wise_agrees_with_row_wise() -> None:
    pairs = list(itertools.product(VALUES, VALUES))
    before, after = [p[0] for p in pairs], [p[1] for p in pairs]
    (old, old_unsent), (new, new_unsent) = text_array(before), text_array(after)
    masks = [pa.array(m) if m is not None else None for m in (old_unsent, new_unsent)]
    same = column_same(old, new, *masks).to_pylist()
    assert same == [unchanged_row((b,), (a,), [0], (TOAST,)) for b, a in pairs]
    assert values_same(before, after, (TOAST,)).to_pylist() == same


def test_nested_values_are_compared() -> None:
    lists = pa.array([[1, 2], [1], None, None])
    assert column_same(lists, pa.array([[1, 2], [2], None, [3]])).to_pylist() == [True, False, True, False]


@pytest.mark.parametrize("native", [False, True], ids=["text", "decoded-values"])
def test_sink_drops_unchanged_updates(tmp_path, native: bool) -> None:
    w = BatchWriter(tmp_path, "conn", piece_rows=4)
    codecs = [IntValues("id"), IntValues("n")] if native else [TextCodec("id"), TextCodec("n")]
    sink = w.sink(
        "s.t", {"schema": "s", "table": "t", "key_columns": ["id"]}, codecs, [0, 2], LAYOUT, "stream", "v1"
    )
    sink.skip_unchanged = True
    value = (lambda i: i) if native else str
    missing = NOT_SENT if native else TOAST
    if native:
        sink.expect_partial_images()
    events = [
        ("c", None, (value(1), "x", value(1))),
        ("u", (value(1), "x", value(1)), (value(1), "y", value(1))),  # only an uncaptured column
        ("u", (value(1), "x", value(1)), (value(1), "x", value(2))),
        ("u", (value(2), "x", value(2)), (value(2), "x", missing)),  # not sent: unchanged
        ("u", (value(3), "x", missing), (value(3), "x", value(3))),  # unknown old value: kept
        ("u", None, (value(4), "x", value(4))),  # no old row: kept
        ("u", (value(5), "x", None), (value(5), "x", None)),
        ("d", (value(1), "x", value(2)), None),
    ]
    for n, (op, before, after) in enumerate(events):
        sink.append(op, before, after, n.to_bytes(16, "big"), (n,))
    b = Batch(w.finish({}))
    rows = [r for rb in b.iter_events("s.t") for r in rb.to_pylist()]
    assert [r["source"]["lsn"] for r in rows] == [0, 2, 4, 5, 7]
    assert b.table_info("s.t")["parts"][0]["ops"] == {"c": 1, "u": 3, "d": 1}


def _images(present: list[bool], texts: list[list], unsent: list[list[bool] | None]) -> RowImages:
    return RowImages(
        pa.array(present),
        [pa.array(t, pa.string()) for t in texts],
        [None if u is None else pa.array(u) for u in unsent],
    )


def test_piece_without_its_unchanged_updates() -> None:
    ops = pa.array(["u", "u", "c", "u"])
    piece = ColumnarPiece(
        ops=ops,
        op_counts={"u": 3, "c": 1},
        positions=pa.array([b"0", b"1", b"2", b"3"]),
        source={"lsn": pa.array([0, 1, 2, 3])},
        before=_images(
            [True, True, False, True], [["1", "2", None, "4"], ["a", "b", None, "d"]], [None, None]
        ),
        after=_images(
            [True, True, True, True],
            [["1", "2", "3", "4"], ["a", "B", "c", None]],
            [None, [False, False, False, True]],
        ),
    )
    kept = drop_unchanged_piece(piece)
    assert kept is not None
    assert kept.ops.to_pylist() == ["u", "c"] and kept.op_counts == {"u": 1, "c": 1}
    assert kept.source["lsn"].to_pylist() == [1, 2] and kept.positions.to_pylist() == [b"1", b"2"]
    assert (
        kept.after.texts[1].to_pylist() == ["B", "c"] and kept.after.unchanged[1].to_pylist() == [False] * 2
    )
    only = ColumnarPiece(
        ops.slice(0, 1),
        {"u": 1},
        piece.positions.slice(0, 1),
        {"lsn": pa.array([0])},
        _images([True], [["1"], ["a"]], [None, None]),
        _images([True], [["1"], ["a"]], [None, None]),
    )
    assert drop_unchanged_piece(only) is None
    assert pc.all(pc.equal(drop_unchanged_piece(kept).ops, kept.ops)).as_py()  # type: ignore[union-attr]
