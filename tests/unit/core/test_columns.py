"""The compiled row-to-column transposition of the table sinks (``core/_columns.c``) equals the
Python one: None rows, tuples and lists, any selection order, and a short row refused on both
paths with the column index."""

from __future__ import annotations

import random

import pytest

from airflow_cdc.core import table_sink
from airflow_cdc.core.errors import ProtocolError

pytestmark = pytest.mark.skipif(table_sink._transpose is None, reason="_columns extension not built")


class _Sink:
    rel_path = "t/part-0.parquet"

    def __init__(self, select: list[int]) -> None:
        self._select = select

    columns = table_sink.TableSink._columns


def _both(monkeypatch, rows, select):
    compiled = _Sink(select).columns(rows)
    monkeypatch.setattr(table_sink, "_transpose", None)
    python = _Sink(select).columns(rows)
    monkeypatch.undo()
    return compiled, python


@pytest.mark.parametrize("seed", range(5))
def test_compiled_columns_equal_python(monkeypatch, seed):
    rnd = random.Random(seed)
    width = rnd.randint(1, 12)
    values = [None, 0, -1, 2**70, 1.5, "x", b"\xff", (1, 2), object()]
    rows = []
    for _ in range(rnd.randint(0, 3000)):
        k = rnd.random()
        if k < 0.2:
            rows.append(None)
        else:
            row = [rnd.choice(values) for _ in range(width + rnd.randint(0, 3))]
            rows.append(row if k < 0.3 else tuple(row))
    select = rnd.sample(range(width), rnd.randint(0, width))
    compiled, python = _both(monkeypatch, rows, select)
    assert list(compiled) == list(python) == select
    for idx in select:
        assert all(a is b for a, b in zip(compiled[idx], python[idx], strict=True))
        assert len(compiled[idx]) == len(rows)


@pytest.mark.parametrize("short", [(1, 2), [1, 2]])
def test_short_rows_are_a_protocol_error_naming_the_column(monkeypatch, short):
    rows = [(1, 2, 3, 4), None, short, (5, 6, 7, 8)]
    for transpose in (table_sink._transpose, None):
        monkeypatch.setattr(table_sink, "_transpose", transpose)
        with pytest.raises(ProtocolError, match=r"t/part-0.parquet: .*fewer columns.*column index 3"):
            _Sink([0, 3]).columns(rows)
