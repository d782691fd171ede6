"""Parts written ahead (``BatchWriter.write_ahead``: snapshot chunks encoded while the next ones are
read) and the constant envelope arrays every piece shares (``table_sink.repeat_value``)."""

from __future__ import annotations

import decimal
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_cdc.core import table_sink
from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.core.table_sink import repeat_value
from tests.unit.core.test_batch import _pos, open_sink, table_info

TABLE = "public.t"


def _ahead(w: BatchWriter, keys: range, delay: float = 0.0, fail: bool = False) -> Any:
    """A part of rows ``keys`` written ahead (after ``delay`` seconds; raising if ``fail``)."""
    sink = open_sink(w, "snapshot", TABLE, ahead=True)

    def write(s: Any) -> None:
        time.sleep(delay)
        if fail:
            raise ValueError("a value the table cannot hold")
        texts = [pa.array([str(k) for k in keys]), pa.array([f"v{k}" for k in keys])]
        s.write_columnar("r", texts, _pos(keys[0]), (keys[0],))

    return w.write_ahead(TABLE, table_info(TABLE), sink, write)


def _ids(path: Any) -> list[int]:
    return sorted(r["after"]["id"] for piece in Batch(path).iter_events(TABLE) for r in piece.to_pylist())


def _files(path: Any) -> set[str]:
    return {p.name for p in Path(path).rglob("*.parquet")}


def test_kept_parts_join_the_batch_others_leave_no_file(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path, "conn")
    stream = open_sink(w, "changes")
    stream.append("c", None, ("1000", "s"), _pos(1000), (1000,))
    kept, dropped, never = _ahead(w, range(0, 10)), _ahead(w, range(10, 20)), _ahead(w, range(20, 30))
    assert w.keep(kept) is True
    w.drop(dropped)
    stream.append("c", None, ("1001", "s"), _pos(1001), (1001,))  # the open part stayed open
    path = w.finish({})
    assert _ids(path) == [*range(0, 10), 1000, 1001]
    parts = Batch(path).manifest["tables"][TABLE]["parts"]
    assert sorted(p["kind"] for p in parts) == ["changes", "snapshot"]
    assert _files(path) == {Path(p["file"]).name for p in parts}
    assert never.rel_path != kept.rel_path != dropped.rel_path


def test_a_failed_write_ahead_is_dropped_and_the_caller_told(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path, "conn")
    failed = _ahead(w, range(0, 5), delay=0.05, fail=True)
    assert w.keep(failed) is False
    assert not (w.area / failed.rel_path).exists()
    path = w.finish({})
    assert Batch(path).tables() == [] and _files(path) == set()


def test_abort_waits_for_writes_ahead_and_leaves_nothing(tmp_path: Path) -> None:
    w = BatchWriter(tmp_path, "conn")
    for k in range(3):
        _ahead(w, range(k * 10, k * 10 + 10), delay=0.1)
    w.abort()
    time.sleep(0.2)
    assert list(tmp_path.rglob("*.parquet")) == []


def test_parts_written_ahead_from_many_threads(tmp_path: Path) -> None:
    """Reader threads start parts side by side: each gets a part of its own."""
    w = BatchWriter(tmp_path, "conn")
    started: list[Any] = []
    lock = threading.Lock()

    def reader(r: int) -> None:
        for k in range(5):
            part = _ahead(w, range(r * 100 + k * 10, r * 100 + k * 10 + 10))
            with lock:
                started.append(part)

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({p.rel_path for p in started}) == 30
    assert all(w.keep(p) for p in started)
    path = w.finish({})
    assert _ids(path) == sorted(r * 100 + k for r in range(6) for k in range(50))
    assert len(Batch(path).manifest["tables"][TABLE]["parts"]) == 30


CASES = [
    (b"x" * 24, pa.binary()),
    (b"", pa.binary()),
    (b"\xff\x00", pa.binary()),
    ("", pa.string()),
    ("héllo", pa.string()),
    ("r", pa.large_string()),
    (5, pa.int64()),
    (-7, pa.int32()),
    (2**63 - 1, pa.int64()),
    (3, pa.int8()),
    (1.5, pa.float64()),
    (True, pa.bool_()),
    (None, pa.int64()),
    (None, pa.struct([pa.field("a", pa.int64())])),
    (decimal.Decimal("1.50"), pa.decimal128(5, 2)),
]


@pytest.mark.parametrize(("value", "type_"), CASES, ids=[f"{t}-{i}" for i, (_, t) in enumerate(CASES)])
@pytest.mark.parametrize("n", [0, 1, 3, 131_072])
def test_repeat_value_is_pa_repeat(value: Any, type_: pa.DataType, n: int) -> None:
    got = repeat_value(value, type_, n)
    got.validate(full=True)
    assert got.type == type_ and got.equals(pa.repeat(pa.scalar(value, type_), n))


def test_kept_constants_are_sliced_bounded_and_keep_field_metadata() -> None:
    kept = table_sink._Constants(max_bytes=8 << 20)
    a = kept.get("postgresql", pa.string(), 1000)
    b = kept.get("postgresql", pa.string(), 10)
    assert b.equals(pa.repeat(pa.scalar("postgresql", pa.string()), 10))
    assert b.buffers()[2].address == a.buffers()[2].address  # the same buffers, sliced
    longer = kept.get("postgresql", pa.string(), 5000)  # longer than kept: built anew
    assert len(longer) == 5000 and longer.equals(pa.repeat(pa.scalar("postgresql", pa.string()), 5000))
    # types equal without their fields' metadata are told apart by it
    one = pa.struct([pa.field("k", pa.int64(), metadata={"pg.type": "int8"})])
    two = pa.struct([pa.field("k", pa.int64(), metadata={"pg.type": "bigint"})])
    assert kept.get(None, one, 4).type.field(0).metadata == {b"pg.type": b"int8"}
    assert kept.get(None, two, 4).type.field(0).metadata == {b"pg.type": b"bigint"}
    # beyond the bound the least recently used go
    for i in range(200):
        kept.get(i, pa.int64(), 65_536)
    assert kept._bytes <= kept.max_bytes
    assert (pa.int64(), 199) in kept._arrays and (pa.int64(), 0) not in kept._arrays
    # a value no dictionary holds is built each time
    assert kept.get([1, 2], pa.list_(pa.int64()), 2).to_pylist() == [[1, 2], [1, 2]]


def test_every_staged_file_is_fsynced_once_before_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts are fsynced when closed (parts written ahead by their writer thread), the rest by
    ``finish``: each file once, all before the batch is published."""
    synced: list[tuple[str, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name))

    monkeypatch.setattr(os, "fsync", fsync)
    w = BatchWriter(tmp_path, "conn")
    stream = open_sink(w, "changes")
    stream.append("c", None, ("1", "s"), _pos(1), (1,))
    snap = open_sink(w, "snapshot", table="public.u")
    snap.write_columnar("r", [pa.array(["2"]), pa.array(["x"])], _pos(2), (2,))
    assert w.keep(_ahead(w, range(3, 9)))
    w.drop(_ahead(w, range(10, 12)))
    path = w.finish({})
    files = sorted(str(p) for p in Path(path).rglob("*.parquet"))
    assert len(files) == 3
    tail = lambda name: Path(name).parts[-2:]  # noqa: E731 - table directory and file name
    by_file = {f: [t for name, t in synced if tail(name) == tail(f)] for f in files}
    assert all(len(threads) == 1 for threads in by_file.values()), by_file
    writer_threads = [t for threads in by_file.values() for t in threads if t.startswith("parquet-write")]
    assert writer_threads  # the part written ahead (a snapshot part too if its last write was running)
