"""Every type of the Debezium Vitess type table, from a MariaDB shard through the emulator, decoded
by the client (Assembler) and encoded Debezium's way (types.column_codec), in the binlog and in the
copy phase."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.offsets import start_vgtid
from airflow_cdc.sources.vitess.types import column_codec
from airflow_cdc.sources.vitess.window import read_window
from airflow_cdc.testing.vitess_emulator import VtgateEmulator
from tests.integration.vitess.test_emulator_events import DDL, INSERT

DAYS_2024_02_29 = 19782
# column -> (Arrow type, schema name, Debezium value from the binlog, from the copy phase)
EXPECTED = {
    "id": (pa.int64(), None, 1, 1),
    "bo": (pa.int16(), None, 1, 1),
    "ti": (pa.int16(), None, -128, -128),
    "uti": (pa.int16(), None, 255, 255),
    "si": (pa.int16(), None, -32768, -32768),
    "mi": (pa.int32(), None, -8388608, -8388608),
    "umi": (pa.int32(), None, 16777215, 16777215),
    "i": (pa.int32(), None, -2147483648, -2147483648),
    "ui": (pa.int64(), None, 4294967295, 4294967295),
    "bi": (pa.int64(), None, -9223372036854775808, -9223372036854775808),
    "ubi": (pa.string(), None, "18446744073709551615", "18446744073709551615"),
    "re": (pa.float64(), None, 3.14159, 3.14159),
    "fl": (pa.float64(), None, 1.5, 1.5),
    "db": (pa.float64(), None, -2.5e-10, -2.5e-10),
    "ch": (pa.string(), None, "abc", "abc"),
    "vc": (pa.string(), None, "h\u00e9llo \u2603", "h\u00e9llo \u2603"),
    "bn": (pa.binary(), None, b"ab\x00\x00", b"ab\x00\x00"),
    "vb": (pa.binary(), None, b"\x00\xff\x10", b"\x00\xff\x10"),
    # strings, as Debezium's Vitess connector resolves them by column_type (DBZ-6748, DBZ-8679)
    "cbin": (pa.string(), None, "B\u00efn", "B\u00efn"),
    "tbin": (pa.string(), None, "t\u00e9xt", "t\u00e9xt"),
    "tb": (pa.binary(), None, b"\x01", b"\x01"),
    "tt": (pa.string(), None, "tiny", "tiny"),
    "bl": (pa.binary(), None, b"\x02\x03", b"\x02\x03"),
    "tx": (pa.string(), None, "text", "text"),
    "mb": (pa.binary(), None, b"\x04", b"\x04"),
    "mt": (pa.string(), None, "medium", "medium"),
    "lb": (pa.binary(), None, b"\x05", b"\x05"),
    "lt": (pa.string(), None, "long", "long"),
    "js": (pa.string(), "io.debezium.data.Json", '{"a": [1, 2]}', '{"a": [1, 2]}'),
    "en": (pa.string(), "io.debezium.data.Enum", "y", "y"),
    "st": (pa.string(), "io.debezium.data.EnumSet", "a,c", "a,c"),
    "yr": (pa.int32(), "io.debezium.time.Year", 2024, 2024),
    "ts": (
        pa.string(),
        "io.debezium.time.ZonedTimestamp",
        "2024-01-02T03:04:05.123456Z",
        "2024-01-02T03:04:05.123456Z",
    ),
    "dec": (pa.string(), None, "-12.345", "-12.345"),
    "num": (pa.string(), None, "42", "42"),
    "dt": (pa.int32(), "io.debezium.time.Date", DAYS_2024_02_29, DAYS_2024_02_29),
    "tm": (pa.int64(), "io.debezium.time.MicroTime", -45296500000, -45296500000),
    "dtm": (pa.int64(), "io.debezium.time.Timestamp", 946684799000, 946684799000),
    "dtm3": (pa.int64(), "io.debezium.time.Timestamp", 1704164645120, 1704164645120),
}


@pytest.fixture
def typed(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, [DDL])
    return keyspace


def _client(vtgate, keyspace) -> VtgateClient:
    host, port = vtgate.address.split(":")
    return VtgateClient(
        vitess_config({"name": "v", "staging.path": "/x", "vitess.keyspace": keyspace,
                       "database.hostname": host, "database.port": int(port)})
    )  # fmt: skip


def test_debezium_encoding_per_type(vtgate, typed):
    vtgate.execute(typed, INSERT)
    client = _client(vtgate, typed)
    try:
        copy = read_window(client, start_vgtid(typed, None, ""), client.current_vgtid(typed), None, 100, 10)
        start = client.current_vgtid(typed)
        vtgate.execute(typed, "UPDATE alltypes SET id = 2")
        stream = read_window(client, start, client.current_vgtid(typed), None, 100, 10)
    finally:
        client.close()
    copied = next(t for t in copy.transactions if t.kind == "copy").changes[0]
    updated = next(t for t in stream.transactions if t.changes).changes[0]
    assert copied.op == "r" and updated.op == "u"
    described = {f.name: f for f in stream.tables[f"{typed}.alltypes"].fields}
    assert [f.name for f in copy.tables[f"{typed}.alltypes"].fields] == list(described)
    for name, (arrow, schema, from_binlog, from_copy) in EXPECTED.items():
        codec = column_codec(described[name], "alltypes")
        assert (codec.arrow_type, codec.schema_name) == (arrow, schema), name
        assert codec.convert(copied.after[name]) == from_copy, name
        expected_binlog = 2 if name == "id" else from_binlog
        assert codec.convert(updated.after[name]) == expected_binlog, name
        assert codec.convert(updated.before[name]) == from_binlog, name
    assert column_codec(described["en"], "alltypes").parameters == {"allowed": "x,y,z"}
    for name in ("b1", "b10"):
        with pytest.raises(UnsupportedType, match=f"alltypes.{name}"):
            column_codec(described[name], "alltypes")
        assert column_codec(described[name], "alltypes", include_unknown=True).convert(copied.after[name])


def test_enum_and_set_indexes_of_a_pre_v20_tablet_are_labels(shard_servers, keyspace, tmp_path):
    """vttablet before v20 streamed ENUM values as their index and SET values as a bit mask (as
    text) and sent FIELD events without ``enum_set_string_values``; copied rows came as labels.
    Issue 32 item 5: the index was staged as the value ("2" for 'y')."""
    from tests.integration.vitess.capture_support import vitess_props
    from tests.support.pipeline import run_capture

    ddl = "CREATE TABLE e (id BIGINT PRIMARY KEY, en ENUM('x','y','z','10'), st SET('a','b','c'))"
    with VtgateEmulator(copy_chunk_rows=4, enum_set_string_values=False) as old:
        old.add_keyspace(keyspace, {"0": shard_servers[0]}, [ddl])
        old.execute(keyspace, "INSERT INTO e VALUES (1, 'y', 'a,c')")
        props = vitess_props(old, keyspace, tmp_path)
        assert run_capture(props).snapshot_rows == 1
        old.execute(keyspace, "INSERT INTO e VALUES (2, 'z', 'b')")
        old.execute(keyspace, "UPDATE e SET en = '10', st = '' WHERE id = 1")
        old.execute(keyspace, "INSERT INTO e VALUES (3, NULL, 'a,b,c')")
        assert run_capture(props).events == 3
    rows = [
        (r["op"], r["after"]["id"], r["after"]["en"], r["after"]["st"])
        for batch in list_batches(props["staging.path"], props["name"])
        for rb in batch.iter_events(f"{keyspace}.e")
        for r in rb.to_pylist()
    ]
    assert rows == [
        ("r", 1, "y", "a,c"), ("c", 2, "z", "b"), ("u", 1, "10", ""), ("c", 3, None, "a,b,c")
    ]  # fmt: skip
