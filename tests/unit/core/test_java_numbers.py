"""Java's Float.toString / Double.toString (what Jackson writes for Kafka Connect's JsonConverter).

``data/java_to_string.txt`` holds ~4,000 values (every float32 exponent with random
significands, subnormals, MIN/MAX, powers of ten and their neighbours, doubles across the
exponent range) with the text Java 25's ``Float.toString``/``Double.toString`` printed for them
(``Float.intBitsToFloat`` / ``Double.longBitsToDouble`` of the hex bits; JDK 19+ algorithm, as
the Java 21 of Debezium 3.3's images).
"""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

from airflow_cdc.core.java_numbers import java_float_value, java_to_string

FIXTURE = Path(__file__).parent / "data" / "java_to_string.txt"


def _value(kind: str, bits: str) -> float:
    return struct.unpack(">f" if kind == "f" else ">d", bytes.fromhex(bits))[0]


def test_matches_java_on_every_fixture_value():
    lines = [ln.split() for ln in FIXTURE.read_text().splitlines() if not ln.startswith("#")]
    assert len(lines) > 3900
    wrong = [
        (kind, bits, want, got)
        for kind, bits, want in lines
        if (got := java_to_string(_value(kind, bits), 32 if kind == "f" else 64)) != want
    ]
    assert wrong == []


@pytest.mark.parametrize(
    ("value", "bits", "text"),
    [
        (1.4e-45, 32, "1.4E-45"),  # Float.MIN_VALUE: length-1 minimum, so 2 digits (not 1E-45)
        (3.4028235e38, 32, "3.4028235E38"),  # Float.MAX_VALUE
        (-3.4028235e38, 32, "-3.4028235E38"),
        (1.17549435e-38, 32, "1.1754944E-38"),  # Float.MIN_NORMAL
        (5e-324, 64, "4.9E-324"),  # Double.MIN_VALUE
        (1.7976931348623157e308, 64, "1.7976931348623157E308"),
        (-0.0, 32, "-0.0"),
        (0.0, 64, "0.0"),
        (1e7, 32, "1.0E7"),
        (9999999.0, 32, "9999999.0"),
        (0.001, 32, "0.001"),
        (0.0001, 32, "1.0E-4"),
        (100.0, 64, "100.0"),
        (3.3, 32, "3.3"),
        (float("nan"), 32, "NaN"),
        (float("inf"), 32, "Infinity"),
        (float("-inf"), 64, "-Infinity"),
        (1e39, 32, "Infinity"),  # beyond float32: a Java (float) cast gives Infinity
    ],
)
def test_known_values(value, bits, text):
    assert java_to_string(value, bits) == text


def _float32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_random_floats_round_trip_with_minimal_digits():
    """Properties on values not in the fixture: the text reads back as the same float32, and no
    decimal with fewer digits (than Java's at least two, when one digit would do) does."""
    rng = random.Random(20261123)
    for _ in range(3000):
        value = _float32(rng.getrandbits(32) & 0x7FFFFFFF)
        if not math.isfinite(value) or value == 0:
            continue
        text = java_to_string(value, 32)
        assert struct.unpack("<f", struct.pack("<f", float(text)))[0] == value, text
        mantissa = text.split("E")[0].replace(".", "").lstrip("0").rstrip("0") or "0"
        digits = len(mantissa)
        if digits > 2:
            shorter = f"{value:.{digits - 2}e}"  # the nearest decimal of one digit less
            assert struct.unpack("<f", struct.pack("<f", float(shorter)))[0] != value, (text, shorter)


def test_float_value_is_the_number_json_readers_get():
    assert java_float_value(_float32(1)) == 1.4e-45
    assert java_float_value(3.4028234663852886e38) == 3.4028235e38
    assert math.copysign(1.0, java_float_value(-0.0)) < 0
