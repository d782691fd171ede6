"""Test helpers for tables without key columns, shared by every source's keyless tests.

A source's test module supplies its dialect -- the statements of :func:`random_change`
(:class:`ChangeSql`), how a writer connects, which errors a writer retries -- and the two tables of
the crash scenario: ``ev`` (``grp int, val text, qty int, note text``, many equal rows) and
``keyed`` (``id int PRIMARY KEY, v text``, ids 1 to 6000).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.oracle import ReferenceApplier
from tests.support.pipeline import (
    CrashRuns,
    WriterThreads,
    assert_multiset_equal,
    assert_rows_equal,
    replay,
    run_capture,
    snapshot_pending,
)

#: capture failpoints of the crash scenario: mid window, mid whole-table read, after publishing,
#: after the state commit
FAILPOINTS = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1,whole_read:0.3"

Rows = Callable[[dict[str, Any], str], Any]  # a source's live rows of a table (``source_multiset``)


def assert_mirrored(config: dict[str, Any], table: str, source_multiset: Rows) -> ReferenceApplier:
    """The replay of every batch holds ``table`` exactly as the source does now, as a multiset
    (``source_multiset``: the source module's reader), without anomalies; returns the replay."""
    oracle = replay(config)
    assert oracle.keyless[table].anomalies == 0
    assert_multiset_equal(table, source_multiset(config, table), oracle.multiset(table))
    return oracle


@dataclass(frozen=True)
class ChangeSql:
    """The statements of :func:`random_change` in one dialect (``%s`` parameters)."""

    copy_row: str  # one more copy of one of the group's rows (grp)
    insert_new: str  # a new row in the group (grp)
    delete_one: str  # one of the group's rows (grp)
    bump_one: str  # qty + 1 on one of the group's rows (grp)
    extend_val: str  # val + '+' on the group's rows with that qty (grp, qty)
    delete_nulls: str  # the group's rows whose note is NULL (grp)
    touch_keyed: str  # v + '!' on one keyed row (id)
    delete_keyed: str  # one keyed row (id)


def random_change(cur: Any, rng: random.Random, sql: ChangeSql) -> None:
    """One random change through the cursor ``cur``, mostly to one of several equal rows of ``ev``."""
    grp, op = rng.randrange(320), rng.random()
    if op < 0.25:  # one more copy of a row that exists (or a new one)
        cur.execute(sql.copy_row, (grp,))
        cur.execute(sql.insert_new, (grp,))
    elif op < 0.45:
        cur.execute(sql.delete_one, (grp,))
    elif op < 0.7:
        cur.execute(sql.bump_one, (grp,))
    elif op < 0.8:
        cur.execute(sql.extend_val, (grp, rng.randrange(3)))
    elif op < 0.85:
        cur.execute(sql.delete_nulls, (grp,))
    elif op < 0.95:
        cur.execute(sql.touch_keyed, (rng.randint(1, 6000),))
    else:
        cur.execute(sql.delete_keyed, (rng.randint(1, 6000),))


def _write(
    connect: Callable[[], Any],
    sql: ChangeSql,
    retry: tuple[type[BaseException], ...],
    stop: threading.Event,
    seed: int,
) -> None:
    """Transactions of 1 to 3 random changes until ``stop``; one failing with ``retry`` (deadlock,
    lock wait timeout) is rolled back."""
    rng = random.Random(seed)
    conn = connect()
    try:
        cur = conn.cursor()
        while not stop.is_set():
            try:
                for _ in range(rng.randint(1, 3)):
                    random_change(cur, rng, sql)
                conn.commit()
            except retry:
                conn.rollback()
            time.sleep(rng.random() * 0.004)
    finally:
        conn.close()


class KeylessWriters(WriterThreads):
    """``n`` writer threads making random changes (:func:`random_change`) while the context runs.

    :param connect: a new DB-API connection, not in autocommit mode.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        sql: ChangeSql,
        retry: tuple[type[BaseException], ...],
        n: int = 2,
    ) -> None:
        super().__init__()
        self.threads = [
            threading.Thread(target=_write, args=(connect, sql, retry, self.stop, i), daemon=True)
            for i in range(n)
        ]


def keyless_crash_runs(
    config: dict[str, Any],
    config_path: Path,
    writers: WriterThreads,
    table: str,
    seed: int,
    failpoints: str = FAILPOINTS,
) -> CrashRuns:
    """Captures of ``config`` (written to ``config_path``) in child processes, SIGKILLed at random
    points (``failpoints``, :data:`FAILPOINTS` by default) while ``writers`` change the tables; half
    way, an ad hoc snapshot of ``table`` (read whole again while they write).  Ends with a clean
    capture."""
    config_path.write_text(json.dumps(config))
    runs = CrashRuns(config_path, failpoints, random.Random(seed), 0.35, 1.0, budget=8)
    signalled = False
    with writers:
        while snapshot_pending(config) or runs.clean < 4 or runs.kills < 3:  # kills are random: go on until 3
            runs.run()
            if runs.runs >= 4 and not signalled:
                run_capture(config, signals=[{"execute-snapshot": {"data-collections": [table]}}])
                signalled = True
    run_capture(config)
    return runs


def assert_crash_runs_converged(
    config: dict[str, Any], runs: CrashRuns, ev: str, keyed: str, source_multiset: Rows, source_rows: Rows
) -> None:
    """After :func:`keyless_crash_runs`: at least 3 captures were killed, ``ev`` is mirrored as a
    multiset (and holds equal rows), ``keyed`` replays equal to the source."""
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    assert_mirrored(config, ev, source_multiset)
    assert_rows_equal(keyed, source_rows(config, keyed), replay(config).rows(keyed))
    rows = source_multiset(config, ev)
    assert len(rows) > len({repr(r) for r in rows}), f"{ev} should hold equal rows"
