"""Tables without a key on real Vitess (``test_real_vitess_convergence``'s cluster): their columns,
the live rows read through vtgate as a multiset, and writers that change one of several equal rows."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql

from airflow_cdc.testing import vitess_real
from tests.support.pipeline import WriterThreads

#: equal rows by design: few distinct values per group; ``grp`` is the hash vindex column, so equal
#: rows live on one shard and a ``WHERE grp = ...`` change is routed to it alone
EV = "grp INT, val VARCHAR(40), qty INT, note VARCHAR(5) NULL"
EV_COLUMNS = ("grp", "val", "qty", "note")
KV = "id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(200)"
GROUPS = 300
_RETRIED = (1205, 1213)  # lock wait timeout, deadlock


def vtgate_multiset(cluster: vitess_real.RealVitessCluster, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (an ``EV``-shaped table) read back through vtgate, as staged."""
    rows = cluster.execute(f"SELECT {', '.join(EV_COLUMNS)} FROM {table}")  # noqa: S608 - fixed names
    return [dict(zip(EV_COLUMNS, r, strict=True)) for r in rows]


def fill(cluster: vitess_real.RealVitessCluster, table: str, rows: int) -> None:
    """``rows`` rows over :data:`GROUPS` groups: duplicates, NULL notes, both shards."""
    values = [
        f"({i % GROUPS}, 'v{i % 7}', {i % 3}, {'NULL' if i % 11 == 0 else repr('n')})" for i in range(rows)
    ]
    for at in range(0, rows, 500):
        cluster.execute(
            f"INSERT INTO {table} (grp, val, qty, note) VALUES " + ", ".join(values[at : at + 500])
        )  # noqa: S608


def change(cur: Any, rng: random.Random, table: str = "ev") -> None:
    """One transaction of 1-3 random changes to one group of ``table`` (so one shard), mostly to one
    of several equal rows (``LIMIT 1``); or one change of ``kv``."""
    grp = rng.randrange(GROUPS)
    if rng.random() < 0.15:
        key = rng.randint(1, 300)
        if rng.random() < 0.7:
            cur.execute("UPDATE kv SET v = CONCAT(v, '!') WHERE id = %s", (key,))
        else:
            cur.execute("DELETE FROM kv WHERE id = %s", (key,))
        return
    cur.execute("BEGIN")
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        if op < 0.3:
            cur.execute(f"SELECT {', '.join(EV_COLUMNS)} FROM {table} WHERE grp = %s LIMIT 1", (grp,))  # noqa: S608
            same = cur.fetchone() or (grp, "new", 0, None)
            cur.execute(f"INSERT INTO {table} (grp, val, qty, note) VALUES (%s, %s, %s, %s)", same)  # noqa: S608
            cur.execute(f"INSERT INTO {table} (grp, val, qty, note) VALUES (%s, 'new', 0, NULL)", (grp,))  # noqa: S608
        elif op < 0.5:
            cur.execute(f"DELETE FROM {table} WHERE grp = %s LIMIT 1", (grp,))  # noqa: S608
        elif op < 0.75:
            cur.execute(f"UPDATE {table} SET qty = qty + 1 WHERE grp = %s LIMIT 1", (grp,))  # noqa: S608
        elif op < 0.9:
            cur.execute(
                f"UPDATE {table} SET val = CONCAT(val, '+') WHERE grp = %s AND qty = %s",  # noqa: S608
                (grp, rng.randrange(3)),
            )
        else:
            cur.execute(f"DELETE FROM {table} WHERE grp = %s AND note IS NULL", (grp,))  # noqa: S608
    cur.execute("COMMIT")


class Writers(WriterThreads):
    """Two threads, each with its own vtgate connection, running ``step(cursor, rng, n)`` (``n``:
    the thread's 1-based count of steps) until stopped; a step failing with a MySQL error code in
    ``retried`` is rolled back and the thread goes on, any other error is kept in ``errors``.  By
    default they change ``ev`` and ``kv`` (:func:`change`), retrying deadlocks: two writers scanning
    one group (no index) deadlock."""

    def __init__(
        self,
        cluster: vitess_real.RealVitessCluster,
        step: Callable[[Any, random.Random, int], None] = lambda cur, rng, n: change(cur, rng),
        seeds: tuple[int, ...] = (3, 4),
        retried: tuple[int, ...] = _RETRIED,
    ) -> None:
        super().__init__()
        self.cluster, self.step, self.retried = cluster, step, retried
        self.errors: list[BaseException] = []
        self.writes = 0
        self.threads = [threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in seeds]

    def _run(self, seed: int) -> None:
        rng, n = random.Random(seed), 0
        try:
            with self.cluster.connect() as conn, conn.cursor() as cur:
                while not self.stop.is_set():
                    n += 1
                    try:
                        self.step(cur, rng, n)
                        self.writes += 1
                    except pymysql.err.OperationalError as e:
                        if e.args[0] not in self.retried:
                            raise
                        cur.execute("ROLLBACK")
                    time.sleep(rng.random() * 0.01)
        except pymysql.MySQLError as e:
            self.errors.append(e)
