"""Snapshot parts on MariaDB: a composite-key table (integer + case-insensitive text) with
values of every stored kind (Decimal, float, bytes, text, dates as numbers) read by parallel part
readers while writers write; several runs until the snapshot completes, then row-by-row equality."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest

from airflow_cdc.core.pipeline import build_capture
from tests.integration.mysql.support import assert_converged, execute, pipeline
from tests.support.pipeline import WriterThreads, snapshot_pending
from tests.support.snapshot_parts import count_loads, prepare

pytestmark = pytest.mark.slow

ROWS = 1800


def _writer(db: Any, stop: threading.Event, seed: int, done: list[int]) -> None:
    rnd = random.Random(seed)
    conn = db.connect(autocommit=True)
    writes = 0
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                r = rnd.randint(0, ROWS // 3 + 5)
                k = rnd.choice(["a", "B", "c"])
                statement = rnd.choice(
                    [
                        "UPDATE t SET d = d + 1, f = f / 3, b = UNHEX(MD5(RAND())) WHERE a = %s AND k = %s",
                        "DELETE FROM t WHERE a = %s AND k = %s",
                        "INSERT INTO t (a, k, d, f, b, s, ts) VALUES (%s, %s, 1.5, 0.1, x'00ff', 'new', NOW(6)) "
                        "ON DUPLICATE KEY UPDATE s = 'upsert'",
                    ]
                )
                cur.execute(statement, (r, k))
                writes += 1
                time.sleep(0.002)
    finally:
        conn.close()
        done.append(writes)


class Writers(WriterThreads):
    def __init__(self, db: Any, n: int = 2) -> None:
        super().__init__()
        self.done: list[int] = []
        self.threads = [
            threading.Thread(target=_writer, args=(db, self.stop, i, self.done), daemon=True)
            for i in range(n)
        ]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert len(self.done) == len(self.threads) and min(self.done) > 20, self.done


def test_parallel_parts_converge_with_a_composite_key(mariadb_db, tmp_path, monkeypatch):
    execute(
        mariadb_db,
        "CREATE TABLE t (a INT, k VARCHAR(20) COLLATE utf8mb4_general_ci, d DECIMAL(20,6), f DOUBLE, "
        "b VARBINARY(40), s TEXT, ts DATETIME(6), PRIMARY KEY (a, k))",
        "INSERT INTO t SELECT seq DIV 3, ELT(seq MOD 3 + 1, 'a', 'B', 'c'), seq / 7, seq / 3e0, "
        "UNHEX(MD5(seq)), CONCAT('s', seq), TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq SECOND "
        f"FROM seq_0_to_{ROWS - 1}",
    )
    config = pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 150, "snapshot.max.rows.per.run": 600},
    )
    loaded = count_loads(monkeypatch)
    runs = 0
    with Writers(mariadb_db):
        while snapshot_pending(config):
            build_capture(config).run(commit=True, prepared=prepare(config, 3))
            runs += 1
            assert runs < 30, "snapshot did not finish"
    build_capture(config).run(commit=True)
    assert runs >= 3 and len(loaded) == runs - 1 and all(loaded), loaded
    assert_converged(config, [f"{mariadb_db.name}.t"])


@pytest.mark.parametrize("ddl", ["DROP COLUMN a", "ADD COLUMN d INT, DROP COLUMN b"])
def test_parts_read_before_the_columns_changed_are_refused(mariadb_db, tmp_path, monkeypatch, caplog, ddl):
    """A column dropped between the parts' reads and the capture: the parts' rows have the old
    structure, the run stages with the new one; the plan is refused (the run reads its chunks
    itself), never loaded shifted by a column."""
    table = "cols_" + ddl.split()[-1]
    execute(
        mariadb_db,
        f"CREATE TABLE {table} (id INT PRIMARY KEY, a VARCHAR(20), b DECIMAL(10,1), c DATE)",
        f"INSERT INTO {table} SELECT seq, CONCAT('a', seq), seq * 1.5, DATE '2000-01-01' + INTERVAL seq DAY "
        "FROM seq_1_to_1500",
    )
    config = pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{"incremental.snapshot.chunk.size": 100, "snapshot.max.rows.per.run": 400,
           "table.include.list": f"{mariadb_db.name}.{table}", "name": table},
    )
    build_capture(config).run(commit=True)
    loaded = count_loads(monkeypatch)
    plan = prepare(config, 2)
    execute(mariadb_db, f"ALTER TABLE {table} {ddl}")
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.core.snapshot_parts"):
        build_capture(config).run(commit=True, prepared=plan)
    assert "columns" in caplog.text and loaded == [0]
    runs = 0
    while snapshot_pending(config):
        build_capture(config).run(commit=True, prepared=prepare(config, 2))
        runs += 1
        assert runs < 10
    build_capture(config).run(commit=True)
    assert loaded[1:] and all(loaded[1:]), "later plans are loaded"
    assert_converged(config, [f"{mariadb_db.name}.{table}"])
