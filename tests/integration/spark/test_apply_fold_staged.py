"""The fold per key on staged values (``fold.newest`` with ``frames.StagedValues``: values converted
to silver's types after the fold, only for the newest action of each key) and the delete check
from the staged parts (``StagedTable.removes_keys``) write what converting every event first and
scanning the actions for deletes wrote: silver and tombstones equal on every column, for staged
columns of every converted kind (zoned timestamps as text, decimals as Kafka decimals, unscaled
bytes and variable-scale structs, micros, epoch days, times of day, unsigned bigints, lists of
zoned timestamps), with updates, deletes, re-inserts, ``u`` events that move a key (SQL Server's,
and every source's in batches staged before key changes became d + c pairs) and a truncate, into
a new table and by MERGE or rewrite into a stored one."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.events import TRANSACTION_TYPE, envelope_schema
from airflow_cdc.sources.postgres.tables import SOURCE_TYPE
from spark_jobs.cdc_apply import backlog, frames
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch, apply_batches
from spark_jobs.cdc_apply.layout import table_path
from spark_jobs.cdc_apply.staged import StagedBatch, StagedTable
from tests.integration.spark.support import every_row

pytestmark = pytest.mark.spark

CONNECTOR = "fold"
TABLE = "public.items"
DBZ = "io.debezium.time."
KAFKA_DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _field(name: str, kind: pa.DataType, semantic: str = "", **extra: str) -> pa.Field:
    meta = {b"connect.name": semantic.encode()} if semantic else {}
    return pa.field(name, kind, metadata={**meta, **{k.encode(): v.encode() for k, v in extra.items()}})


SCALE = json.dumps({"scale": "2"})
COLUMNS = [
    _field("id", pa.int64()),
    _field("zoned", pa.string(), DBZ + "ZonedTimestamp"),
    _field("price", pa.decimal128(12, 2), KAFKA_DECIMAL, **{"connect.parameters": SCALE}),
    _field("wide", pa.binary(), KAFKA_DECIMAL, **{"connect.parameters": SCALE}),
    _field(
        "vsd",
        pa.struct([("scale", pa.int32()), ("value", pa.binary())]),
        "io.debezium.data.VariableScaleDecimal",
    ),
    _field("micro", pa.int64(), DBZ + "MicroTimestamp"),
    _field("day", pa.int32(), DBZ + "Date"),
    _field("clock", pa.int64(), DBZ + "MicroTime"),
    _field("big", pa.int64(), **{"mysql.type": "BIGINT UNSIGNED"}),
    _field("stamps", pa.list_(_field("item", pa.string(), DBZ + "ZonedTimestamp"))),
    _field("note", pa.string(), "io.debezium.data.Json"),
]


def _values(rng: random.Random, key: int) -> dict[str, Any]:
    cents = rng.randrange(-(10**9), 10**9)
    zone = rng.choice(["Z", "+02:00", "-07:30"])
    return {
        "id": key,
        "zoned": f"20{rng.randrange(10, 40)}-0{rng.randrange(1, 10)}-1{rng.randrange(10)}T0{rng.randrange(10)}:"
        f"1{rng.randrange(10)}:2{rng.randrange(10)}.{rng.randrange(10**6):06d}{zone}",
        "price": Decimal(cents) / 100,
        "wide": cents.to_bytes(8, "big", signed=True),
        "vsd": {"scale": rng.randrange(0, 6), "value": cents.to_bytes(8, "big", signed=True)},
        "micro": rng.randrange(-(10**15), 10**15),
        "day": rng.randrange(-40000, 40000),
        "clock": rng.randrange(0, 86_400 * 10**6),
        "big": rng.randrange(-(2**63), 2**63),
        "stamps": [f"2024-05-0{rng.randrange(1, 10)}T12:00:00{zone}" for _ in range(rng.randrange(3))],
        "note": json.dumps({"k": rng.randrange(100)}),
    } | ({} if rng.random() > 0.2 else {"zoned": None, "price": None, "vsd": None, "stamps": None})


def _events(rng: random.Random, n: int) -> list[list[tuple]]:
    """Three batches of (op, before, after): inserts; then updates (several per key), deletes,
    re-inserts, key moves by ``u``, a truncate; then more updates and moves."""
    live: dict[int, dict] = {}
    batches: list[list[tuple]] = [[], [], []]
    for key in range(n):
        live[key] = _values(rng, key)
        batches[0].append(("c", None, live[key]))
    for b in (1, 2):
        for i in range(4 * n):
            if b == 1 and i == 2 * n:
                batches[b].append(("t", None, None))
            roll, key = rng.random(), rng.randrange(2 * n)
            if key not in live:
                live[key] = _values(rng, key)
                batches[b].append(("c", None, live[key]))
            elif roll < 0.7:
                old, live[key] = live[key], _values(rng, key)
                batches[b].append(("u", old, live[key]))
            elif roll < 0.85:
                batches[b].append(("d", live.pop(key), None))
            else:
                to = rng.randrange(2 * n, 3 * n)
                if to not in live:
                    old = live.pop(key)
                    live[to] = _values(rng, to)
                    batches[b].append(("u", old, live[to]))
    return batches


def _position(i: int) -> bytes:
    return i.to_bytes(8, "big") + bytes(8)


def write_batch(
    root: Path, index: int, events: list[tuple], first: int, piece: int, columns: list[pa.Field] = COLUMNS
) -> Path:
    """One staged batch of ``events`` (positions from ``first``), in parts of ``piece`` events,
    keyed by the first of ``columns``."""
    schema = envelope_schema(columns, SOURCE_TYPE)
    batch_id = f"20260101T00000000000{index}Z-00000{index}"
    path = root / batch_id
    (path / "tables" / TABLE).mkdir(parents=True)
    row = schema.field("after").type
    parts = []
    for k, lo in enumerate(range(0, len(events), piece)):
        chunk = events[lo : lo + piece]
        n = len(chunk)
        source = {
            "version": "t",
            "connector": "postgresql",
            "name": CONNECTOR,
            "ts_ms": 0,
            "snapshot": "false",
        }
        table = pa.Table.from_arrays(
            [
                pa.array([e[0] for e in chunk]),
                pa.array([1_700_000_000_000 + lo + i for i in range(n)], pa.int64()),
                pa.array([0] * n, pa.int64()),
                pa.array([0] * n, pa.int64()),
                pa.array([e[1] for e in chunk], row),
                pa.array([e[2] for e in chunk], row),
                pa.array([{**source, "db": "d", "schema": "public", "table": "items"}] * n, SOURCE_TYPE),
                pa.nulls(n, TRANSACTION_TYPE),
                pa.array([_position(first + lo + i) for i in range(n)], pa.binary()),
                pa.nulls(n, pa.list_(pa.string())),
            ],
            schema=schema,
        )
        rel = f"tables/{TABLE}/part-{k:05d}.parquet"
        pq.write_table(table, path / rel, row_group_size=max(1, piece // 2))
        ops: dict[str, int] = {}
        for e in chunk:
            ops[e[0]] = ops.get(e[0], 0) + 1
        parts.append({"file": rel, "rows": n, "kind": "stream", "schema_version": "v1", "ops": ops})
    manifest = {
        "format": 1,
        "batch_id": batch_id,
        "connector": CONNECTOR,
        "messages": [],
        "tables": {
            TABLE: {"schema": "public", "table": "items", "key_columns": [columns[0].name], "parts": parts}
        },
        "from_offset": {"pos": first},
        "to_offset": {"pos": first + len(events)},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("staged")
    out, first = [], 1
    for i, events in enumerate(_events(random.Random(11), 60), 1):
        out.append(write_batch(root, i, events, first, 70))
        first += len(events)
    return out


_TABLE_FRAME = frames.table_frame  # the job's, before _converting_first replaces it


def _direct(spark, table: StagedTable, truncates: list) -> frames.TableFrame:
    """``table``'s frame read with every value converted as it is read (the path of tables that
    may list unchanged-TOAST values), without the staged values."""
    made = _TABLE_FRAME(spark, replace(table, toast=True), truncates)
    return replace(made, staged=None, toast=table.toast)


def _converting_first(monkeypatch) -> None:
    """The job as before the staged fold: every event converted first, deletes found by a scan."""
    monkeypatch.setattr(frames, "table_frame", _direct)
    monkeypatch.setattr(StagedTable, "removes_keys", lambda self: None)


def _layers(spark, target: Path) -> dict[str, list[tuple]]:
    return {
        layer: every_row(spark, table_path(str(target), layer, CONNECTOR, TABLE))
        for layer in ("silver", "tombstones")
    }


def _apply(spark, staged: list[Path], target: Path, settings: ApplySettings, split: bool) -> None:
    paths = [str(p) for p in staged]
    if split:  # the first batch alone, then the others as a backlog into the stored rows
        apply_batch(spark, paths[0], str(target), settings)
        paths = paths[1:]
    apply_batches(spark, paths, str(target), settings)


@pytest.mark.parametrize(
    ("split", "rewrite_ratio"),
    [(False, 0.5), (True, 0.0), (True, 0.5)],
    ids=["new-table", "merged", "rewritten"],
)
def test_staged_fold_writes_what_converting_first_wrote(
    spark, staged, tmp_path, monkeypatch, split, rewrite_ratio
):
    settings = ApplySettings(bronze=False, rewrite_ratio=rewrite_ratio)
    _apply(spark, staged, tmp_path / "staged", settings, split)
    got = _layers(spark, tmp_path / "staged")
    with monkeypatch.context() as patched:
        _converting_first(patched)
        _apply(spark, staged, tmp_path / "converted", settings, split)
    want = _layers(spark, tmp_path / "converted")
    assert got == want
    # rows, keyed tombstones (columns by name: __position, __truncate, id) and the truncate's
    assert len(got["silver"]) > 20 and {row[1] for row in got["tombstones"]} == {False, True}


def _upserts(rng: random.Random, n: int) -> list[list[tuple]]:
    """Three batches of inserts and updates only (several per key, new keys too): no event
    removes a key, so the fold carries no ``__action`` and each newest action's batch as an index."""
    live = {key: _values(rng, key) for key in range(n)}
    batches: list[list[tuple]] = [[("c", None, v) for v in live.values()], [], []]
    for b in (1, 2):
        for _ in range(3 * n):
            key = rng.randrange(2 * n)
            old, live[key] = live.get(key), _values(rng, key)
            batches[b].append(("c", None, live[key]) if old is None else ("u", old, live[key]))
    return batches


def _stretch(paths: list[Path]) -> StagedTable:
    """The staged table of ``paths`` applied as one backlog stretch."""
    batches = [StagedBatch(str(p)) for p in paths]
    entries = [backlog.Entry(i, b, b.tables()[0]) for i, b in enumerate(batches)]
    return backlog.combined_table(entries)


@pytest.mark.parametrize("split", [False, True], ids=["new-table", "merged"])
def test_upserts_only_fold_writes_what_converting_first_wrote(spark, tmp_path, monkeypatch, split):
    staged, first = [], 1
    for i, events in enumerate(_upserts(random.Random(5), 50), 1):
        staged.append(write_batch(tmp_path / "in", i, events, first, 40))
        first += len(events)
    table = _stretch(staged)
    frame = frames.table_frame(spark, table, [])
    assert frame.staged is not None and frame.staged.upserts_only
    assert len(set(frame.staged.batches)) == 3
    settings = ApplySettings(bronze=False)
    _apply(spark, staged, tmp_path / "staged", settings, split)
    got = every_row(spark, table_path(str(tmp_path / "staged"), "silver", CONNECTOR, TABLE))
    with monkeypatch.context() as patched:
        _converting_first(patched)
        _apply(spark, staged, tmp_path / "converted", settings, split)
    want = every_row(spark, table_path(str(tmp_path / "converted"), "silver", CONNECTOR, TABLE))
    assert got == want and len(got) > 90
    # the newest action of keys comes from each of the applied batches
    newest_from = {row[0] for row in got}  # __batch_id, the first column by name
    assert {staged[1].name, staged[2].name} <= newest_from <= {p.name for p in staged}


def test_staged_frame_is_used_and_converts_every_kind(spark, staged):
    """The frame of the backlog carries the staged values; converted after the fold they equal
    the converted actions' fold."""
    table = StagedBatch(str(staged[1])).tables()[0]
    frame = frames.table_frame(spark, table, [])
    assert frame.staged is not None
    keys = frame.keys
    converted = frames.latest_per_key(frame.actions, keys)
    late = frame.staged.convert(frames.latest_per_key(frame.staged.actions, keys))
    columns = [*frame.columns, *frames.MERGED, frames.UNAVAILABLE]
    assert {f.name: f.dataType for f in late.schema.fields} == {
        f.name: f.dataType for f in converted.select(*columns).schema.fields
    }
    rows = sorted(map(tuple, late.select(*columns).collect()), key=repr)
    assert rows == sorted(map(tuple, converted.select(*columns).collect()), key=repr)


@pytest.mark.parametrize("stretch", [False, True], ids=["one-batch", "three-batches"])
def test_staged_frame_actions_equal_the_actions_converted_as_read(spark, staged, stretch):
    """A staged frame's converted actions (history and the delete scan read them) are decoded from
    the staged reads; they equal the actions read with every value converted: the same columns,
    types and rows (upserts and the removing actions of deletes and key moves, each with its own
    batch's id), both those after the batch's truncate and every one."""
    table = _stretch(staged) if stretch else StagedBatch(str(staged[1])).tables()[0]
    truncates = frames.truncate_events(spark, table)
    frame = frames.table_frame(spark, table, truncates)
    direct = _direct(spark, table, truncates)
    assert frame.staged is not None and direct.staged is None
    assert frame.every_action is not None and direct.every_action is not None
    assert truncates and frame.actions.count() < frame.every_action.count()
    # the stretch's first batch is all before the truncate (in the second)
    after = {p.name for p in staged[1:]} if stretch else {staged[1].name}
    every = {p.name for p in staged} if stretch else {staged[1].name}
    pairs = ((frame.actions, direct.actions, after), (frame.every_action, direct.every_action, every))
    for got, want, batch_ids in pairs:
        assert [(f.name, f.dataType) for f in got.schema.fields] == [
            (f.name, f.dataType) for f in want.schema.fields
        ]
        collected = got.collect()
        rows = sorted(map(tuple, collected), key=repr)
        assert rows == sorted(map(tuple, want.collect()), key=repr)
        assert {r[frames.ACTION] for r in collected} == {"upsert", "delete"}
        assert {r[frames.BATCH] for r in collected} == batch_ids


def _one_part(tmp_path: Path, events: list[tuple], columns: list[pa.Field], counted: bool) -> StagedTable:
    path = write_batch(tmp_path, 1, events, 1, 2, columns)
    if not counted:  # parts staged before op counts
        manifest = json.loads((path / "manifest.json").read_text())
        for part in manifest["tables"][TABLE]["parts"]:
            part.pop("ops")
        (path / "manifest.json").write_text(json.dumps(manifest))
    return StagedBatch(str(path)).tables()[0]


def test_removes_keys_from_the_staged_parts(tmp_path):
    plain = [_field("id", pa.int64()), _field("v", pa.string())]

    def row(key, v="x"):
        return {"id": key, "v": v}

    def case(name: str, ops, before, after, counted: bool = True, columns=plain) -> bool | None:
        events = list(zip(ops, before, after, strict=True))
        return _one_part(tmp_path / name, events, columns, counted).removes_keys()

    assert case("inserts", ["c", "c", "c"], [None] * 3, [row(1), row(2), row(3)]) is False
    assert case("delete", ["c", "d"], [None, row(1)], [row(1), None]) is True
    updates = ["c", "c", "u", "u", "u"]
    same = [None, None, row(1), None, row(None, "y")]
    after = [row(1), row(2), row(1, "y"), row(2, "z"), row(None, "q")]
    assert case("updates", updates, same, after) is False  # before images of the same key, or none
    assert case("moved", updates, [None, None, row(1), row(7), None], after) is True  # 7 -> 2
    assert case("to-null", updates, [None, None, row(1), None, row(5)], after) is True  # 5 -> NULL
    assert case("uncounted", ["c", "c", "d"], [None, None, row(2)], [row(1), row(2), None], False) is True
    assert case("uncounted-u", updates, same, after, False) is False
    floats = [_field("id", pa.float64()), _field("v", pa.string())]
    assert (
        case("float", ["c", "u"], [None, row(-0.0, "a")], [row(0.0, "a"), row(0.0)], columns=floats) is None
    )
    dotted = [_field("a.b", pa.int64()), _field("v", pa.string())]
    d_before, d_after = [None, {"a.b": 1, "v": "a"}], [{"a.b": 1, "v": "a"}, {"a.b": 1, "v": "b"}]
    assert case("dotted", ["c", "u"], d_before, d_after, columns=dotted) is None
