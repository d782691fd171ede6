"""Snapshot parts on PostgreSQL: each run's chunks read by parallel readers while writers write,
loaded by the capture in key order; runs until every snapshot completes, then row-by-row equality."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.core.pipeline import build_capture
from tests.integration.postgres.support import assert_converged, pipeline, source_rows
from tests.support.pipeline import WriterThreads, assert_rows_equal, replay, snapshot_pending
from tests.support.snapshot_parts import count_loads, prepare

pytestmark = pytest.mark.slow

ROWS = 2400
SCHEMA = f"""
CREATE TABLE t_int (id int PRIMARY KEY, v text, n int);
INSERT INTO t_int SELECT g, 'v' || g, g FROM generate_series(1, {ROWS}) g;
CREATE TABLE t_text (k text COLLATE "en-x-icu" PRIMARY KEY, v text);
INSERT INTO t_text SELECT (ARRAY['a', 'B', 'ä', 'Z', 'é'])[g % 5 + 1] || g, 'v' || g
FROM generate_series(1, {ROWS}) g;
CREATE TABLE t_comp (a int, "b b" text, v text, PRIMARY KEY (a, "b b"));
INSERT INTO t_comp SELECT g / 3, 'k' || (g % 3), 'v' || g FROM generate_series(1, {ROWS}) g;
CREATE TABLE t_uuid (u uuid PRIMARY KEY, v text);
INSERT INTO t_uuid SELECT md5(g::text)::uuid, 'v' || g FROM generate_series(1, {ROWS}) g;
CREATE TABLE t_ts (t timestamptz PRIMARY KEY, v text);
INSERT INTO t_ts SELECT timestamptz '2024-01-01 00:00:00.5+00' + g * interval '1 minute 1 ms', 'v' || g
FROM generate_series(1, {ROWS}) g;
"""
TABLES = [f"public.{t}" for t in ("t_int", "t_text", "t_comp", "t_uuid", "t_ts")]
# one statement per table, each touching a random existing or new row (inserts, updates, deletes)
WRITES = [
    "INSERT INTO t_int VALUES (%(n)s, 'w', 0) ON CONFLICT (id) DO UPDATE SET v = 'u' || t_int.n",
    "UPDATE t_int SET v = 'u' || n, n = n + 1 WHERE id = %(r)s",
    "DELETE FROM t_int WHERE id = %(r)s",
    "UPDATE t_text SET v = 'u' WHERE k = (ARRAY['a', 'B', 'ä', 'Z', 'é'])[%(r)s %% 5 + 1] || %(r)s",
    "INSERT INTO t_text VALUES ('b' || %(n)s, 'w') ON CONFLICT DO NOTHING",
    "DELETE FROM t_comp WHERE a = %(r)s / 3 AND \"b b\" = 'k' || (%(r)s %% 3)",
    "UPDATE t_comp SET v = 'u' WHERE a = %(r)s / 3",
    "UPDATE t_uuid SET v = 'u' WHERE u = md5(%(r)s::text)::uuid",
    "DELETE FROM t_uuid WHERE u = md5((%(r)s + 1)::text)::uuid",
    "INSERT INTO t_ts VALUES (timestamptz '2024-01-01 00:00:00.5+00' + %(r)s * interval '1 minute', 'w') "
    "ON CONFLICT DO NOTHING",
    "UPDATE t_ts SET v = 'u' WHERE t = timestamptz '2024-01-01 00:00:00.5+00' + %(r)s * interval '1 minute 1 ms'",
]


def _writer(dsn: str, stop: threading.Event, seed: int, next_id: list[int], lock: threading.Lock) -> None:
    rnd = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with lock:
                next_id[0] += 1
                n = next_id[0]
            with conn.transaction():
                for _ in range(rnd.randint(1, 3)):
                    conn.execute(rnd.choice(WRITES), {"n": n, "r": rnd.randint(1, ROWS + 50)})
            time.sleep(0.002)
    with lock:
        next_id.append(seed)  # this writer ran to the end (a crashed one fails the test)


class Writers(WriterThreads):
    def __init__(self, dsn: str, n: int = 2) -> None:
        super().__init__()
        lock, next_id = threading.Lock(), [ROWS * 10]
        self.next_id, self.n = next_id, n
        self.threads = [
            threading.Thread(target=_writer, args=(dsn, self.stop, i, next_id, lock), daemon=True)
            for i in range(n)
        ]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert len(self.next_id) == 1 + self.n, "a writer failed"
        assert self.next_id[0] > ROWS * 10 + 100, "the writers hardly wrote"


def _setup(pg_db: Any, tmp_path: Path) -> dict[str, Any]:
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return pipeline(
        pg_db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 250, "snapshot.max.rows.per.run": 2000},
    )


def test_parallel_parts_converge_under_writes(pg_db, tmp_path, monkeypatch):
    config = _setup(pg_db, tmp_path)
    loaded = count_loads(monkeypatch)
    runs = 0
    with Writers(pg_db.dsn):
        while snapshot_pending(config):
            plan = prepare(config, 3)
            build_capture(config).run(commit=True, prepared=plan)
            assert plan is None or not Path(plan).exists(), "a consumed plan is removed"
            runs += 1
            assert runs < 40, "snapshot did not finish"
    build_capture(config).run(commit=True)  # the writes after the last run
    # the first run has no committed state to plan from; every later one used its parts
    assert runs >= 5 * ROWS // 2000 and len(loaded) == runs - 1 and all(loaded), loaded
    assert_converged(config, TABLES)


def test_stale_plan_is_refused_and_the_run_still_converges(pg_db, tmp_path, monkeypatch, caplog):
    config = _setup(pg_db, tmp_path)
    loaded = count_loads(monkeypatch)
    build_capture(config).run(commit=True)  # anchors the state, snapshots begin
    plan = prepare(config, 3)
    assert plan is not None
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE t_int SET v = 'after plan' WHERE id <= 3000")
        conn.execute("DELETE FROM t_comp")
    build_capture(config).run(commit=True)  # another run commits: the plan is stale now
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.core.snapshot_parts"):
        build_capture(config).run(commit=True, prepared=plan)
    assert "stale plan" in caplog.text and loaded == [0]
    assert not Path(plan).exists(), "a refused plan is removed"
    plan = prepare(config, 3)  # fits the state, but a part claims to be read before the window start
    done = Path(plan) / "part-0001" / "done.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "low": 0}))
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.core.snapshot_parts"):
        build_capture(config).run(commit=True, prepared=plan)
    assert "part 1 read before the window start" in caplog.text and loaded == [0, 0]
    for _ in range(40):
        if not snapshot_pending(config):
            break
        build_capture(config).run(commit=True, prepared=prepare(config, 2))
    assert not snapshot_pending(config)
    assert_converged(config, TABLES)


def test_adhoc_snapshot_with_condition_and_repeating_surrogate_key(pg_db, tmp_path, monkeypatch):
    """Ranges over a surrogate key whose values repeat (and are NULL): equal values never straddle
    two parts, the condition holds in the boundary query too; every matching row is read once."""
    from airflow_cdc.core.batch import list_batches
    from tests.airflow.support import batch_rows

    config = _setup(pg_db, tmp_path)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE t_int ADD COLUMN grp int")
        conn.execute("UPDATE t_int SET grp = CASE WHEN id % 11 = 0 THEN NULL ELSE id / 40 END")
    while snapshot_pending(config):
        build_capture(config).run(commit=True)
    before = {b.batch_id for b in list_batches(config["staging.path"], config["name"])}
    config["snapshot.max.rows.per.run"] = 500  # several runs of parts, ~167 rows per part
    config["snapshot.additional.conditions.raw.sql"] = True  # n % 3: raw SQL, opted in (boundary queries too)
    loaded = count_loads(monkeypatch)
    signal = {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["public.t_int"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "public.t_int", "filter": "n % 3 <> 1"}],
            "surrogate-key": "grp",
        },
    }
    build_capture(config).run(commit=True, signals=[signal])  # the first chunks: read by capture
    runs = 1
    while snapshot_pending(config):
        build_capture(config).run(commit=True, prepared=prepare(config, 3))
        runs += 1
        assert runs < 20
    keys = [
        r["after"]["id"]
        for b in list_batches(config["staging.path"], config["name"])
        if b.batch_id not in before
        for r in batch_rows(b, "public.t_int")
        if r["op"] == "r"
    ]
    with psycopg.connect(pg_db.dsn) as conn:
        expected = [r[0] for r in conn.execute("SELECT id FROM t_int WHERE n % 3 <> 1")]
    assert sorted(keys) == sorted(expected)  # each matching row exactly once
    assert runs >= 2 and loaded and all(loaded), loaded
    assert_converged(config, TABLES)


@pytest.mark.parametrize("ddl", ["DROP COLUMN a", "ADD COLUMN d int, DROP COLUMN b"])
def test_parts_read_before_the_columns_changed_are_refused(pg_db, tmp_path, monkeypatch, caplog, ddl):
    """A column dropped between the parts' reads and the capture: the parts' rows have the old
    columns, the run stages the new ones; the plan is refused (the run reads its chunks itself),
    never loaded shifted by a column."""
    table = "cols_" + ddl.split()[-1]
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, a text, b numeric, c date)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'a' || g, g * 1.5, date '2000-01-01' + g "
                     "FROM generate_series(1, 1500) g")
    config = pipeline(pg_db, tmp_path / "staging", **{
        "incremental.snapshot.chunk.size": 100, "snapshot.max.rows.per.run": 400, "name": table,
        "table.include.list": f"public.{table}", "slot.name": f"slot_{table}", "publication.name": f"pub_{table}"})
    build_capture(config).run(commit=True)
    loaded = count_loads(monkeypatch)
    plan = prepare(config, 2)
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} {ddl}")
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.core.snapshot_parts"):
        build_capture(config).run(commit=True, prepared=plan)
    assert "columns" in caplog.text and loaded == [0]
    while snapshot_pending(config):
        build_capture(config).run(commit=True, prepared=prepare(config, 2))
    build_capture(config).run(commit=True)
    assert loaded[1:] and all(loaded[1:]), "later plans are loaded"
    rows = source_rows(config, f"public.{table}")
    assert_rows_equal(table, rows, replay(config).rows(f"public.{table}"), lenient_columns=True)
