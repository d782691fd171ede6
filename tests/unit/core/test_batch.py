"""Staged batches: write/read round trip, abort, incomplete directories, verification."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_cdc.core.batch import Batch, BatchWriter, clean_incomplete, list_batches
from airflow_cdc.core.errors import BatchError
from airflow_cdc.core.table_sink import SourceLayout


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


def _write(tmp_path, piece_rows=16):
    w = BatchWriter(tmp_path, "conn", piece_rows=piece_rows)
    sink = w.sink(
        "public.t",
        {"schema": "public", "table": "t", "key_columns": ["id"]},
        [IntCodec("id"), TextCodec("v")],
        [0, 1],
        LAYOUT,
        "changes",
        "v1",
    )
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


def test_clean_incomplete(tmp_path):
    done = _write(tmp_path).finish({})
    _write(tmp_path)  # never finished: a crashed capture
    root = tmp_path / "conn" / "batches"
    assert len([p for p in root.iterdir() if p.name.startswith(".inprogress-")]) == 1
    assert [b.batch_id for b in list_batches(tmp_path, "conn")] == [done.name]
    assert clean_incomplete(tmp_path, "conn") == 1
    assert [p.name for p in root.iterdir()] == [done.name]
    assert clean_incomplete(tmp_path, "conn") == 0
    assert clean_incomplete(tmp_path / "nowhere", "conn") == 0


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
