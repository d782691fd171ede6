"""Bounded memory without Spark: staged row groups and pieces by bytes, legacy parts copied into
small row groups, default settings scaled to the machine, out-of-memory reported as such."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.apply.submit import apply_exit_error, build_apply_job, launch_defaults
from airflow_cdc.apply.verify import chunk_rows
from airflow_cdc.cli import _spark_conf, parser
from airflow_cdc.core import table_sink
from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.core.errors import ApplyFailed, ConfigError
from spark_jobs.cdc_apply import rechunk
from spark_jobs.cdc_apply.layout import default_driver_memory
from spark_jobs.cdc_apply.staged import StagedBatch, row_bytes
from tests.unit.core.test_batch import _pos, open_sink

KB = 1024


def _recording_sink(w: BatchWriter) -> tuple[Any, list[int]]:
    """``public.t``'s sink of ``w``, and the list its flushes append their piece sizes to."""
    sink, pieces = open_sink(w), []
    original = sink.flush

    def flush() -> None:
        pieces.append(sink.buffered)
        original()

    sink.flush = flush  # type: ignore[method-assign]
    return sink, pieces


def _wide_batch(tmp_path: Path, rows: int, width: int, piece_rows: int = 65_536) -> tuple[BatchWriter, Path]:
    w = BatchWriter(tmp_path, "conn", piece_rows=piece_rows)
    sink, pieces = _recording_sink(w)
    for i in range(rows):
        value = (f"{i:07d}-" * (width // 8 + 1))[:width]  # distinct: no dictionary encoding
        sink.append("c", None, (str(i), value), _pos(i), (i,))
    w._pieces = pieces  # type: ignore[attr-defined]
    return w, w.finish({})


def _groups(batch: Path) -> list[tuple[int, int]]:
    part = next(batch.rglob("part-*.parquet"))
    meta = pq.read_metadata(part)
    return [
        (meta.row_group(i).num_rows, meta.row_group(i).total_byte_size) for i in range(meta.num_row_groups)
    ]


def test_wide_rows_make_small_row_groups_and_pieces(tmp_path):
    w, path = _wide_batch(tmp_path, 1_000, 100 * KB)
    groups = _groups(path)
    assert sum(n for n, _ in groups) == 1_000
    assert max(size for _, size in groups) <= table_sink.ROW_GROUP_BYTES * 1.1
    # the Python buffer ends a piece at about PIECE_BYTES (sampled every 64 events)
    assert max(w._pieces) <= table_sink.PIECE_BYTES // (100 * KB) + 64
    rows = [r for rb in Batch(path).iter_events("public.t") for r in rb.to_pylist()]
    assert [r["after"]["id"] for r in rows] == list(range(1_000)) and len(rows[7]["after"]["v"]) == 100 * KB


def test_narrow_rows_keep_whole_pieces(tmp_path):
    _, path = _wide_batch(tmp_path / "a", 3_000, 10, piece_rows=1_000)
    assert [n for n, _ in _groups(path)] == [1_000, 1_000, 1_000]


def test_row_group_rows_by_bytes():
    table = pa.table({"v": ["x" * 1000] * 100})
    assert table_sink.row_group_rows(table, limit=10_000) in (9, 10)
    assert table_sink.row_group_rows(table, limit=10**9) == 100
    assert table_sink.row_group_rows(table.slice(0, 0)) == 1


def _legacy_part(tmp_path: Path) -> Path:
    """A batch as staged before parts were cut by bytes: one row group of every event."""
    path = _wide_batch(tmp_path, 300, 10 * KB)[1]
    part = next(path.rglob("part-*.parquet"))
    table = pq.read_table(part)
    pq.write_table(table, part, row_group_size=table.num_rows)
    return path


def test_legacy_oversized_parts_are_read_from_small_copies(tmp_path):
    path = _legacy_part(tmp_path)
    staged = StagedBatch(str(path))
    tables = staged.tables()
    original = tables[0].groups[0].files[0]
    assert row_bytes(staged.footer(original)) > 10 * KB
    scratch = rechunk.scratch_dir(str(tmp_path / "lake"), staged)
    copies = rechunk.copy_oversized(staged, tables, scratch, limit=1 << 20, row_group_bytes=256 * KB)
    assert copies == tables[0].groups[0].files and copies[0].startswith(scratch)
    copy = pq.ParquetFile(copies[0])
    assert copy.metadata.num_row_groups >= 10
    assert (
        max(copy.metadata.row_group(i).total_byte_size for i in range(copy.metadata.num_row_groups))
        < 300 * KB
    )
    assert copy.schema_arrow == pq.read_schema(original)  # field metadata (Connect types) kept
    assert copy.read().equals(pq.read_table(original))
    assert Path(original).exists(), "the published batch is never changed"
    again = rechunk.copy_oversized(staged, staged.tables(), scratch, limit=1 << 20)
    assert again == copies  # a re-run rewrites the same copies
    rechunk.remove(scratch)
    assert not Path(scratch).exists()
    rechunk.remove(scratch)  # nothing left: no error


def test_parts_within_the_limit_are_not_copied(tmp_path):
    path = _legacy_part(tmp_path)
    staged = StagedBatch(str(path))
    assert rechunk.copy_oversized(staged, staged.tables(), str(tmp_path / "s")) == []


@pytest.mark.parametrize("code", [6, 52])
def test_out_of_memory_is_not_a_damaged_batch(code):
    err = apply_exit_error(code, "b1")
    assert type(err) is ApplyFailed and "out of memory" in str(err) and "damaged" not in str(err)
    assert "spark.driver.memory" in err.hint and "re-run apply for batch b1" in err.hint


def test_launch_defaults_size_the_driver_and_yield_to_the_user(tmp_path):
    assert default_driver_memory("yarn") == "2g"
    local = default_driver_memory("local[2]")
    assert local.endswith("g") and 1 <= int(local[:-1]) <= 4
    assert launch_defaults("local[2]")["spark.driver.memory"] == local
    assert launch_defaults("local[2]")["spark.ui.enabled"] == "false"
    assert "spark.ui.enabled" not in launch_defaults("spark://m:7077")
    call_sites = "spark.python.sql.dataFrameDebugging.enabled"  # a launch setting: every master
    assert launch_defaults("spark://m:7077")[call_sites] == launch_defaults("local[2]")[call_sites] == "false"
    batch = _wide_batch(tmp_path, 3, 10)[1]
    conf = {"spark.driver.memory": "512m", call_sites: "true"}
    job = build_apply_job(batch, str(tmp_path / "lake"), conf=conf)
    assert job.conf["spark.driver.memory"] == "512m" and job.conf[call_sites] == "true"
    assert "spark.sql.extensions" in job.conf
    assert "--conf" in job.command() and "spark.driver.memory=512m" in job.command()


def test_runtime_defaults_scale_with_cores_and_heap():
    pytest.importorskip("pyspark")
    from spark_jobs.cdc_apply.session import runtime_defaults

    small = runtime_defaults(2, 512 << 20)
    assert small["spark.sql.shuffle.partitions"] == "4"
    assert small["spark.databricks.delta.snapshotPartitions"] == "2"
    assert int(small["parquet.block.size"]) == 32 << 20
    assert int(small["spark.sql.autoBroadcastJoinThreshold"]) == 8 << 20
    big = runtime_defaults(16, 64 << 30)
    assert big["spark.sql.shuffle.partitions"] == "32" and int(big["parquet.block.size"]) == 128 << 20
    assert "parquet.block.size" not in runtime_defaults(8, None)


def test_cli_spark_conf():
    args = parser().parse_args(
        ["apply", "--config", "p.yaml", "--conf", "spark.driver.memory=8g", "--conf", "a.b=x=y"]
    )
    assert _spark_conf(args) == {"spark.driver.memory": "8g", "a.b": "x=y"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        _spark_conf(parser().parse_args(["verify", "--config", "p", "--conf", "nonsense"]))


class _Source:
    kind = "fake"

    def __init__(self, width: int, rows: int = 1000) -> None:
        self.width, self.rows, self.closed = width, rows, 0

    def encoded_chunks(self, table: str, chunk: int):
        try:
            for lo in range(0, self.rows, chunk):
                n = min(chunk, self.rows - lo)
                yield pa.table({"id": list(range(lo, lo + n)), "v": ["x" * self.width] * n})
        finally:
            self.closed += 1


def test_verify_chunks_by_bytes():
    wide = _Source(100 * KB)
    assert 600 <= chunk_rows(wide, "t", 50_000, 64 << 20) <= 660 and wide.closed == 1
    assert chunk_rows(_Source(10), "t", 50_000, 64 << 20) == 50_000
    assert chunk_rows(_Source(10, rows=0), "t", 7, 64 << 20) == 7
    assert chunk_rows(_Source(1 << 20, rows=20), "t", 50_000, 1 << 20) == 16


def test_job_recognises_out_of_memory():
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark_jobs"))
    from spark_jobs.apply_changes import _out_of_memory

    try:
        try:
            raise RuntimeError("An error occurred ... java.lang.OutOfMemoryError: Java heap space")
        except RuntimeError as inner:
            raise ValueError("job aborted") from inner
    except ValueError as e:
        assert _out_of_memory(e)
    assert not _out_of_memory(ValueError("file is not a parquet file"))


def test_local_runs_keep_spark_at_warn_unless_the_user_says_otherwise(tmp_path):
    option = launch_defaults("local[2]")["spark.driver.extraJavaOptions"]
    assert option.startswith("-Dlog4j2.configurationFile=file:")
    properties = Path(option.split("file:", 1)[1]).read_text()
    assert "rootLogger.level = warn" in properties
    assert "spark.driver.extraJavaOptions" not in launch_defaults("spark://m:7077")  # the cluster's own
    batch = _wide_batch(tmp_path, 3, 10)[1]
    mine = "-Dlog4j2.configurationFile=file:/etc/spark/log4j2.properties"
    job = build_apply_job(batch, str(tmp_path / "lake"), conf={"spark.driver.extraJavaOptions": mine})
    assert job.conf["spark.driver.extraJavaOptions"] == mine


@pytest.mark.parametrize("width", [10, 3 * KB, 100 * KB])
@pytest.mark.parametrize("piece_rows", [1, 63, 64, 1_000])
def test_add_many_ends_pieces_where_add_does(tmp_path, width, piece_rows):
    """Events handed over in lists (the compiled MySQL reader: one list per rows event) make the
    same pieces and the same rows as one event at a time, whatever the list sizes."""
    import random

    rnd = random.Random(width + piece_rows)
    events = [
        ("c", None, (str(i), (f"{i:07d}-" * (width // 8 + 1))[: rnd.choice([width, width // 3, 1])]), _pos(i), (i,), None)
        for i in range(1_500)
    ]
    pieces: dict[str, list[int]] = {}
    paths = {}
    for how in ("one", "many"):
        w = BatchWriter(tmp_path / how, "conn", piece_rows=piece_rows)
        sink, pieces[how] = _recording_sink(w)
        if how == "one":
            for e in events:
                sink.add(e)
        else:
            i = 0
            while i < len(events):
                n = rnd.choice([0, 1, 2, 63, 64, 65, 200, 1_500])
                sink.add_many(events[i : i + n])
                i += n
        paths[how] = w.finish({})
    assert pieces["one"] == pieces["many"] and sum(pieces["many"]) == 1_500
    rows = {how: [r for rb in Batch(p).iter_events("public.t") for r in rb.to_pylist()] for how, p in paths.items()}
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith("ts_")}  # noqa: E731
    assert [strip(r) for r in rows["one"]] == [strip(r) for r in rows["many"]]
