"""Event shape: envelope, source block, replica identity effects, TOAST placeholder, transaction
metadata, truncate and logical messages, and encoded values, as the Debezium seed documents."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import Batch
from tests.integration.postgres.support import pipeline, run_capture

SOURCE_FIELDS = ["version", "connector", "name", "ts_ms", "ts_us", "ts_ns", "snapshot", "db", "sequence",
                 "schema", "table", "txId", "lsn", "xmin"]


def _exec(db, *statements):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _events(result, table):
    batch = Batch(result.batch_path)
    if table not in batch.tables():
        return []
    return [row for rb in batch.iter_events(table) for row in rb.to_pylist()]


@pytest.fixture
def shape(pg_db, tmp_path):
    _exec(pg_db,
          "CREATE TABLE d (id int PRIMARY KEY, v text, big text)",
          "CREATE TABLE f (id int PRIMARY KEY, v text)", "ALTER TABLE f REPLICA IDENTITY FULL",
          "INSERT INTO d VALUES (1, 'one', NULL)", "INSERT INTO f VALUES (1, 'one')")
    config = pipeline(pg_db, tmp_path / "staging", **{"skipped.operations": "none",
                                                       "provide.transaction.metadata": "true"})
    first = run_capture(config)
    return config, first


def test_snapshot_rows_are_reads(shape):
    _, first = shape
    rows = _events(first, "public.d")
    assert [r["op"] for r in rows] == ["r"]
    assert rows[0]["after"] == {"id": 1, "v": "one", "big": None} and rows[0]["before"] is None
    assert rows[0]["source"]["snapshot"] == "incremental"
    assert list(rows[0]["source"]) == SOURCE_FIELDS


def test_ops_envelope_and_replica_identity(pg_db, shape):
    config, _ = shape
    big = "".join(f"{i:08x}" for i in range(3000))  # 24 kB, incompressible enough to be TOASTed
    _exec(pg_db, "BEGIN; INSERT INTO d VALUES (2, 'two', '" + big + "'); INSERT INTO f VALUES (2, 'two'); COMMIT",
          "UPDATE d SET v = 'TWO' WHERE id = 2", "UPDATE f SET v = 'TWO' WHERE id = 2",
          "UPDATE d SET id = 3 WHERE id = 2", "DELETE FROM d WHERE id = 3", "DELETE FROM f WHERE id = 2",
          # a non-transactional message is not flushed by itself: the commits after it flush it
          "SELECT pg_logical_emit_message(false, 'nontx', 'x')",
          "TRUNCATE f", "SELECT pg_logical_emit_message(true, 'audit', 'hello')")
    result = run_capture(config)
    d, f = _events(result, "public.d"), _events(result, "public.f")
    assert [e["op"] for e in d] == ["c", "u", "d", "c", "d"]
    assert [e["op"] for e in f] == ["c", "u", "d", "t"]
    insert, update, moved_from, moved_to, delete = d
    assert insert["before"] is None and insert["after"]["big"] == big
    # REPLICA IDENTITY DEFAULT: no before image on update; unchanged TOAST gets the placeholder
    assert update["before"] is None
    assert update["after"]["big"] == "__debezium_unavailable_value"
    assert update["__unavailable"] == ["big"]
    # key change (Debezium): d of the old key (before = the old key only, as the server sends it
    # under REPLICA IDENTITY DEFAULT), then c of the new key (before null; the unchanged TOAST
    # value is the placeholder), consecutive in one transaction; the c names the old key
    assert moved_from["before"] == {"id": 2, "v": None, "big": None} and moved_from["after"] is None
    assert moved_to["before"] is None and moved_to["after"]["id"] == 3 and moved_to["after"]["v"] == "TWO"
    assert moved_to["after"]["big"] == "__debezium_unavailable_value" and moved_to["__unavailable"] == ["big"]
    assert moved_to["__old_key"] == {"id": 2} and moved_from["__old_key"] is None
    assert moved_from["source"] == moved_to["source"]
    assert moved_from["transaction"]["id"] == moved_to["transaction"]["id"]
    assert [e["transaction"]["total_order"] for e in (moved_from, moved_to)] == [1, 2]
    assert [e["transaction"]["data_collection_order"] for e in (moved_from, moved_to)] == [1, 2]
    seqs = [int.from_bytes(e["__position"][8:], "big") for e in (moved_from, moved_to)]
    assert moved_from["__position"][:8] == moved_to["__position"][:8] and seqs[1] == seqs[0] + 1
    assert all(e["__old_key"] is None for e in (insert, update, delete))
    assert delete["before"]["id"] == 3 and delete["after"] is None
    # REPLICA IDENTITY FULL: full before images
    assert f[1]["before"] == {"id": 2, "v": "two"} and f[2]["before"] == {"id": 2, "v": "TWO"}
    assert f[3]["before"] is None and f[3]["after"] is None
    # source block
    src = insert["source"]
    assert list(src) == SOURCE_FIELDS
    assert src["connector"] == "postgresql" and src["snapshot"] == "false" and src["db"] == pg_db.name
    assert src["schema"] == "public" and src["table"] == "d" and src["xmin"] is None
    assert src["ts_us"] == src["ts_ms"] * 1000 + src["ts_us"] % 1000 and src["ts_ns"] == src["ts_us"] * 1000
    last_commit, lsn = json.loads(src["sequence"])
    assert int(lsn) == src["lsn"]
    # transaction metadata: id "txId:LSN", total order across tables, order within the table
    assert insert["transaction"]["id"] == f"{src['txId']}:{int.from_bytes(insert['__position'][:8], 'big')}"
    assert insert["transaction"]["total_order"] == 1 and f[0]["transaction"]["total_order"] == 2
    assert f[0]["transaction"]["data_collection_order"] == 1
    # positions strictly increase in log order
    positions = [e["__position"] for e in d]
    assert positions == sorted(positions) and len(set(positions)) == 5
    # logical messages
    batch = Batch(result.batch_path)
    msgs = [r for rb in batch.iter_messages() for r in rb.to_pylist()]
    assert {(m["message"]["prefix"], m["message"]["content"]) for m in msgs} == {("audit", b"hello"),
                                                                                 ("nontx", b"x")}
    assert all(m["op"] == "m" for m in msgs)


def test_value_encodings(pg_db, tmp_path):
    _exec(pg_db, """CREATE TABLE v (id int PRIMARY KEY, b bool, i2 smallint, i8 bigint, r real, f float8,
        n numeric(10,2), nv numeric, d date, ts timestamp(6), ts3 timestamp(3), tstz timestamptz,
        t time, iv interval, j jsonb, u uuid, by bytea, arr int[], m money)""")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    _exec(pg_db, """INSERT INTO v VALUES (1, true, -2, 9007199254740993, 1.5, 0.1, 12.34, 3.14159, '2018-06-20',
        '2018-06-20 15:13:16.945104', '2018-06-20 15:13:16.945', '2018-06-20 15:13:16.945104+02',
        '15:13:16.945104', '1 day 2 hours', '{"a": [1, 2]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '\\x0102ff', '{1,NULL,3}', 12.5)""")
    result = run_capture(config)
    row = _events(result, "public.v")[0]["after"]
    assert row["b"] is True and row["i2"] == -2 and row["i8"] == 9007199254740993
    assert row["r"] == 1.5 and row["f"] == 0.1
    assert row["n"] == Decimal("12.34")
    assert row["d"] == 17702                      # epoch days (io.debezium.time.Date)
    assert row["ts"] == 1529507596945104          # the seed's MicroTimestamp example
    assert row["ts3"] == 1529507596945            # io.debezium.time.Timestamp, millis
    assert row["tstz"] == "2018-06-20T13:13:16.945104Z"
    assert row["t"] == 54796945104                # MicroTime
    assert row["iv"] == 93600000000               # MicroDuration
    assert json.loads(row["j"]) == {"a": [1, 2]}
    assert row["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert row["by"] == b"\x01\x02\xff"
    assert row["arr"] == [1, None, 3]
    assert row["m"] == Decimal("12.50")
    after = pq.read_schema(Batch(result.batch_path).parts("public.v")[0]).field("after").type
    names = {after.field(i).name: (after.field(i).metadata or {}).get(b"connect.name") for i in range(after.num_fields)}
    assert names["d"] == b"io.debezium.time.Date"
    assert names["ts"] == b"io.debezium.time.MicroTimestamp"
    assert names["ts3"] == b"io.debezium.time.Timestamp"
    assert names["tstz"] == b"io.debezium.time.ZonedTimestamp"
    assert names["n"] == b"org.apache.kafka.connect.data.Decimal"
    assert names["nv"] == b"io.debezium.data.VariableScaleDecimal"
    assert names["j"] == b"io.debezium.data.Json" and names["u"] == b"io.debezium.data.Uuid"
    assert names["iv"] == b"io.debezium.time.MicroDuration" and names["t"] == b"io.debezium.time.MicroTime"
    # an empty window still produces a valid, empty batch
    assert Batch(run_capture(config).batch_path).tables() == []


@pytest.mark.parametrize(("skipped", "ops"), [("none", ["d", "c", "u"]), ("u", ["d", "c"]), ("d", ["c", "u"]),
                                             ("c", ["d", "u"]), ("c,d", ["u"])])
def test_key_change_and_skipped_operations(pg_db, tmp_path, skipped, ops):
    """``skipped.operations`` applies to the d and the c of a key change as Debezium's dispatcher
    does (skipping u leaves them); the compiled and pure-Python decoders agree."""
    _exec(pg_db, "CREATE TABLE k (id int PRIMARY KEY, v text)", "INSERT INTO k VALUES (1, 'a'), (2, 'b')")
    config = pipeline(pg_db, tmp_path / "staging", **{"skipped.operations": skipped})
    run_capture(config)
    _exec(pg_db, "UPDATE k SET id = 10, v = 'moved' WHERE id = 1", "UPDATE k SET v = 'same' WHERE id = 2")
    events = _events(run_capture(config), "public.k")
    assert [e["op"] for e in events] == ops
    for e in events:
        if e["op"] == "d":
            assert e["before"]["id"] == 1 and e["after"] is None
        elif e["op"] == "c":
            assert e["before"] is None and e["after"] == {"id": 10, "v": "moved"} and e["__old_key"] == {"id": 1}
