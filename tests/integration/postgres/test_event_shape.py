"""Event shape: envelope, source block, replica identity effects, TOAST placeholder, transaction
metadata, truncate and logical messages, and encoded values, as the Debezium seed documents."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import Batch
from tests.integration.postgres.support import every_version, pipeline, run_capture

SOURCE_FIELDS = ["version", "connector", "name", "ts_ms", "ts_us", "ts_ns", "snapshot", "db", "sequence",
                 "schema", "table", "txId", "lsn", "xmin", "origin", "origin_lsn"]  # Debezium 3.6 (test_origin.py)


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
    # transaction metadata: id "txId:<the event's own LSN>", total order across tables, order within the table
    assert insert["transaction"]["id"] == f"{src['txId']}:{src['lsn']}"
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


@every_version
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


# -- Debezium 3.3 details checked against its source (PostgresStreamingChangeEventSource, SourceInfo,
# PostgresTransactionMonitor, PostgresChangeRecordEmitter, PostgresValueConverter) ----------------

def _commit_ends(db, slot):
    """The end LSN of every commit and the LSN of every non-transactional message, as the server's
    own test_decoding plugin reports them (an oracle independent of pgoutput and of our decoder)."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)",
                            (slot,)).fetchall()
    return [lsn for lsn, data in rows if data.startswith("COMMIT") or data.startswith("message: transactional: 0")]


def test_sequence_transaction_id_and_non_transactional_message(pg_db, shape):
    config, _ = shape
    _exec(pg_db, "SELECT pg_create_logical_replication_slot('oracle_td', 'test_decoding')")
    try:
        _exec(pg_db, "BEGIN; INSERT INTO d VALUES (10, 'a', NULL); INSERT INTO f VALUES (10, 'a'); "
                     "INSERT INTO d VALUES (11, 'b', NULL); COMMIT",
              "UPDATE d SET v = 'B' WHERE id = 11",
              "SELECT pg_logical_emit_message(false, 'nontx', 'x')",
              "DELETE FROM d WHERE id = 10")
        first = run_capture(config)
        _exec(pg_db, "INSERT INTO d VALUES (12, 'c', NULL)")
        second = run_capture(config)
        ends = _commit_ends(pg_db, "oracle_td")
    finally:
        _exec(pg_db, "SELECT pg_drop_replication_slot('oracle_td')")
    d, f = _events(first, "public.d"), _events(first, "public.f")
    ins10, ins11, upd, dele = d
    (later,) = _events(second, "public.d")
    msg = [r for rb in Batch(first.batch_path).iter_messages() for r in rb.to_pylist()][0]
    txn1_end, txn2_end, msg_lsn, txn3_end, txn4_end = ends

    def seq(e):
        return json.loads(e["source"]["sequence"])

    # no commit seen yet since the snapshot: null (JSON null, not ""), then the event's own LSN
    assert seq(ins10) == [None, str(ins10["source"]["lsn"])] and seq(f[0])[0] is None
    assert ins10["source"]["sequence"] == f'[null,"{ins10["source"]["lsn"]}"]'
    # later events: the end LSN of the previous commit (what Debezium's stream reports for Commit)
    assert seq(upd) == [str(txn1_end), str(upd["source"]["lsn"])]
    # a non-transactional message counts as a commit at its own LSN, before its event is built
    assert msg["source"]["lsn"] == msg_lsn and seq(msg) == [str(msg_lsn), str(msg_lsn)]
    assert seq(dele) == [str(msg_lsn), str(dele["source"]["lsn"])]
    # carried across runs through the stored offset
    assert seq(later) == [str(txn3_end), str(later["source"]["lsn"])]
    assert txn4_end > later["source"]["lsn"]
    # transaction.id = "<txId>:<the event's own LSN>": varies within a transaction
    for e in d + f + [later]:
        assert e["transaction"]["id"] == f"{e['source']['txId']}:{e['source']['lsn']}"
    assert ins10["transaction"]["id"] != ins11["transaction"]["id"]
    assert [e["transaction"]["total_order"] for e in (ins10, f[0], ins11)] == [1, 2, 3]
    assert [e["transaction"]["data_collection_order"] for e in (ins10, f[0], ins11)] == [1, 1, 2]
    # pgoutput has no time for a non-transactional message: the source keeps the previous
    # transaction's commit time (Debezium's SourceInfo ignores a null commit time); no txId
    assert msg["source"]["ts_us"] == upd["source"]["ts_us"] and msg["source"]["txId"] is None
    assert msg["source"]["ts_ms"] == upd["source"]["ts_ms"] and msg["transaction"] is None
    assert msg["ts_ms"] >= msg["source"]["ts_ms"]


def test_replica_identity_full_fills_unchanged_toast_from_the_old_image(pg_db, tmp_path):
    big = "".join(f"{i:08x}" for i in range(3000))  # 24 kB: stored out of line (TOAST)
    _exec(pg_db, "CREATE TABLE ft (id int PRIMARY KEY, v text, big text, nb bytea)",
          "ALTER TABLE ft REPLICA IDENTITY FULL",
          "CREATE TABLE dt (id int PRIMARY KEY, v text, big text)")
    config = pipeline(pg_db, tmp_path / "staging", **{"skipped.operations": "none"})
    run_capture(config)
    _exec(pg_db, f"INSERT INTO ft VALUES (1, 'one', '{big}', decode(repeat('ab', 20000), 'hex'))",
          f"INSERT INTO dt VALUES (1, 'one', '{big}')",
          "UPDATE ft SET v = 'ONE' WHERE id = 1", "UPDATE dt SET v = 'ONE' WHERE id = 1",
          "UPDATE ft SET id = 2 WHERE id = 1",  # key change, TOASTed columns unchanged
          "DELETE FROM ft WHERE id = 2")
    result = run_capture(config)
    ft, dt = _events(result, "public.ft"), _events(result, "public.dt")
    update = [e for e in ft if e["op"] == "u" and e["after"]["id"] == 1][0]
    assert update["before"]["big"] == big and update["after"]["big"] == big
    assert update["after"]["nb"] == bytes.fromhex("ab" * 20000) and update["__unavailable"] is None
    moved = [e for e in ft if e["after"] is not None and e["after"]["id"] == 2][0]
    assert moved["after"]["big"] == big and moved["__unavailable"] is None
    delete = [e for e in ft if e["op"] == "d"][-1]
    assert delete["before"] == {"id": 2, "v": "ONE", "big": big, "nb": bytes.fromhex("ab" * 20000)}
    # REPLICA IDENTITY DEFAULT has no old image: the placeholder stays, and is listed
    dt_update = [e for e in dt if e["op"] == "u"][0]
    assert dt_update["after"]["big"] == "__debezium_unavailable_value"
    assert dt_update["__unavailable"] == ["big"]


@pytest.mark.parametrize("txn_metadata", ["true", "false"])  # pure-Python and compiled decoders
def test_multidimensional_arrays_do_not_stop_capture(pg_db, tmp_path, txn_metadata):
    _exec(pg_db, "CREATE TABLE ma (id int PRIMARY KEY, i int[], t text[], n numeric(5,1)[])",
          "INSERT INTO ma VALUES (1, '{{1,2},{3,4}}', '{{a,\"b}\"},{NULL,d}}', '{1.5}')")
    config = pipeline(pg_db, tmp_path / "staging", **{"provide.transaction.metadata": txn_metadata})
    snap = _events(run_capture(config), "public.ma")
    _exec(pg_db, "INSERT INTO ma VALUES (2, '[0:2][1:1]={{1},{2},{3}}', '{x}', '{{{1}},{{2}}}')",
          "INSERT INTO ma VALUES (3, '{7}', NULL, '{}')")
    streamed = _events(run_capture(config), "public.ma")
    # Debezium: one null element per sub-array (its element converter cannot take a Java array)
    assert [e["after"] for e in snap] == [{"id": 1, "i": [None, None], "t": [None, None], "n": [Decimal("1.5")]}]
    assert [e["after"] for e in streamed] == [
        {"id": 2, "i": [None, None, None], "t": ["x"], "n": [None, None]},
        {"id": 3, "i": [7], "t": None, "n": []},
    ]
    # the same sequence on either decoder: null before the first commit, then its end LSN
    first, second = (json.loads(e["source"]["sequence"]) for e in streamed)
    assert first == [None, str(streamed[0]["source"]["lsn"])]
    assert streamed[0]["source"]["lsn"] < int(second[0]) <= streamed[1]["source"]["lsn"]


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
