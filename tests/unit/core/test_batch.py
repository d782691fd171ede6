"""Staged batches: write/read round trip, abort, incomplete directories, verification."""

from __future__ import annotations

import operator
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core import table_sink
from airflow_cdc.core.batch import Batch, BatchWriter, clean_incomplete, list_batches
from airflow_cdc.core.errors import BatchError
from airflow_cdc.core.lease import pid_namespace
from airflow_cdc.core.table_sink import BackgroundWrites, SnapshotSinks, SourceLayout


class IntCodec:
    def __init__(self, name):
        self.field = pa.field(name, pa.int64())
        self.placeholder = None

    def convert(self, text):
        return pc.cast(text, pa.int64())


class TextCodec:
    def __init__(self, name):
        self.field = pa.field(name, pa.string())
        self.placeholder = None

    def convert(self, text):
        return text


LAYOUT = SourceLayout(
    pa.struct([pa.field("db", pa.string()), pa.field("lsn", pa.int64())]), {"db": "d"}, ("lsn",)
)


def _pos(n):
    return n.to_bytes(8, "big") + (0).to_bytes(8, "big")


def open_sink(w: BatchWriter, kind: str = "changes", table: str = "public.t", ahead: bool = False):
    """The sink of the two-column test table ``public.t`` (id, v) of ``w`` (``ahead``: a part for
    :meth:`BatchWriter.write_ahead`)."""
    return w.sink(
        table,
        table_info(table),
        [IntCodec("id"), TextCodec("v")],
        [0, 1],
        LAYOUT,
        kind,
        "v1",
        ahead=ahead,
    )


def table_info(table: str = "public.t") -> dict:
    return {"schema": "public", "table": table.split(".")[1], "key_columns": ["id"]}


def _write(tmp_path, piece_rows=16, owner=None):
    w = BatchWriter(tmp_path, "conn", piece_rows=piece_rows, owner=owner)
    sink = open_sink(w)
    for i in range(40):
        sink.append("c", None, (str(i), f"v{i}"), _pos(i), (i,))
    sink.append("d", (str(0), None), None, _pos(100), (100,))
    return w


def test_round_trip(tmp_path):
    w = _write(tmp_path)
    path = w.finish({"to_offset": {"lsn": "0/10"}, "state_after": {"x": 1}})
    b = Batch(path)
    assert b.batch_id == w.batch_id and b.tables() == ["public.t"]
    assert b.manifest["to_offset"] == {"lsn": "0/10"} and b.manifest["state_after"] == {"x": 1}
    info = b.table_info("public.t")
    assert info["key_columns"] == ["id"] and info["rows"] == 41
    assert info["parts"][0]["ops"] == {"c": 40, "d": 1}
    rows = [r for rb in b.iter_events("public.t", batch_rows=7) for r in rb.to_pylist()]
    assert [r["op"] for r in rows] == ["c"] * 40 + ["d"]
    assert rows[5]["after"] == {"id": 5, "v": "v5"} and rows[5]["before"] is None
    assert rows[-1]["before"] == {"id": 0, "v": None} and rows[-1]["after"] is None
    assert rows[3]["source"] == {"db": "d", "lsn": 3} and rows[3]["__position"] == _pos(3)
    b.verify()
    assert [x.batch_id for x in list_batches(tmp_path, "conn")] == [w.batch_id]
    assert not any(p.name.startswith(".inprogress") for p in path.parent.iterdir())


def test_abort_leaves_nothing(tmp_path):
    w = _write(tmp_path)
    w.abort()
    root = tmp_path / "conn" / "batches"
    assert list(root.iterdir()) == []
    assert list_batches(tmp_path, "conn") == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid no longer exists
    return proc.pid


def test_clean_incomplete_removes_only_dead_writers(tmp_path):
    done = _write(tmp_path).finish({})
    here = {"host": socket.gethostname(), "pidns": pid_namespace()}
    dead = _write(tmp_path, owner={**here, "pid": _dead_pid(), "token": 1})  # a SIGKILLed capture
    live = _write(tmp_path, owner={**here, "pid": os.getpid(), "token": 2})  # a capture still running
    # same host name, another pid space (a container named like the host): its pid proves nothing
    foreign = _write(tmp_path, owner={"host": here["host"], "pidns": "other", "pid": _dead_pid(), "token": 3})
    other_old = _write(tmp_path, owner={"host": "elsewhere", "pid": 1, "token": 1})
    other_new = _write(tmp_path, owner={"host": "elsewhere", "pid": 1, "token": 3})
    root = tmp_path / "conn" / "batches"
    assert len([p for p in root.iterdir() if p.name.startswith(".inprogress-")]) == 5
    assert [b.batch_id for b in list_batches(tmp_path, "conn")] == [done.name]
    # holding lease token 3: the other host's token-1 writer lost its lease; token 3 is ours
    assert clean_incomplete(tmp_path, "conn", token=3) == 2
    assert not dead.tmp.exists() and not other_old.tmp.exists()
    assert live.tmp.exists() and other_new.tmp.exists() and foreign.tmp.exists()
    assert live.finish({}).exists()  # the live capture's batch was left intact and publishes
    assert clean_incomplete(tmp_path, "conn", token=3) == 0
    assert clean_incomplete(tmp_path / "nowhere", "conn") == 0


def test_clean_incomplete_ownerless_directories_after_grace(tmp_path):
    w = _write(tmp_path)
    (w.tmp / "owner.json").unlink()  # a crash before the owner was recorded
    assert clean_incomplete(tmp_path, "conn", grace=3600) == 0
    assert clean_incomplete(tmp_path, "conn", grace=0) == 1


def test_staged_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        staging = tmp_path / "staging"
        done = Path(_write(staging).finish({}))
        pending = _write(staging)
    finally:
        os.umask(old)
    for d in (staging, staging / "conn", staging / "conn" / "batches", done, pending.tmp):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    inside = list(done.rglob("*"))
    assert any(p.suffix == ".parquet" for p in inside) and (done / "manifest.json") in inside
    assert not (done / "owner.json").exists()
    for p in inside:
        assert stat.S_IMODE(os.stat(p).st_mode) == (0o700 if p.is_dir() else 0o600), p


def test_verify_detects_missing_file(tmp_path):
    path = _write(tmp_path).finish({})
    b = Batch(path)
    part = b.parts("public.t")[0]
    part.unlink()
    with pytest.raises(BatchError, match=r"tables/public\.t/part-00000\.parquet is missing"):
        b.verify()


def test_incomplete_or_foreign_directory_is_not_a_batch(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(BatchError, match="no manifest.json"):
        Batch(tmp_path / "x")
    (tmp_path / "x" / "manifest.json").write_text("{")
    with pytest.raises(BatchError, match="not valid JSON"):
        Batch(tmp_path / "x")
    (tmp_path / "x" / "manifest.json").write_text('{"format": 99}')
    with pytest.raises(BatchError, match="unsupported format 99"):
        Batch(tmp_path / "x")


def test_empty_table_part_is_dropped(tmp_path):
    w = BatchWriter(tmp_path, "conn")
    w.sink("public.e", {"key_columns": ["id"]}, [IntCodec("id")], [0], LAYOUT, "changes", "v1")
    b = Batch(w.finish({}))
    assert b.tables() == []
    assert not (b.path / "tables" / "public.e" / "part-00000.parquet").exists()


def _snapshot_rows(sinks, pieces):
    for i in range(pieces):
        for k, sink in enumerate(sinks):
            ids = pa.array([str(i * 1000 + j + k) for j in range(50 + i)])
            sink.write_columnar("r", [ids, pc.binary_join_element_wise(ids, "x", "")], _pos(i), (i,))


def test_snapshot_parts_written_in_the_background_equal_parts_written_inline(tmp_path):
    """Snapshot parts encode their row groups on the writer's threads, two tables side by side:
    the files hold the same rows in the same row groups as when written in the caller's thread."""
    files = {}
    for background in (True, False):
        w = BatchWriter(tmp_path / str(background), "conn")
        sinks = [open_sink(w, "snapshot", t) for t in ("public.t", "public.u")]
        for sink in sinks:
            assert sink.writes is not None
            if not background:
                sink.writes = None
        _snapshot_rows(sinks, 12)
        b = Batch(w.finish({}))
        files[background] = [pq.ParquetFile(b.path / b.table_info(t)["parts"][0]["file"]) for t in b.tables()]
        assert [b.table_info(t)["rows"] for t in b.tables()] == [sum(range(50, 62))] * 2
    for got, want in zip(files[True], files[False], strict=True):
        assert got.metadata.num_row_groups == want.metadata.num_row_groups == 12
        assert (
            got.read().drop(["ts_ms", "ts_us", "ts_ns"]).equals(want.read().drop(["ts_ms", "ts_us", "ts_ns"]))
        )


def test_a_failed_background_write_fails_the_batch(tmp_path, monkeypatch):
    """A row group the writer thread could not write surfaces when the part closes: the batch is
    not published and its directory is removed on abort."""
    w = BatchWriter(tmp_path, "conn")
    sink = open_sink(w, "snapshot")
    real, calls = sink._writer.write_table, []

    def fail_second(table, **kw):
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise OSError("disk full")
        real(table, **kw)

    monkeypatch.setattr(sink._writer, "write_table", fail_second)
    with pytest.raises(OSError, match="disk full"):
        _snapshot_rows([sink], 1)
        _snapshot_rows([sink], 1)
        w.finish({})  # closing the part waits for the failed write
    w.abort()
    assert calls == [50, 50] and list_batches(tmp_path, "conn") == []
    assert list((tmp_path / "conn" / "batches").iterdir()) == []


class _State:
    """What :class:`SnapshotSinks` needs of a table state: the test table ``public.t``."""

    name, signature = "public.t", "v1"

    def open_sink(self, writer, kind):
        return open_sink(writer, kind)


def _rotated_batch(tmp_path, monkeypatch, fail_write=None):
    """12 chunks of ``public.t`` (50..61 rows) through :class:`SnapshotSinks` with parts rotated
    at 120 rows; ``fail_write``: the n-th row-group write (over all parts) raises."""
    monkeypatch.setenv(table_sink.PART_ROWS_ENV, "120")
    w, sinks, calls = BatchWriter(tmp_path, "conn"), SnapshotSinks(), []
    for i in range(12):
        sink = sinks.get(w, _State())
        if fail_write is not None and not hasattr(sink._writer, "_wrapped"):
            real = sink._writer.write_table

            def write(table, _real=real, **kw):
                calls.append(table.num_rows)
                if len(calls) == fail_write:
                    raise OSError("disk full")
                _real(table, **kw)

            monkeypatch.setattr(sink._writer, "write_table", write)
            sink._writer._wrapped = True
        ids = pa.array([str(i * 1000 + j) for j in range(50 + i)])
        sink.write_columnar("r", [ids, pc.binary_join_element_wise(ids, "x", "")], _pos(i), (i,))
    return w, calls


def test_large_snapshot_parts_rotate_and_close_on_the_writer_threads(tmp_path, monkeypatch):
    """A table's snapshot rows beyond ROTATE_ROWS go to a new part while a writer thread finishes
    and closes the previous one: the batch lists every part, in the order they were opened, each
    closed and complete, and together they hold every row once."""
    w, _ = _rotated_batch(tmp_path, monkeypatch)
    b = Batch(w.finish({}))
    parts = b.table_info("public.t")["parts"]
    # chunks of 50, 51, ... rows: a part reaches 120 rows with its third chunk; 12 chunks fill 4
    assert [p["file"] for p in parts] == [f"tables/public.t/part-{n:05d}.parquet" for n in range(4)]
    assert [p["rows"] for p in parts] == [153, 162, 171, 180]
    ids = []
    for p in parts:
        data = pq.read_table(b.path / p["file"])
        assert p["rows"] == data.num_rows and p["ops"] == {"r": data.num_rows}
        ids += data.column("after").combine_chunks().field("id").to_pylist()
    assert sorted(ids) == sorted(i * 1000 + j for i in range(12) for j in range(50 + i))


def test_a_failed_write_of_a_part_closed_on_a_writer_thread_fails_the_batch(tmp_path, monkeypatch):
    """The last row group of a rotated part failed on the writer thread that closes it: the batch
    does not publish (the error is raised when the parts are settled) and abort removes it all."""
    w, calls = _rotated_batch(tmp_path, monkeypatch, fail_write=3)  # part 0's third chunk
    with pytest.raises(OSError, match="disk full"):
        w.finish({})
    w.abort()
    assert len(calls) >= 3 and list_batches(tmp_path, "conn") == []
    assert list((tmp_path / "conn" / "batches").iterdir()) == []


def test_background_writes_hold_at_most_their_bound():
    """A writer handing over rows blocks while ``most`` writes are outstanding (bounded memory),
    and goes on once one completes; a write's error is its future's."""
    writes, gate, handed = BackgroundWrites(threads=1, most=2), threading.Event(), []

    def hand_over():
        for i in range(3):
            writes.submit(gate.wait, 10)
            handed.append(i)

    producer = threading.Thread(target=hand_over)
    producer.start()
    producer.join(0.3)
    assert handed == [0, 1] and producer.is_alive()  # the third waits for a free slot
    gate.set()
    producer.join(10)
    assert handed == [0, 1, 2]
    failed = writes.submit(operator.truediv, 1, 0)
    with pytest.raises(ZeroDivisionError):
        failed.result()
    held = threading.Event()
    second = threading.Thread(target=lambda: [writes.submit(held.wait, 10) for _ in range(2)])
    second.start()
    second.join(2)
    assert not second.is_alive()  # both slots free again: the failed write gave its slot back
    held.set()
    writes.shutdown()


def test_envelope_strings_handed_over_as_dictionaries_read_back_as_plain_strings(tmp_path, monkeypatch):
    """``op`` and the ``source`` strings reach the encoder as dictionary arrays (a snapshot
    chunk's one value unhashed, a change piece's values dictionary-encoded), yet the part is what
    it was: readers get the sink's plain schema (field and schema metadata included) from the
    ``ARROW:schema`` footer entry, the same Parquet columns, dictionary-encoded, and the values."""
    layout = SourceLayout(
        pa.struct(
            [
                pa.field("db", pa.string(), metadata={b"k": b"v"}),
                pa.field("snapshot", pa.string()),
                pa.field("sequence", pa.string()),
                pa.field("lsn", pa.int64()),
            ]
        ),
        {"db": "d"},
        ("snapshot", "sequence", "lsn"),
    )
    handed: list[pa.Table] = []
    write_table = pq.ParquetWriter.write_table

    def spy(self, table, *args, **kwargs):
        handed.append(table)
        return write_table(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", spy)
    w = BatchWriter(tmp_path, "conn", piece_rows=16)
    sinks = {}
    for kind, table in (("snapshot", "public.t"), ("changes", "public.u")):
        sinks[kind] = w.sink(
            table, table_info(table), [IntCodec("id"), TextCodec("v")], [0, 1], layout, kind, "v1"
        )
    ids = pa.array([str(i) for i in range(50)])
    sinks["snapshot"].write_columnar("r", [ids, ids], _pos(1), ("true", None, 7))
    for i in range(40):  # varying op and source strings, a NULL among them
        sinks["changes"].append(
            "cd"[i % 2], None, (str(i), f"v{i}"), _pos(i), (None if i == 3 else f"s{i % 3}", f"[{i}]", i)
        )
    b = Batch(w.finish({}))
    assert handed and all(t.schema.field("op").type == table_sink.DICTIONARY_STRING for t in handed)
    (snapshot_source,) = [t.column("source").chunk(0) for t in handed if t.num_rows == 50]
    assert snapshot_source.field("db").dictionary.to_pylist() == ["d"]  # one entry: nothing hashed
    assert snapshot_source.field("sequence").type == pa.string()  # distinct per event: no dictionary
    for kind, table in (("snapshot", "public.t"), ("changes", "public.u")):
        file = b.path / b.table_info(table)["parts"][0]["file"]
        schema = pq.read_schema(file)
        plain = tmp_path / f"{kind}.parquet"  # the sink's schema written as plain strings
        pq.write_table(sinks[kind].schema.empty_table(), plain)
        assert schema.equals(pq.read_schema(plain), check_metadata=True)
        assert schema.field("op").type == pa.string() and schema.field("source").type.field(
            "db"
        ).metadata == {b"k": b"v"}
        meta = pq.read_metadata(file)
        assert set(sinks[kind].schema.metadata or {}) <= set(meta.metadata)
        columns = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
        for path in ("op", "source.db", "source.snapshot"):
            chunk = meta.row_group(0).column(columns[path])
            assert chunk.physical_type == "BYTE_ARRAY" and chunk.has_dictionary_page, path
        assert not meta.row_group(0).column(columns["source.sequence"]).has_dictionary_page
    snap = pq.read_table(b.path / b.table_info("public.t")["parts"][0]["file"]).to_pylist()
    assert {r["op"] for r in snap} == {"r"} and len(snap) == 50
    assert {(r["source"]["db"], r["source"]["snapshot"], r["source"]["lsn"]) for r in snap} == {
        ("d", "true", 7)
    }
    changes = pq.read_table(b.path / b.table_info("public.u")["parts"][0]["file"]).to_pylist()
    assert [r["op"] for r in changes] == ["cd"[i % 2] for i in range(40)]
    assert [r["source"]["snapshot"] for r in changes] == [None if i == 3 else f"s{i % 3}" for i in range(40)]
    assert [r["source"]["sequence"] for r in changes] == [f"[{i}]" for i in range(40)]
