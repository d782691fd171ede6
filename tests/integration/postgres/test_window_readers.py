"""The two window readers (``window.reader``): the streaming replication protocol and the peek.

Both must stage the same events at the same positions with the same ``source`` fields, window by
window (interleaved transactions, TOAST, key changes, truncate, logical messages, a transaction
larger than ``run.max.events``); the stream must never consume: a crash before the commit re-reads
the same changes, and the slot's confirmed position never passes the committed offset.  Every
stream test runs with both stream readers: the compiled one (``_walstream.c``) and the pure-Python
one (``AIRFLOW_CDC_PG_STREAM=python``); both also stage the same events for every column type.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.sources.postgres import copyread, walstream
from airflow_cdc.sources.postgres.position import parse_pg_lsn
from tests.integration.postgres.support import every_version, pipeline, run_capture
from tests.support.pipeline import capture_process

STREAM_READERS = ["native", "python"]


@pytest.fixture(params=STREAM_READERS)
def stream_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which stream reader runs (also in capture subprocesses: the environment is inherited)."""
    if request.param == "python":
        monkeypatch.setenv(walstream.STREAM_ENV, "python")
    else:
        assert walstream.native_stream_available(), "the compiled stream reader is not built"
        monkeypatch.delenv(walstream.STREAM_ENV, raising=False)
    return str(request.param)


BIG = "".join(f"{i:08x}" for i in range(3000))  # 24 kB: stored out of line (TOAST)


def _exec(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _config(pg_db: Any, tmp_path: Path, reader: str, label: str | None = None, **props: Any) -> dict[str, Any]:
    """A connector reading with ``reader``; ``label`` (default: the reader) names it, its slot and folder."""
    label = label or reader
    return pipeline(pg_db, tmp_path / label, **{"name": f"{label}_{pg_db.name}", "slot.name": f"slot_{label}",
                                                 "topic.prefix": "same", "window.reader": reader,
                                                 "snapshot.mode": "no_data", "skipped.operations": "none",
                                                 **props})


def _staged(result: Any) -> list[tuple[str, Any]]:
    """Every staged event and message of a run, without the capture-time envelope timestamps."""
    if not result.events:
        return []
    batch = Batch(result.batch_path)
    out: list[tuple[str, Any]] = []
    for table in batch.tables():
        out += [(table, _strip(r)) for rb in batch.iter_events(table) for r in rb.to_pylist()]
    out += [("messages", _strip(r)) for rb in batch.iter_messages() for r in rb.to_pylist()]
    return out


def _strip(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("ts_ms", "ts_us", "ts_ns")}


def _workload(dsn: str) -> None:
    """Interleaved transactions, TOAST, key change, truncate, messages, one big transaction."""
    with psycopg.connect(dsn) as c1, psycopg.connect(dsn) as c2:
        c1.execute("INSERT INTO a VALUES (1, 'one', %s)", (BIG,))
        c2.execute("INSERT INTO a VALUES (2, 'two', NULL)")
        c2.execute("SELECT pg_logical_emit_message(true, 'tx', 'in c2')")
        c2.commit()  # commits first, began second
        c1.execute("INSERT INTO b VALUES (1, 'b1'), (2, 'b2')")
        c1.commit()
    _exec(dsn,
          "UPDATE a SET v = 'ONE' WHERE id = 1",  # the TOASTed value is not sent: unchanged
          "UPDATE b SET v = 'B1' WHERE id = 1",  # replica identity full: old image
          "SELECT pg_logical_emit_message(false, 'nontx', 'between')",
          "UPDATE a SET id = 3 WHERE id = 2",  # key change: delete + create
          "INSERT INTO a SELECT g, 'bulk', NULL FROM generate_series(100, 1099) g",  # > run.max.events
          "TRUNCATE b",
          "DELETE FROM a WHERE id = 3",
          "BEGIN; INSERT INTO b VALUES (5, 'five'); SELECT pg_logical_emit_message(true, 'tx', 'last'); COMMIT")


def _workload_tables(dsn: str) -> None:
    """The tables ``_workload`` writes to."""
    _exec(dsn, "CREATE TABLE a (id int PRIMARY KEY, v text, big text)",
          "CREATE TABLE b (id int PRIMARY KEY, v text)", "ALTER TABLE b REPLICA IDENTITY FULL")


def _assert_same_windows(one: list, other: list) -> None:
    """Two connectors' ``_runs`` staged the same windows: same events and rows, and the same end
    offset for every window but the last."""
    pairs = list(zip(one, other, strict=True))
    for n, ((a_events, a_offset, a_rows), (b_events, b_offset, b_rows)) in enumerate(pairs, start=1):
        assert a_events == b_events and a_rows == b_rows
        # a window cut by run.max.events ends on the same commit; the last one ends at its run's
        # target LSN, which other databases of the shared server move between the two runs
        assert a_offset == b_offset if n < len(pairs) else parse_pg_lsn(a_offset["lsn"]) <= parse_pg_lsn(b_offset["lsn"])


def _runs(config: dict[str, Any]) -> list[tuple[int, dict[str, Any], list]]:
    out = []
    for _ in range(20):
        res = run_capture(config)
        if not res.events:
            return out
        out.append((res.events, res.to_offset, _staged(res)))
    raise AssertionError("the windows did not catch up")


@pytest.mark.parametrize("max_events", [3, 5_000_000])
def test_stream_and_peek_stage_the_same_windows(pg_db: Any, tmp_path: Path, max_events: int,
                                                stream_reader: str) -> None:
    _workload_tables(pg_db.dsn)
    configs = [_config(pg_db, tmp_path, r, **{"run.max.events": max_events}) for r in ("stream", "peek")]
    for config in configs:
        run_capture(config)  # creates both slots before any change
    _workload(pg_db.dsn)
    stream_runs, peek_runs = (_runs(c) for c in configs)
    _assert_same_windows(stream_runs, peek_runs)
    events = [e for _, _, rows in stream_runs for e in rows]
    assert len(events) == 1011 + 3  # 1011 row events and truncates, 3 logical messages
    if max_events < 10:
        # the 1000-row transaction is larger than run.max.events and still lands whole, in one window
        assert len(stream_runs) > 4
        bulk = [rows for _, _, rows in stream_runs if any(e.get("after", {}) and e["after"]["v"] == "bulk"
                                                          for _, e in rows)]
        assert len(bulk) == 1 and sum(e["after"]["v"] == "bulk" for _, e in bulk[0]) == 1000
    toast = [e for t, e in events if t == "public.a" and e["op"] == "u" and e["after"]["id"] == 1]
    assert toast and toast[0]["after"]["big"] == "__debezium_unavailable_value"


def _confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::int8 FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None
    return int(row[0])


def _lsn(result: Any) -> int:
    return parse_pg_lsn(result.to_offset["lsn"])


def test_slot_never_passes_the_committed_offset(pg_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               stream_reader: str) -> None:
    """Status updates go out on every wait: the position each reports, and the slot's confirmed
    position read after each while the stream runs and after it, stay at the committed offset."""
    _exec(pg_db.dsn, "CREATE TABLE a (id int PRIMARY KEY, v text, big text)")
    config = _config(pg_db, tmp_path, "stream", **{"run.max.events": 300})
    committed = _lsn(run_capture(config))
    _exec(pg_db.dsn, *[f"INSERT INTO a SELECT g, 'x', NULL FROM generate_series({i * 100}, {i * 100 + 99}) g"
                       for i in range(10)])
    seen: list[int] = []
    reported: list[int] = []

    def spy(self: walstream.ReplicationStream, pos: int, reply: bool) -> None:
        reported.append(pos)
        seen.append(_confirmed(pg_db.dsn, "slot_stream"))

    monkeypatch.setattr(walstream.ReplicationStream, "_on_status", spy)
    monkeypatch.setattr(walstream, "STATUS_INTERVAL", 0.0)
    res = run_capture(config, commit=False)
    assert res.events == 300 and len(seen) > 1
    assert max(reported) == committed and max(seen) <= committed
    assert _confirmed(pg_db.dsn, "slot_stream") <= committed
    res = run_capture(config)  # not committed before: the same window again, now committed
    assert res.events == 300 and committed < _lsn(res)
    assert _confirmed(pg_db.dsn, "slot_stream") <= _lsn(res)


def test_follow_on_windows_never_confirm_past_the_committed_offset(
    pg_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream_reader: str
) -> None:
    """A run reads a second window when a snapshot it started must be reconciled (a signal in
    its first window): that stream starts at the first window's end, which is not committed.
    Its status updates still report the committed offset; they reported the stream's start
    before, the server confirmed it, and a run killed then left the slot past the offset (a lost
    offset: found by the standby convergence test)."""
    _exec(pg_db.dsn, "CREATE TABLE a (id int PRIMARY KEY, v text)",
          "INSERT INTO a SELECT g, 'x' FROM generate_series(1, 50) g",
          "CREATE TABLE dbz_signal (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))")
    config = _config(pg_db, tmp_path, "stream", **{"signal.data.collection": "public.dbz_signal",
                                                   "incremental.snapshot.chunk.size": 10})
    committed = _lsn(run_capture(config))
    data = json.dumps({"data-collections": ["public.a"], "type": "incremental"})
    _exec(pg_db.dsn, f"INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', '{data}')",
          "UPDATE a SET v = 'y' WHERE id = 3")
    starts: list[int] = []
    reported: list[int] = []
    seen: list[int] = []
    init = walstream.ReplicationStream.__init__

    def spy_init(self: walstream.ReplicationStream, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        starts.append(self.from_lsn)

    def spy(self: walstream.ReplicationStream, pos: int, reply: bool) -> None:
        reported.append(pos)
        seen.append(_confirmed(pg_db.dsn, "slot_stream"))

    monkeypatch.setattr(walstream.ReplicationStream, "__init__", spy_init)
    monkeypatch.setattr(walstream.ReplicationStream, "_on_status", spy)
    res = run_capture(config, commit=False)
    assert res.snapshot_rows > 0 and len(starts) >= 2 and max(starts) > committed, starts
    assert max(reported) == committed and max(seen) <= committed
    assert _confirmed(pg_db.dsn, "slot_stream") == committed


def test_crash_mid_stream_rereads_the_same_changes(pg_db: Any, tmp_path: Path, stream_reader: str) -> None:
    """SIGKILL while the window streams (failpoint ``mid_window``): nothing was consumed, the next
    run stages exactly the events an uncrashed run stages, and the slot stayed where it was."""
    _exec(pg_db.dsn, "CREATE TABLE a (id int PRIMARY KEY, v text, big text)")
    config = _config(pg_db, tmp_path, "stream")
    run_capture(config)
    before = _confirmed(pg_db.dsn, "slot_stream")
    _exec(pg_db.dsn, "INSERT INTO a SELECT g, 'x', NULL FROM generate_series(1, 20000) g",
          "UPDATE a SET v = 'y' WHERE id % 3 = 0", "SELECT pg_logical_emit_message(false, 'p', 'm')",
          "INSERT INTO a VALUES (0, 'flushes the message', NULL)")
    reference = _staged(run_capture(config, commit=False))
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    proc = capture_process(path, "mid_window")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert _confirmed(pg_db.dsn, "slot_stream") == before
    again = _staged(run_capture(config))
    assert len(again) == 20000 + 20000 // 3 + 2 and again == reference


def test_compiled_and_python_stream_readers_stage_the_same_events_for_every_type(
    pg_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One column per type of the key-type generators (tests/integration/postgres/test_snapshot_keys.py:
    temporal precisions, numeric, money, enum, domain, collations, bytea, uuid, inet ...) plus jsonb,
    an array and a TOASTed text; inserts, updates (key moves too), deletes, NULLs; both stream
    readers stage the same rows, and the row count is what the workload made."""
    from tests.integration.postgres.test_snapshot_keys import SETUP, TEMPORAL, T

    types = [*T.values(), *TEMPORAL]
    cols = ", ".join(f"c{i} {t.sql}" for i, t in enumerate(types))
    _exec(pg_db.dsn, *SETUP, f"CREATE TABLE t (id int PRIMARY KEY, {cols}, j jsonb, arr int[], big text)")
    configs = {r: pipeline(pg_db, tmp_path / r, **{"name": f"{r}_{pg_db.name}", "slot.name": f"slot_{r}",
                                                    "topic.prefix": "same", "window.reader": "stream",
                                                    "snapshot.mode": "no_data", "skipped.operations": "none"})
               for r in STREAM_READERS}
    for config in configs.values():
        run_capture(config)
    rng = random.Random(15)
    pools = [t.literals(rng) for t in types]

    def values(i: int) -> str:
        row = [rng.choice(p) if rng.random() > 0.1 else "NULL" for p in pools]
        return (f"({i}, {', '.join(row)}, '{{\"k\": {i}, \"s\": \"x\\\\u00e9\"}}', '{{{i},NULL,3}}', "
                f"{'repeat(md5(' + str(i) + '::text), 900)' if i % 7 == 0 else 'NULL'})")

    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        for i in range(1, 301):
            conn.execute(f"INSERT INTO t VALUES {values(i)} ON CONFLICT DO NOTHING")  # noqa: S608
        set_cols = ", ".join(f"c{j} = {rng.choice(pools[j])}" for j in range(0, len(types), 3))
        conn.execute(f"UPDATE t SET {set_cols} WHERE id % 4 = 0")  # noqa: S608
        conn.execute("UPDATE t SET id = id + 1000 WHERE id % 9 = 0")  # key change: delete + create
        conn.execute("DELETE FROM t WHERE id % 10 = 1")
    staged = {}
    for reader, config in configs.items():
        if reader == "python":
            monkeypatch.setenv(walstream.STREAM_ENV, "python")
        else:
            monkeypatch.delenv(walstream.STREAM_ENV, raising=False)
        staged[reader] = [e for _, _, rows in _runs(config) for e in rows]
    assert _nan_safe(staged["native"]) == _nan_safe(staged["python"])
    ops = [e["op"] for _, e in staged["native"]]
    assert ops.count("c") == 300 + 33 and ops.count("u") == 75 and ops.count("d") == 33 + 30


def _nan_safe(value: Any) -> Any:
    """``value`` with float NaNs replaced by a marker (NaN != NaN would fail equal rows)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, dict):
        return {k: _nan_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_safe(v) for v in value]
    return value


@every_version
def test_streamed_large_transactions_stage_like_the_peek(
    pg_db: Any, tmp_path: Path, stream_reader: str, monkeypatch: pytest.MonkeyPatch, pg_version: int,
) -> None:
    """With ``logical_decoding_work_mem`` at its 64 kB minimum the server streams the large
    transactions in pieces (protocol 2, PostgreSQL 14+; 13's pgoutput has protocol 1 only and
    sends them whole at commit): a committed one (with a rolled-back savepoint) stages exactly what
    the peek stages, an aborted one leaves nothing, and a window bounded by ``run.max.events``
    still ends on whole transactions."""
    from airflow_cdc.sources.postgres import streamed

    spooled: list[int] = []
    add = streamed.Spool.add
    monkeypatch.setattr(streamed.Spool, "add", lambda self, lsn, data: (spooled.append(lsn), add(self, lsn, data)))
    _exec(pg_db.dsn, f'ALTER DATABASE "{pg_db.name}" SET logical_decoding_work_mem = \'64kB\'',
          "CREATE TABLE a (id int PRIMARY KEY, v text, big text)")
    configs = [_config(pg_db, tmp_path, r, **{"run.max.events": 2500}) for r in ("stream", "peek")]
    for config in configs:
        run_capture(config)
    _exec(pg_db.dsn,
          "BEGIN; INSERT INTO a SELECT g, 'big', repeat('x', 200) FROM generate_series(1, 3000) g; "
          "SAVEPOINT s; INSERT INTO a SELECT g, 'rolled back', NULL FROM generate_series(5001, 6000) g; "
          "ROLLBACK TO s; UPDATE a SET v = 'u' WHERE id % 2 = 0; COMMIT",
          "BEGIN; INSERT INTO a SELECT g, 'aborted', repeat('y', 200) FROM generate_series(7001, 9000) g; ROLLBACK",
          "INSERT INTO a VALUES (0, 'small', NULL)",
          "BEGIN; DELETE FROM a WHERE id > 2000; COMMIT")
    stream_runs, peek_runs = (_runs(c) for c in configs)
    assert bool(spooled) == (pg_version >= 14), f"PostgreSQL {pg_version}: streamed pieces {len(spooled)}"
    assert [rows for _, _, rows in stream_runs] == [rows for _, _, rows in peek_runs]
    events = [e for _, _, rows in stream_runs for _, e in rows]
    assert len(events) == 3000 + 1500 + 1 + 1000
    assert not [e for e in events if (e["after"] or {}).get("v") in ("aborted", "rolled back")]
    assert len(stream_runs) >= 2  # run.max.events ended a window after a whole (streamed) transaction


@pytest.mark.parametrize("max_events", [3, 5_000_000])
def test_peek_through_copy_and_cursor_stage_the_same_windows(
    pg_db: Any, tmp_path: Path, max_events: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peek's rows come through a binary COPY drained by the compiled reader
    (``copyread.PairCopy``) or, with ``AIRFLOW_CDC_PG_COPY=python``, a binary cursor: the same
    windows, events and offsets either way."""
    assert copyread.pairs_available(), "the compiled COPY reader is not built"
    _workload_tables(pg_db.dsn)
    configs = {fetch: _config(pg_db, tmp_path, "peek", fetch, **{"run.max.events": max_events})
               for fetch in ("copy", "cursor")}
    for config in configs.values():
        run_capture(config)
    _workload(pg_db.dsn)
    runs = {}
    for fetch, config in configs.items():
        if fetch == "cursor":
            monkeypatch.setenv(copyread.COPY_ENV, "python")
        else:
            monkeypatch.delenv(copyread.COPY_ENV, raising=False)
        runs[fetch] = _runs(config)
    _assert_same_windows(runs["copy"], runs["cursor"])
    assert sum(len(rows) for _, _, rows in runs["copy"]) == 1011 + 3


def _pair_copy(dsn: str, select: str, size: int = 2) -> list[list[tuple[int, bytes]]]:
    """Every ``fetchmany(size)`` of a ``PairCopy`` over ``COPY (select) TO STDOUT (FORMAT binary)``."""
    with psycopg.connect(dsn) as conn, conn.cursor().copy(f"COPY ({select}) TO STDOUT (FORMAT binary)") as copy:
        rows = copyread.PairCopy(conn, copy)
        out = []
        while batch := rows.fetchmany(size):
            out.append(batch)
        assert rows.fetchmany(size) == []
        return out


def test_pair_copy_reads_rows_and_refuses_other_shapes(pg_db: Any) -> None:
    """``PairCopy``: batches of at most ``size`` ``(int, bytes)`` rows, the header and trailer
    skipped (also with no row); a row of another shape is a DataError and a server error mid-COPY
    is psycopg's own error, each leaving the connection usable."""
    assert copyread.pairs_available(), "the compiled COPY reader is not built"
    got = _pair_copy(pg_db.dsn, "SELECT g::int8 * 4294967296, decode(repeat('ab', g), 'hex') "
                                "FROM generate_series(0, 4) g")
    assert [len(b) for b in got] == [2, 2, 1]
    assert [r for b in got for r in b] == [(g << 32, b"\xab" * g) for g in range(5)]
    assert _pair_copy(pg_db.dsn, "SELECT 1::int8, ''::bytea WHERE false") == []
    assert _pair_copy(pg_db.dsn, "SELECT -1::int8, '\\x00ff'::bytea") == [[(-1, b"\x00\xff")]]
    for select in ("SELECT 1::int8, NULL::bytea", "SELECT 1::int4, 'x'::bytea", "SELECT 1::int8, 'x'::bytea, 2",
                   "SELECT 1::int8"):
        with pytest.raises(psycopg.DataError, match=r"not \(bigint, bytea\)"):
            _pair_copy(pg_db.dsn, select)
    with psycopg.connect(pg_db.dsn) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            with conn.cursor().copy("COPY (SELECT g::int8, 'x'::bytea FROM generate_series(-3, 3) g "
                                    "WHERE 1 / g > -5) TO STDOUT (FORMAT binary)") as copy:
                rows = copyread.PairCopy(conn, copy)
                while rows.fetchmany(1):
                    pass
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
