"""Kafka Connect JsonConverter rendering of codec output (schemas and payload values)."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_cdc.core.connect_json import connect_schema, decimal_unscaled, java_bigint_bytes, to_connect_json
from airflow_cdc.sources.postgres.types import HandlingModes, PgTypeInfo, column_codec

NUMERIC_10_2 = ((10 << 16) | 2) + 4


def field(
    typname: str, typmod: int = -1, modes: HandlingModes | None = None, name: str = "c", **kw
) -> pa.Field:
    return column_codec(name, PgTypeInfo(1, typname, **kw), typmod, modes or HandlingModes()).field


def rendered(typname: str, texts: list, typmod: int = -1, modes: HandlingModes | None = None, **kw) -> list:
    c = column_codec("c", PgTypeInfo(1, typname, **kw), typmod, modes or HandlingModes())
    return [to_connect_json(v, c.field) for v in c.convert(pa.array(texts, pa.string())).to_pylist()]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "00"),
        (127, "7f"),
        (128, "0080"),
        (-128, "80"),
        (-129, "ff7f"),
        (-1, "ff"),
        (110, "6e"),
        (222222, "03640e"),
    ],
)
def test_java_bigint_bytes(value, expected):
    assert java_bigint_bytes(value).hex() == expected


def test_decimal_unscaled_is_exact_beyond_context_precision():
    assert (
        decimal_unscaled(Decimal("12345678901234567890123456789012345.678"), 3)
        == 12345678901234567890123456789012345678
    )
    assert decimal_unscaled(Decimal("-1.10"), 2) == -110
    assert decimal_unscaled(Decimal("12300"), -2) == 123


def test_schema_fragments_in_json_converter_key_order():
    date = connect_schema(field("date", name="d"))
    assert json.dumps(date) == (
        '{"type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1, "field": "d"}'
    )
    price = connect_schema(field("numeric", NUMERIC_10_2, name="price"))
    assert json.dumps(price) == (
        '{"type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal", "version": 1, '
        '"parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"}'
    )
    assert connect_schema(field("float8")) == {"type": "double", "optional": True, "field": "c"}
    assert connect_schema(field("float4")) == {"type": "float", "optional": True, "field": "c"}
    assert connect_schema(field("int2"), include_name=False) == {"type": "int16", "optional": True}
    bits = connect_schema(field("bit", 3))
    assert bits["parameters"] == {"length": "3"} and bits["name"] == "io.debezium.data.Bits"


def test_struct_array_and_map_schemas():
    vsd = connect_schema(field("numeric"))
    assert vsd == {
        "type": "struct",
        "fields": [
            {"type": "int32", "optional": False, "field": "scale"},
            {"type": "bytes", "optional": False, "field": "value"},
        ],
        "optional": True,
        "name": "io.debezium.data.VariableScaleDecimal",
        "version": 1,
        "doc": "Variable scaled decimal",
        "field": "c",
    }
    point = connect_schema(field("point"))
    assert [(f["field"], f["type"], f["optional"]) for f in point["fields"]] == [
        ("x", "double", False),
        ("y", "double", False),
        ("wkb", "bytes", True),
        ("srid", "int32", True),
    ]
    assert point["doc"] == "Geometry (POINT)"
    ints = connect_schema(field("_int4", element=PgTypeInfo(23, "int4")))
    assert ints == {
        "type": "array",
        "items": {"type": "int32", "optional": True},
        "optional": True,
        "field": "c",
    }
    dates = connect_schema(field("_date", element=PgTypeInfo(1082, "date")))
    assert dates["items"] == {
        "type": "int32",
        "optional": True,
        "name": "io.debezium.time.Date",
        "version": 1,
    }
    hstore = connect_schema(field("hstore", modes=HandlingModes(hstore="map")))
    assert hstore == {
        "type": "map",
        "keys": {"type": "string", "optional": False},
        "values": {"type": "string", "optional": True},
        "optional": True,
        "field": "c",
    }


def test_decimal_values_are_base64_unscaled_bytes():
    assert rendered("numeric", ["1.10", "-1234.11", None], NUMERIC_10_2) == ["bg==", "/h3t", None]
    assert rendered("money", ["$1,234.11"]) == ["AeIT"]  # 123411 = 01 e2 13
    # VariableScaleDecimal: 22.2222 -> scale 4, unscaled 222222 = 03 64 0e (Debezium test value)
    assert rendered("numeric", ["22.2222"]) == [{"scale": 4, "value": "A2QO"}]
    assert rendered("numeric", ["1.10"], modes=HandlingModes(decimal="string")) == ["1.10"]


def test_seed_examples():
    # "2018-06-20 15:13:16.945104" TIMESTAMP -> MicroTimestamp 1529507596945104
    assert rendered("timestamp", ["2018-06-20 15:13:16.945104"]) == [1529507596945104]
    as_string = HandlingModes(interval="string")
    assert rendered("interval", ["1 year 2 mons 3 days 04:05:06.78"], modes=as_string) == [
        "P1Y2M3DT4H5M6.78S"
    ]
    # HSTORE: {"key" : "val"} in both modes
    assert rendered("hstore", ['"key"=>"val"']) == ['{"key":"val"}']
    assert rendered("hstore", ['"key"=>"val"'], modes=HandlingModes(hstore="map")) == [{"key": "val"}]
    iso = HandlingModes(time_precision="isostring")
    assert rendered("date", ["2017-09-15"], modes=iso) == ["2017-09-15Z"]
    assert rendered("time", ["04:05:11.789"], modes=iso) == ["04:05:11.789Z"]


def test_bytes_floats_structs_and_arrays():
    assert rendered("bytea", ["\\x010203"]) == ["AQID"]
    assert rendered("bit", ["000000110000001000000001"], 24) == ["AQID"]
    assert rendered("float8", ["NaN", "Infinity", "-Infinity", "4.44"]) == [
        "NaN",
        "Infinity",
        "-Infinity",
        4.44,
    ]
    assert rendered("float4", ["3.3", "1e-07"]) == [3.3, 1e-07]
    assert rendered("point", ["(1,1)"]) == [
        {"x": 1.0, "y": 1.0, "wkb": "AQEAAAAAAAAAAADwPwAAAAAAAPA/", "srid": None}
    ]
    assert rendered("_numeric", ["{1.20,NULL}"], NUMERIC_10_2, element=PgTypeInfo(1700, "numeric")) == [
        ["eA==", None]
    ]
    assert rendered("_bytea", ['{"\\\\x01"}'], element=PgTypeInfo(17, "bytea")) == [["AQ=="]]
    assert rendered("sparsevec", ["{1:1.5,3:2}/5"]) == [{"dimensions": 5, "vector": [[1, 1.5], [3, 2.0]]}]
    assert rendered("int4", ["7", None]) == [7, None]
    assert rendered("bool", ["t"]) == [True]


def test_values_render_to_valid_json():
    out = rendered("float8", ["NaN"]) + rendered("hstore", ['"a"=>NULL'], modes=HandlingModes(hstore="map"))
    assert json.loads(json.dumps(out, allow_nan=False)) == ["NaN", {"a": None}]
    assert not any(isinstance(v, float) and math.isnan(v) for v in out)


def test_fields_without_connect_metadata_are_inferred():
    plain = pa.field("n", pa.list_(pa.int64()), nullable=False)
    assert connect_schema(plain) == {
        "type": "array",
        "items": {"type": "int64", "optional": True},
        "optional": False,
        "field": "n",
    }
    assert to_connect_json([1, 2], plain) == [1, 2]
    with pytest.raises(ValueError, match="no Kafka Connect type"):
        connect_schema(pa.field("t", pa.timestamp("us")))


def test_float32_values_are_javas_float_to_string_numbers():
    # Float.MAX_VALUE used to raise OverflowError; MIN_VALUE rendered as 1e-45 (Java: 1.4E-45)
    assert rendered("float4", ["3.4028235e38", "-3.4028235e38", "1.4e-45", "1.17549435e-38"]) == [
        3.4028235e38,
        -3.4028235e38,
        1.4e-45,
        1.1754944e-38,
    ]
    out = rendered("float4", ["-0", "NaN", "Infinity", "-Infinity", "1e7", "0.0001"])
    assert json.dumps(out) == '[-0.0, "NaN", "Infinity", "-Infinity", 10000000.0, 0.0001]'
    assert rendered("float8", ["4.9e-324"]) == [5e-324]  # doubles: Python's float is that number
