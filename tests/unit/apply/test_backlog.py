"""Which batches of a backlog are applied to a table as one (spark_jobs/cdc_apply/backlog.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_jobs.cdc_apply.backlog import Entry, breaks, combinable, combined_table, stretches
from spark_jobs.cdc_apply.staged import SchemaGroup, StagedBatch, StagedTable


def _batch(batch_id: str, **manifest) -> StagedBatch:
    staged = StagedBatch.__new__(StagedBatch)
    staged.manifest = {"batch_id": batch_id, "connector": "c", **manifest}
    return staged


def _table(batch_id: str, keys=("id",), ops=None, toast=False, counted=True, row_bytes=10) -> StagedTable:
    group = SchemaGroup("v1", pa.schema([]), [f"{batch_id}/part-0.parquet"], 5, batch_id)
    return StagedTable("public.t", list(keys), [group], dict(ops or {"c": 5}), toast, counted, row_bytes)


def _entries(n: int, **kw) -> list[Entry]:
    return [Entry(i, _batch(f"b{i}"), _table(f"b{i}", **kw)) for i in range(n)]


def _ids(out: list[list[Entry]]) -> list[list[int]]:
    return [[e.index for e in stretch] for stretch in out]


def test_consecutive_batches_form_one_stretch():
    assert _ids(stretches(_entries(4), set(), lambda s: False, True)) == [[0, 1, 2, 3]]


def test_tables_applied_batch_by_batch_are_never_combined():
    assert _ids(stretches(_entries(3), set(), lambda s: False, False)) == [[0], [1], [2]]


def test_an_applied_batch_splits_the_stretch_and_stands_alone():
    out = stretches(_entries(6), set(), lambda s: s.batch_id in {"b2", "b3"}, True)
    assert _ids(out) == [[0, 1], [2], [3], [4, 5]]


def test_a_break_in_the_offsets_splits_the_stretch():
    entries = _entries(5)
    assert _ids(stretches(entries, {3}, lambda s: False, True)) == [[0, 1, 2], [3, 4]]
    # a break at a batch without this table still splits the stretch around it
    sparse = [entries[0], entries[1], entries[4]]
    assert _ids(stretches(sparse, {3}, lambda s: False, True)) == [[0, 1], [4]]
    assert _ids(stretches(sparse, {1}, lambda s: False, True)) == [[0], [1, 4]]


def test_a_key_change_splits_the_stretch():
    entries = _entries(4)
    entries[2] = Entry(2, entries[2].staged, _table("b2", keys=("id", "k")))
    entries[3] = Entry(3, entries[3].staged, _table("b3", keys=("id", "k")))
    assert _ids(stretches(entries, set(), lambda s: False, True)) == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    ("before", "after", "cut"),
    [
        ({"to_offset": {"lsn": 5}}, {"from_offset": {"lsn": 5}}, False),
        ({"to_offset": {"lsn": 5}}, {"from_offset": {"lsn": 4}}, True),
        ({"to_offset": {"lsn": 5}}, {}, False),  # offsets not recorded: consecutive as given
        ({}, {"from_offset": {"lsn": 4}}, False),
        ({"to_offset": {"lsn": 5}}, {"from_offset": {}}, False),
    ],
)
def test_breaks_compare_end_and_start_offsets(before, after, cut):
    assert breaks([_batch("a", **before), _batch("b", **after)]) == ({1} if cut else set())


def test_combined_table_keeps_every_group_in_order_and_sums_counts():
    entries = [
        Entry(0, _batch("b0"), _table("b0", ops={"c": 3, "u": 2}, row_bytes=40)),
        Entry(1, _batch("b1"), _table("b1", ops={"u": 1, "d": 4}, toast=True, row_bytes=90)),
        Entry(2, _batch("b2"), _table("b2", ops={"t": 1}, counted=False, row_bytes=10)),
    ]
    table = combined_table(entries)
    assert [g.batch_id for g in table.groups] == ["b0", "b1", "b2"]
    assert table.ops == {"c": 3, "u": 3, "d": 4, "t": 1}
    assert table.rows == 15 and table.row_bytes == 90
    assert table.toast and not table.ops_counted and table.may_remove
    assert combined_table(entries[:1]) is entries[0].table


def test_keyless_history_and_soft_delete_tables_are_applied_batch_by_batch():
    assert combinable(_table("b"), history=False, soft=False)
    assert not combinable(_table("b", keys=()), history=False, soft=False)
    assert not combinable(_table("b"), history=True, soft=False)
    assert not combinable(_table("b"), history=False, soft=True)
