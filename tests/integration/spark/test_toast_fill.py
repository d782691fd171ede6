"""The apply's unchanged-TOAST fill paths, on hand-made key actions (no source needed).

Each case is a batch of actions as ``frames.table_frame`` produces them (position order = event
order) plus, optionally, the stored silver rows; the fill must give every placeholder the value
its row had just before the event.
"""

from __future__ import annotations

import pytest

from spark_jobs.cdc_apply import toast
from spark_jobs.cdc_apply.frames import TableFrame

pytestmark = pytest.mark.spark

SCHEMA = (
    "__action string, __position binary, __op string, __ts_ms bigint, __unavailable array<string>, "
    "id int, v string, big string, __old_key struct<id:int>"
)
STORED = "id int, v string, big string, __position binary, __op string, __ts_ms bigint, __batch_id string"
COLUMNS = {"id": "int", "v": "string", "big": "string"}


def _pos(n: int) -> bytes:
    return n.to_bytes(16, "big")


def up(pos: int, key: int, v: str, big: str | None, unsent: bool = False, old: int | None = None) -> tuple:
    return (
        "upsert",
        _pos(pos),
        "c" if old is not None else "u",
        0,
        ["big"] if unsent else [],
        key,
        v,
        None if unsent else big,
        None if old is None else (old,),
    )


def delete(pos: int, key: int) -> tuple:
    return ("delete", _pos(pos), "d", 0, [], key, None, None, None)


def _fill(spark, actions: list[tuple], stored: list[tuple] | None = None) -> dict[tuple[int, int], tuple]:
    from pyspark.sql import types as T

    frame = TableFrame(
        spark.createDataFrame(actions, SCHEMA),
        {k: T._parse_datatype_string(t) for k, t in COLUMNS.items()},
        ["id"],
        None,
    )
    silver = None
    if stored is not None:
        rows = [(k, v, big, _pos(p), "u", 0, "b0") for k, v, big, p in stored]
        silver = spark.createDataFrame(rows, STORED)
    out = toast.fill_unavailable(frame, silver)
    got = {
        (r["id"], int.from_bytes(r["__position"], "big")): (r["big"], list(r["__unavailable"]))
        for r in out.collect()
        if r["__action"] == "upsert"
    }
    assert len(got) == sum(1 for a in actions if a[0] == "upsert"), "the fill must not add or drop actions"
    return got


def test_key_change_fills_from_the_old_key_in_the_batch(spark):
    got = _fill(
        spark,
        [
            up(1, 1, "a", "A"),
            up(2, 1, "b", None, unsent=True),
            delete(3, 1),
            up(4, 2, "b", None, unsent=True, old=1),  # moved 1 -> 2, big unchanged
            up(5, 2, "c", None, unsent=True),
            up(6, 3, "x", "X3"),  # an unrelated key keeps its own values
            up(7, 3, "y", None, unsent=True),
        ],
    )
    assert got[(2, 4)] == ("A", []) and got[(2, 5)] == ("A", [])
    assert got[(1, 2)] == ("A", []) and got[(3, 7)] == ("X3", [])


def test_chained_key_changes_fill_from_silver(spark):
    # 10 -> 11 -> 12 -> 13 in one batch; only silver knows key 10's value
    actions = [delete(20, 10), up(21, 11, "m", None, unsent=True, old=10)]
    actions += [delete(22, 11), up(23, 12, "m", None, unsent=True, old=11)]
    actions += [
        delete(24, 12),
        up(25, 13, "m", None, unsent=True, old=12),
        up(26, 13, "n", None, unsent=True),
    ]
    got = _fill(spark, actions, stored=[(10, "s", "S10", 5), (99, "z", "S99", 5)])
    assert {k: v for k, v in got.items()} == {
        (11, 21): ("S10", []),
        (12, 23): ("S10", []),
        (13, 25): ("S10", []),
        (13, 26): ("S10", []),
    }


def test_move_into_a_key_deleted_earlier_takes_the_moved_row(spark):
    got = _fill(
        spark,
        [
            up(1, 5, "old", "OLD5"),
            delete(2, 5),  # key 5 is gone ...
            up(3, 6, "b", "B6"),
            delete(4, 6),
            up(5, 5, "b", None, unsent=True, old=6),  # ... then row 6 moves there
        ],
        stored=[(5, "s", "STORED5", 0)],
    )
    assert got[(5, 5)] == ("B6", [])


def test_old_key_value_is_the_one_just_before_the_move(spark):
    got = _fill(
        spark,
        [
            up(1, 1, "a", "FIRST"),
            up(2, 1, "a", "SECOND"),
            delete(3, 1),
            up(4, 2, "a", None, unsent=True, old=1),
            up(5, 1, "again", "LATER"),  # key 1 reused afterwards: not the moved row's value
        ],
        stored=[(1, "s", "STORED", 0)],
    )
    assert got[(2, 4)] == ("SECOND", [])


def test_silver_row_newer_than_the_move_is_not_used(spark):
    # applied out of order: silver already holds a later state of the old key
    got = _fill(
        spark,
        [delete(3, 1), up(4, 2, "a", None, unsent=True, old=1)],
        stored=[(1, "later", "NEWER", 9)],
    )
    assert got[(2, 4)] == (None, ["big"]), "unresolved placeholders stay listed"


def test_unknown_old_key_stays_listed_and_a_delete_skipped_move_still_fills(spark):
    got = _fill(
        spark,
        [
            up(4, 8, "a", None, unsent=True, old=7),  # key 7 known nowhere
            up(5, 20, "x", "X20"),
            up(6, 21, "x", None, unsent=True, old=20),  # skipped.operations=d: no delete of 20
        ],
    )
    assert got[(8, 4)] == (None, ["big"])
    assert got[(21, 6)] == ("X20", [])


def test_batches_without_placeholders_are_returned_as_they_are(spark):
    got = _fill(spark, [up(1, 1, "a", "A"), delete(2, 1), up(3, 2, "a", "B", old=1)])
    assert got == {(1, 1): ("A", []), (2, 3): ("B", [])}


def test_many_keys_fill_only_from_their_own_earlier_actions(spark):
    # keys 1..60 of one action each (every third sends big); keys 101..110 send big, then leave it
    actions = [
        up(k, k, f"v{k}", None, unsent=True) if k % 3 else up(k, k, f"v{k}", f"B{k}") for k in range(1, 61)
    ]
    actions += [up(100 + k, 100 + k, "a", f"E{k}") for k in range(1, 11)]
    actions += [up(200 + k, 100 + k, "b", None, unsent=True) for k in range(1, 11)]
    actions += [delete(300 + k, 400 + k) for k in range(5)]
    got = _fill(spark, actions)
    assert got[(3, 3)] == ("B3", []) and got[(4, 4)] == (None, ["big"])
    assert all(got[(k, k)] == (None, ["big"]) for k in range(1, 61) if k % 3)
    assert all(got[(100 + k, 200 + k)] == (f"E{k}", []) for k in range(1, 11))


def test_mixed_placeholder_and_sent_updates_of_one_key_fill_in_order(spark):
    got = _fill(
        spark,
        [
            up(1, 1, "a", None, unsent=True),  # first of its key: stays listed (stored value)
            up(2, 1, "b", "B"),
            up(3, 1, "c", None, unsent=True),  # takes B
            up(4, 2, "x", None, unsent=True),  # a key of one action next to them: stays listed
            up(5, 1, "d", "D"),
            up(6, 1, "e", None, unsent=True),  # takes D, not B
        ]
        + [up(10 + k, 10 + k, "s", None, unsent=True) for k in range(20)],
    )
    assert got[(1, 1)] == (None, ["big"])
    assert got[(1, 3)] == ("B", [])
    assert got[(2, 4)] == (None, ["big"])
    assert got[(1, 6)] == ("D", [])
    assert got[(15, 15)] == (None, ["big"])


def test_delete_then_reinsert_with_a_placeholder_stays_listed(spark):
    got = _fill(
        spark,
        [
            up(1, 1, "a", "A"),
            delete(2, 1),
            up(3, 1, "b", None, unsent=True),
            up(4, 2, "z", None, unsent=True),
        ],
    )
    assert got[(1, 3)] == (None, ["big"])  # the delete ends the key's history: no A
    assert got[(2, 4)] == (None, ["big"])


def test_key_move_with_placeholder_still_fills_among_single_action_keys(spark):
    # the moved row takes the old key's value; an unrelated key of one action stays listed
    got = _fill(
        spark, [up(1, 1, "a", "A"), up(2, 2, "b", None, unsent=True, old=1), up(3, 3, "c", None, unsent=True)]
    )
    assert got[(2, 2)] == ("A", [])
    assert got[(3, 3)] == (None, ["big"])
