"""Tables without a primary key on MariaDB: captured, not refused, and mirrored exactly as
multisets (the binlog's full row images): duplicates, updates and deletes of one of several equal
rows, whole-table snapshots at the consistent snapshot's binlog coordinate, SIGKILLs."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pymysql
import pytest

from airflow_cdc.core.batch import list_batches
from tests.integration.mysql.support import (
    execute,
    pipeline,
    run_capture,
    source_multiset,
    source_rows,
)
from tests.support import keyless
from tests.support.pipeline import CrashRuns, snapshot_pending

assert_mirrored = partial(keyless.assert_mirrored, source_multiset=source_multiset)


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


#: the random changes of the crash scenario (:func:`keyless.random_change`)
CHANGES = keyless.ChangeSql(
    copy_row="INSERT INTO ev SELECT grp, val, qty, note FROM ev WHERE grp = %s LIMIT 1",
    insert_new="INSERT INTO ev VALUES (%s, 'new', 0, NULL)",
    delete_one="DELETE FROM ev WHERE grp = %s LIMIT 1",
    bump_one="UPDATE ev SET qty = qty + 1 WHERE grp = %s LIMIT 1",
    extend_val="UPDATE ev SET val = concat(val, '+') WHERE grp = %s AND qty = %s",
    delete_nulls="DELETE FROM ev WHERE grp = %s AND note IS NULL",
    touch_keyed="UPDATE keyed SET v = concat(v, '!') WHERE id = %s",
    delete_keyed="DELETE FROM keyed WHERE id = %s",
)
RETRY = (pymysql.err.OperationalError,)  # deadlock, lock wait timeout


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
    writers = keyless.KeylessWriters(lambda: db.connect(autocommit=False), CHANGES, RETRY)
    return config, keyless.keyless_crash_runs(
        config, tmp_path / "pipeline.json", writers, f"{db.name}.ev", seed
    )


@pytest.mark.slow
def test_keyless_converges_with_sigkills(mariadb_db, tmp_path: Path):
    config, runs = keyless_crash_runs(mariadb_db, tmp_path)
    ev, keyed = f"{mariadb_db.name}.ev", f"{mariadb_db.name}.keyed"
    keyless.assert_crash_runs_converged(config, runs, ev, keyed, source_multiset, source_rows)
