"""Event shape against the Debezium MySQL seed: envelope and ``source`` block per op, transaction
metadata, truncate, schema change events, and each column type's encoding per handling mode."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import Batch
from tests.integration.mysql.support import execute, pipeline, run_capture

# Debezium 3.3: SchemaFactory.sourceInfoSchemaBuilder's common fields (ts_us/ts_ns after sequence),
# then BinlogSourceInfoStructMaker's
SOURCE_FIELDS = [
    "version",
    "connector",
    "name",
    "ts_ms",
    "snapshot",
    "db",
    "sequence",
    "ts_us",
    "ts_ns",
    "table",
    "server_id",
    "gtid",
    "file",
    "pos",
    "row",
    "thread",
    "query",
]
TYPES_DDL = """CREATE TABLE v (id int PRIMARY KEY, ti tinyint, tu tinyint unsigned, t1 tinyint(1), si smallint,
    su smallint unsigned, mi mediumint, iu int unsigned, bi bigint, bu bigint unsigned, fl float, db double,
    dc decimal(12,4), dz decimal(40,10), dt date, dt3 datetime(3), dt6 datetime(6), ts timestamp(6) NULL,
    ts0 timestamp NULL, tm time, tm6 time(6), yr year, ch char(5), vc varchar(300), tx text, bn binary(4),
    vb varbinary(10), bl blob, en enum('small','medium','large'), st set('a','b','c'), b1 bit(1), b10 bit(10),
    js json, g geometry, zd date NOT NULL DEFAULT '2000-01-01', zdt datetime NULL)"""
TYPES_INSERT = """INSERT INTO v VALUES (1, -5, 250, 1, -300, 65000, -8000000, 4000000000, -9007199254740993,
    18446744073709551615, 1.5, 0.1, 12345678.9012, 123456789012345678901234567890.0123456789, '2018-06-20',
    '2018-06-20 15:13:16.945', '2018-06-20 15:13:16.945104', '2018-06-20 13:13:16.945104', '2018-06-20 13:13:16',
    '-838:59:59', '15:13:16.945104', 2024, 'ab', 'héllo wörld', 'long text', x'0102', x'ff00', x'000102',
    'medium', 'a,c', b'1', b'1010101010', '{"k": [1, 2]}', ST_GeomFromText('POINT(1 2)', 4326), '2000-01-01', NULL)"""


def _events(result, table):
    batch = Batch(result.batch_path)
    if table not in batch.tables():
        return []
    return [row for rb in batch.iter_events(table) for row in rb.to_pylist()]


@pytest.fixture
def shape(mariadb_db, tmp_path):
    execute(
        mariadb_db,
        "CREATE TABLE d (id int PRIMARY KEY, v varchar(20))",
        "CREATE TABLE e (id int PRIMARY KEY)",
        "INSERT INTO d VALUES (1, 'one')",
    )
    config = pipeline(
        mariadb_db,
        tmp_path / "staging",
        **{"skipped.operations": "none", "include.query": "true", "provide.transaction.metadata": "true"},
    )
    return config, run_capture(config)


def test_snapshot_rows_are_reads(mariadb_db, shape):
    _, first = shape
    rows = _events(first, f"{mariadb_db.name}.d")
    assert [r["op"] for r in rows] == ["r"]
    assert rows[0]["after"] == {"id": 1, "v": "one"} and rows[0]["before"] is None
    src = rows[0]["source"]
    # the pipeline says connector: mariadb -> Debezium's MariaDbConnector writes "mariadb"
    assert list(src) == SOURCE_FIELDS and src["snapshot"] == "incremental" and src["connector"] == "mariadb"
    assert src["ts_us"] // 1000 == src["ts_ms"] and src["ts_ns"] == src["ts_us"] * 1000
    assert src["gtid"] is None and src["row"] == 0 and src["file"].startswith("binlog.")


def test_ops_source_block_and_transactions(mariadb_db, shape):
    config, _ = shape
    db = mariadb_db.name
    execute(
        mariadb_db,
        "BEGIN",
        "INSERT INTO d VALUES (2, 'two'), (3, 'three')",
        "INSERT INTO e VALUES (9)",
        "COMMIT",
        "UPDATE d SET v = 'TWO' WHERE id = 2",
        "UPDATE d SET id = 4 WHERE id = 3",
        "DELETE FROM d WHERE id = 4",
        "TRUNCATE TABLE e",
        "ALTER TABLE d ADD COLUMN extra int NULL",
        "UPDATE d SET extra = 7 WHERE id = 1",
    )
    result = run_capture(config)
    d, e = _events(result, f"{db}.d"), _events(result, f"{db}.e")
    assert [x["op"] for x in d] == ["c", "c", "u", "d", "c", "d", "u"]
    assert [x["op"] for x in e] == ["c", "t"]
    ins, ins2, upd, moved_from, moved_to, delete, after_ddl = d
    assert ins["before"] is None and ins["after"] == {"id": 2, "v": "two"}
    assert upd["before"] == {"id": 2, "v": "two"} and upd["after"] == {
        "id": 2,
        "v": "TWO",
    }  # full before images
    # key change (Debezium): d of the old row, then c of the new one (before null), same source
    # block (same rows event and row), consecutive positions; the c names the old key
    assert moved_from["before"] == {"id": 3, "v": "three"} and moved_from["after"] is None
    assert moved_to["before"] is None and moved_to["after"] == {"id": 4, "v": "three"}
    assert moved_to["__old_key"] == {"id": 3} and moved_from["__old_key"] is None
    assert moved_from["source"] == moved_to["source"] and moved_to["source"]["row"] == 0
    assert moved_from["transaction"]["id"] == moved_to["transaction"]["id"]
    assert [x["transaction"]["total_order"] for x in (moved_from, moved_to)] == [1, 2]
    assert moved_from["__position"][:12] == moved_to["__position"][:12]
    assert int.from_bytes(moved_to["__position"][12:], "big") == int.from_bytes(moved_from["__position"][12:], "big") + 1
    assert delete["before"] == {"id": 4, "v": "three"} and delete["after"] is None
    assert after_ddl["after"] == {"id": 1, "v": "one", "extra": 7}  # decoded with the structure after the DDL
    src = ins["source"]
    assert list(src) == SOURCE_FIELDS
    assert (src["connector"], src["snapshot"], src["db"], src["table"], src["sequence"]) == (
        "mariadb",
        "false",
        db,
        "d",
        None,
    )
    assert src["server_id"] == 1 and src["file"].startswith("binlog.") and src["pos"] > 4
    assert src["gtid"].startswith("0-1-") and src["query"].startswith("INSERT INTO d VALUES")
    assert (ins["source"]["row"], ins2["source"]["row"]) == (0, 1) and ins["source"]["pos"] == ins2["source"][
        "pos"
    ]
    assert src["ts_ms"] % 1000 == 0 and ins["ts_us"] == ins["ts_ms"] * 1000 + ins["ts_us"] % 1000
    # source.ts_us/ts_ns: the same binlog event time (whole seconds) as ts_ms
    assert (src["ts_us"], src["ts_ns"]) == (src["ts_ms"] * 1000, src["ts_ms"] * 1_000_000)
    # TRUNCATE is a statement outside BEGIN: Debezium's source.thread comes only from a BEGIN
    # query event (none on MariaDB, whose GTID event opens the transaction) and is cleared at commit
    assert e[1]["source"]["thread"] is None and e[1]["source"]["connector"] == "mariadb"
    assert [x["source"]["thread"] for x in d] == [None] * len(d)
    # transaction metadata: id is the GTID, total order across tables, order within each table
    assert ins["transaction"] == {"id": src["gtid"], "total_order": 1, "data_collection_order": 1}
    assert ins2["transaction"]["total_order"] == 2 and e[0]["transaction"]["total_order"] == 3
    assert e[0]["transaction"]["data_collection_order"] == 1
    positions = [x["__position"] for x in d]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # schema change events: DDL with its position and the table structure after it
    changes = Batch(result.batch_path).manifest["schema_changes"]
    alter = [c for c in changes if c["ddl"].startswith("ALTER")][0]
    assert alter["databaseName"] == db and alter["source"]["pos"] > src["pos"]
    table = alter["tableChanges"][0]
    assert table["type"] == "ALTER" and table["id"] == f'"{db}"."d"'
    assert [c["name"] for c in table["table"]["columns"]] == ["id", "v", "extra"]
    assert table["table"]["primaryKeyColumnNames"] == ["id"]
    assert any(c["ddl"].startswith("TRUNCATE") for c in changes)


def test_skipped_operations_and_column_filter(mariadb_db, tmp_path):
    execute(mariadb_db, "CREATE TABLE s (id int PRIMARY KEY, keep_me int, secret varchar(10))")
    config = pipeline(
        mariadb_db,
        tmp_path / "st",
        **{"skipped.operations": "u,d", "column.exclude.list": f"{mariadb_db.name}.s.secret"},
    )
    run_capture(config)
    execute(
        mariadb_db,
        "INSERT INTO s VALUES (1, 1, 'x')",
        "UPDATE s SET keep_me = 2",
        "DELETE FROM s",
        "TRUNCATE s",
    )
    events = _events(run_capture(config), f"{mariadb_db.name}.s")
    assert [x["op"] for x in events] == ["c", "t"]  # u and d skipped; the list replaces the default "t"
    assert events[0]["after"] == {"id": 1, "keep_me": 1}


def _value_row(mariadb_db, tmp_path, name, **props):
    config = pipeline(mariadb_db, tmp_path / name, name=f"{name}_{mariadb_db.name}", **props)
    run_capture(config)
    execute(mariadb_db, TYPES_INSERT.replace("VALUES (1,", f"VALUES ({len(name)},"))
    result = run_capture(config)
    row = _events(result, f"{mariadb_db.name}.v")[-1]["after"]
    schema = pq.read_schema(Batch(result.batch_path).parts(f"{mariadb_db.name}.v")[0]).field("after").type
    meta = {schema.field(i).name: schema.field(i).metadata or {} for i in range(schema.num_fields)}
    return row, meta


def test_value_encodings_default_modes(mariadb_db, tmp_path):
    execute(mariadb_db, TYPES_DDL)
    row, meta = _value_row(mariadb_db, tmp_path, "defaults")
    expected = {
        "ti": -5,
        "tu": 250,
        "t1": 1,
        "si": -300,
        "su": 65000,
        "mi": -8000000,
        "iu": 4000000000,
        "bi": -9007199254740993,
        "bu": -1,  # bigint.unsigned.handling.mode=long wraps like Java's long
        "fl": 1.5,
        "db": 0.1,
        "dc": Decimal("12345678.9012"),
        # beyond 38 digits: Debezium's own encoding, the unscaled value's two's complement bytes
        "dz": (1234567890123456789012345678900123456789).to_bytes(17, "big", signed=True),
        "dt": 17702,
        "dt3": 1529507596945,
        "dt6": 1529507596945104,
        "ts": "2018-06-20T13:13:16.945104Z",
        "ts0": "2018-06-20T13:13:16Z",
        "tm": -3020399000000,
        "tm6": 54796945104,
        "yr": 2024,
        "ch": "ab",
        "vc": "héllo wörld",
        "tx": "long text",
        "bn": b"\x01\x02\x00\x00",
        "vb": b"\xff\x00",
        "bl": b"\x00\x01\x02",
        "en": "medium",
        "st": "a,c",
        "b1": True,
        "b10": b"\xaa\x02",
        "js": '{"k": [1, 2]}',
        "zd": 10957,
        "zdt": None,
    }
    assert {k: row[k] for k in expected} == expected
    assert row["g"]["srid"] == 4326 and row["g"]["wkb"][:5] == b"\x01\x01\x00\x00\x00"
    names = {k: m.get(b"connect.name") for k, m in meta.items()}
    assert names["dt"] == b"io.debezium.time.Date" and names["dt3"] == b"io.debezium.time.Timestamp"
    assert (
        names["dt6"] == b"io.debezium.time.MicroTimestamp"
        and names["ts"] == b"io.debezium.time.ZonedTimestamp"
    )
    assert names["tm"] == b"io.debezium.time.MicroTime" and names["yr"] == b"io.debezium.time.Year"
    assert names["dc"] == b"org.apache.kafka.connect.data.Decimal" and names["en"] == b"io.debezium.data.Enum"
    assert names["st"] == b"io.debezium.data.EnumSet" and names["b10"] == b"io.debezium.data.Bits"
    assert names["g"] == b"io.debezium.data.geometry.Geometry"
    assert json.loads(meta["en"][b"connect.parameters"]) == {"allowed": "small,medium,large"}
    assert json.loads(meta["dc"][b"connect.parameters"]) == {"scale": "4", "connect.decimal.precision": "12"}
    assert meta["t1"][b"connect.type"] == b"int16" and meta["iu"][b"connect.type"] == b"int64"
    assert meta["fl"][b"connect.type"] == b"float32" and meta["t1"][b"mysql.type"] == b"tinyint(1)"


def test_value_encodings_alternative_modes(mariadb_db, tmp_path):
    execute(mariadb_db, TYPES_DDL)
    row, meta = _value_row(
        mariadb_db,
        tmp_path,
        "modes",
        **{
            "decimal.handling.mode": "string",
            "time.precision.mode": "connect",
            "binary.handling.mode": "hex",
            "bigint.unsigned.handling.mode": "precise",
            "converters": "boolean",
            "boolean.type": "io.debezium.connector.mysql.converters.TinyIntOneToBooleanConverter",
        },
    )
    assert row["dc"] == "12345678.9012" and row["bu"] == Decimal("18446744073709551615")
    assert row["dt3"] == 1529507596945 and row["dt6"] == 1529507596945 and row["tm6"] == 54796945
    assert meta["dt6"][b"connect.name"] == b"org.apache.kafka.connect.data.Timestamp"
    assert row["vb"] == "ff00" and row["bn"] == "01020000" and row["t1"] is True


def test_snapshot_and_binlog_encode_alike(mariadb_db, tmp_path):
    execute(mariadb_db, TYPES_DDL, TYPES_INSERT)
    config = pipeline(mariadb_db, tmp_path / "alike")
    snap_row = _events(run_capture(config), f"{mariadb_db.name}.v")[0]["after"]
    execute(mariadb_db, "UPDATE v SET id = 2")
    stream_row = [e for e in _events(run_capture(config), f"{mariadb_db.name}.v") if e["op"] == "c"][0][
        "after"
    ]  # the key change's c event
    assert {**snap_row, "id": 2} == stream_row


@pytest.mark.parametrize(
    ("connector", "expected"),
    [
        ("mysql", "mysql"),  # Debezium's MySQL connector against MariaDB still says mysql
        ("io.debezium.connector.mysql.MySqlConnector", "mysql"),
        ("mariadb", "mariadb"),
        ("io.debezium.connector.mariadb.MariaDbConnector", "mariadb"),
    ],
)
def test_source_connector_follows_the_configured_connector(mariadb_db, tmp_path, connector, expected):
    execute(mariadb_db, "CREATE TABLE c (id int PRIMARY KEY)", "INSERT INTO c VALUES (1)")
    props: dict = {"connector": None, "connector.class": connector} if "." in connector else {"connector": connector}
    props["skipped.operations"] = "none"
    config = {k: v for k, v in pipeline(mariadb_db, tmp_path / "st", **props).items() if v is not None}
    snap = _events(run_capture(config), f"{mariadb_db.name}.c")
    execute(mariadb_db, "INSERT INTO c VALUES (2)", "TRUNCATE TABLE c")
    streamed = _events(run_capture(config), f"{mariadb_db.name}.c")
    assert [x["op"] for x in snap + streamed] == ["r", "c", "t"]
    assert {x["source"]["connector"] for x in snap + streamed} == {expected}
    assert streamed[1]["source"]["thread"] is None


@pytest.mark.parametrize(
    ("skipped", "ops"),
    [
        ("none", ["d", "c", "d", "c", "u"]),
        ("u", ["d", "c", "d", "c"]),  # the pair is a d and a c, not an update
        ("d", ["c", "c", "u"]),
        ("c", ["d", "d", "u"]),
    ],
)
def test_key_changes_in_one_rows_event(mariadb_db, tmp_path, skipped, ops):
    """Two rows of one rows event change their keys (and a third does not): each becomes d + c,
    ``source.row`` stays the row's index, positions number the events (unique, ordered), and
    ``skipped.operations`` applies to the d and the c as Debezium's dispatcher does."""
    execute(mariadb_db, "CREATE TABLE k (id int PRIMARY KEY, g int, v varchar(10))",
            "INSERT INTO k VALUES (1, 1, 'a'), (2, 1, 'b'), (3, 2, 'c')")
    config = pipeline(mariadb_db, tmp_path / "staging",
                      **{"skipped.operations": skipped, "provide.transaction.metadata": "true"})
    run_capture(config)
    execute(mariadb_db, "UPDATE k SET id = id + 10, v = concat(v, '!') WHERE g = 1 ORDER BY id",
            "UPDATE k SET v = 'same key' WHERE id = 3")
    events = _events(run_capture(config), f"{mariadb_db.name}.k")
    assert [e["op"] for e in events] == ops
    positions = [e["__position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    moved = [e for e in events if e["op"] in "dc"]
    assert [e["source"]["row"] for e in moved] == [row for row in (0, 1) for op in "dc" if op not in skipped]
    for e in moved:
        if e["op"] == "d":
            assert e["after"] is None and e["before"]["id"] in (1, 2) and e["__old_key"] is None
        else:
            assert e["before"] is None and e["after"]["id"] == e["__old_key"]["id"] + 10
            assert e["after"]["v"].endswith("!")
    assert [e["transaction"]["total_order"] for e in moved] == list(range(1, len(moved) + 1))
