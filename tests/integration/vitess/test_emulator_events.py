"""The emulator's change events, drained by a raw grpcio client: FIELD types and ROW values for every
type of the Debezium Vitess type table, per op, in the binlog and in the copy phase; whole
transactions; VGTID progression; DDL/OTHER; heartbeats."""

from __future__ import annotations

import pytest

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from tests.integration.vitess.support import Drain, kinds, last_vgtid, request, rows_of, transactions

# (column, DDL type, inserted SQL literal, Vitess type, text from the binlog, text from a SELECT)
TYPES = [
    ("id", "BIGINT NOT NULL PRIMARY KEY", "1", q.INT64, b"1", b"1"),
    ("bo", "BOOLEAN", "TRUE", q.INT8, b"1", b"1"),
    ("ti", "TINYINT", "-128", q.INT8, b"-128", b"-128"),
    ("uti", "TINYINT UNSIGNED", "255", q.UINT8, b"255", b"255"),
    ("si", "SMALLINT", "-32768", q.INT16, b"-32768", b"-32768"),
    ("mi", "MEDIUMINT", "-8388608", q.INT24, b"-8388608", b"-8388608"),
    ("umi", "MEDIUMINT UNSIGNED", "16777215", q.UINT24, b"16777215", b"16777215"),
    ("i", "INT", "-2147483648", q.INT32, b"-2147483648", b"-2147483648"),
    ("ui", "INT UNSIGNED", "4294967295", q.UINT32, b"4294967295", b"4294967295"),
    ("bi", "BIGINT", "-9223372036854775808", q.INT64, b"-9223372036854775808", b"-9223372036854775808"),
    ("ubi", "BIGINT UNSIGNED", "18446744073709551615", q.UINT64, b"18446744073709551615", b"18446744073709551615"),
    ("re", "REAL", "3.14159", q.FLOAT64, b"3.14159E+00", b"3.14159"),
    ("fl", "FLOAT", "1.5", q.FLOAT32, b"1.5E+00", b"1.5"),
    # a SELECT gives the server's own text: MariaDB prints -0.00000000025 where MySQL 8 prints -2.5e-10
    ("db", "DOUBLE", "-2.5e-10", q.FLOAT64, b"-2.5E-10", b"-0.00000000025"),
    ("ch", "CHAR(5)", "'abc'", q.CHAR, b"abc", b"abc"),
    ("vc", "VARCHAR(20)", "'h\u00e9llo \u2603'", q.VARCHAR, "h\u00e9llo \u2603".encode(), "h\u00e9llo \u2603".encode()),
    ("bn", "BINARY(4)", "X'6162'", q.BINARY, b"ab\x00\x00", b"ab\x00\x00"),
    ("vb", "VARBINARY(8)", "X'00ff10'", q.VARBINARY, b"\x00\xff\x10", b"\x00\xff\x10"),
    # a binary collation sets MySQL's BINARY flag: Vitess sends VARBINARY/BLOB, column_type varchar/text
    ("cbin", "VARCHAR(10) COLLATE utf8mb4_bin", "'B\u00efn'", q.VARBINARY, "B\u00efn".encode(), "B\u00efn".encode()),
    ("tbin", "TEXT COLLATE utf8mb4_bin", "'t\u00e9xt'", q.BLOB, "t\u00e9xt".encode(), "t\u00e9xt".encode()),
    ("tb", "TINYBLOB", "X'01'", q.BLOB, b"\x01", b"\x01"),
    ("tt", "TINYTEXT", "'tiny'", q.TEXT, b"tiny", b"tiny"),
    ("bl", "BLOB", "X'0203'", q.BLOB, b"\x02\x03", b"\x02\x03"),
    ("tx", "TEXT", "'text'", q.TEXT, b"text", b"text"),
    ("mb", "MEDIUMBLOB", "X'04'", q.BLOB, b"\x04", b"\x04"),
    ("mt", "MEDIUMTEXT", "'medium'", q.TEXT, b"medium", b"medium"),
    ("lb", "LONGBLOB", "X'05'", q.BLOB, b"\x05", b"\x05"),
    ("lt", "LONGTEXT", "'long'", q.TEXT, b"long", b"long"),
    ("js", "JSON", "'{\"a\": [1, 2]}'", q.JSON, b'{"a": [1, 2]}', b'{"a": [1, 2]}'),
    ("en", "ENUM('x','y','z')", "'y'", q.ENUM, b"y", b"y"),
    ("st", "SET('a','b','c')", "'a,c'", q.SET, b"a,c", b"a,c"),
    ("yr", "YEAR", "2024", q.YEAR, b"2024", b"2024"),
    ("ts", "TIMESTAMP(6) NULL", "'2024-01-02 03:04:05.123456'", q.TIMESTAMP,
     b"2024-01-02 03:04:05.123456", b"2024-01-02 03:04:05.123456"),
    ("dec", "DECIMAL(10,3)", "-12.345", q.DECIMAL, b"-12.345", b"-12.345"),
    ("num", "NUMERIC(5,0)", "42", q.DECIMAL, b"42", b"42"),
    ("dt", "DATE", "'2024-02-29'", q.DATE, b"2024-02-29", b"2024-02-29"),
    ("tm", "TIME(6)", "'-12:34:56.5'", q.TIME, b"-12:34:56.500000", b"-12:34:56.500000"),
    ("dtm", "DATETIME", "'1999-12-31 23:59:59'", q.DATETIME, b"1999-12-31 23:59:59", b"1999-12-31 23:59:59"),
    ("dtm3", "DATETIME(3)", "'2024-01-02 03:04:05.120'", q.DATETIME,
     b"2024-01-02 03:04:05.120", b"2024-01-02 03:04:05.120"),
    ("b1", "BIT(1)", "b'1'", q.BIT, b"\x01", b"\x01"),
    ("b10", "BIT(10)", "b'1000000001'", q.BIT, b"\x02\x01", b"\x02\x01"),
]  # fmt: skip
DDL = "CREATE TABLE alltypes (" + ", ".join(f"`{c}` {t}" for c, t, *_ in TYPES) + ")"
INSERT = "INSERT INTO alltypes VALUES (" + ", ".join(v for _, _, v, *_ in TYPES) + ")"


@pytest.fixture
def typed(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, [DDL])
    return keyspace


def test_field_and_row_encoding_per_type_in_the_binlog(vtgate, typed):
    with Drain(vtgate.address, request(typed)) as drain:
        drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        vtgate.execute(typed, INSERT)
        vtgate.execute(typed, "UPDATE alltypes SET vc = NULL, ti = 5 WHERE id = 1")
        vtgate.execute(typed, "DELETE FROM alltypes WHERE id = 1")
        events = drain.until(lambda ev: len(rows_of(ev)) >= 3)
    fields = [e.field_event for e in events if e.type == b.FIELD]
    assert len(fields) == 1 and fields[0].table_name == f"{typed}.alltypes"
    assert (fields[0].keyspace, fields[0].shard) == (typed, "0")
    assert [(f.name, f.type) for f in fields[0].fields] == [(c, t) for c, _, _, t, _, _ in TYPES]
    by_name = {f.name: f for f in fields[0].fields}
    assert by_name["id"].flags & q.PRI_KEY_FLAG and by_name["id"].flags & q.NOT_NULL_FLAG
    assert by_name["ubi"].flags & q.UNSIGNED_FLAG and by_name["en"].column_type == "enum('x','y','z')"
    assert by_name["bn"].charset == 63 and by_name["vc"].database == f"vt_{typed}"
    (ins_before, ins_after), (up_before, up_after), (del_before, del_after) = rows_of(events)
    expected = [binlog for *_, binlog, _ in TYPES]
    assert ins_before is None and ins_after == expected
    assert up_before == expected
    changed = dict(zip([c for c, *_ in TYPES], up_after, strict=True))
    assert changed["vc"] is None and changed["ti"] == b"5"
    assert del_after is None and del_before == up_after


def test_null_row_and_copy_phase_values(vtgate, typed):
    vtgate.execute(typed, INSERT)
    vtgate.execute(typed, "INSERT INTO alltypes (id) VALUES (2)")
    with Drain(vtgate.address, request(typed, gtid="")) as drain:
        events = drain.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
    rows = rows_of(events, f"{typed}.alltypes")
    assert [before for before, _ in rows] == [None, None]
    assert rows[0][1] == [select for *_, select in TYPES]
    nulls = dict(zip([c for c, *_ in TYPES], rows[1][1], strict=True))
    assert nulls.pop("id") == b"2"
    assert nulls.pop("bo") is None and set(nulls.values()) == {None}


def test_whole_transactions_and_vgtid_progression(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-": shard_servers[0]}, ["CREATE TABLE t (id INT PRIMARY KEY, v INT)"])
    shard = vtgate.route(keyspace)
    with Drain(vtgate.address, request(keyspace)) as drain:
        first = drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        assert kinds(first)[:2] == ["VGTID", "OTHER"]
        start = shard.parse(last_vgtid(first).shard_gtids[0].gtid)
        conn = shard.server.connect(database=shard.database)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, i) for i in range(5)])
        conn.commit()
        vtgate.execute(keyspace, "UPDATE t SET v = v + 1")
        events = drain.until(lambda ev: len(rows_of(ev)) >= 10)
    mine = [t for t in transactions(events) if any(e.type == b.ROW for e in t)]
    assert [len(rows_of(t)) for t in mine] == [5, 5]
    for txn in mine:
        assert kinds(txn)[0] == "BEGIN" and kinds(txn)[-2:] == ["VGTID", "COMMIT"]
    positions = [shard.parse(e.vgtid.shard_gtids[0].gtid) for e in events if e.type == b.VGTID]
    assert positions == sorted(positions) and positions[-1] > start
    assert shard.parse(mine[-1][-2].vgtid.shard_gtids[0].gtid) == shard.seq()
    assert [(g.keyspace, g.shard) for g in mine[-1][-2].vgtid.shard_gtids] == [(keyspace, "-")]


def test_ddl_and_a_new_field_event(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-": shard_servers[0]}, ["CREATE TABLE t (id INT PRIMARY KEY)"])
    with Drain(vtgate.address, request(keyspace)) as drain:
        drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        vtgate.execute(keyspace, "INSERT INTO t VALUES (1)")
        vtgate.execute(keyspace, "ALTER TABLE t ADD COLUMN note VARCHAR(10)")
        vtgate.execute(keyspace, "INSERT INTO t VALUES (2, 'x')")
        events = drain.until(lambda ev: len(rows_of(ev)) >= 2)
    ddl = [e for e in events if e.type == b.DDL]
    assert len(ddl) == 1 and ddl[0].statement.startswith("ALTER TABLE t ADD COLUMN")
    assert kinds(events)[kinds(events).index("DDL") - 1] == "VGTID"
    fields = [[f.name for f in e.field_event.fields] for e in events if e.type == b.FIELD]
    assert fields == [["id"], ["id", "note"]]
    assert rows_of(events)[1][1] == [b"2", b"x"]


def test_heartbeats_when_idle(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"-": shard_servers[0]}, ["CREATE TABLE t (id INT PRIMARY KEY)"])
    with Drain(vtgate.address, request(keyspace, heartbeat_interval=1)) as drain:
        events = drain.until(lambda ev: b.HEARTBEAT in [e.type for e in ev], timeout=10)
    beat = [e for e in events if e.type == b.HEARTBEAT][0]
    assert beat.current_time > 0 and abs(beat.current_time // 10**9 - beat.timestamp) <= 1
