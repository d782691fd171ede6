"""A deterministic unchanged-TOAST scenario, shared by the capture (oracle) and Spark tests.

Every row holds a 12,000-character random text and most a random bytea (both stored out of line,
too random to compress below the TOAST threshold).  Right after each run reads its snapshot
chunks -- so after the chunks' snapshots, inside the run's window -- other transactions update
chunk rows without touching those columns: same-key updates, key changes, chains of key changes,
updates after a key change, deletes, and updates that do send the value.  The chunk rows they
touch are dropped by reconciliation; the right value of every placeholder is the dropped row's
(or, after a key change, the old key's).  Later windows repeat key changes of streamed rows.
"""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest

from airflow_cdc.sources.postgres.source import PostgresSource

ROWS = 400
TABLES = ["public.docs", "public.pairs"]
KEYS = {"public.docs": ["id"], "public.pairs": ["a", "b"]}
BIG_TEXT = "(SELECT string_agg(md5(random()::text || g || s), '') FROM generate_series(1, 375) s)"
BIG_BYTES = "(SELECT decode(string_agg(md5(random()::text || g || s), ''), 'hex') FROM generate_series(1, 190) s)"

SCHEMA = f"""
CREATE TABLE docs (id int PRIMARY KEY, v text, note text, doc bytea);
INSERT INTO docs SELECT g, 'v' || g, {BIG_TEXT}, CASE WHEN g % 4 <> 0 THEN {BIG_BYTES} END
FROM generate_series(1, {ROWS}) g;
CREATE TABLE pairs (a int, b text, v int, note text, PRIMARY KEY (a, b));
INSERT INTO pairs SELECT g / 2, 'b' || (g % 2), g, {BIG_TEXT} FROM generate_series(1, {ROWS // 2}) g;
"""


def _changes(conn: psycopg.Connection, ids: list[int], fresh: itertools.count) -> None:
    """One transaction per change of the chunk keys ``ids`` (docs ids, pairs ``a = id // 2``)."""
    for i in ids:
        kind = i % 10
        if kind == 1:
            conn.execute("UPDATE docs SET v = v || '!' WHERE id = %s", (i,))
        elif kind == 2:
            conn.execute("UPDATE docs SET id = %s WHERE id = %s", (next(fresh), i))
        elif kind == 3:  # a chain of key changes, then an update of the last key
            a, b = next(fresh), next(fresh)
            conn.execute("UPDATE docs SET id = %s WHERE id = %s", (a, i))
            conn.execute("UPDATE docs SET id = %s, v = 'chained' WHERE id = %s", (b, a))
            conn.execute("UPDATE docs SET v = v || '?' WHERE id = %s", (b,))
        elif kind == 4:  # the value is sent, then left unchanged
            conn.execute("UPDATE docs SET note = 'short now' WHERE id = %s", (i,))
            conn.execute("UPDATE docs SET v = 'after short' WHERE id = %s", (i,))
        elif kind == 5:
            conn.execute("DELETE FROM docs WHERE id = %s", (i,))
        elif kind == 6:  # key change and a move into the freed key in one transaction
            with conn.transaction():
                conn.execute("UPDATE docs SET id = %s WHERE id = %s", (next(fresh), i))
                conn.execute("UPDATE docs SET id = %s WHERE id = %s", (i, i + 1))
        if kind in (1, 2, 7) and i % 2 == 0:
            conn.execute("UPDATE pairs SET b = b || 'x', v = v + 1 WHERE a = %s", (i // 2,))
        elif kind == 8:
            conn.execute("UPDATE pairs SET v = v + 100 WHERE a = %s", (i // 2,))


def _pair_changes(conn: psycopg.Connection, keys: list[tuple[int, str]]) -> None:
    for a, b in keys:
        if a % 3 == 0:
            conn.execute("UPDATE pairs SET b = b || 'y' WHERE a = %s AND b = %s", (a, b))
        elif a % 3 == 1:
            conn.execute("UPDATE pairs SET v = -v WHERE a = %s AND b = %s", (a, b))


class ChunkWriters:
    """Patches the source's chunk reads: after each, run :func:`_changes` on the chunks' keys."""

    def __init__(self, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.fresh = itertools.count(100_000)
        self.touched = 0
        original = PostgresSource.read_chunks

        def read_chunks(source: Any, pending: list, max_rows: int, chunk_size: int) -> list:
            chunks = original(source, pending, max_rows, chunk_size)
            for chunk in chunks:
                keys = list(zip(*(chunk.data.column(i).to_pylist() for i in chunk.key_index), strict=True))
                if chunk.snapshot.table == "public.docs":
                    _changes(self.conn, [int(k[0]) for k in keys], self.fresh)
                else:
                    _pair_changes(self.conn, [(int(a), b) for a, b in keys])
                self.touched += len(keys)
            return chunks

        monkeypatch.setattr(PostgresSource, "read_chunks", read_chunks)

    def streamed_changes(self) -> None:
        """Key changes and updates of rows already snapshotted (values from earlier batches)."""
        rows = self.conn.execute("SELECT id FROM docs WHERE id < 100000 ORDER BY id LIMIT 60").fetchall()
        for (i,) in rows:
            if i % 3 == 0:
                self.conn.execute("UPDATE docs SET id = %s WHERE id = %s", (next(self.fresh), i))
            elif i % 3 == 1:
                self.conn.execute("UPDATE docs SET v = 'streamed' WHERE id = %s", (i,))
        self.conn.execute("UPDATE pairs SET a = a + 1000 WHERE a % 7 = 0")

    def close(self) -> None:
        self.conn.close()


def setup(dsn: str, identity: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        if identity == "full":
            conn.execute("ALTER TABLE docs REPLICA IDENTITY FULL")
            conn.execute("ALTER TABLE pairs REPLICA IDENTITY FULL")
        toasted = conn.execute("SELECT count(*) FROM docs WHERE pg_column_size(note) > 4000").fetchone()
        assert toasted and toasted[0] == ROWS, "the text values must stay above the TOAST threshold"
