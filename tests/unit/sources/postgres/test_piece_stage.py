"""The window's helper threads: pieces handed over (PieceStage) and row groups written in the
background, in order, with errors raised in the reading thread and no thread left behind."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.sources.postgres import columnar
from airflow_cdc.sources.postgres import stream as stream_mod
from airflow_cdc.sources.postgres.columnar import PieceStage
from airflow_cdc.sources.postgres.stream import WindowReader

from .test_columnar import _relation_state, capture, needs_native, window

HELPERS = ("airflow-cdc-pieces", "parquet-write")
_before: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before():
    """The threads alive before the test (another test in this process may have left a
    process-wide writer, e.g. the MySQL hand-over's, idle): only the test's own count."""
    _before.clear()
    _before.update(threading.enumerate())
    yield


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(HELPERS) and t not in _before]


def test_stage_runs_work_in_order_on_its_thread() -> None:
    stage, seen = PieceStage(depth=2), []
    for i in range(20):
        stage.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    stage.sync()
    assert seen == [(i, "airflow-cdc-pieces") for i in range(20)]
    stage.stop()
    assert not _helpers()


def test_stage_error_is_raised_by_sync_and_submit_and_later_work_is_skipped() -> None:
    stage, seen = PieceStage(depth=1), []

    def fail() -> None:
        raise OSError("disk full")

    stage.submit(lambda: seen.append(1))
    stage.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        for i in range(2, 10):
            stage.submit(lambda i=i: seen.append(i))
            stage.sync()
    with pytest.raises(OSError, match="disk full"):
        stage.sync()
    stage.stop()  # returns: the thread skips what is left
    assert seen == [1]
    assert not _helpers()


def test_stage_keeps_at_most_depth_items_waiting() -> None:
    stage, release, started = PieceStage(depth=2), threading.Event(), threading.Event()

    def block() -> None:
        started.set()
        release.wait(10)

    stage.submit(block)
    started.wait(10)
    stage.submit(lambda: None)
    stage.submit(lambda: None)  # the queue is now full: the next submit waits
    submitted = threading.Event()
    waiter = threading.Thread(target=lambda: (stage.submit(lambda: None), submitted.set()))
    waiter.start()
    time.sleep(0.2)
    assert not submitted.is_set()
    release.set()
    waiter.join(10)
    assert submitted.is_set()
    stage.sync()
    stage.stop()


@dataclass
class FakeStream:
    """What :meth:`WindowReader.read_stream` reads: batches of ``(lsn, data)`` and the bounds."""

    rows: list
    fetch: int = 5
    from_lsn: int = 300
    upto_lsn: int = 1000
    bounded: bool = False

    def batches(self):
        for start in range(0, len(self.rows), self.fetch):
            yield self.rows[start:start + self.fetch]


def _read(tmp_path, monkeypatch, rows, piece_rows: int = 4):
    monkeypatch.setenv(columnar.DECODER_ENV, "native")
    writer = BatchWriter(tmp_path / "out", "t", piece_rows=piece_rows)
    reader = WindowReader(_relation_state, writer, None, frozenset(), False, lambda p: True, "t", "db")
    try:
        res = reader.read_stream(FakeStream(rows))
    except BaseException:
        writer.abort()
        raise
    return Batch(writer.finish({})), res, reader


@needs_native
def test_window_read_through_the_helper_threads_equals_the_python_path(tmp_path, monkeypatch) -> None:
    rows = window()
    batch, res, reader = _read(tmp_path, monkeypatch, rows)
    assert not _helpers()  # both helpers are gone once the window is read
    assert all(rs.sink is None or rs.sink.writes is None for rs in reader.rels.values())
    python = capture(tmp_path, monkeypatch, rows, False)
    for table in ("public.orders", "public.items"):
        got = [t.drop_columns(["ts_ms", "ts_us", "ts_ns"]).to_pylist() for t in _tables(batch, table)]
        assert got == [t.to_pylist() for t in python[table]]
    assert {t: batch.table_info(t)["parts"] for t in batch.tables()} == python["manifest"]
    truncates = sum(ops.get("t", 0) for ops in res.per_table.values())
    assert res.events - truncates == python["result"][2]  # the reader's counter omits truncates


def _tables(batch: Batch, table: str) -> list:
    return [pq.read_table(p) for p in batch.parts(table)]


@needs_native
def test_a_failed_piece_hand_over_fails_the_window_without_a_thread_left(tmp_path, monkeypatch) -> None:
    calls = {"n": 0}
    real = stream_mod.to_piece

    def flaky(taken):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("no space left on device")
        return real(taken)

    monkeypatch.setattr(stream_mod, "to_piece", flaky)
    with pytest.raises(OSError, match="no space left"):
        _read(tmp_path, monkeypatch, window(), piece_rows=1)
    assert calls["n"] == 2  # nothing after the failed piece was handed over
    assert not _helpers()
    assert not list((tmp_path / "out").rglob("*.parquet"))  # aborted: nothing published
