"""SCD type 2 history against an independent model: random change sequences (inserts, updates
of tracked and untracked columns, no-op updates, unsent TOAST values, deletes, re-inserts, key
changes, a truncate), cut into batches and applied in order, out of order and twice."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_cdc.core.batch import BatchWriter
from airflow_cdc.core.table_sink import SourceLayout
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.spark.history_model import UNSENT, Event, Model, random_events
from tests.unit.core.test_batch import IntCodec, TextCodec

pytestmark = pytest.mark.spark

TABLE = "public.h"
CONNECTOR = "hist"
LAYOUT = SourceLayout(
    pa.struct([pa.field("ts_ms", pa.int64()), pa.field("lsn", pa.int64())]), {}, ("ts_ms", "lsn")
)
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
    """Cut ``events`` into ``batches`` staged batches (consecutive windows, as captured)."""
    cuts = sorted(rng.sample(range(1, len(events)), batches - 1))
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


def history_rows(spark, target: str) -> set[tuple]:
    frame = spark.read.format("delta").load(table_path(target, "history", CONNECTOR, TABLE))
    return {
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
        for r in frame.collect()
    }


def silver_rows(spark, target: str) -> dict[int, dict]:
    frame = spark.read.format("delta").load(table_path(target, "silver", CONNECTOR, TABLE))
    return {r.id: {"id": r.id, "a": r.a, "b": r.b, "x": r.x} for r in frame.collect()}


def _diff(want: set[tuple], got: set[tuple]) -> str:
    missing, extra = sorted(want - got, key=str), sorted(got - want, key=str)
    return f"{len(missing)} missing {missing[:4]}, {len(extra)} extra {extra[:4]}"


@pytest.mark.parametrize(
    ("seed", "order"),
    [(1, "in order"), (2, "reversed, then again in order"), (3, "shuffled, one batch twice")],
)
def test_history_matches_the_model(spark, tmp_path, seed, order):
    rng = random.Random(seed)
    events = random_events(seed)
    batches = write_batches(tmp_path / "staging", events, 4, rng)
    if order.startswith("reversed"):
        plan = [*reversed(batches), *batches]
    elif order.startswith("shuffled"):
        plan = rng.sample(batches, len(batches))
        plan.insert(rng.randrange(len(plan) + 1), rng.choice(batches))
    else:
        plan = batches
    target = str(tmp_path / "lake")
    for batch in plan:
        apply_batch(spark, str(batch), target, SETTINGS)
    model = Model().apply(events)
    assert {e.op for e in events} >= {"c", "u", "d", "t"} and any(e.old for e in events)
    got = history_rows(spark, target)
    assert got == model.rows(), _diff(model.rows(), got)
    in_place = sum(1 for e in events if e.op == "u") - sum(1 for v in model.versions if v.start_ts)
    assert in_place != 0  # some updates changed only untracked columns (or nothing)
    assert silver_rows(spark, target) == model.current_rows()
