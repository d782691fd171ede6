"""The staging contract, one suite for every store: a local disk, S3 (s3proxy), GCS
(fake-gcs-server) and Azure Blob Storage (Azurite).

What every store must give: a published batch reads back exactly; only published batches are
listed, oldest first; expiry keeps the newest; a crash between the parts and the manifest leaves
nothing readable and is swept once its writer is gone (or by age when no owner was recorded);
of two publishers of one batch id exactly one wins and the batch is the winner's, whole; the
store's put-if-absent has one winner under a race.
"""

from __future__ import annotations

import contextlib
import threading
import time
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_cdc.core.batch import (
    Batch,
    BatchWriter,
    batches_at,
    clean_incomplete,
    expire_batches,
    list_batches,
    new_batch_id,
)
from airflow_cdc.core.errors import BatchError, StorageUnavailable
from airflow_cdc.core.storage import open_location, python_url
from airflow_cdc.core.table_sink import SourceLayout

LAYOUT = SourceLayout(pa.struct([pa.field("lsn", pa.int64())]), {}, ("lsn",))
DEAD_OWNER = {"host": "elsewhere", "pid": 1, "token": 1}  # another host's writer whose lease ended


class _Int:
    def __init__(self, name):
        self.field, self.placeholder = pa.field(name, pa.int64()), None

    def convert(self, text):
        return pc.cast(text, pa.int64())


_WRITERS: list[BatchWriter] = []


@pytest.fixture(autouse=True)
def _abort_writers():
    """Close what a failed test left open (an open S3 upload would hold the interpreter's exit)."""
    yield
    while _WRITERS:
        with contextlib.suppress(StorageUnavailable):  # a test stopped (and dropped) its server
            _WRITERS.pop().abort()


def _writer(staging, rows=range(30), batch_id=None, owner=None, before_publish=None) -> BatchWriter:
    w = BatchWriter(staging, "conn", batch_id, piece_rows=16, owner=owner, before_publish=before_publish)
    _WRITERS.append(w)
    for table in ("public.a", "public.b"):
        sink = w.sink(
            table, {"key_columns": ["id"]}, [_Int("id"), _Int("v")], [0, 1], LAYOUT, "changes", "v1"
        )
        for i in rows:
            sink.append("c", None, (str(i), str(i * 10)), i.to_bytes(16, "big"), (i,))
    return w


def _ids(batch: Batch, table: str = "public.a") -> list[int]:
    return [r["after"]["id"] for rb in batch.iter_events(table) for r in rb.to_pylist()]


def _unpublished(staging) -> list[str]:
    """Names under the batches root that are not published batches and hold files (in-progress
    leftovers; an empty directory that a store's backend keeps after its last object went is not)."""
    root = batches_at(staging, "conn")
    published = {b.batch_id for b in list_batches(staging, "conn")}
    names = [i.base_name for i in root.children() if i.base_name not in published]
    return [n for n in names if (root / n).walk()]


def test_publish_and_read_back(staging):
    w = _writer(staging)
    path = w.finish({"to_offset": {"lsn": 30}, "state_after": {"x": 1}})
    assert str(path).startswith(python_url(staging))
    batch = Batch(path)
    assert batch.batch_id == w.batch_id and batch.tables() == ["public.a", "public.b"]
    assert batch.manifest["state_after"] == {"x": 1} and batch.table_info("public.a")["rows"] == 30
    assert _ids(batch) == list(range(30)) and _ids(batch, "public.b") == list(range(30))
    batch.verify()
    assert [b.batch_id for b in list_batches(staging, "conn")] == [w.batch_id]
    assert _unpublished(staging) == []  # nothing of the writer's is left beside the batch


def test_list_only_published_oldest_first_and_expire(staging):
    ids = []
    for n in range(4):
        w = _writer(staging, rows=range(n + 1))
        w.finish({})
        ids.append(w.batch_id)
    pending = _writer(staging)  # still writing: parts there, no manifest
    listed = [b.batch_id for b in list_batches(staging, "conn")]
    assert listed == sorted(ids) and pending.batch_id not in listed
    # committed up to the third batch, keep one committed batch beyond it
    assert expire_batches(staging, "conn", keep_after=ids[2], retain=1) == 1
    assert [b.batch_id for b in list_batches(staging, "conn")] == ids[1:]
    assert _ids(list_batches(staging, "conn")[0]) == [0, 1]
    pending.abort()
    assert _unpublished(staging) == []


def test_crash_between_parts_and_manifest(staging):
    """A writer killed after its parts and before its manifest: nothing is readable, and the
    next lease holder (token 2) sweeps it; a live writer's files are left alone."""

    class Killed(BaseException):
        pass

    def crash():
        raise Killed

    dead = _writer(staging, owner=DEAD_OWNER, before_publish=crash)
    with pytest.raises(Killed):
        dead.finish({})  # parts written and closed; the process "dies" before publishing
    live = _writer(staging, owner={**DEAD_OWNER, "token": 2})
    assert list_batches(staging, "conn") == [] and len(_unpublished(staging)) == 2
    with pytest.raises(BatchError, match="no manifest.json"):
        Batch(batches_at(staging, "conn") / dead.batch_id)
    assert clean_incomplete(staging, "conn", token=2) == 1
    assert len(_unpublished(staging)) == 1
    live.finish({})
    assert [b.batch_id for b in list_batches(staging, "conn")] == [live.batch_id]
    assert clean_incomplete(staging, "conn", token=2) == 0


def test_ownerless_leftover_is_swept_by_age(staging):
    w = _writer(staging, owner=DEAD_OWNER)
    w.close_table("public.a")
    w.close_table("public.b")
    for info in batches_at(staging, "conn").walk():  # a crash before the owner was recorded
        if info.base_name.startswith("owner"):
            batches_at(staging, "conn").fs.delete_file(info.path)
    assert clean_incomplete(staging, "conn", token=2, grace=3600) == 0
    time.sleep(2.1)  # object stores keep modification times to the second
    assert clean_incomplete(staging, "conn", token=2, grace=1) == 1
    assert _unpublished(staging) == [] and w.batch_id


def test_two_publishers_of_one_batch(staging):
    """Same batch id, different contents: exactly one publishes, and the batch is its own."""
    batch_id = new_batch_id()
    first = _writer(staging, rows=range(0, 20), batch_id=batch_id)
    second = _writer(staging, rows=range(100, 130), batch_id=batch_id)
    first.finish({"who": "first"})
    with pytest.raises(BatchError, match="published by another writer"):
        second.finish({"who": "second"})
    second.abort()
    (batch,) = list_batches(staging, "conn")
    assert batch.manifest["who"] == "first" and _ids(batch) == list(range(20))
    batch.verify()


def test_two_publishers_race(staging):
    batch_id = new_batch_id()
    writers = [_writer(staging, rows=range(n * 100, n * 100 + 10), batch_id=batch_id) for n in range(4)]
    outcome: dict[int, object] = {}
    go = threading.Barrier(len(writers))

    def publish(n: int) -> None:
        go.wait()
        try:
            outcome[n] = writers[n].finish({"who": n})
        except BatchError as e:
            outcome[n] = e
            writers[n].abort()

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcome.items() if not isinstance(o, BatchError)]
    assert len(winners) == 1
    (batch,) = list_batches(staging, "conn")
    assert batch.manifest["who"] == winners[0]
    assert _ids(batch) == list(range(winners[0] * 100, winners[0] * 100 + 10))
    batch.verify()
    assert _unpublished(staging) == []


def test_create_is_atomic(staging):
    """Put-if-absent under a race (the store's own check, not ours): of 8 writers of one
    object exactly one wins, every other is told it exists, and the object is the winner's."""
    root = open_location(staging).make_dirs()
    for round_ in range(3):
        target, go, won, lost = root / f"race-{round_}.json", threading.Barrier(8), [], []

        def create(n: int, target=target, go=go, won=won, lost=lost) -> None:
            go.wait()
            try:
                target.create(f"writer {n}".encode())
                won.append(n)
            except FileExistsError:
                lost.append(n)

        threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == 7, (won, lost)
        assert target.read_text() == f"writer {won[0]}"


def test_table_names_that_need_escaping(staging):
    """Percent-encoded table directories: read back through the batch, and through the part
    names it hands out (``Path``\\ s, or URIs that Python libraries decode)."""
    import pyarrow.parquet as pq

    name = 'Odd Schema.we"ird %tbl ü'
    w = BatchWriter(staging, "conn", piece_rows=16)
    _WRITERS.append(w)
    sink = w.sink(name, {"key_columns": ["id"]}, [_Int("id"), _Int("v")], [0, 1], LAYOUT, "changes", "v1")
    sink.append("c", None, ("1", "2"), (1).to_bytes(16, "big"), (1,))
    batch = Batch(w.finish({}))
    assert batch.tables() == [name] and _ids(batch, name) == [1]
    (part,) = batch.parts(name)
    if str(part).startswith(("gs://", "abfss://")):
        # pyarrow resolves these only with the cloud's own credentials (an emulator's
        # endpoint is not in the URL): read them back through our settings instead
        where = open_location(unquote(str(part)))
        assert str(part).startswith(python_url(staging)) and where.exists()
        assert pq.read_schema(where.path, filesystem=where.fs).names[0] == "op"
    else:
        assert pq.read_schema(part).names[0] == "op"
