"""Issue 11, edge 5 on PostgreSQL: a transaction emitted by an earlier window but still invisible to
the next chunk's snapshot (a commit waiting for a synchronous standby).

The race, made deterministic: ``synchronous_standby_names`` names a standby that never connects, so
an ``UPDATE`` with ``synchronous_commit=on`` is in the WAL and marked committed in ``pg_xact`` (the
slot decodes it) but stays in the proc array (every snapshot lists it as running) until the setting
is cleared.  Run 2 emits the update and commits its offset past it; run 3 snapshots the table
(``execute-snapshot``) while the update is still invisible.  A chunk read then holds the old row,
positioned at run 3's window end -- after the update -- so the stale row would win.

The tests use a server of their own: they change ``synchronous_standby_names``, which would stall
every writer of a shared server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.sources.postgres import source as pg_source
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.testing.servers import PostgresServer
from tests.contract.harness import OwnPgDb
from tests.integration.postgres import support as pg

pytestmark = pytest.mark.integration
TABLE = "public.items"
HIDDEN_ID = 15


@pytest.fixture(scope="module")
def sync_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def db(sync_server: PostgresServer) -> Iterator[OwnPgDb]:
    name = f"vis_{uuid.uuid4().hex[:10]}"
    sync_server.create_database(name)
    try:
        yield OwnPgDb(name, sync_server)
    finally:
        sync_server.set_config("synchronous_standby_names", "")
        sync_server.drop_database(name)


class HeldCommit:
    """An ``UPDATE`` whose commit waits for the ghost standby: logged, committed, not yet visible."""

    def __init__(self, db: OwnPgDb) -> None:
        self.db = db
        self.error: BaseException | None = None
        self.pid: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.db.connect(autocommit=True) as conn:
                self.pid = conn.info.backend_pid
                conn.execute("SET synchronous_commit = on")
                conn.execute("UPDATE items SET v = 'new' WHERE id = %s", (HIDDEN_ID,))
        except BaseException as e:  # reported by release()
            self.error = e

    def start(self) -> None:
        """Hold the commit: returns once the backend waits for the standby (``SyncRep``)."""
        self.db.server.set_config("synchronous_standby_names", "ghost")
        self.thread.start()
        deadline = time.monotonic() + 20
        while True:
            rows = self.db.server.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (self.pid or 0,)
            )
            if rows and rows[0][0] == "SyncRep":
                return
            assert self.thread.is_alive(), f"the update did not wait for the standby: {self.error!r}"
            assert time.monotonic() < deadline, "the update never started waiting for the ghost standby"
            time.sleep(0.02)

    def hidden_xids(self) -> list[str]:
        """Transactions committed in the WAL that a snapshot taken now does not see."""
        return list(self.db.server.execute(q.HIDDEN_COMMITS)[0][0])

    def release(self, delay: float = 0.0) -> None:
        """Clear ``synchronous_standby_names`` (after ``delay`` seconds) and wait for the commit."""
        time.sleep(delay)
        self.db.server.set_config("synchronous_standby_names", "")
        self.thread.join(timeout=20)
        assert not self.thread.is_alive(), "the held commit was not released"
        if self.error is not None:
            raise self.error


def _emit_held_commit(db: OwnPgDb, tmp_path: Path) -> tuple[dict[str, Any], HeldCommit]:
    """Snapshot the table, hold an update invisible, and let a window emit it (offset committed past it)."""
    with db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items SELECT g, 'old' FROM generate_series(1, 30) g")
    config = pg.pipeline(db, tmp_path / "staging", **{"incremental.snapshot.chunk.size": 10})
    first = pg.run_capture(config)
    assert first.snapshot_rows == 30
    held = HeldCommit(db)
    held.start()
    assert held.hidden_xids(), "no committed-but-invisible transaction: the race is not set up"
    emitted = pg.run_capture(config)  # no chunk pending: nothing waits on visibility here
    assert emitted.events == 1 and emitted.committed
    assert held.thread.is_alive() and held.hidden_xids(), "the update became visible too early"
    return config, held


RESNAPSHOT = [{"type": "execute-snapshot", "data": {"data-collections": [TABLE]}}]


def test_chunk_waits_for_a_commit_the_previous_window_emitted(
    db: OwnPgDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, held = _emit_held_commit(db, tmp_path)
    hidden_reads: list[list[str]] = []
    hidden_commits = pg_source.PostgresSource._hidden_commits

    def spy(self: Any) -> list[str]:
        hidden = hidden_commits(self)
        if hidden:
            hidden_reads.append(hidden)
        return hidden

    monkeypatch.setattr(pg_source.PostgresSource, "_hidden_commits", spy)
    releaser = threading.Thread(target=held.release, args=(1.0,), daemon=True)
    releaser.start()
    try:
        resnap = pg.run_capture(config, signals=RESNAPSHOT)
    finally:
        releaser.join(timeout=30)
    held.release()  # re-raises a failure of the writer
    assert hidden_reads, "the chunk was never read while the update was invisible: race not reproduced"
    assert resnap.snapshot_rows == 30 and resnap.events == 0
    oracle = pg.assert_converged(config, [TABLE])
    assert oracle.rows(TABLE)[(HIDDEN_ID,)]["v"] == "new"


def test_without_the_reread_the_stale_chunk_row_wins(
    db: OwnPgDb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old behaviour (hidden commits not waited for): proof that the test above reproduces the
    race, and what it costs -- silver keeps the pre-update row."""
    config, held = _emit_held_commit(db, tmp_path)
    monkeypatch.setattr(q, "HIDDEN_COMMITS", "SELECT '{}'::text[]")
    try:
        resnap = pg.run_capture(config, signals=RESNAPSHOT)
    finally:
        held.release()
    assert resnap.snapshot_rows == 30
    replayed = pg.replay(config).rows(TABLE)
    live = pg.source_rows(config, TABLE)
    assert live[(HIDDEN_ID,)]["v"] == "new"
    assert replayed[(HIDDEN_ID,)]["v"] == "old", "the stale chunk row did not win: race not reproduced"
    assert {k: v for k, v in replayed.items() if k != (HIDDEN_ID,)} == {
        k: v for k, v in live.items() if k != (HIDDEN_ID,)
    }
    with psycopg.connect(db.server.dsn(db.name)) as conn:  # the server itself agrees: committed
        assert conn.execute("SELECT v FROM items WHERE id = %s", (HIDDEN_ID,)).fetchone() == ("new",)


def test_a_user_blind_to_waiting_commits_is_refused_under_synchronous_replication(db: OwnPgDb) -> None:
    """Without superuser or pg_read_all_stats the SyncRep waiters are invisible to the check: refuse
    (naming the grant) rather than read chunks that may be stale."""
    from airflow_cdc.core.errors import MissingPrivilege
    from airflow_cdc.sources.postgres.client import check_commit_visibility

    role = f"cap_{db.name}"
    server = db.server
    server.execute(f'CREATE ROLE "{role}" LOGIN REPLICATION PASSWORD \'pw\'')
    try:
        with psycopg.connect(server.dsn(db.name, user=role, password="pw"), autocommit=True) as conn:
            check_commit_visibility(conn)  # no synchronous standby: nothing to see
            server.set_config("synchronous_standby_names", "ghost")
            with pytest.raises(MissingPrivilege, match=f"{role}.*synchronous_standby_names = 'ghost'") as e:
                check_commit_visibility(conn)
            assert f'GRANT pg_read_all_stats TO "{role}"' in str(e.value)
            server.set_config("synchronous_standby_names", "")  # a GRANT would wait for the ghost
            server.execute(f'GRANT pg_read_all_stats TO "{role}"')
            server.set_config("synchronous_standby_names", "ghost")
            check_commit_visibility(conn)
    finally:
        server.set_config("synchronous_standby_names", "")
        server.execute(f'DROP ROLE "{role}"')
