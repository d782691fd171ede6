"""The compiled snapshot chunk reader (``_pgcopy``, text-format COPY) against the pure-Python CSV
path: identical chunk tables over every type family, escapes, NULLs, TOASTed values, small
pieces and chunk boundaries on composite keys with escaped characters; server errors in the
middle of a COPY surface as psycopg errors and leave the connection usable."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from airflow_cdc.core.pipeline import build_config
from airflow_cdc.core.snapshot import key_ordered_chunks
from airflow_cdc.sources.postgres import copyread
from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres.support import every_version, pipeline

pytestmark = pytest.mark.skipif(not copyread.native_available(), reason="_pgcopy is not built")

NASTY = ["", "\\N", "\\", "a\tb", "line\nbreak", "cr\rlf\r\n", "\x01\x07\x08\x0b\x0c\x1f", "quote\"'", "ü€😀",
         "trail\\", "\\x41\\101", ",;|", " lead and trail "]

DDL = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy tab\t')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN short_text AS varchar(20)",
    """CREATE TABLE every (
        k text NOT NULL, n int NOT NULL,
        b bool, i2 smallint, i8 bigint, r real, f float8, nm numeric(10,2), nv numeric, bigv numeric,
        d date, ts timestamp(3), tstz timestamptz, tm time, ttz timetz, iv interval,
        j json, jb jsonb, u uuid, by bytea, ia int[], ta text[], na numeric[], md int[][],
        e mood, ea mood[], dp posint, ds short_text, m money, bt bit(5), vb varbit, inet inet, cidr cidr,
        mac macaddr, pt point, rg int4range, tsr tstzrange, x xml, big text, bigb bytea,
        PRIMARY KEY (k, n))""",
    "ALTER TABLE every ALTER COLUMN big SET STORAGE EXTERNAL",
]


def _row(i: int, rng: random.Random) -> str:
    """A literal row; every 5th row is all NULL outside the key, others draw from the edge values."""
    key = sql.Literal(NASTY[i % len(NASTY)] + str(i // len(NASTY))).as_string()
    if i % 5 == 4:
        return f"({key}, {i}" + ", NULL" * 38 + ")"
    text = NASTY[rng.randrange(len(NASTY))]
    lit = sql.Literal(text).as_string()
    vals = [
        rng.choice(["true", "false"]), str(rng.randint(-32768, 32767)), str(rng.randint(-(2**63), 2**63 - 1)),
        rng.choice(["'NaN'", "'Infinity'", "'-0'", "1.5e-40", "3.4e38"]),
        rng.choice(["'NaN'", "'-Infinity'", "5e-324", "0.1", "1.7976931348623157e308"]),
        rng.choice(["12.34", "-0.01", "99999999.99"]),
        rng.choice(["'NaN'", "0", "-1.000000000000000000001", "1e-30"]), "9" * 120 + ".5",
        rng.choice(["'infinity'", "'-infinity'", "'2024-02-29'", "'0001-01-01 BC'"]),
        rng.choice(["'2018-06-20 15:13:16.945'", "'infinity'", "'1900-01-01 00:00:00'"]),
        rng.choice(["'2018-06-20 15:13:16.945104+02'", "'-infinity'", "'0044-03-15 12:00:00 BC'"]),
        rng.choice(["'24:00:00'", "'00:00:00.000001'"]), rng.choice(["'12:00:00+05'", "'23:59:59.5-14'"]),
        rng.choice(["'1 day 2 hours'", "'-178000000 years'", "'1 mon -1 day 00:00:00.000001'"]),
        "'" + '{"a": "t\\tx\\n", "b": [1, null]}' + "'",
        "'" + '{"k": "\\\\ back", "u": "\\u00fc"}' + "'",
        "gen_random_uuid()", rng.choice(["'\\x00ff5c09'", "''"]),
        "'{1,NULL,3}'", "ARRAY[" + lit + ", NULL, 'x,y', '\"q\"']::text[]", "'{1.5,NaN,NULL}'",
        "'{{1,2},{3,NULL}}'", rng.choice(["'sad'", "E'happy tab\\t'"]), "'{ok,NULL}'", "7", lit[:20] if
        len(lit) <= 20 else "'short'", "12.5", "B'10101'", "B'1'", "'10.1.2.3/8'", "'10.0.0.0/8'",
        "'08:00:2b:01:02:03'", "'(1.5,-2)'", "'[1,5)'", "'[2024-01-01 00:00+00,)'",
        "'<a>t\tx</a>'", "repeat(" + lit + " || md5(random()::text), 4000)",
        "decode(repeat(md5(random()::text), 3000), 'hex')",
    ]
    return f"({key}, {i}, " + ", ".join(vals) + ")"


@pytest.fixture
def every(pg_db: Any) -> Any:
    rng = random.Random(15)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        for ddl in DDL:
            conn.execute(ddl)
        rows = [_row(i, rng) for i in range(90)]
        conn.execute("INSERT INTO every VALUES " + ", ".join(rows))
        conn.execute("ANALYZE every")
    return pg_db


def _chunks(config: dict[str, Any], chunk_size: int) -> list[pa.Table]:
    source = PostgresSource(build_config(config))
    source.open()
    try:
        return [c.data for c in key_ordered_chunks(source, "public.every", chunk_size)]
    finally:
        source.close()


@every_version
@pytest.mark.parametrize("chunk_size", [7, 1000])
def test_native_chunks_equal_the_csv_path(every: Any, tmp_path: Any, monkeypatch: Any, chunk_size: int) -> None:
    config = pipeline(every, tmp_path / "staging")
    native = _chunks(config, chunk_size)
    monkeypatch.setenv(copyread.COPY_ENV, "python")
    assert not copyread.native_available()
    reference = _chunks(config, chunk_size)
    assert [t.num_rows for t in native] == [t.num_rows for t in reference]
    assert sum(t.num_rows for t in native) == 90
    for got, want in zip(native, reference, strict=True):
        assert got.schema == want.schema
        assert got.combine_chunks().equals(want.combine_chunks())
    values = pa.concat_tables(native).to_pylist()
    assert {r["c0"][:-1] for r in values} >= set(NASTY[1:]) and any(r["c0"] == "0" for r in values)
    assert any(len(r["c38"] or "") > 100_000 for r in values)  # TOASTed (external) values arrived whole


def test_small_pieces_concatenate_to_the_same_table(every: Any, monkeypatch: Any) -> None:
    query = sql.SQL("COPY (SELECT * FROM every ORDER BY k, n) TO STDOUT (FORMAT {})")
    with psycopg.connect(every.dsn, autocommit=True) as conn:
        whole = copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
        monkeypatch.setattr(copyread, "MAX_PIECE_BYTES", 100)
        pieces = copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
        monkeypatch.setenv(copyread.COPY_ENV, "python")
        reference = copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
    assert pieces.column(0).num_chunks > 10
    assert whole.combine_chunks().equals(reference.combine_chunks())
    assert pieces.combine_chunks().equals(reference.combine_chunks())


def test_error_in_the_middle_of_a_copy_is_raised_and_the_connection_recovers(pg_db: Any) -> None:
    query = sql.SQL("COPY (SELECT g, 1 / (g - 40000) FROM generate_series(1, 50000) g) TO STDOUT (FORMAT {})")
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 2)
        with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
            copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 2)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        empty = copyread.read_table(conn, lambda fmt: sql.SQL("COPY (SELECT 1 WHERE false) TO STDOUT"), 1)
        assert empty.num_rows == 0 and empty.column_names == ["c0"]


def test_native_columns_keep_their_buffers_after_the_reader_is_done(every: Any) -> None:
    """The compiled reader hands its column buffers to Arrow without copying them: the arrays own
    that memory and stay intact after the read, garbage collection and many reads reusing freed
    memory; the buffers are exactly the data's size, not the reader's doubled capacity."""
    import gc

    query = sql.SQL("COPY (SELECT * FROM every ORDER BY k, n) TO STDOUT (FORMAT {})")
    with psycopg.connect(every.dsn, autocommit=True) as conn:
        kept = copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
        for _ in range(20):
            copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
            gc.collect()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(copyread.COPY_ENV, "python")
            reference = copyread.read_table(conn, lambda fmt: query.format(sql.SQL(fmt)), 40)
    assert kept.combine_chunks().equals(reference.combine_chunks())
    big = kept.column(38).chunk(0)  # TOASTed texts: megabytes, far past any small-block allocator
    validity, offsets, data = big.buffers()
    assert data.size == int.from_bytes(offsets.to_pybytes()[-4:], "little") > 1_000_000
    assert offsets.size == (len(big) + 1) * 4
    assert validity is not None and validity.size == (len(big) + 7) // 8
