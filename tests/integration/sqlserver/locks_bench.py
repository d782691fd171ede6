"""A bench for the lock and privilege tests (``test_source_locks_privileges.py``), on the emulator or
a real SQL Server (``tests/integration/sqlserver_real``): a captured table ``dbo.items`` of
:data:`ROWS` rows ``(id, v)``, the application's writers, and a timer for how long they wait.

Times are wall-clock seconds; :data:`HOLD` is how long a chunk's transaction is kept open after its
``SELECT`` (:class:`SlowCommit`: a big chunk's rows still streaming to the client) so that what a
mode holds until the commit shows as a writer's wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_cdc.sources.sqlserver import client, sql
from airflow_cdc.sources.sqlserver.config import sqlserver_config

ROWS = 600
CHUNK = 100
HOLD = 1.0
WAITED = 0.6 * HOLD  # a writer that waited for the chunk's commit
FREE = 0.25 * HOLD  # a writer that did not wait for anything
CHUNK_SELECT = "SELECT TOP (10) [id], [v] FROM [dbo].[items] ORDER BY [id]"  # ids 1..10


class App:
    """The application: one connection whose updates are transactions of their own, or one left
    open (:meth:`begin`).  ``param`` is the driver's placeholder (``%s`` or ``?``)."""

    def __init__(self, conn: Any, param: str) -> None:
        self.conn, self._pyformat = conn, param == "%s"
        self._update = f"UPDATE dbo.items SET v = v + 1 WHERE id = {param}"  # noqa: S608

    def update(self, key: int) -> float:
        """Update row ``key`` and commit; return the seconds it took (its lock wait)."""
        start = time.monotonic()
        self.begin(key)
        self.conn.commit()
        return time.monotonic() - start

    def begin(self, key: int) -> None:
        """Update row ``key`` and leave the transaction open (its exclusive lock held)."""
        self.conn.cursor().execute(self._update, (key,) if self._pyformat else key)

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


@dataclass
class Bench:
    """The test's database: subclasses reach it on the emulator or a real server."""

    database: str
    staging: Path
    logins: list[str] = field(default_factory=list)

    def properties(self) -> dict[str, Any]:
        raise NotImplementedError

    def app(self) -> App:
        raise NotImplementedError

    def run_capture_job(self) -> None:
        raise NotImplementedError

    def least_privilege_login(self) -> tuple[str, str]:
        """A login without VIEW SERVER STATE that reads the captured table and the cdc schema
        (what Debezium's docs require); its (user, password)."""
        raise NotImplementedError

    def values(self) -> dict[int, int]:
        conn = self.reader()
        try:
            return {r[0]: r[1] for r in conn.cursor().execute("SELECT id, v FROM [dbo].[items]").fetchall()}
        finally:
            conn.close()

    # -- shared ------------------------------------------------------------------------------
    def config(self, **props: Any) -> dict[str, Any]:
        return {"name": f"locks_{self.database}", "connector": "sqlserver", "staging.path": str(self.staging),
                "incremental.snapshot.chunk.size": CHUNK, **self.properties(),
                **{k.replace("__", "."): v for k, v in props.items()}}  # fmt: skip

    def reader(self, **props: Any) -> Any:
        """An autocommit pyodbc connection through the source's own client (T-SQL as sent)."""
        return client.connect(sqlserver_config(self.config(**props)), self.database)


def rows(conn: Any, statement: str, *params: Any) -> list[tuple]:
    return [tuple(r) for r in conn.cursor().execute(statement, *params).fetchall()]


@contextmanager
def background() -> Iterator[Callable[..., Future]]:
    """Run blocking calls on threads (``submit(fn, *args)``); every one is awaited on exit."""
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        yield pool.submit
    finally:
        pool.shutdown(wait=True)


def timed(fn: Callable[..., Any], *args: Any) -> float:
    """The seconds ``fn(*args)`` took."""
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def stamped(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the moment it returned."""
    out = fn(*args)
    return out, time.monotonic()


class SlowCommit:
    """A pyodbc connection whose transactions stay open ``hold`` seconds before ``COMMIT`` (a big
    chunk's rows still on their way to the client).  ``reached`` is set when a commit starts waiting;
    ``chunks`` records each chunk transaction's seconds from ``BEGIN`` to the end of its commit."""

    def __init__(self, conn: Any, hold: float) -> None:
        self._conn, self.hold = conn, hold
        self.reached = threading.Event()
        self.chunks: list[float] = []
        self._began = 0.0

    def cursor(self) -> _SlowCursor:
        return _SlowCursor(self, self._conn.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _SlowCursor:
    def __init__(self, owner: SlowCommit, cur: Any) -> None:
        self._owner, self._cur = owner, cur

    def execute(self, statement: str, *params: Any) -> Any:
        owner = self._owner
        if statement == sql.BEGIN:
            owner._began = time.monotonic()
        if statement == sql.COMMIT:
            owner.reached.set()
            time.sleep(owner.hold)
        out = self._cur.execute(statement, *params)
        if statement == sql.COMMIT:
            owner.chunks.append(time.monotonic() - owner._began)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)
