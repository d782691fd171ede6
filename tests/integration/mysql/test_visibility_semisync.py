"""Issue 11, edge 5 on MariaDB: a transaction emitted by an earlier window but not yet committed in
the engine when the next chunk's consistent snapshot is taken (semi-sync ``AFTER_SYNC``).

The race, made deterministic: semi-synchronous replication waits ``AFTER_SYNC`` for a replica's ACK
that never comes (no replica is connected; ``rpl_semi_sync_master_wait_no_slave`` is on), so an
``UPDATE`` is written to the binlog (the window reads it) but InnoDB has not committed it: every
consistent snapshot still shows the old row, and its ``binlog_snapshot_position`` lies before the
update.  Run 2 emits the update and commits its offset past it; run 3 snapshots the table
(``execute-snapshot``) meanwhile.  The chunk row is positioned at run 3's window end -- after the
update -- so a stale chunk row would win.  Turning semi-sync off releases the waiting commit.

The tests use a server of their own: semi-sync would stall every writer of a shared server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.sources.mysql import source as my_source
from airflow_cdc.testing.servers import MariaDbServer
from tests.contract.harness import OwnMariaDb
from tests.integration.mysql import support as my

pytestmark = pytest.mark.integration
HIDDEN_ID = 15
WAITING = "Waiting for semi-sync ACK from slave"


@pytest.fixture(scope="module")
def semisync_server() -> Iterator[MariaDbServer]:
    server = MariaDbServer().start()
    try:
        server.execute("SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'")
        server.execute("SET GLOBAL rpl_semi_sync_master_timeout = 60000")  # ms; released by the test
        server.execute("SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON")
        yield server
    finally:
        server.stop()


@pytest.fixture
def db(semisync_server: MariaDbServer) -> Iterator[OwnMariaDb]:
    name = semisync_server.create_database(f"vis_{uuid.uuid4().hex[:10]}")
    try:
        yield OwnMariaDb(name, semisync_server)
    finally:
        semisync_server.execute("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        semisync_server.drop_database(name)


class HeldCommit:
    """An ``UPDATE`` in the binlog whose engine commit waits for a semi-sync ACK."""

    def __init__(self, db: OwnMariaDb) -> None:
        self.db = db
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            my.execute(self.db, f"UPDATE items SET v = 'new' WHERE id = {HIDDEN_ID}")
        except BaseException as e:  # reported by release()
            self.error = e

    def start(self) -> None:
        """Hold the commit: returns once the update is binlogged and waits for the ACK."""
        server = self.db.server
        server.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON")
        self.thread.start()
        deadline = time.monotonic() + 20
        while not server.execute(
            "SELECT 1 FROM information_schema.processlist WHERE state = %s AND db = %s", (WAITING, self.db.name)
        ):
            assert self.thread.is_alive(), f"the update did not wait for a semi-sync ACK: {self.error!r}"
            assert time.monotonic() < deadline, "the update never started waiting for a semi-sync ACK"
            time.sleep(0.02)

    def invisible(self) -> bool:
        """Whether a consistent snapshot taken now still shows the old row."""
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                cur.execute(f"SELECT v FROM items WHERE id = {HIDDEN_ID}")
                return bool(cur.fetchone() == ("old",))
        finally:
            conn.close()

    def release(self, delay: float = 0.0) -> None:
        """Turn semi-sync off (after ``delay`` seconds): the waiting commit completes."""
        time.sleep(delay)
        self.db.server.execute("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the held commit was not released"
        if self.error is not None:
            raise self.error


def _emit_held_commit(db: OwnMariaDb, tmp_path: Path) -> tuple[dict[str, Any], HeldCommit]:
    """Snapshot the table, hold an update uncommitted, and let a window emit it (offset past it)."""
    values = ", ".join(f"({i}, 'old')" for i in range(1, 31))
    my.execute(db, "CREATE TABLE items (id int PRIMARY KEY, v varchar(10))", f"INSERT INTO items VALUES {values}")
    config = my.pipeline(db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 10})
    first = my.run_capture(config)
    assert first.snapshot_rows == 30
    held = HeldCommit(db)
    held.start()
    assert held.invisible(), "the held update is visible: the race is not set up"
    emitted = my.run_capture(config)  # no chunk pending: nothing waits on visibility here
    assert emitted.events == 1 and emitted.committed
    assert held.thread.is_alive() and held.invisible(), "the update was committed too early"
    return config, held


def _table(db: OwnMariaDb) -> str:
    return f"{db.name}.items"


def test_chunk_waits_for_a_commit_the_previous_window_emitted(
    db: OwnMariaDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, held = _emit_held_commit(db, tmp_path)
    behind: list[int] = []
    read_once = my_source.MySqlSource._read_chunk_structured

    def spy(self: Any, *args: Any) -> Any:
        chunk = read_once(self, *args)
        if not self._start[0]:  # a live read (convergence check), not a capture run
            return chunk
        start = my_source.client.coordinate(self._start[0], self._start[1])
        if chunk.watermark.coord is not None and chunk.watermark.coord < start:
            behind.append(chunk.watermark.coord)
        return chunk

    monkeypatch.setattr(my_source.MySqlSource, "_read_chunk_structured", spy)
    releaser = threading.Thread(target=held.release, args=(1.0,), daemon=True)
    releaser.start()
    try:
        resnap = my.run_capture(config, signals=[{"type": "execute-snapshot",
                                                  "data": {"data-collections": [_table(db)]}}])
    finally:
        releaser.join(timeout=30)
    held.release()  # re-raises a failure of the writer
    assert behind, "no chunk was read while the update was uncommitted: race not reproduced"
    assert resnap.snapshot_rows == 30 and resnap.events == 0
    oracle = my.assert_converged(config, [_table(db)])
    assert oracle.rows(_table(db))[(HIDDEN_ID,)]["v"] == "new"


def test_without_the_reread_the_stale_chunk_row_wins(
    db: OwnMariaDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old behaviour (the chunk's binlog_snapshot coordinate not compared with the window start):
    proof that the test above reproduces the race, and what it costs -- silver keeps the old row."""
    config, held = _emit_held_commit(db, tmp_path)
    monkeypatch.setattr(my_source.MySqlSource, "_read_chunk", my_source.MySqlSource._read_chunk_structured)
    try:
        resnap = my.run_capture(config, signals=[{"type": "execute-snapshot",
                                                  "data": {"data-collections": [_table(db)]}}])
    finally:
        held.release()
    assert resnap.snapshot_rows == 30
    replayed = my.replay(config).rows(_table(db))
    live = my.source_rows(config, _table(db))
    assert live[(HIDDEN_ID,)]["v"] == "new"
    assert replayed[(HIDDEN_ID,)]["v"] == "old", "the stale chunk row did not win: race not reproduced"
    assert {k: v for k, v in replayed.items() if k != (HIDDEN_ID,)} == {
        k: v for k, v in live.items() if k != (HIDDEN_ID,)
    }
