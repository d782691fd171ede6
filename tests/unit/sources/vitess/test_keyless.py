"""Tables without key columns on Vitess: their state, positions in the keyless round, and what the
stager does with the changes a whole read (``whole.py``) holds -- against a recording writer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_cdc.core.errors import SchemaError
from airflow_cdc.sources.vitess import position, whole
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.protocol import Change, Table, Transaction
from airflow_cdc.sources.vitess.stager import Stager
from airflow_cdc.sources.vitess.tables import TableState

KS, TABLE = "ks", "ks.ev"
FIELDS = [q.Field(name="grp", type=q.INT32), q.Field(name="val", type=q.VARCHAR)]
CONFIG = vitess_config({"name": "v", "staging.path": "/tmp/x", "vitess.keyspace": KS})


def _state(override: tuple[str, ...] | None = None, fields: list[q.Field] = FIELDS) -> TableState:
    return TableState.build(TABLE, fields, CONFIG, lambda *_: True, override)


def test_a_table_without_primary_key_is_a_multiset():
    state = _state()
    assert state.keyless and state.key == []
    assert state.table_info()["keyless"] == "multiset" and state.table_info()["key_columns"] == []
    keyed = _state(("grp",))  # message.key.columns
    assert not keyed.keyless and "keyless" not in keyed.table_info()
    pk = [q.Field(name="grp", type=q.INT32, flags=q.PRI_KEY_FLAG | q.NOT_NULL_FLAG), FIELDS[1]]
    assert _state(fields=pk).key == ["grp"]
    with pytest.raises(SchemaError, match="key column.*nope.*missing"):
        _state(("nope",))


def test_keyless_positions_order_by_round_before_shard_counts():
    # shards' transaction counts are unrelated: a later round sorts above any count of an earlier one
    assert position.keyless_key(0, 2, 1, 1) > position.keyless_key(0, 1, 10**9, 7, 99)
    assert position.keyless_key(1, 0, 0, 0) > position.keyless_key(0, 9, 10**9, 7)  # the epoch first
    floor = position.keyless_key(0, 2, 0, 0)
    assert (
        floor < position.keyless_key(0, 2, 1, position.SNAPSHOT_INDEX, 5) < position.keyless_key(0, 2, 2, 1)
    )


def test_whole_read_positions_merge_per_shard():
    low, high = "MariaDB/0-1-5", "MariaDB/0-1-9"
    one = whole.WholeRead(TABLE, {(KS, "-80"): low, (KS, "80-"): "MariaDB/0-2-3"})
    two = whole.WholeRead(TABLE, {(KS, "-80"): high})
    assert one.covers((KS, "-80"), 5) and not one.covers((KS, "-80"), 6) and not one.covers((KS, "x"), 1)
    orphan_end = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=KS, shard="80-", gtid="MariaDB/0-2-8")])
    merged = whole.read_past([one, two], orphan_end)
    assert merged is not None
    assert {g.shard: g.gtid for g in merged.shard_gtids} == {"-80": high, "80-": "MariaDB/0-2-8"}
    start = b.VGtid(
        shard_gtids=[b.ShardGtid(keyspace=KS, shard="-80"), b.ShardGtid(keyspace=KS, shard="80-")]
    )
    whole.fill_empty_starts(start, [one, two])
    assert [g.gtid for g in start.shard_gtids] == [low, "MariaDB/0-2-3"]
    for g in start.shard_gtids:
        g.table_p_ks.extend([b.TableLastPK(table_name="ev"), b.TableLastPK(table_name="keyed")])
    whole.unlist(start, lambda name: name == "ev")  # never copied by the window's copy phase
    assert [[t.table_name for t in g.table_p_ks] for g in start.shard_gtids] == [["keyed"], ["keyed"]]


class _Sink:
    def __init__(self) -> None:
        self.rows: list[tuple[str, Any, Any, bytes]] = []
        self.closed = False

    def append(self, op: str, before: Any, after: Any, at: bytes, *_: Any) -> None:
        self.rows.append((op, before, after, at))

    def expect_partial_images(self) -> None:
        raise AssertionError("a keyless table never takes partial images")


class _Writer:
    def __init__(self) -> None:
        self.sink_ = _Sink()

    def sink(self, *_: Any, **__: Any) -> _Sink:
        return self.sink_


def _source(reads: dict[str, whole.WholeRead]) -> Any:
    table = Table.from_event(b.FieldEvent(table_name=TABLE, fields=FIELDS))
    state = _state()
    return SimpleNamespace(
        config=CONFIG, epoch=5, whole_reads=reads, keyless_round=lambda: (3, 7),
        includes=lambda _: True, table_state=lambda _: state, table=table,
    )  # fmt: skip


def _txn(shard: str, seq: int, *changes: Change) -> Transaction:
    vgtid = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=KS, shard=shard, gtid=f"MariaDB/0-1-{seq}")])
    return Transaction(KS, shard, vgtid, "commit", list(changes), timestamp=1)


def _change(op: str, before: Any = None, after: Any = None, partial: bool = False) -> Change:
    return Change(op, TABLE, "-80", before, after, 1, partial)


def test_stager_drops_what_a_whole_read_holds_and_positions_in_the_round():
    read = whole.WholeRead(TABLE, {(KS, "-80"): "MariaDB/0-1-10"})
    source, writer = _source({TABLE: read}), _Writer()
    stager = Stager(source, writer, 0, frozenset({(KS, "-80")}), set())  # type: ignore[arg-type]
    tables = {TABLE: source.table}
    row = {"grp": 1, "val": "a"}
    stager.stage(_txn("-80", 10, _change("c", after=row), _change("d", before=row)), tables)  # held
    stager.stage(_txn("-80", 11, _change("u", before=row, after={"grp": 1, "val": "b"})), tables)
    # the run's keyless epoch and round, not its own epoch (5: raised mid-run)
    assert [(op, at) for op, _, _, at in writer.sink_.rows] == [("u", position.keyless_key(3, 7, 11, 1))]
    with pytest.raises(SchemaError, match="partial row image"):
        stager.stage(_txn("-80", 12, _change("c", after=row, partial=True)), tables)
    stager.stage(_txn("-80", 9, _change("c", after=row, partial=True)), tables)  # held: no image needed


@pytest.mark.parametrize(
    ("committed", "orphan", "run_epoch", "expected"),
    [
        ({"epoch": 2, "keyless_round": 4}, None, 2, (2, 5)),  # stored before keyless_epoch: the epoch
        ({"epoch": 3, "keyless_epoch": 1, "keyless_round": 4}, None, 3, (1, 5)),
        # an uncommitted batch whose run raised the epoch (a snapshot requested after a whole read)
        ({"epoch": 1, "keyless_epoch": 1, "keyless_round": 4}, {"epoch": 2, "keyless_round": 5}, 1, (2, 6)),
        (
            {"epoch": 1, "keyless_epoch": 1, "keyless_round": 4},
            {"epoch": 2, "keyless_epoch": 1, "keyless_round": 5},
            2,
            (1, 6),
        ),
        (None, None, 0, (0, 1)),
    ],
)
def test_the_keyless_epoch_and_round_sort_a_run_above_every_earlier_batch(
    committed: dict | None, orphan: dict | None, run_epoch: int, expected: tuple[int, int]
) -> None:
    """A run's keyless positions lead with ``(keyless epoch, round)``: above the committed offset's
    and an uncommitted batch's (its manifest's ``to_offset``), fixed for the run whatever its own
    epoch does afterwards, and stored in the offset it commits."""
    from airflow_cdc.sources.vitess.orphans import Orphans
    from airflow_cdc.sources.vitess.source import VitessSource

    source = VitessSource(CONFIG)
    earlier = [(position.stored_keyless_epoch(o), o["keyless_round"]) for o in (committed, orphan) if o]
    source._orphan_cache = Orphans()
    if orphan is not None:
        source._orphan_cache.keyless_epoch, source._orphan_cache.keyless_round = earlier[-1]
    if committed is not None:
        source._keyless_epoch, source._keyless_round = earlier[0]
    source.epoch = run_epoch
    assert source.keyless_round() == expected
    source.epoch += 1  # a snapshot requested in the window: the keyless positions do not follow
    assert source.keyless_round() == expected
    assert all(expected > e for e in earlier)
    end = SimpleNamespace(vgtid=b.VGtid(), generation=0)
    stored = source.offset_at(end, None, None)  # type: ignore[arg-type]
    assert (stored["keyless_epoch"], stored["keyless_round"]) == expected
    assert stored["epoch"] == run_epoch + 1
