"""SCD type 2 history against an independent model: random change sequences (inserts, updates
of tracked and untracked columns, no-op updates, unsent TOAST values, deletes, re-inserts, key
changes, a truncate), cut into batches and applied in order, out of order and twice."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from airflow_cdc.apply.applied import missing_tables
from airflow_cdc.apply.submit import ApplyOptions
from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import Batch, BatchWriter, list_batches
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.core.table_sink import SourceLayout
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import app_id, table_path
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.history_model import UNSENT, Event, Model, random_events
from tests.integration.spark.support import crash_at
from tests.unit.core.test_batch import IntCodec, TextCodec

pytestmark = pytest.mark.spark

TABLE = "public.h"
CONNECTOR = "hist"
LAYOUT = SourceLayout(
    pa.struct([pa.field("ts_ms", pa.int64()), pa.field("lsn", pa.int64())]), {}, ("ts_ms", "lsn")
)
COLUMNS = ("id", "a", "b", "x")
HISTORY_COLUMNS = ("__start_at", "__end_at", "__start_ts", "__end_ts", "__is_current")
SETTINGS = ApplySettings(history=(r"public\.h",), history_except=(r"public\.h\.x",))


def _pos(n: int) -> bytes:
    return n.to_bytes(8, "big") + bytes(8)


def _text(values: dict | None) -> tuple | None:
    if values is None:
        return None
    return tuple(
        v if v is UNSENT else (None if v is None else str(v))
        for v in (values[c] for c in ("id", "a", "b", "x"))
    )


def _key_only(key: int) -> tuple:
    return (str(key), None, None, None)


def write_batches(root: Path, events: list[Event], batches: int, rng: random.Random) -> list[Path]:
    """Cut ``events`` into ``batches`` staged batches (consecutive windows, as captured; a key
    change's two events stay in one batch)."""
    splits = [i for i in range(1, len(events)) if events[i].old is None]
    cuts = sorted(rng.sample(splits, batches - 1))
    out = []
    for lo, hi in zip([0, *cuts], [*cuts, len(events)], strict=True):
        w = BatchWriter(root, CONNECTOR)
        sink = w.sink(
            TABLE,
            {"schema": "public", "table": "h", "key_columns": ["id"]},
            [IntCodec("id"), IntCodec("a"), TextCodec("b"), TextCodec("x")],
            [0, 1, 2, 3],
            LAYOUT,
            "changes",
            "v1",
        )
        for e in events[lo:hi]:
            src = (e.ts_ms, e.pos)
            if e.op == "t":
                sink.append("t", None, None, _pos(e.pos), src)
            elif e.op == "d":
                sink.append("d", _key_only(e.key), None, _pos(e.pos), src)  # type: ignore[arg-type]
            else:
                before = _key_only(e.old) if e.old is not None else None
                sink.append(e.op, before, _text(e.values), _pos(e.pos), src)
        out.append(w.finish({"to_offset": {"pos": events[hi - 1].pos}}))
    return out


def _int(position: bytes | None) -> int | None:
    return None if position is None else int.from_bytes(bytes(position)[:8], "big")


def _ms(ts) -> int | None:
    if ts is None:
        return None
    import datetime as dt

    return int((ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts).timestamp() * 1000)


def history_rows(spark, target: str) -> list[tuple]:
    """Every row of the history table, every column, in the model's terms (sorted: a duplicate
    version counts)."""
    frame = spark.read.format("delta").load(table_path(target, "history", CONNECTOR, TABLE))
    assert set(frame.columns) == {*COLUMNS, *HISTORY_COLUMNS}, frame.columns
    rows = [
        (
            r.id,
            r.a,
            r.b,
            r.x,
            _int(r["__start_at"]),
            _int(r["__end_at"]),
            _ms(r["__start_ts"]),
            _ms(r["__end_ts"]),
            r["__is_current"],
        )
        for r in frame.toLocalIterator()
    ]
    return sorted(rows, key=repr)


def silver_rows(spark, target: str) -> dict[int, dict]:
    frame = spark.read.format("delta").load(table_path(target, "silver", CONNECTOR, TABLE))
    return {r.id: {"id": r.id, "a": r.a, "b": r.b, "x": r.x} for r in frame.toLocalIterator()}


def _diff(want: list[tuple], got: list[tuple]) -> str:
    missing = list((Counter(want) - Counter(got)).elements())
    extra = list((Counter(got) - Counter(want)).elements())
    return f"{len(missing)} missing {missing[:4]}, {len(extra)} extra {extra[:4]}"


@pytest.mark.parametrize(
    ("seed", "batches", "order"),
    [(1, 3, "in order, history enabled after the first batch"), (2, 4, "out of order, one batch twice")],
)
def test_history_matches_the_model(spark, tmp_path, monkeypatch, seed, batches, order):
    rng = random.Random(seed)
    events = random_events(seed)
    full = Model().apply(events)
    assert {e.op for e in events} >= {"r", "c", "u", "d", "t"} and any(e.old for e in events)
    assert full.in_place and full.reopened  # EXCEPT-only updates, re-inserts
    staged = write_batches(tmp_path / "staging", events, batches, rng)
    target = str(tmp_path / "lake")
    if order.startswith("in order"):  # silver only, then history seeded from silver's rows
        apply_batch(spark, str(staged[0]), target, ApplySettings())
        upto = Batch(staged[0]).manifest["to_offset"]["pos"]
        model = (
            Model().seeded([e for e in events if e.pos <= upto]).apply([e for e in events if e.pos > upto])
        )
        plan = staged[1:]
    else:
        plan = [staged[-1], *rng.sample(staged[:-1], len(staged) - 1)]  # the newest batch first
        plan.insert(rng.randrange(1, len(plan) + 1), rng.choice(staged))
        assert plan != sorted(plan) and len(set(plan)) < len(plan)
        _crash_after_history_log(spark, monkeypatch, plan[1], target)
        model = full
    for batch in plan:
        apply_batch(spark, str(batch), target, SETTINGS)
    assert any(v.end is not None for v in model.versions) and model.current
    seeded = {v.start for v in model.versions if v.start_ts is None}
    assert bool(seeded) == order.startswith("in order")
    got = [(*r[:6], None, *r[7:]) if r[4] in seeded else r for r in history_rows(spark, target)]
    assert got == model.rows(), _diff(model.rows(), got)
    assert silver_rows(spark, target) == model.current_rows()


BIG = "(SELECT string_agg(md5(s::text || {0}), '') FROM generate_series(1, 150) s)"  # ~4.8 KB: TOASTed


def _exec(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _versions(spark, target: str, config: dict) -> dict[int, list[tuple]]:
    """Per key, its versions in position order: ``(a, note, big, is_current)``; checks the
    bounds: a version ends where the key's next one starts unless a delete closed it first,
    only an open version is current, time bounds follow the positions."""
    path = table_path(target, "history", config["name"], "public.hp")
    out: dict[int, list[tuple]] = {}
    rows = sorted(
        spark.read.format("delta").load(path).toLocalIterator(), key=lambda r: bytes(r["__start_at"])
    )
    for r in rows:
        assert (r["__end_at"] is None) == r["__is_current"] == (r["__end_ts"] is None), r
        assert r["__start_ts"] is not None and (r["__end_ts"] is None or r["__end_ts"] >= r["__start_ts"]), r
        mine = out.setdefault(r.id, [])
        if mine:
            assert mine[-1][-1] is not None and bytes(mine[-1][-1]) <= bytes(r["__start_at"]), (mine, r)
        mine.append((r.a, r.note, r.big, r["__is_current"], r["__end_at"]))
    return {k: [v[:4] for v in vs] for k, vs in out.items()}


def _crash_after_history_log(spark, monkeypatch, batch: Path, target: str) -> None:
    """Apply ``batch`` up to its history log write and stop there (as a SIGKILL would): its
    history rebuild and silver are left for the next run of the batch."""
    from spark_jobs.cdc_apply import delta_log, job

    with crash_at(monkeypatch, job, "apply_after_history_log"):
        apply_batch(spark, str(batch), target, SETTINGS)
    mark = app_id(CONNECTOR, batch.name)
    assert delta_log.has_applied(table_path(target, "history_log", CONNECTOR, TABLE), mark)
    assert not delta_log.has_applied(table_path(target, "history", CONNECTOR, TABLE), mark)


def test_history_of_a_postgres_capture(spark, pg_db, tmp_path):
    """Snapshot rows, tracked and EXCEPT-only updates (unchanged TOAST unsent), delete, re-insert,
    key change, delete of the moved key; batches applied out of order and one twice; ``verify``
    checks the history's current versions against the source too."""
    _exec(
        pg_db.dsn,
        "CREATE TABLE hp (id int PRIMARY KEY, a int, note text, big text)",
        "INSERT INTO hp SELECT g, g, 'n', " + BIG.format("g") + " FROM generate_series(1, 6) g",
    )
    history = {"delta.history.enabled": r"public\.hp", "delta.history.except.columns": r"public\.hp\.note"}
    config = pipeline(pg_db, tmp_path / "staging", **history)
    run_capture(config)  # snapshot: r
    _exec(
        pg_db.dsn,
        "UPDATE hp SET a = 11 WHERE id = 1",  # tracked: a new version (big unsent)
        "UPDATE hp SET note = 'n2' WHERE id = 2",  # EXCEPT only: in place
        "DELETE FROM hp WHERE id = 3",
        "INSERT INTO hp VALUES (3, 33, 'r', 'small')",  # re-insert
        "UPDATE hp SET id = 60 WHERE id = 4",  # key change
        "UPDATE hp SET a = 55 WHERE id = 5",
        "UPDATE hp SET note = 'n5' WHERE id = 5",
    )
    run_capture(config)
    _exec(pg_db.dsn, "UPDATE hp SET note = 'n1' WHERE id = 1", "DELETE FROM hp WHERE id = 60")
    run_capture(config)
    first, second, third = list_batches(config["staging.path"], config["name"])
    options = ApplyOptions.from_config(build_config(config))
    settings = ApplySettings(history=options.history_tables(), history_except=options.history_except)
    target = str(tmp_path / "lake")
    for batch in (first, third, second, third):
        apply_batch(spark, str(batch.path), target, settings)
    bronze = spark.read.format("delta").load(table_path(target, "bronze", config["name"], "public.hp"))
    assert bronze.where("array_contains(__unavailable, 'big')").count() >= 2  # unchanged TOAST unsent
    big = {k: _big(pg_db.dsn, k) for k in range(1, 7)}
    assert _versions(spark, target, config) == {
        1: [(1, "n", big[1], False), (11, "n1", big[1], True)],
        2: [(2, "n2", big[2], True)],
        3: [(3, "n", big[3], False), (33, "r", "small", True)],
        4: [(4, "n", big[4], False)],
        60: [(4, "n", big[4], False)],
        5: [(5, "n", big[5], False), (55, "n5", big[5], True)],
        6: [(6, "n", big[6], True)],
    }
    report = verify(build_config(config), target, spark=spark)
    assert report.ok, report.differences
    assert sorted(t.table for t in report.tables) == ["public.hp", "public.hp (history)"]
    assert missing_tables(third, target, True, options.history_tables()) == []


def _big(dsn: str, key: int) -> str:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT " + BIG.format(key)).fetchone()[0]
