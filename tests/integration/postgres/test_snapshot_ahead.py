"""Snapshot chunks written ahead (``BatchWriter.write_ahead``): each chunk is encoded as a part of
its own as soon as it is read, and the window decides whether that part is kept (no row of the
chunk touched by a transaction it does not reflect) or dropped and its surviving rows written
the usual way.  A change commits inside each chunk's read here (after its snapshot, before its
high watermark), in the chunk just read, in ranges not read yet, or none at all, so both
outcomes happen in one run; replayed, the batches equal the table."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_cdc.core.batch import BatchWriter, list_batches
from airflow_cdc.core.table_sink import AHEAD_ROWS_ENV
from airflow_cdc.sources.postgres.position import PgPosition, parse_pg_lsn
from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres.support import assert_converged, execute, pipeline, run_capture
from tests.support.pipeline import snapshot_pending

ROWS = 400
CHUNK = 9


def _table(dsn: str, name: str) -> None:
    execute(
        dsn,
        f"CREATE TABLE {name} (id int PRIMARY KEY, label text, amount numeric(12, 3), at timestamptz, "
        "doc jsonb, blob text)",
        f"ALTER TABLE {name} ALTER COLUMN blob SET STORAGE EXTERNAL",  # TOASTed, never compressed
        f"INSERT INTO {name} SELECT g, 'row ' || g, g * 1.125, timestamptz '2024-01-01' + g * interval '1 h', "
        f"jsonb_build_object('g', g), CASE WHEN g % 5 = 0 THEN repeat(md5(g::text), 200) END "
        f"FROM generate_series(1, {ROWS}) g",
    )


def _change(dsn: str, table: str, chunk: int, keys: list[int]) -> None:
    """Change rows right after a chunk of ``keys`` was read (committed after its snapshot)."""
    if not keys:
        return
    lo, hi = min(keys), max(keys)
    kind = chunk % 6
    statements = {
        0: [],  # untouched: the part written ahead is kept
        1: [f"UPDATE {table} SET label = label || '+' WHERE id = {hi}"],  # in the chunk just read
        2: [f"UPDATE {table} SET amount = amount + 1 WHERE id = {hi + 3 * CHUNK}"],  # not read yet
        3: [
            f"DELETE FROM {table} WHERE id = {lo}",
            f"INSERT INTO {table} (id, label) VALUES ({lo + 100000}, 'new')",
        ],
        # a TOASTed row updated without its blob: dropped from the chunk, staged as its pre-image
        4: [
            f"UPDATE {table} SET label = 'toast ' || id WHERE id = (SELECT max(id) FROM {table} "
            f"WHERE id BETWEEN {lo} AND {hi} AND blob IS NOT NULL)"
        ],
        5: [f"UPDATE {table} SET id = id + 200000 WHERE id = {lo}"],  # a key change out of the chunk
    }[kind]
    if statements:
        execute(dsn, *statements)


def _changes_between_chunks(monkeypatch: Any, dsn: str, table: str) -> list[int]:
    """Patch the chunk read so that a change commits right after each chunk's rows were read, in
    the chunk's transaction, before its high watermark is read: the change sorts below the chunk's
    rows and the chunk does not see it -- the case a kept chunk would get wrong.  Returns the
    chunk counter."""
    original, lock, count = PostgresSource._copy_chunk, threading.Lock(), [0]

    def copy(self: PostgresSource, tid: Any, cols: list[str], order: list[str], *args: Any) -> Any:
        data = original(self, tid, cols, order, *args)
        with lock:
            count[0] += 1
            n = count[0]
        keys = [int(k) for k in data.column(cols.index(order[0])).to_pylist()] if data.num_rows else []
        _change(dsn, table, n, keys)
        return data

    monkeypatch.setattr(PostgresSource, "_copy_chunk", copy)
    return count


def _outcomes(monkeypatch: Any) -> dict[str, int]:
    """Count the parts written ahead that were kept and dropped."""
    seen = {"kept": 0, "dropped": 0}
    keep, drop = BatchWriter.keep, BatchWriter.drop

    def kept(self: BatchWriter, ahead: Any) -> bool:
        ok = keep(self, ahead)
        seen["kept"] += ok
        return ok

    def dropped(self: BatchWriter, ahead: Any) -> None:
        if ahead in self._ahead:
            seen["dropped"] += 1
        drop(self, ahead)

    monkeypatch.setattr(BatchWriter, "keep", kept)
    monkeypatch.setattr(BatchWriter, "drop", dropped)
    return seen


@pytest.mark.parametrize("threads", [1, 2], ids=["one-reader", "two-readers"])
def test_chunks_written_ahead_are_kept_or_dropped_and_the_batches_equal_the_table(
    pg_db: Any, tmp_path: Any, monkeypatch: Any, threads: int
) -> None:
    table = f"ahead_{threads}"
    _table(pg_db.dsn, table)
    monkeypatch.setenv(AHEAD_ROWS_ENV, "1")
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": CHUNK,
            "snapshot.max.rows.per.run": 150,
            "snapshot.max.threads": threads,
            "table.include.list": f"public.{table}",
            "slot.name": f"slot_{table}",
            "publication.name": f"pub_{table}",
            "name": table,
        },
    )
    count = _changes_between_chunks(monkeypatch, pg_db.dsn, table)
    seen = _outcomes(monkeypatch)
    runs = 0
    while True:
        run_capture(config)
        runs += 1
        if not snapshot_pending(config):
            break
        assert runs < 20
    run_capture(config)  # the changes after the last chunk
    assert runs >= 3 and count[0] >= ROWS // CHUNK
    assert seen["kept"] >= 10 and seen["dropped"] >= 10, seen
    assert_converged(config, [f"public.{table}"])

    # every snapshot row is at its chunk's high watermark: inside its batch, below the batch's end
    positions: set[bytes] = set()
    for batch in list_batches(config["staging.path"], config["name"]):
        if f"public.{table}" not in batch.tables():
            continue
        end = parse_pg_lsn(batch.manifest["to_offset"]["lsn"])
        for piece in batch.iter_events(f"public.{table}"):
            for row in piece.select(["op", "__position", "source"]).to_pylist():
                if row["op"] == "r":
                    lsn = PgPosition.from_sort_key(row["__position"]).commit_lsn
                    assert row["source"]["lsn"] == lsn <= end
                    positions.add(row["__position"])
    assert len(positions) > runs  # a position per chunk, not one per batch


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def test_small_chunks_are_not_written_ahead(pg_db: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """Below ``AHEAD_ROWS`` rows a chunk goes to the table's shared part: no part per small chunk."""
    table = "ahead_small"
    _table(pg_db.dsn, table)
    monkeypatch.delenv(AHEAD_ROWS_ENV, raising=False)
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 50,
            "table.include.list": f"public.{table}",
            "slot.name": f"slot_{table}",
            "publication.name": f"pub_{table}",
            "name": table,
        },
    )
    seen = _outcomes(monkeypatch)
    while True:
        run_capture(config)
        if not snapshot_pending(config):
            break
    assert seen == {"kept": 0, "dropped": 0}
    (batch,) = list_batches(config["staging.path"], config["name"])
    assert len(batch.manifest["tables"][f"public.{table}"]["parts"]) == 1
    assert_converged(config, [f"public.{table}"])
