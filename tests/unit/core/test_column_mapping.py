"""Column mappers as configured and applied to codecs (the staged values are checked per source in
tests/contract/test_column_mappers_staged.py)."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from airflow_cdc.core.column_mapping import ColumnInfo, MappedCodec, configured_mappers, map_array, map_codecs
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.source import resolve_connector
from airflow_cdc.sources.property_table import BASE_CONFIGS


def config(connector: str = "postgresql", **extra: str):
    return resolve_connector({"connector": connector})[1].build_config({**BASE_CONFIGS[connector], **extra})


@pytest.mark.parametrize("connector", list(BASE_CONFIGS))
def test_every_connector_accepts_the_properties_in_precedence_order(connector):
    cfg = config(
        connector,
        **{
            "column.mask.hash.v2.SHA-256.with.salt.a.b": "s\\.t\\.h",
            "column.mask.with.3.chars": "s\\.t\\.m, s\\.t\\.m2",
            "column.truncate.to.2.chars": "s\\.t\\.t",
        },
    )
    mappers = configured_mappers(cfg)
    assert [(m.kind, m.length) for m in mappers] == [("truncate", 2), ("mask", 3), ("hash", 0)]
    assert mappers[2].salt == "a.b" and mappers[2].v2 and mappers[1].matches("S.T.M2")
    assert "a.b" not in repr(mappers[2])  # the salt is not shown


@pytest.mark.parametrize(
    "name,message",
    [
        ("column.truncate.to.ten.chars", "non-negative integer"),
        ("column.mask.with.-2.chars", "non-negative integer"),
        ("column.mask.hash.NOPE-1.with.salt.s", "unknown hash algorithm 'NOPE-1'"),
        ("column.mask.hash.SHA-256.with.nosalt", "did you mean .column.mask.hash.<algorithm>"),
    ],
)
def test_bad_values_are_config_errors_naming_the_property(name, message):
    with pytest.raises(ConfigError, match=message) as err:
        config(**{name: "a.b.c"})
    assert name.split(".with.salt.")[0] in str(err.value)


def test_bad_regex_is_a_config_error_and_the_salt_is_not_shown():
    with pytest.raises(ConfigError, match="invalid column regex"):
        config(**{"column.truncate.to.3.chars": "a(b"})
    with pytest.raises(
        ConfigError, match=r"'column.mask.hash.MD5.with.salt.\*\*\*': invalid column regex"
    ) as e:
        config(**{"column.mask.hash.MD5.with.salt.pepper": "a(b"})
    assert "pepper" not in str(e.value)


class Text:
    """A text codec as the PostgreSQL source has (convert only)."""

    def __init__(self, name: str, type_: pa.DataType | None = None) -> None:
        self.field, self.placeholder = pa.field(name, type_ or pa.string()), None

    def convert(self, text: pa.Array) -> pa.Array:
        return text.cast(self.field.type)


class Native(Text):
    """A codec converting decoded values (MySQL, SQL Server, Vitess)."""

    def convert_values(self, values: list) -> pa.Array:
        return pa.array(values, self.field.type)


def test_map_codecs_wraps_only_matching_character_columns_and_guards_keys():
    cfg = config(
        **{
            "column.truncate.to.2.chars": "s\\.t\\.(name|n)",
            "column.mask.hash.SHA-256.with.salt.k": "s\\.t\\.(id|code)",
        }
    )
    mappers = configured_mappers(cfg)
    codecs = [Text("id"), Native("name"), Text("n", pa.int64()), Text("code"), Text("other")]
    infos = [
        ColumnInfo("id", True),
        ColumnInfo("name", True),
        ColumnInfo("n", False),
        ColumnInfo("code", True, 5),
    ]
    infos.append(ColumnInfo("other", True))
    out = map_codecs(codecs, "s.t", infos, mappers, key=["id"])
    assert [type(c).__name__ for c in out] == ["MappedCodec", "MappedCodec", "Text", "MappedCodec", "Text"]
    assert out[1].convert_values(["Grüße", None, ""]).to_pylist() == ["Gr", None, ""]
    assert not hasattr(out[0], "convert_values")  # a text codec stays a text codec
    java = bytes([0xAC, 0xED, 0, 5, 0x74, 0, 2]) + b"ab"
    assert out[3].convert(pa.array(["ab"])).to_pylist() == [hashlib.sha256(b"k" + java).hexdigest()[:5]]
    with pytest.raises(ConfigError, match=r"table s\.t, key column 'name'.*column.truncate.to.2.chars"):
        map_codecs(codecs, "s.t", infos, mappers, key=["name"])
    assert map_codecs(codecs, "s.t", infos, (), key=["name"]) == codecs


def test_map_array_mask_replaces_nulls_and_truncate_counts_utf16_units():
    cfg = config(**{"column.mask.with.4.chars": "x", "column.truncate.to.3.chars": "y"})
    truncate, mask = configured_mappers(cfg)
    assert map_array(mask, pa.array(["secret", None, ""])).to_pylist() == ["****"] * 3
    assert map_array(truncate, pa.array(["a😀b", "中文字符", None, ""])).to_pylist() == [
        "a😀",
        "中文字",
        None,
        "",
    ]
    short = pa.array(["ab", None])
    assert map_array(truncate, short) is short  # nothing longer than the limit: no copy
    assert isinstance(MappedCodec(Text("x"), mask, -1).convert(pa.chunked_array([["a"]])), pa.Array)


def test_fast_paths_agree_with_the_reference_functions():
    """Arrow's code-point slice (no astral character in the column) and UTF-8 as modified UTF-8
    (no NUL, no astral character) give what the per-value reference functions give."""
    import random

    from airflow_cdc.core.column_mappers import java_serialized_string, modified_utf8, parse_mapper, truncate

    rng = random.Random(7)
    alphabet = ["a", "Z", " ", "ü", "ß", "中", "文", "\u07ff", "\uffff", "\x00", "😀", "\U0010ffff"]
    for n in range(4):
        mapper = parse_mapper(f"column.truncate.to.{n}.chars", ("x",))
        assert mapper is not None
        for astral in (False, True):
            chars = alphabet if astral else alphabet[:-2]
            values = ["".join(rng.choices(chars, k=rng.randrange(8))) for _ in range(200)] + [None]
            assert map_array(mapper, pa.array(values)).to_pylist() == [truncate(v, n) for v in values]
            for v in values[:-1]:
                body = modified_utf8(v)
                assert java_serialized_string(v)[7:] == body, repr(v)


def test_hash_values_is_hash_value_per_value():
    from airflow_cdc.core.column_mappers import hash_value, hash_values

    values = ["", "a", "Grüße 😀 中文", None, "x\x00y", "z" * 70_000]
    for algorithm, v2, length in (("SHA-256", False, -1), ("MD5", True, 7), ("SHA-512/256", False, 100)):
        want = [hash_value(v, algorithm, "s.alt", v2, length) for v in values]
        assert hash_values(values, algorithm, "s.alt", v2, length) == want
