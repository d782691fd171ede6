"""``bigint.unsigned.handling.mode`` on Vitess: Debezium's Vitess connector's three encodings of
BIGINT UNSIGNED (``string`` the default, ``long``, ``precise``) and its refusal of bad values."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pytest

from airflow_cdc.core.errors import ConfigError, SchemaError
from airflow_cdc.sources.postgres.types_base import META_NAME, META_PARAMS, META_TYPE
from airflow_cdc.sources.vitess.config import vitess_config
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.tables import TableState

BASE = {"name": "v", "staging.path": "/tmp/x", "vitess.keyspace": "ks"}
MAX = 2**64 - 1
VALUES = [0, 2**63 - 1, 2**63, MAX, None]
FIELDS = [
    q.Field(name="id", type=q.INT64, flags=2, column_type="bigint"),
    q.Field(name="u", type=q.UINT64, flags=32, column_type="bigint unsigned"),
]


def _codec(**props):
    state = TableState.build("ks.t", FIELDS, vitess_config({**BASE, **props}), lambda *_: True, None)
    return state.codecs[1]


def test_string_is_the_default_and_exact():
    codec = _codec()
    assert codec.field.type == pa.string() and codec.field.metadata[META_TYPE] == b"string"
    assert codec.convert_values(VALUES).to_pylist() == ["0", str(2**63 - 1), str(2**63), str(MAX), None]


def test_precise_is_a_connect_decimal_of_scale_0():
    codec = _codec(**{"bigint.unsigned.handling.mode": "precise"})
    meta = codec.field.metadata
    assert codec.field.type == pa.decimal128(20, 0)
    assert (meta[META_TYPE], meta[META_NAME]) == (b"bytes", b"org.apache.kafka.connect.data.Decimal")
    assert json.loads(meta[META_PARAMS]) == {"scale": "0"}  # Debezium's Decimal.builder(0)
    got = codec.convert_values(VALUES).to_pylist()
    assert got == [Decimal(0), Decimal(2**63 - 1), Decimal(2**63), Decimal("18446744073709551615"), None]


def test_long_is_int64_up_to_2_63_minus_1():
    codec = _codec(**{"bigint.unsigned.handling.mode": "LONG"})
    assert codec.field.type == pa.int64() and codec.field.metadata[META_TYPE] == b"int64"
    assert codec.convert_values([0, 2**63 - 1, None]).to_pylist() == [0, 2**63 - 1, None]


@pytest.mark.parametrize("value", [2**63, MAX])
def test_long_refuses_what_a_java_long_cannot_hold(value):
    """Debezium's Vitess connector parses the text with Long.valueOf and fails: no wrapped
    negative number, no NULL; the error names the column and the modes that hold it."""
    codec = _codec(**{"bigint.unsigned.handling.mode": "long"})
    with pytest.raises(SchemaError, match=r"column ks\.t\.u: .*above 2\^63-1.*=long") as err:
        codec.convert_values([1, value])
    assert "precise" in err.value.hint and "string" in err.value.hint
    assert str(value) not in str(err.value), "row values stay out of error messages"


@pytest.mark.parametrize("bad", ["double", "", "int64"])
def test_bad_values_name_the_property_and_the_allowed_values(bad):
    with pytest.raises(ConfigError, match=r"'bigint.unsigned.handling.mode'.*string, long, precise"):
        vitess_config({**BASE, "bigint.unsigned.handling.mode": bad})
