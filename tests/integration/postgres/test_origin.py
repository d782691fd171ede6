"""``source.origin`` / ``origin_lsn`` (Debezium 3.6) against real servers.

A transaction replayed through a replication origin -- as a logical replication subscriber's
apply worker does, here by hand with ``pg_replication_origin_session_setup`` (superuser) and
``pg_replication_origin_xact_setup`` -- makes pgoutput send an Origin message after its Begin:
every event of the transaction carries the origin's name and the commit LSN on the origin server;
every other event has both null.  pgoutput sends that message on every major tested (13-18, not
only 16+: 16 added the ``origin`` *option* that filters such transactions out, which we do not
use).  Checked on both window readers and both decoders (compiled and pure Python).  A
transaction the stream reader receives in progress (protocol 2, 14+) reports origin LSN 0: the
server does not know it before the commit and sends ``InvalidXLogRecPtr``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.sources.postgres import columnar
from tests.integration.postgres.support import every_version, pipeline, run_capture

ORIGIN_LSN = 0x12345  # '0/12345'


@pytest.fixture(params=["compiled", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which pgoutput decoder stages the row changes (``AIRFLOW_CDC_PG_DECODER``)."""
    if request.param == "python":
        monkeypatch.setenv(columnar.DECODER_ENV, "python")
    else:
        monkeypatch.delenv(columnar.DECODER_ENV, raising=False)
        assert columnar.native_available(), "the compiled decoder is not built"
    return str(request.param)


def _exec(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


@contextmanager
def _origins(dsn: str, *names: str) -> Iterator[None]:
    """Replication origins are cluster-wide (dropping the database keeps them): dropped at the end."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute("SELECT pg_replication_origin_create(%s)", (name,))
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names:
                conn.execute("SELECT pg_replication_origin_drop(%s)", (name,))


def _events(result: Any, table: str) -> list[dict[str, Any]]:
    batch = Batch(result.batch_path)
    return (
        [row for rb in batch.iter_events(table) for row in rb.to_pylist()] if table in batch.tables() else []
    )


def _messages(result: Any) -> list[dict[str, Any]]:
    return [row for rb in Batch(result.batch_path).iter_messages() for row in rb.to_pylist()]


def _origin(event: dict[str, Any]) -> tuple[str, str | None, int | None]:
    return event["op"], event["source"]["origin"], event["source"]["origin_lsn"]


def _config(pg_db: Any, tmp_path: Path, reader: str, **props: Any) -> dict[str, Any]:
    return pipeline(
        pg_db, tmp_path / reader, **{"window.reader": reader, "skipped.operations": "none", **props}
    )


@every_version
@pytest.mark.parametrize("reader", ["peek", "stream"])
def test_events_of_a_replicated_transaction_carry_its_origin(
    pg_db: Any, tmp_path: Path, reader: str, decoder: str, pg_version: int
) -> None:
    a, b = f"{pg_db.name}_a", f"{pg_db.name}_b"
    _exec(pg_db.dsn, "CREATE TABLE o (id int PRIMARY KEY, v text)", "INSERT INTO o VALUES (0, 'snapshot')")
    config = _config(pg_db, tmp_path, reader)
    first = run_capture(config)
    (snapshot_row,) = _events(first, "public.o")
    assert _origin(snapshot_row) == ("r", None, None)  # a snapshot row belongs to no transaction
    with _origins(pg_db.dsn, a, b):
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (a,))
            with conn.transaction():
                conn.execute("SELECT pg_replication_origin_xact_setup('0/12345', now())")
                conn.execute("INSERT INTO o VALUES (1, 'a'), (2, 'a')")
                conn.execute("UPDATE o SET v = 'A' WHERE id = 1")
                conn.execute("UPDATE o SET id = 10 WHERE id = 1")  # key change: d + c
                conn.execute("SELECT pg_logical_emit_message(true, 'app', 'in a')")
            conn.execute("SELECT pg_replication_origin_session_reset()")
            conn.execute("INSERT INTO o VALUES (3, 'plain')")  # same session, no origin any more
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (b,))
            conn.execute("DELETE FROM o WHERE id = 2")  # without xact_setup: origin LSN 0
            conn.execute("SELECT pg_replication_origin_session_reset()")
        _exec(
            pg_db.dsn,
            # a non-transactional message reaches the window with the commits after it
            "SELECT pg_logical_emit_message(false, 'app', 'none')",
            "INSERT INTO o VALUES (4, 'plain')",
        )
        result = run_capture(config)
    events = _events(result, "public.o")
    in_a = ("c", a, ORIGIN_LSN)
    assert [_origin(e) for e in events] == [
        in_a,
        in_a,
        ("u", a, ORIGIN_LSN),
        ("d", a, ORIGIN_LSN),
        in_a,
        ("c", None, None),
        ("d", b, 0),
        ("c", None, None),
    ], f"PostgreSQL {pg_version}"
    names = list(events[0]["source"])
    assert names[names.index("xmin") :] == ["xmin", "origin", "origin_lsn"]  # Debezium's order
    messages = {m["message"]["content"]: m["source"] for m in _messages(result)}
    if pg_version >= 14:  # 13's pgoutput sends no logical decoding messages
        assert (messages[b"in a"]["origin"], messages[b"in a"]["origin_lsn"]) == (a, ORIGIN_LSN)
        assert (messages[b"none"]["origin"], messages[b"none"]["origin_lsn"]) == (None, None)
    else:
        assert not messages


@every_version
def test_a_transaction_streamed_in_progress_has_origin_lsn_zero(
    pg_db: Any, tmp_path: Path, pg_version: int
) -> None:
    """With ``logical_decoding_work_mem`` at its 64 kB minimum the stream reader receives a large
    transaction in pieces from 14 on (13: whole at commit); pgoutput then sends its Origin message
    with the first piece and origin LSN 0.  The peek reader (protocol 1) always gets the real one."""
    a = f"{pg_db.name}_a"
    _exec(
        pg_db.dsn,
        f"ALTER DATABASE \"{pg_db.name}\" SET logical_decoding_work_mem = '64kB'",
        "CREATE TABLE o (id int PRIMARY KEY, v text)",
    )
    configs = {
        r: _config(pg_db, tmp_path, r, **{"slot.name": f"slot_{r}", "snapshot.mode": "no_data"})
        for r in ("peek", "stream")
    }
    for config in configs.values():
        run_capture(config)
    with _origins(pg_db.dsn, a):
        with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_origin_session_setup(%s)", (a,))
            with conn.transaction():
                conn.execute("SELECT pg_replication_origin_xact_setup('0/12345', now())")
                conn.execute("INSERT INTO o SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g")
            conn.execute("SELECT pg_replication_origin_session_reset()")
        origins = {
            r: {_origin(e)[1:] for e in _events(run_capture(c), "public.o")} for r, c in configs.items()
        }
    assert origins["peek"] == {(a, ORIGIN_LSN)}
    assert origins["stream"] == {(a, 0 if pg_version >= 14 else ORIGIN_LSN)}, f"PostgreSQL {pg_version}"
