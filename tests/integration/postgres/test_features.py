"""Connector features end to end: ad hoc snapshot signals, publication modes, filters, skipped
operations, message key columns, heartbeat query, snapshot modes, odd identifiers, and a crash
between the state commit and the slot advance."""

from __future__ import annotations

import psycopg
import pytest

from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_capture, build_config, build_store
from tests.integration.postgres.support import assert_converged, pipeline, run_capture


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _query(db, sql, params=()):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _state(config):
    return build_store(build_config(config)).load(config["name"])


def _events(result_or_batch, table):
    batch = result_or_batch if isinstance(result_or_batch, Batch) else Batch(result_or_batch.batch_path)
    if table not in batch.tables():
        return []
    return [row for rb in batch.iter_events(table) for row in rb.to_pylist()]


def _all_events(config, table):
    return [e for b in list_batches(config["staging.path"], config["name"]) for e in _events(b, table)]


def _ids(events, op, col="id"):
    return [(e["after"] or e["before"])[col] for e in events if e["op"] == op]


def _captured_tables(config):
    return {t for b in list_batches(config["staging.path"], config["name"]) for t in b.tables()}


def _pending(config):
    return _state(config).data["snapshot"]["pending"]


# -- 1. ad hoc snapshots -----------------------------------------------------------------------


@pytest.fixture
def ab(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE b (id int PRIMARY KEY)",
        "INSERT INTO a SELECT g, 'x' FROM generate_series(1, 50) g",
        "INSERT INTO b SELECT generate_series(1, 5)",
    )
    config = pipeline(pg_db, tmp_path / "staging")
    first = run_capture(config)
    assert sorted(_ids(_events(first, "public.a"), "r")) == list(range(1, 51))
    _exec(
        pg_db,
        "UPDATE a SET v = 'y' WHERE id = 3",
        "INSERT INTO a VALUES (60, 'n')",
        "DELETE FROM a WHERE id = 20",
    )
    return config


def test_adhoc_snapshot_with_additional_condition(ab):
    sig = {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["public.a"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "public.a", "filter": "id IN (10, 20, 30, 40, 50, 60)"}],
        },
    }
    result = run_capture(ab, signals=[sig])
    a = _events(result, "public.a")
    assert sorted(_ids(a, "r")) == [10, 30, 40, 50, 60]
    assert sorted(_ids(a, "c")) == [60] and _ids(a, "u") == [3] and _ids(a, "d") == [20]
    assert _events(result, "public.b") == []
    assert _pending(ab) == []
    assert_converged(ab, ["public.a", "public.b"])


def test_adhoc_snapshot_run_conf_shorthand(ab):
    result = run_capture(ab, signals=[{"execute-snapshot": {"data-collections": ["public.b"]}}])
    assert sorted(_ids(_events(result, "public.b"), "r")) == [1, 2, 3, 4, 5]
    assert _ids(_events(result, "public.a"), "r") == []
    assert_converged(ab, ["public.a", "public.b"])


def test_adhoc_snapshot_surrogate_key_over_several_runs(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE c (id int PRIMARY KEY, code int UNIQUE NOT NULL, v text)",
        "INSERT INTO c SELECT g, 100 - g, 'v' FROM generate_series(1, 20) g",
    )
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{"snapshot.mode": "no_data", "incremental.snapshot.chunk.size": 3, "snapshot.max.rows.per.run": 7},
    )
    assert run_capture(config).snapshot_rows == 0
    sig = {"type": "execute-snapshot", "data": {"data-collections": ["public.c"], "surrogate-key": "code"}}
    results = [run_capture(config, signals=[sig])]
    for _ in range(6):
        if not _pending(config):
            break
        results.append(run_capture(config))
    assert _pending(config) == []
    assert len(results) >= 3  # 20 rows, at most 7 per run
    per_run = [_ids(_events(r, "public.c"), "r", "code") for r in results]
    codes = [c for run in per_run for c in run]
    assert sorted(codes) == list(range(80, 100)) and len(codes) == 20  # each row exactly once
    assert codes == sorted(codes)  # chunked in surrogate-key order
    assert_converged(config, ["public.c"])


def test_stop_snapshot_in_the_middle(pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE a (id int PRIMARY KEY)", "INSERT INTO a SELECT generate_series(1, 30)")
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{"snapshot.mode": "no_data", "incremental.snapshot.chunk.size": 2, "snapshot.max.rows.per.run": 4},
    )
    run_capture(config)
    first = run_capture(config, signals=[{"execute-snapshot": {"data-collections": ["public.a"]}}])
    assert sorted(_ids(_events(first, "public.a"), "r")) == [1, 2, 3, 4]
    assert len(_pending(config)) == 1
    stopped = run_capture(
        config,
        signals=[
            {"type": "stop-snapshot", "data": {"data-collections": ["public.a"], "type": "incremental"}}
        ],
    )
    assert _ids(_events(stopped, "public.a"), "r") == []
    assert _pending(config) == []
    _exec(pg_db, "INSERT INTO a VALUES (100)")
    later = run_capture(config)
    assert _ids(_events(later, "public.a"), "r") == [] and _ids(_events(later, "public.a"), "c") == [100]


@pytest.mark.parametrize("collections", [["public.nope.*"], ["public.("]])
def test_bad_signal_is_config_error_and_state_unchanged(ab, collections):
    before = _state(ab).version
    with pytest.raises(ConfigError, match="data-collections"):
        run_capture(ab, signals=[{"execute-snapshot": {"data-collections": collections}}])
    assert _state(ab).version == before
    assert len(list_batches(ab["staging.path"], ab["name"])) == 1


# -- 2. publications ---------------------------------------------------------------------------


def _pub(db, name):
    row = _query(db, "SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = %s", (name,))
    tables = {
        f"{s}.{t}"
        for s, t in _query(
            db, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,)
        )
    }
    return (row[0] if row else None), tables


def _abc(db):
    _exec(db, *(f"CREATE TABLE {t} (id int PRIMARY KEY)" for t in "abc"))


def test_publication_all_tables(pg_db, tmp_path):
    _abc(pg_db)
    config = pipeline(pg_db, tmp_path / "s", **{"publication.autocreate.mode": "all_tables"})
    run_capture(config)
    (alltables, viaroot), tables = _pub(pg_db, config["publication.name"])
    assert alltables is True and viaroot is False
    assert tables == {"public.a", "public.b", "public.c"}


def test_publication_filtered_follows_include_list(pg_db, tmp_path):
    _abc(pg_db)
    config = pipeline(
        pg_db,
        tmp_path / "s",
        **{"publication.autocreate.mode": "filtered", "table.include.list": "public.a,public.b"},
    )
    run_capture(config)
    (alltables, _), tables = _pub(pg_db, config["publication.name"])
    assert alltables is False and tables == {"public.a", "public.b"}
    config["table.include.list"] = "public.c"
    run_capture(config)
    assert _pub(pg_db, config["publication.name"])[1] == {"public.c"}
    _exec(pg_db, "INSERT INTO a VALUES (1)", "INSERT INTO c VALUES (1)")
    result = run_capture(config)
    assert Batch(result.batch_path).tables() == ["public.c"]
    assert _ids(_events(result, "public.c"), "c") == [1]


def test_publication_no_tables_until_user_adds_one(pg_db, tmp_path):
    _abc(pg_db)
    config = pipeline(
        pg_db, tmp_path / "s", **{"publication.autocreate.mode": "no_tables", "snapshot.mode": "no_data"}
    )
    run_capture(config)
    (alltables, _), tables = _pub(pg_db, config["publication.name"])
    assert alltables is False and tables == set()
    _exec(pg_db, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
    result = run_capture(config)
    assert Batch(result.batch_path).tables() == [] and result.events == 0
    _exec(
        pg_db,
        f"ALTER PUBLICATION {config['publication.name']} ADD TABLE a",
        "INSERT INTO a VALUES (2)",
        "INSERT INTO b VALUES (2)",
    )
    result = run_capture(config)
    assert Batch(result.batch_path).tables() == ["public.a"]
    assert _ids(_events(result, "public.a"), "c") == [2]
    assert _pub(pg_db, config["publication.name"])[1] == {"public.a"}


def test_publication_disabled_uses_existing(pg_db, tmp_path):
    _abc(pg_db)
    _exec(pg_db, "CREATE PUBLICATION mine FOR TABLE a")
    config = pipeline(
        pg_db,
        tmp_path / "s",
        **{"publication.autocreate.mode": "disabled", "publication.name": "mine", "snapshot.mode": "no_data"},
    )
    run_capture(config)
    _exec(pg_db, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
    result = run_capture(config)
    assert Batch(result.batch_path).tables() == ["public.a"]
    assert _ids(_events(result, "public.a"), "c") == [1]
    assert _pub(pg_db, "mine") == ((False, False), {"public.a"})


@pytest.mark.parametrize("via_root", [True, False])
def test_publish_via_partition_root(pg_db, tmp_path, via_root):
    _exec(
        pg_db,
        "CREATE TABLE p (id int, v text, PRIMARY KEY (id)) PARTITION BY RANGE (id)",
        "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200)",
        "INSERT INTO p VALUES (1, 'a'), (150, 'b')",
    )
    config = pipeline(pg_db, tmp_path / "s", **{"publish.via.partition.root": str(via_root).lower()})
    first = run_capture(config)
    (_, viaroot), _ = _pub(pg_db, config["publication.name"])
    assert viaroot is via_root
    _exec(pg_db, "INSERT INTO p VALUES (2, 'c'), (151, 'd')", "UPDATE p SET v = 'B' WHERE id = 150")
    result = run_capture(config)
    if via_root:
        assert Batch(first.batch_path).tables() == ["public.p"]
        assert sorted(_ids(_events(first, "public.p"), "r")) == [1, 150]
        assert Batch(result.batch_path).tables() == ["public.p"]
        assert sorted(_ids(_events(result, "public.p"), "c")) == [2, 151]
        assert _ids(_events(result, "public.p"), "u") == [150]
        assert_converged(config, ["public.p"])
    else:
        assert Batch(first.batch_path).tables() == ["public.p1", "public.p2"]
        assert Batch(result.batch_path).tables() == ["public.p1", "public.p2"]
        assert _ids(_events(result, "public.p1"), "c") == [2]
        assert _ids(_events(result, "public.p2"), "c") == [151] and _ids(
            _events(result, "public.p2"), "u"
        ) == [150]
        assert_converged(config, ["public.p1", "public.p2"])


# -- 3. filters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "props,expected",
    [
        ({"table.include.list": "public.a"}, {"public.a"}),
        ({"table.exclude.list": "public.b"}, {"public.a", "s2.c"}),
        ({"schema.exclude.list": "s2"}, {"public.a", "public.b"}),
        ({"schema.include.list": "s2"}, {"s2.c"}),
    ],
)
def test_table_filters(pg_db, tmp_path, props, expected):
    _exec(
        pg_db,
        "CREATE SCHEMA s2",
        "CREATE TABLE a (id int PRIMARY KEY)",
        "CREATE TABLE b (id int PRIMARY KEY)",
        "CREATE TABLE s2.c (id int PRIMARY KEY)",
        "INSERT INTO a VALUES (1)",
        "INSERT INTO b VALUES (1)",
        "INSERT INTO s2.c VALUES (1)",
    )
    config = pipeline(pg_db, tmp_path / "s", **props)
    run_capture(config)
    _exec(pg_db, "INSERT INTO a VALUES (2)", "INSERT INTO b VALUES (2)", "INSERT INTO s2.c VALUES (2)")
    run_capture(config)
    assert _captured_tables(config) == expected
    for table in expected:
        events = _all_events(config, table)
        assert [(e["op"], e["after"]["id"]) for e in events] == [("r", 1), ("c", 2)]


@pytest.mark.parametrize(
    "props",
    [
        {"column.exclude.list": "public.a.secret,public.a.id"},
        {"column.include.list": "public.a.v"},
    ],
)
def test_column_filters_keep_key(pg_db, tmp_path, props):
    _exec(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v text, secret text)",
        "ALTER TABLE a REPLICA IDENTITY FULL",
        "INSERT INTO a VALUES (1, 'one', 's1')",
    )
    config = pipeline(pg_db, tmp_path / "s", **props)
    run_capture(config)
    _exec(
        pg_db,
        "INSERT INTO a VALUES (2, 'two', 's2')",
        "UPDATE a SET v = 'TWO', secret = 'x' WHERE id = 2",
        "DELETE FROM a WHERE id = 1",
    )
    run_capture(config)
    events = _all_events(config, "public.a")
    assert [e["op"] for e in events] == ["r", "c", "u", "d"]
    for e in events:
        for image in (e["before"], e["after"]):
            if image is not None:
                assert set(image) == {"id", "v"}
    assert events[2]["before"] == {"id": 2, "v": "two"} and events[2]["after"] == {"id": 2, "v": "TWO"}
    assert events[3]["before"] == {"id": 1, "v": "one"}
    assert_converged(config, ["public.a"])


# -- 4. skipped.operations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "skipped,ops", [(None, ["c", "u", "d"]), ("c,d", ["u", "t"]), ("none", ["c", "u", "d", "t"])]
)
def test_skipped_operations(pg_db, tmp_path, skipped, ops):
    _exec(pg_db, "CREATE TABLE a (id int PRIMARY KEY, v int)")
    props = {"snapshot.mode": "no_data"}
    if skipped is not None:
        props["skipped.operations"] = skipped
    config = pipeline(pg_db, tmp_path / "s", **props)
    run_capture(config)
    _exec(pg_db, "INSERT INTO a VALUES (1, 1)", "UPDATE a SET v = 2", "DELETE FROM a", "TRUNCATE a")
    result = run_capture(config)
    assert [e["op"] for e in _events(result, "public.a")] == ops


# -- 5. message.key.columns --------------------------------------------------------------------


@pytest.mark.parametrize(
    "key_prop,key", [(None, ["id"]), ("public.k:code", ["code"]), ("public.k:code,id", ["code", "id"])]
)
def test_message_key_columns_override(pg_db, tmp_path, key_prop, key):
    _exec(
        pg_db,
        "CREATE TABLE k (id int PRIMARY KEY, code text UNIQUE NOT NULL, v int)",
        "INSERT INTO k VALUES (1, 'a', 1), (2, 'b', 2)",
    )
    config = pipeline(pg_db, tmp_path / "s", **({"message.key.columns": key_prop} if key_prop else {}))
    first = run_capture(config)
    assert Batch(first.batch_path).table_info("public.k")["key_columns"] == key
    _exec(pg_db, "INSERT INTO k VALUES (3, 'c', 3)", "UPDATE k SET v = 20 WHERE id = 2")
    result = run_capture(config)
    assert Batch(result.batch_path).table_info("public.k")["key_columns"] == key
    assert_converged(config, ["public.k"])


# -- 6. heartbeat.action.query -----------------------------------------------------------------


def test_heartbeat_action_query_once_per_run(pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE heartbeat (ts timestamptz)", "CREATE TABLE a (id int PRIMARY KEY)")
    config = pipeline(
        pg_db,
        tmp_path / "s",
        **{
            "heartbeat.action.query": "INSERT INTO heartbeat VALUES (now())",
            "table.exclude.list": "public.heartbeat",
        },
    )
    for n in (1, 2, 3):
        run_capture(config)
        assert _query(pg_db, "SELECT count(*) FROM heartbeat")[0][0] == n
    assert _captured_tables(config) == set()


# -- 7. snapshot.mode --------------------------------------------------------------------------


@pytest.fixture
def two_rows(pg_db):
    _exec(pg_db, "CREATE TABLE a (id int PRIMARY KEY, v text)", "INSERT INTO a VALUES (1, 'x'), (2, 'y')")
    return pg_db


@pytest.mark.parametrize("mode", ["initial", "when_needed"])
def test_snapshot_mode_initial(two_rows, tmp_path, mode):
    config = pipeline(two_rows, tmp_path / "s", **{"snapshot.mode": mode})
    first = run_capture(config)
    assert sorted(_ids(_events(first, "public.a"), "r")) == [1, 2]
    _exec(two_rows, "INSERT INTO a VALUES (3, 'z')")
    second = run_capture(config)
    assert [(e["op"], e["after"]["id"]) for e in _events(second, "public.a")] == [("c", 3)]
    third = run_capture(config)
    assert _events(third, "public.a") == []
    assert_converged(config, ["public.a"])


@pytest.mark.parametrize("mode", ["no_data", "never"])
def test_snapshot_mode_no_data(two_rows, tmp_path, mode):
    config = pipeline(two_rows, tmp_path / "s", **{"snapshot.mode": mode})
    first = run_capture(config)
    assert first.snapshot_rows == 0 and _events(first, "public.a") == []
    _exec(two_rows, "INSERT INTO a VALUES (3, 'z')", "UPDATE a SET v = 'X' WHERE id = 1")
    run_capture(config)
    assert [(e["op"], e["after"]["id"]) for e in _all_events(config, "public.a")] == [("c", 3), ("u", 1)]


def test_snapshot_mode_initial_only(two_rows, tmp_path):
    config = pipeline(two_rows, tmp_path / "s", **{"snapshot.mode": "initial_only"})
    first = run_capture(config)
    assert sorted(_ids(_events(first, "public.a"), "r")) == [1, 2]
    _exec(two_rows, "INSERT INTO a VALUES (3, 'z')")
    second = run_capture(config)
    assert _events(second, "public.a") == [] and second.events == 0
    assert _all_events(config, "public.a") == _events(first, "public.a")


def test_snapshot_mode_always(two_rows, tmp_path):
    config = pipeline(two_rows, tmp_path / "s", **{"snapshot.mode": "always"})
    first = run_capture(config)
    assert sorted(_ids(_events(first, "public.a"), "r")) == [1, 2]
    _exec(two_rows, "INSERT INTO a VALUES (3, 'z')")
    second = run_capture(config)
    events = _events(second, "public.a")
    assert _ids(events, "c") == [3]
    assert sorted(_ids(events, "r")) == [1, 2, 3]
    assert_converged(config, ["public.a"])


# -- 8. odd identifiers ------------------------------------------------------------------------


def test_quoted_unicode_identifiers(pg_db, tmp_path):
    _exec(
        pg_db,
        'CREATE SCHEMA "my.schema"',
        'CREATE TABLE "my.schema"."tab le ""q"" ü" ("co.l 1" int PRIMARY KEY, "v ""x"" é" text)',
        'INSERT INTO "my.schema"."tab le ""q"" ü" VALUES (1, \'one\'), (2, \'two\')',
    )
    table = 'my.schema.tab le "q" ü'
    config = pipeline(pg_db, tmp_path / "s")
    first = run_capture(config)
    assert Batch(first.batch_path).tables() == [table]
    rows = _events(first, table)
    assert sorted(r["after"]["co.l 1"] for r in rows) == [1, 2]
    assert set(rows[0]["after"]) == {"co.l 1", 'v "x" é'}
    assert rows[0]["source"]["schema"] == "my.schema" and rows[0]["source"]["table"] == 'tab le "q" ü'
    _exec(
        pg_db,
        'INSERT INTO "my.schema"."tab le ""q"" ü" VALUES (3, \'three\')',
        'UPDATE "my.schema"."tab le ""q"" ü" SET "v ""x"" é" = \'ONE\' WHERE "co.l 1" = 1',
        'DELETE FROM "my.schema"."tab le ""q"" ü" WHERE "co.l 1" = 2',
    )
    second = run_capture(config)
    assert [e["op"] for e in _events(second, table)] == ["c", "u", "d"]
    assert_converged(config, [table])


# -- 9. crash between state commit and slot advance --------------------------------------------


def test_crash_between_state_commit_and_slot_advance(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "INSERT INTO a SELECT g, 0 FROM generate_series(1, 10) g",
    )
    config = pipeline(pg_db, tmp_path / "s")
    run_capture(config)
    slot = config["slot.name"]
    _exec(
        pg_db, "INSERT INTO a SELECT g, 1 FROM generate_series(11, 20) g", "UPDATE a SET v = 2 WHERE id <= 5"
    )
    capture = build_capture(config)
    crashed = capture.run(commit=False)
    manifest = Batch(crashed.batch_path).manifest
    slot_before = _query(
        pg_db, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    capture.store.compare_and_set(config["name"], manifest["state_version"], manifest["state_after"])
    _exec(pg_db, "INSERT INTO a SELECT g, 3 FROM generate_series(21, 25) g", "DELETE FROM a WHERE id = 1")
    run_capture(config)
    run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    ids = [b.batch_id for b in batches]
    after = batches[ids.index(crashed.batch_id) :]
    changes = [e for b in after for e in _events(b, "public.a") if e["op"] != "r"]
    positions = [e["__position"] for e in changes]
    assert len(positions) == len(set(positions))
    assert sorted((e["op"], (e["after"] or e["before"])["id"]) for e in changes) == sorted(
        [("c", i) for i in range(11, 26)] + [("u", i) for i in range(1, 6)] + [("d", 1)]
    )
    assert slot_before != _query(
        pg_db, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    assert_converged(config, ["public.a"])
