"""Tables without a primary key on MariaDB: captured, not refused, and mirrored exactly as
multisets (the binlog's full row images): duplicates, updates and deletes of one of several equal
rows, whole-table snapshots at the consistent snapshot's binlog coordinate, SIGKILLs."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pymysql
import pytest

from airflow_cdc.core.batch import list_batches
from tests.integration.mysql.support import (
    execute,
    pipeline,
    replay,
    run_capture,
    source_multiset,
    source_rows,
)
from tests.support.pipeline import (
    CrashRuns,
    WriterThreads,
    assert_multiset_equal,
    assert_rows_equal,
    snapshot_pending,
)


def assert_mirrored(config, table):
    oracle = replay(config)
    assert oracle.keyless[table].anomalies == 0
    assert_multiset_equal(table, source_multiset(config, table), oracle.multiset(table))
    return oracle


def test_keyless_table_is_a_multiset(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        "CREATE TABLE h (a int, b varchar(10), n decimal(6,2), d datetime(3), j json, bl varbinary(4))",
        "INSERT INTO h SELECT seq % 7, concat('b', seq % 3), NULL, '2024-01-01 00:00:00.5', '{\"x\": 1}', "
        "x'00' FROM seq_1_to_300",
        "INSERT INTO h VALUES (NULL, NULL, NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    config = pipeline(mariadb_db, tmp_path / "staging", **{"snapshot.max.rows.per.run": 50})
    run_capture(config)
    assert not snapshot_pending(config), "a keyless table is read whole in one run"
    table = f"{mariadb_db.name}.h"
    batch = list_batches(config["staging.path"], config["name"])[-1]
    assert batch.table_info(table)["keyless"] == "multiset"
    assert_mirrored(config, table)
    execute(
        mariadb_db,
        "DELETE FROM h WHERE a = 1 LIMIT 1",
        "UPDATE h SET n = 5 WHERE a = 2 LIMIT 1",
        "DELETE FROM h WHERE a IS NULL LIMIT 1",
        "INSERT INTO h VALUES (1, 'b1', NULL, '2024-01-01 00:00:00.5', '{\"x\": 1}', x'00')",
        "UPDATE h SET b = 'z' WHERE a = 3",
        "DELETE FROM h WHERE a = 4",
        "INSERT INTO h (a, b) VALUES (4, 'back'), (4, 'back')",
    )
    run_capture(config)
    assert_mirrored(config, table)
    execute(mariadb_db, "TRUNCATE h", "INSERT INTO h (a) VALUES (7), (7)", "UPDATE h SET a = 8 LIMIT 1")
    run_capture(config, signals=[{"execute-snapshot": {"data-collections": [table]}}])
    execute(mariadb_db, "DELETE FROM h WHERE a = 7 LIMIT 1")
    run_capture(config)
    assert_mirrored(config, table)


def _change(cur, rng: random.Random) -> None:
    """One random change, mostly to one of several equal rows of ``ev`` (``LIMIT 1``)."""
    grp, op = rng.randrange(320), rng.random()
    if op < 0.25:
        cur.execute("INSERT INTO ev SELECT grp, val, qty, note FROM ev WHERE grp = %s LIMIT 1", (grp,))
        cur.execute("INSERT INTO ev VALUES (%s, 'new', 0, NULL)", (grp,))
    elif op < 0.45:
        cur.execute("DELETE FROM ev WHERE grp = %s LIMIT 1", (grp,))
    elif op < 0.7:
        cur.execute("UPDATE ev SET qty = qty + 1 WHERE grp = %s LIMIT 1", (grp,))
    elif op < 0.8:
        cur.execute(
            "UPDATE ev SET val = concat(val, '+') WHERE grp = %s AND qty = %s", (grp, rng.randrange(3))
        )
    elif op < 0.85:
        cur.execute("DELETE FROM ev WHERE grp = %s AND note IS NULL", (grp,))
    elif op < 0.95:
        cur.execute("UPDATE keyed SET v = concat(v, '!') WHERE id = %s", (rng.randint(1, 6000),))
    else:
        cur.execute("DELETE FROM keyed WHERE id = %s", (rng.randint(1, 6000),))


def _writer(db, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    conn = db.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                try:
                    for _ in range(rng.randint(1, 3)):
                        _change(cur, rng)
                    conn.commit()
                except pymysql.err.OperationalError:  # deadlock, lock wait timeout
                    conn.rollback()
                time.sleep(rng.random() * 0.004)
    finally:
        conn.close()


class Writers(WriterThreads):
    def __init__(self, db, n: int = 2) -> None:
        super().__init__()
        self.threads = [
            threading.Thread(target=_writer, args=(db, self.stop, i), daemon=True) for i in range(n)
        ]


def keyless_crash_runs(db, tmp_path: Path, seed: int = 5) -> tuple[dict, CrashRuns]:
    """``ev`` (equal rows) and ``keyed`` captured by child processes SIGKILLed at random points
    (mid window, mid whole-table read, after publishing, after the state commit) while writers
    change both; half way, an ad hoc snapshot of ``ev`` (read whole again while they write)."""
    execute(
        db,
        "CREATE TABLE ev (grp int, val varchar(40), qty int, note varchar(5))",
        "INSERT INTO ev SELECT seq % 300, concat('v', seq % 7), seq % 3, IF(seq % 11 = 0, NULL, 'n') "
        "FROM seq_1_to_30000",
        "CREATE TABLE keyed (id int PRIMARY KEY, v varchar(200))",
        "INSERT INTO keyed SELECT seq, concat('k', seq) FROM seq_1_to_6000",
    )
    config = pipeline(
        db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 500, "snapshot.max.rows.per.run": 1500},
    )
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(config))
    failpoints = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1,whole_read:0.3"
    runs = CrashRuns(config_path, failpoints, random.Random(seed), 0.35, 1.0, budget=8)
    signalled = False
    with Writers(db):
        while snapshot_pending(config) or runs.clean < 4 or runs.kills < 3:  # kills are random: go on until 3
            runs.run()
            if runs.runs >= 4 and not signalled:
                run_capture(config, signals=[{"execute-snapshot": {"data-collections": [f"{db.name}.ev"]}}])
                signalled = True
    run_capture(config)
    return config, runs


@pytest.mark.slow
def test_keyless_converges_with_sigkills(mariadb_db, tmp_path: Path):
    config, runs = keyless_crash_runs(mariadb_db, tmp_path)
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    ev, keyed = f"{mariadb_db.name}.ev", f"{mariadb_db.name}.keyed"
    assert_mirrored(config, ev)
    assert_rows_equal(keyed, source_rows(config, keyed), replay(config).rows(keyed))
    rows = source_multiset(config, ev)
    assert len(rows) > len({repr(r) for r in rows})
