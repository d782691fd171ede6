"""Snapshot completeness on MariaDB for every key type and key shape (issue 10).

Each group is one database of small tables, one per key type or shape, captured by one connector
with small chunks over several runs.  After every chunk read a mutator updates, deletes, re-keys
and inserts rows of the table just read (so the watermark tracker must match streamed keys with
chunk keys), and between runs too.  The replayed batches must equal the source row by row, and
the source side is checked against ``COUNT(*)`` so a reader that loses rows cannot pass.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.sources.mysql.source import MySqlSource
from tests.integration.mysql.support import pipeline, run_capture, source_rows, state
from tests.support.keyspace import (
    KeyCase,
    KeyType,
    Mutator,
    case_variants,
    frac,
    insert_sql,
    key_tuples,
    many,
)
from tests.support.pipeline import assert_rows_equal, replay


def _q(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _datetime(p: int, zero: bool = True) -> KeyType:
    def gen(rng: random.Random) -> list[str]:
        def one(r: random.Random) -> str:
            return (
                f"{r.randint(1000, 9999):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
                f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac(r, p)}"
            )

        edges = [
            f"1000-01-01 00:00:00{'.' + '0' * p if p else ''}",
            f"9999-12-31 23:59:59{'.' + '9' * p if p else ''}",
        ]
        edges += ["0000-00-00 00:00:00"] if zero else []
        edges += [
            f"2024-02-29 12:00:00{frac(rng, p)}",
            f"2024-02-29 12:00:00{'.' + '0' * (p - 1) + '1' if p else ''}",
        ]
        return [_q(v) for v in many(rng, 200, one, edges)]

    return KeyType(f"datetime{p}", f"datetime({p})", gen)


def _timestamp(p: int) -> KeyType:
    def gen(rng: random.Random) -> list[str]:
        def one(r: random.Random) -> str:
            return (
                f"{r.randint(1971, 2037):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
                f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac(r, p)}"
            )

        nines = "." + "9" * p if p else ""
        # instants around the 2024 EU DST changes (01:00 UTC): equal local texts in Europe/Berlin
        edges = [
            "1970-01-01 00:00:01",
            f"2038-01-19 03:14:07{nines}",
            f"2024-03-31 00:59:59{nines}",
            "2024-03-31 01:00:00",
            "2024-10-27 00:30:00",
            "2024-10-27 01:30:00",
            f"2024-10-27 00:59:59{nines}",
        ]
        return [_q(v) for v in many(rng, 200, one, edges)]

    return KeyType(f"timestamp{p}", f"timestamp({p})", gen)


def _time(p: int) -> KeyType:
    def gen(rng: random.Random) -> list[str]:
        def one(r: random.Random) -> str:
            sign = "-" if r.random() < 0.4 else ""
            return f"{sign}{r.randint(0, 838):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}{frac(r, p)}"

        f1 = "." + "0" * (p - 1) + "1" if p else ""
        edges = [
            "-838:59:59",
            "838:59:59",
            "00:00:00",
            f"-00:00:00{f1}",
            f"00:00:00{f1}",
            "24:00:00",
            "-24:00:01",
        ]
        return [_q(v) for v in many(rng, 200, one, edges)]

    return KeyType(f"time{p}", f"time({p})", gen)


def _date(rng: random.Random) -> list[str]:
    def one(r: random.Random) -> str:
        return f"{r.randint(1000, 9999):04d}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"

    return [_q(v) for v in many(rng, 200, one, ["1000-01-01", "9999-12-31", "0000-00-00", "2024-02-29"])]


def _ints(lo: int, hi: int) -> Any:
    return lambda rng: many(
        rng, 200, lambda r: str(r.randint(lo, hi)), [str(lo), str(hi), "0", "1", "-1"][: 5 if lo < 0 else 3]
    )


def _decimal(p: int, s: int) -> Any:
    def one(r: random.Random) -> str:
        whole = r.randint(0, 10 ** min(p - s, 12) - 1)
        return f"{'-' if r.random() < 0.5 else ''}{whole}.{r.randint(0, 10**s - 1):0{s}d}"

    top = "9" * (p - s) + "." + "9" * s
    return lambda rng: many(
        rng, 200, one, [top, "-" + top, "0." + "0" * (s - 1) + "1", "-0." + "0" * (s - 1) + "1", "0"]
    )


def _double(single: bool) -> Any:
    def one(r: random.Random) -> str:
        v = r.choice(
            [r.uniform(-1, 1), r.uniform(-1e30, 1e30), r.expovariate(1) * 1e-30, r.uniform(-1e6, 1e6)]
        )
        if single:
            v = struct.unpack("f", struct.pack("f", v))[0]
        return repr(v) + ("" if "e" in repr(v) else "e0")

    big = "3.4028234663852886e38" if single else "1.7976931348623157e308"
    tiny = "1.401298464324817e-45" if single else "5e-324"
    return lambda rng: many(rng, 200, one, [big, "-" + big, tiny, "-" + tiny, "0e0", "0.1e0", "1e0"])


def _text(accents: bool, pad: bool) -> Any:
    words = ["abc", "abd", "ab", "a", "b", "zeta", "étude", "eta", "omega", "über", "ubel", "x y", "ß", "ss"]

    def gen(rng: random.Random) -> list[str]:
        base = [w + str(i) for i in range(40) for w in words[i % len(words) : i % len(words) + 1]]
        vals = [case_variants(rng, w, accents) for w in words + base]
        vals += ["", " ", "a ", "A", "Á", "a\t"] + (["a  "] if pad else [])
        return [_q(v) for v in dict.fromkeys(vals)]

    return gen


def _binary(rng: random.Random) -> list[str]:
    vals = ["00" * 16, "ff" * 16, "01" + "00" * 15, "00" * 15 + "01", "80" + "00" * 15]
    vals += [rng.randbytes(16).hex() for _ in range(150)] + [
        rng.randbytes(10).hex() + "00" * 6 for _ in range(20)
    ]
    return [f"X'{v}'" for v in dict.fromkeys(vals)]


def _varbinary(rng: random.Random) -> list[str]:
    vals = ["", "00", "0000", "ab", "ab00", "abff", "ff", "ffff", "7f", "80"]
    vals += [rng.randbytes(rng.randint(1, 20)).hex() for _ in range(150)]
    return [f"X'{v}'" for v in dict.fromkeys(vals)]


ENUM = KeyType(
    "enum",
    "enum('zulu','bravo','alpha','mike','','x y')",
    lambda r: ["'zulu'", "'bravo'", "'alpha'", "'mike'", "''", "'x y'"],
)
SET = KeyType("set", "set('z','b','a','m')", lambda r: [f"'{','.join(s)}'" for s in _subsets("zbam")])


def _subsets(labels: str) -> list[list[str]]:
    return [[c for k, c in enumerate(labels) if m >> k & 1] for m in range(1 << len(labels))]


DATE = KeyType("date", "date", _date)
YEAR = KeyType(
    "year", "year", lambda r: ["0", "1901", "2155", "2000", "1999"] + [str(y) for y in range(1902, 2155, 3)]
)
BIT = KeyType(
    "bit10", "bit(10)", lambda r: many(r, 200, lambda x: str(x.randint(0, 1023)), ["0", "1023", "512", "1"])
)
INT = KeyType("int", "int", _ints(-(2**31), 2**31 - 1))
TINY = KeyType("tinyint", "tinyint", _ints(-128, 127))
BIGU = KeyType(
    "bigint_unsigned",
    "bigint unsigned",
    lambda r: many(
        r, 200, lambda x: str(x.randint(0, 2**64 - 1)), ["0", str(2**64 - 1), str(2**63), str(2**63 - 1)]
    ),
)
BIG = KeyType("bigint", "bigint", _ints(-(2**63), 2**63 - 1))
DEC = KeyType("decimal20_6", "decimal(20,6)", _decimal(20, 6))
DEC65 = KeyType("decimal65_30", "decimal(65,30)", _decimal(65, 30))
FLOAT = KeyType("float", "float", _double(True))
DOUBLE = KeyType("double", "double", _double(False))
BINARY = KeyType("binary16", "binary(16)", _binary)
VARBINARY = KeyType("varbinary", "varbinary(20)", _varbinary)
COLLATED = {
    "general_ci": KeyType("general_ci", "varchar(20) collate utf8mb4_general_ci", _text(True, False)),
    "unicode_ci": KeyType("unicode_ci", "varchar(20) collate utf8mb4_unicode_ci", _text(True, False)),
    "nopad_ci": KeyType("nopad_ci", "varchar(20) collate utf8mb4_general_nopad_ci", _text(True, True)),
    "bin": KeyType("utf8mb4_bin", "varchar(20) collate utf8mb4_bin", _text(True, True)),
    "latin1": KeyType(
        "latin1", "varchar(20) character set latin1 collate latin1_swedish_ci", _text(True, False)
    ),
    "char": KeyType("char", "char(12) collate utf8mb4_unicode_ci", _text(True, False)),
}

SINGLE = [DATE, YEAR, ENUM, SET, BIT, INT, TINY, BIG, BIGU, DEC, DEC65, FLOAT, DOUBLE, BINARY, VARBINARY]
SINGLE += [_datetime(p) for p in range(7)] + [_time(p) for p in range(7)] + [_timestamp(p) for p in range(7)]
SINGLE += list(COLLATED.values())


def _case(*types: KeyType, **kw: Any) -> KeyCase:
    return KeyCase("_".join(t.name for t in types), tuple(types), **kw)


COMPOSITE = [
    _case(DATE, _time(0)),
    _case(DATE, _time(6)),
    _case(ENUM, _datetime(3)),
    _case(COLLATED["general_ci"], INT),
    _case(COLLATED["unicode_ci"], _timestamp(6)),
    _case(BINARY, DEC),
    _case(SET, COLLATED["bin"], BIT),
    _case(YEAR, VARBINARY, DOUBLE),
    _case(_timestamp(0), COLLATED["nopad_ci"]),
]
NULLABLE = [
    _case(INT, DATE, nullable=(False, True)),
    _case(COLLATED["general_ci"], _datetime(6), nullable=(True, True)),
    _case(ENUM, BINARY, nullable=(True, False)),
]
GROUPS = {
    "single_c3": ([_case(t, rows=60) for t in SINGLE[: len(SINGLE) // 2]], 3),
    "single_c7": ([_case(t) for t in SINGLE[len(SINGLE) // 2 :]], 7),
    "composite": (COMPOSITE, 7),
    "nullable_unique": (NULLABLE, 3),
}


@pytest.fixture(scope="module")
def module_db(mariadb_server: Any) -> Iterator[Any]:
    from tests.conftest import MariaDbDatabase

    name = mariadb_server.create_database(f"keys_{random.randrange(16**8):08x}")
    try:
        yield MariaDbDatabase(name=name, server=mariadb_server)
    finally:
        mariadb_server.drop_database(name)


def _connect(db: Any) -> Any:
    conn = db.connect(autocommit=True)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
    return conn


def _create(cur: Any, table: str, case: KeyCase, seed: int) -> tuple[dict[int, tuple[str, ...]], list]:
    cols = ", ".join(
        f"{c} {t.sql} {'NULL' if case.is_nullable(i) else 'NOT NULL'}"
        for i, (c, t) in enumerate(zip(case.columns, case.types, strict=True))
    )
    key = ", ".join(case.columns)
    constraint = f"UNIQUE KEY uk ({key})" if case.nullable else f"PRIMARY KEY ({key})"
    cur.execute(f"CREATE TABLE {table} (id int NOT NULL UNIQUE, v int NOT NULL, {cols}, {constraint})")
    keys = key_tuples(case, case.rows * 2, seed)
    cur.execute(insert_sql(table, case.columns, keys[: case.rows], 1).replace("INSERT", "INSERT IGNORE"))
    cur.execute(f"SELECT id FROM {table}")
    present = {int(r[0]) for r in cur.fetchall()}
    live = {i + 1: k for i, k in enumerate(keys[: case.rows]) if i + 1 in present}
    return live, keys[case.rows :]


def _key_props(db: Any, tables: dict[str, KeyCase]) -> dict[str, Any]:
    nullable = [f"{db.name}.{t}:{','.join(c.columns)}" for t, c in tables.items() if c.nullable]
    return {"message.key.columns": ";".join(nullable)} if nullable else {}


@pytest.mark.parametrize("group", list(GROUPS), ids=list(GROUPS))
def test_snapshot_complete_for_key_type(module_db: Any, tmp_path: Any, monkeypatch: Any, group: str) -> None:
    cases, chunk = GROUPS[group]
    conn = _connect(module_db)
    cur = conn.cursor()
    cur.execute(f"CREATE DATABASE {module_db.name}_{group}")
    db = type(module_db)(name=f"{module_db.name}_{group}", server=module_db.server)
    try:
        _run_group(db, conn, cases, chunk, tmp_path, monkeypatch)
    finally:
        cur.execute(f"DROP DATABASE {db.name}")
        conn.close()


def _run_group(db: Any, conn: Any, cases: list[KeyCase], chunk: int, tmp_path: Any, monkeypatch: Any) -> None:
    cur = conn.cursor()
    cur.execute(f"USE {db.name}")
    tables = {f"t_{c.id}"[:60]: c for c in cases}
    mutators = {}
    for n, (table, case) in enumerate(tables.items()):
        live, spare = _create(cur, table, case, seed=n)
        mutators[f"{db.name}.{table}"] = Mutator(
            lambda s, a: cur.execute(s, a), table, case.columns, live, spare, pymysql.err.IntegrityError, n
        )
    config = pipeline(
        db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": chunk, "snapshot.max.rows.per.run": 80},
        **_key_props(db, tables),
    )
    original = MySqlSource._read_chunk

    def read_then_mutate(self: MySqlSource, snap: Any, cursor: Any, limit: int) -> Any:
        read = original(self, snap, cursor, limit)
        mutators[snap.table].step(2)  # changes the window streams after this chunk's snapshot
        return read

    monkeypatch.setattr(MySqlSource, "_read_chunk", read_then_mutate)
    for runs in range(1, 200):  # noqa: B007 (the count is checked after the loop)
        run_capture(config)
        for m in mutators.values():
            m.step(1)
        if not state(config).data["snapshot"]["pending"]:
            break
    run_capture(config)  # the changes after the last chunk
    monkeypatch.undo()  # the checks below read the table with the same chunk reader
    assert runs > 2, "the snapshot should span several runs"
    oracle = replay(config)
    for full, case in ((f"{db.name}.{t}", c) for t, c in tables.items()):
        expected = source_rows(config, full)
        cur.execute(f"SELECT id FROM {full}")
        ids = {int(r[0]) for r in cur.fetchall()}
        read = {row["id"] for row in expected.values()}
        if read != ids:
            cur.execute(f"SELECT * FROM {full} WHERE id IN ({','.join(map(str, ids - read))})")
            lost = cur.fetchall()
            raise AssertionError(f"{full}: the source read lost rows {lost}")
        assert_rows_equal(full, expected, oracle.rows(full))
        assert mutators[full].done > 5, case.id


def test_old_cursor_format_restarts_the_table(mariadb_db: Any, tmp_path: Any, caplog: Any) -> None:
    """A snapshot stored by the old version (neutral cursor: a DATE as its packed integer) restarts."""
    conn = _connect(mariadb_db)
    cur = conn.cursor()
    cur.execute("CREATE TABLE d (k date PRIMARY KEY, v int)")
    cur.execute("INSERT INTO d SELECT '2020-01-01' + INTERVAL seq DAY, seq FROM seq_1_to_40")
    config = pipeline(
        mariadb_db, tmp_path, **{"incremental.snapshot.chunk.size": 7, "snapshot.max.rows.per.run": 14}
    )
    run_capture(config)
    store_state = state(config)
    snap = store_state.data["snapshot"]["pending"][0]
    assert snap["last_key"] == ["2020-01-15"] and snap["cursor_format"] == 2
    # what the old version stored for the same progress: DATE as y << 9 | m << 5 | d
    snap["last_key"], snap["max_key"] = [str(2020 << 9 | 1 << 5 | 15)], [str(2020 << 9 | 2 << 5 | 10)]
    del snap["cursor_format"]
    from airflow_cdc.core.pipeline import build_config, build_store

    store = build_store(build_config(config))
    store.compare_and_set(config["name"], store_state.version, store_state.data)
    with caplog.at_level("WARNING"):
        for _ in range(10):
            run_capture(config)
    assert "older format" in caplog.text
    assert not state(config).data["snapshot"]["pending"]
    assert len(replay(config).rows(f"{mariadb_db.name}.d")) == 40


@pytest.mark.parametrize(
    ("ddl", "key"),
    [
        ("CREATE TABLE g (p point NOT NULL, v int)", "p"),
        ("CREATE TABLE g (k int PRIMARY KEY, p geometry NOT NULL)", "k,p"),
    ],
)
def test_key_without_exact_order_is_a_startup_error(
    mariadb_db: Any, tmp_path: Any, ddl: str, key: str
) -> None:
    conn = _connect(mariadb_db)
    conn.cursor().execute(ddl)
    config = pipeline(mariadb_db, tmp_path, **{"message.key.columns": f"{mariadb_db.name}.g:{key}"})
    with pytest.raises(UnsupportedType, match=rf"{mariadb_db.name}\.g: key column 'p'"):
        run_capture(config)
    assert state(config) is None  # nothing stored, no offset moved
