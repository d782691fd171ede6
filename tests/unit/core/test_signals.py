"""Ad hoc snapshot signals: accepted shapes, validation errors, and their effect on the context."""

from __future__ import annotations

import json

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.signals import SnapshotSignal, apply_signals, check_signals, parse_signal
from airflow_cdc.core.snapshot import SnapshotContext

FULL = {
    "type": "execute-snapshot",
    "data": {
        "data-collections": ["public.orders"],
        "type": "incremental",
        "additional-conditions": [{"data-collection": "public.orders", "filter": "status = 'open'"}],
        "surrogate-key": "order_no",
    },
}
EXPECTED = SnapshotSignal(
    "execute-snapshot", ("public.orders",), {"public.orders": "status = 'open'"}, "order_no"
)


def test_full_shape():
    assert parse_signal(FULL) == EXPECTED


def test_shorthand_and_json_shapes():
    assert parse_signal({"execute-snapshot": FULL["data"]}) == EXPECTED
    assert parse_signal(json.dumps(FULL)) == EXPECTED
    assert parse_signal({"type": "execute-snapshot", "data": json.dumps(FULL["data"])}) == EXPECTED


def test_comma_separated_collections_and_defaults():
    sig = parse_signal({"execute-snapshot": {"data-collections": "public.a, public.b ,"}})
    assert sig == SnapshotSignal("execute-snapshot", ("public.a", "public.b"), {}, None)


def test_stop_snapshot_without_collections():
    assert parse_signal({"type": "stop-snapshot", "data": {"type": "INCREMENTAL"}}) == SnapshotSignal(
        "stop-snapshot"
    )
    assert parse_signal({"type": "stop-snapshot", "data": ""}) == SnapshotSignal("stop-snapshot")


def test_blocking_is_parsed_as_its_own_kind():
    sig = parse_signal({"execute-snapshot": {"data-collections": ["a"], "type": "BLOCKING"}})
    assert sig.data_collections == ("a",) and sig.kind == "blocking"
    assert parse_signal({"execute-snapshot": {"data-collections": ["a"]}}).kind == "incremental"
    with pytest.raises(ConfigError, match="surrogate-key.*incremental"):
        parse_signal({"execute-snapshot": {"data-collections": ["a"], "type": "blocking", "surrogate-key": "k"}})


def test_blocking_signal_is_read_in_the_run_and_never_queued():
    ctx, blocking = SnapshotContext(), []
    sig = parse_signal(
        {"execute-snapshot": {"data-collections": ["s.a", "s.b"], "type": "blocking",
                              "additional-conditions": [{"data-collection": "s.a", "filter": "x = 1"}]}}
    )  # fmt: skip
    notes = apply_signals(ctx, [sig], ["s.a", "s.b", "s.c"], blocking)
    assert ctx.pending == [] and "blocking" in notes[0]
    assert [(b.table, b.origin, b.condition) for b in blocking] == [
        ("s.a", "blocking", "x = 1"),
        ("s.b", "blocking", None),
    ]
    with pytest.raises(ConfigError, match="cannot be run here"):
        apply_signals(ctx, [sig], ["s.a", "s.b"])


def test_blocking_is_refused_where_the_source_cannot_read_whole():
    sig = parse_signal({"execute-snapshot": {"data-collections": ["s.a"], "type": "blocking"}})
    check_signals([sig], ["s.a"], lambda t: None, False)  # supported: nothing to say
    with pytest.raises(ConfigError, match="'blocking' is not supported: the vitess source") as e:
        check_signals([sig], ["s.a"], lambda t: None, False, "the vitess source has no whole read")
    assert "incremental" in str(e.value.hint)


@pytest.mark.parametrize(
    "raw,match",
    [
        ({"foo": 1}, "expected"),
        ({"type": "execute-snapshot"}, "expected"),
        ({"type": "pause-snapshot", "data": {}}, "'pause-snapshot' is not supported"),
        (
            {"execute-snapshot": {"data-collections": ["a"], "type": "full"}},
            "snapshot type 'full' is not supported",
        ),
        ({"execute-snapshot": {}}, "'data-collections' must name at least one table"),
        ({"execute-snapshot": {"data-collections": []}}, "'data-collections' must name at least one table"),
        (
            {"execute-snapshot": {"data-collections": ["a"], "additional-conditions": [{"filter": "x"}]}},
            "needs 'data-collection' and 'filter'",
        ),
        (
            {"execute-snapshot": {"data-collections": ["a"], "additional-conditions": ["x > 1"]}},
            "needs 'data-collection' and 'filter'",
        ),
    ],
)
def test_errors(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_signal(raw)


def test_apply_execute_with_regex_and_conditions():
    ctx = SnapshotContext()
    sig = parse_signal(
        {
            "execute-snapshot": {
                "data-collections": ["public\\..*"],
                "surrogate-key": "k",
                "additional-conditions": [{"data-collection": "public.a", "filter": "id > 1"}],
            }
        }
    )
    notes = apply_signals(ctx, [sig], ["public.a", "public.b", "other.c"])
    assert [(p.table, p.origin, p.condition, p.surrogate_key) for p in ctx.pending] == [
        ("public.a", "adhoc", "id > 1", "k"),
        ("public.b", "adhoc", None, "k"),
    ]
    assert notes == ["execute-snapshot: queued ['public.a', 'public.b']"]


def test_apply_unmatched_and_bad_regex():
    ctx = SnapshotContext()
    with pytest.raises(ConfigError, match="match no captured table"):
        apply_signals(
            ctx, [parse_signal({"execute-snapshot": {"data-collections": ["public.x"]}})], ["public.a"]
        )
    with pytest.raises(ConfigError, match="invalid data-collections regex"):
        apply_signals(ctx, [parse_signal({"execute-snapshot": {"data-collections": ["("]}})], ["public.a"])
    assert ctx.pending == []


def test_apply_stop():
    ctx = SnapshotContext()
    ctx.add(["public.a", "public.b", "public.c"], "adhoc")
    apply_signals(
        ctx,
        [parse_signal({"stop-snapshot": {"data-collections": ["public.b"]}})],
        ["public.a", "public.b", "public.c"],
    )
    assert [p.table for p in ctx.pending] == ["public.a", "public.c"]
    notes = apply_signals(ctx, [parse_signal({"stop-snapshot": {}})], ["public.a", "public.b", "public.c"])
    assert ctx.pending == [] and notes == ["stop-snapshot: stopped ['public.a', 'public.c']"]
