"""Convergence on MariaDB: a chunked snapshot spread over many runs while writers insert, update,
delete and change keys, ALTER TABLE (add / modify / drop column) between and during windows, with
and without SIGKILLs; replayed batches must equal the source."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pymysql
import pytest

from tests.integration.mysql.support import assert_converged, execute, pipeline, run_capture
from tests.support.pipeline import CrashRuns, WriterThreads, snapshot_pending

pytestmark = pytest.mark.slow
ODD = "`we``ird tbl ü`"
ODD_NAME = "we`ird tbl ü"
ROWS = 30_000


def schema(rows: int, odd_rows: int) -> list[str]:
    """DDL and data of the scenario: ``items`` (many types) with ``rows`` rows, ``ODD`` with ``odd_rows``."""
    return [
        """CREATE TABLE items (id bigint PRIMARY KEY, qty int NOT NULL, price decimal(12,2), name varchar(60),
           created datetime(6), stamp timestamp(3) NULL, day date, flag tinyint(1), ratio double,
           blob_ varbinary(16), kind enum('a','b','c'), tags set('x','y','z'), u bigint unsigned, t time(3),
           payload json)""",
        f"""INSERT INTO items SELECT seq, seq % 97, seq * 1.37, concat('name ', seq, repeat('x', seq % 40)),
           '2024-01-01 00:00:00' + INTERVAL seq * 17 SECOND, '2024-01-01 00:00:00' + INTERVAL seq SECOND,
           '2020-01-01' + INTERVAL seq % 3000 DAY, seq % 2, seq / 7.0, unhex(md5(seq)), elt(1 + seq % 3, 'a', 'b', 'c'),
           'x,z', seq * 1000003, sec_to_time(seq % 86000), json_object('g', seq) FROM seq_1_to_{rows}""",
        f"CREATE TABLE {ODD} (k1 int, `k 2` varchar(10), val varchar(200), n decimal(20,5), PRIMARY KEY (k1, `k 2`))",
        f"INSERT INTO {ODD} SELECT seq DIV 4, concat('k', seq % 4), concat('v', seq), seq * 0.5 FROM seq_1_to_{odd_rows}",
    ]


SCHEMA = schema(ROWS, 8000)

ALTERS = [
    "ALTER TABLE items ADD COLUMN extra int NULL",
    "ALTER TABLE items MODIFY name varchar(120)",
    "ALTER TABLE items DROP COLUMN extra",
    "ALTER TABLE items ADD COLUMN note varchar(20) NULL AFTER qty",
    "ALTER TABLE items DROP COLUMN note",
    "ALTER TABLE items MODIFY qty bigint NOT NULL",
]


def _one_change(cur, rng: random.Random, next_id: list[int], lock: threading.Lock) -> None:
    op, target = rng.random(), rng.randint(1, next_id[0])
    if op < 0.3:
        with lock:
            next_id[0] += 1
            new = next_id[0]
        cur.execute(
            "INSERT INTO items (id, qty, price, name, created, stamp, kind, tags, u, payload) "
            "VALUES (%s, %s, %s, %s, now(6), now(3), 'b', 'y', %s, %s)",
            (
                new,
                rng.randint(0, 9),
                rng.randint(0, 10**6) / 100,
                f"new {new}",
                new * 7,
                json.dumps({"n": new}),
            ),
        )
    elif op < 0.6:
        cur.execute(
            "UPDATE items SET qty = qty + 1, price = %s, name = concat(left(name, 50), '!'), "
            "flag = 1 - coalesce(flag, 0) WHERE id = %s",
            (rng.randint(0, 10**6) / 100, target),
        )
    elif op < 0.75:
        cur.execute("DELETE FROM items WHERE id = %s", (target,))
    elif op < 0.85:
        with lock:
            next_id[0] += 1
            new = next_id[0]
        cur.execute("UPDATE items SET id = %s WHERE id = %s", (new, target))
    elif op < 0.95:
        cur.execute(
            f"UPDATE {ODD} SET val = concat(left(val, 150), '+'), n = n + 1 WHERE k1 = %s", (target % 2000,)
        )
    else:
        cur.execute(
            f"UPDATE IGNORE {ODD} SET `k 2` = concat(`k 2`, 'm') WHERE k1 = %s AND `k 2` = %s",
            (target % 2000, f"k{target % 4}"),
        )


def _writer(db, stop: threading.Event, seed: int, next_id: list[int], lock: threading.Lock) -> None:
    rng = random.Random(seed)
    conn = db.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                try:
                    for _ in range(rng.randint(1, 4)):
                        _one_change(cur, rng, next_id, lock)
                    conn.commit()
                except pymysql.err.MySQLError:
                    conn.rollback()
                time.sleep(rng.random() * 0.004)
    finally:
        conn.close()


class Writers(WriterThreads):
    """Concurrent writers plus, when ``alters``, a thread running ALTER TABLE now and then."""

    join_timeout = 60.0

    def __init__(self, db, n: int = 2, alters: bool = True, rows: int = ROWS) -> None:
        super().__init__()
        lock, next_id = threading.Lock(), [rows]
        self.threads = [
            threading.Thread(target=_writer, args=(db, self.stop, i, next_id, lock), daemon=True)
            for i in range(n)
        ]
        if alters:
            self.threads.append(threading.Thread(target=self._alter, args=(db,), daemon=True))

    def _alter(self, db) -> None:
        for statement in ALTERS[:4]:
            if self.stop.wait(1.5):
                return
            execute(db, statement)




def _setup(db, tmp_path: Path) -> tuple[dict, list[str]]:
    execute(db, *SCHEMA)
    config = pipeline(
        db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 1000,
            "snapshot.max.rows.per.run": 4_000,
            "run.max.events": 20_000,
        },
    )
    return config, [f"{db.name}.items", f"{db.name}.{ODD_NAME}"]


def test_converges_under_concurrent_writes_and_alters(mariadb_db, tmp_path):
    config, tables = _setup(mariadb_db, tmp_path)
    runs = 0
    with Writers(mariadb_db):
        while snapshot_pending(config) or runs < 3:
            run_capture(config)
            runs += 1
            assert runs < 60, "snapshot did not finish"
            if runs == 4:
                execute(mariadb_db, ALTERS[5])  # between windows
    for _ in range(3):
        run_capture(config)
    assert runs >= 8, "snapshot should be spread over many runs"
    oracle = assert_converged(config, tables)
    assert len(oracle.rows(tables[0])) > ROWS * 0.8



def test_converges_with_sigkill_at_random_points(mariadb_db, tmp_path):
    config, tables = _setup(mariadb_db, tmp_path)
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(config))
    runs = CrashRuns(
        config_path, "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1", random.Random(42), 0.35, 1.0
    )
    with Writers(mariadb_db):
        while snapshot_pending(config) or runs.clean < 3:
            runs.run()
    assert runs.kills >= 5, f"only {runs.kills} kills happened"
    run_capture(config)
    assert_converged(config, tables)


def test_truncate_during_chunked_snapshot(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        "CREATE TABLE tt (id int PRIMARY KEY, v varchar(20))",
        "INSERT INTO tt SELECT seq, concat('a', seq) FROM seq_1_to_5000",
    )
    config = pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 400,
            "snapshot.max.rows.per.run": 1200,
            "skipped.operations": "none",
        },
    )
    run_capture(config)
    execute(
        mariadb_db,
        "TRUNCATE tt",
        "INSERT INTO tt SELECT seq, concat('b', seq) FROM seq_1_to_4000 WHERE seq % 3 = 1",
    )
    while snapshot_pending(config):
        run_capture(config)
    run_capture(config)
    assert_converged(config, [f"{mariadb_db.name}.tt"])
