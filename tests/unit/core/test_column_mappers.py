"""Debezium's column mappers against values computed independently here."""

from __future__ import annotations

import hashlib

import pytest

from airflow_cdc.core.column_mappers import (
    hash_value,
    java_serialized_string,
    mask,
    parse_mapper,
    truncate,
)
from airflow_cdc.core.errors import ConfigError


def java_bytes_by_hand(text: str) -> bytes:
    """ObjectOutputStream for a BMP, NUL-free string: AC ED 00 05, 0x74, u16 length, UTF-8 body."""
    body = text.encode("utf-8")
    return bytes([0xAC, 0xED, 0x00, 0x05, 0x74, len(body) >> 8, len(body) & 0xFF]) + body


@pytest.mark.parametrize("text", ["", "hello", "grüße", "日本語テキスト", "x" * 300])
def test_java_serialization_of_bmp_strings(text):
    assert java_serialized_string(text) == java_bytes_by_hand(text)


def test_java_serialization_modified_utf8_nul_and_supplementary():
    # NUL is C0 80; U+1F600 is the surrogate pair D83D DE00, each unit as three bytes (CESU-8)
    assert java_serialized_string("a\x00") == b"\xac\xed\x00\x05\x74\x00\x03a\xc0\x80"
    assert java_serialized_string("\U0001f600") == b"\xac\xed\x00\x05\x74\x00\x06\xed\xa0\xbd\xed\xb8\x80"


def test_java_serialization_long_string_uses_tc_longstring():
    data = java_serialized_string("y" * 70_000)
    assert data[:5] == b"\xac\xed\x00\x05\x7c" and data[5:13] == (70_000).to_bytes(8, "big")


@pytest.mark.parametrize("value", ["hello", "grüße", "日本"])
def test_hash_v1_and_v2(value):
    v1 = hashlib.sha256(b"CzQMA0cB5K" + java_bytes_by_hand(value)).hexdigest()
    v2 = hashlib.sha256(b"CzQMA0cB5K" + value.encode("utf-8")).hexdigest()
    assert hash_value(value, "SHA-256", "CzQMA0cB5K", v2=False) == v1
    assert hash_value(value, "SHA-256", "CzQMA0cB5K", v2=True) == v2
    assert hash_value(value, "SHA-256", "CzQMA0cB5K", v2=True, column_length=10) == v2[:10]
    assert hash_value(value, "MD5", "s", v2=True) == hashlib.md5(b"s" + value.encode()).hexdigest()
    assert (
        hash_value(value, "SHA-512", "s", v2=False)
        == hashlib.sha512(b"s" + java_bytes_by_hand(value)).hexdigest()
    )
    assert hash_value(None, "SHA-256", "s", v2=False) is None


def test_truncate_counts_utf16_units_and_never_splits_a_pair():
    assert truncate("grüße", 3) == "grü" and truncate("日本語", 2) == "日本"
    assert truncate("abc", 3) == "abc" and truncate(None, 1) is None and truncate("abc", 0) == ""
    assert truncate("a\U0001f600b", 3) == "a\U0001f600"  # the emoji is two units
    assert truncate("a\U0001f600b", 2) == "a"  # Debezium would keep a lone high surrogate


def test_mask():
    assert mask(5) == "*****" and mask(0) == ""


def test_parse_mapper():
    m = parse_mapper("column.mask.hash.v2.SHA-256.with.salt.a.b", ("public\\.users\\.email",))
    assert m and (m.kind, m.algorithm, m.salt, m.v2) == ("hash", "SHA-256", "a.b", True)
    assert (
        m.matches("public.users.email")
        and m.matches("PUBLIC.users.EMAIL")
        and not m.matches("public.users.email2")
    )
    m1 = parse_mapper("column.mask.hash.SHA-256.with.salt.s", ("x",))
    assert m1 and not m1.v2 and m1.algorithm == "SHA-256"
    t = parse_mapper("column.truncate.to.20.chars", ("a.b.c",))
    assert t and (t.kind, t.length) == ("truncate", 20)
    k = parse_mapper("column.mask.with.4.chars", ("a.b.c",))
    assert k and (k.kind, k.length) == ("mask", 4)
    assert parse_mapper("column.include.list", ("x",)) is None
    with pytest.raises(ConfigError, match="unknown hash algorithm 'NOPE'"):
        parse_mapper("column.mask.hash.NOPE.with.salt.s", ("x",))
    with pytest.raises(ConfigError, match="invalid column regex"):
        parse_mapper("column.mask.with.4.chars", ("(",))


@pytest.mark.parametrize(
    "algorithm,v2,value,expected",
    [
        ("SHA-256", False, "hello", "af5843a0f0e728ab0332c8888b6e1190bfb79e584f0d40538de8f10df6ef29c6"),
        ("SHA-256", False, "world", "4588e1f2dcdc7fefc1515d3acd5acb9033478eace68286f383c337b9ff4464a3"),
        ("MD5", False, "hello", "46f48a7a5ea32efba87cbff49d46d35a"),
        ("MD5", False, "world", "030f632140d9c9591b0d8c21098024b8"),
        ("SHA-256", True, "hello", "cd31b3b98ece60cb739c0bf770b2de892ae0ad133f645513c3d83f08757a843a"),
        ("SHA-256", True, "world", "e84ac3142870113ddc6710c06f76421befc8e8ca6de64e98d2993ed8d41f4085"),
        ("MD5", True, "hello", "06decc8b095724f80103712c235586be"),
        ("MD5", True, "world", "172c8e95398cc72ab5358ead6981e7e5"),
    ],
)
def test_matches_debezium_mask_strings_test_vectors(algorithm, v2, value, expected):
    # expected values from Debezium's MaskStringsTest (salt "salt", JVM output)
    assert hash_value(value, algorithm, "salt", v2=v2) == expected
