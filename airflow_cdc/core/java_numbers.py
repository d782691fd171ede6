"""Java's ``Float.toString`` / ``Double.toString`` text of a binary floating-point value.

Kafka Connect's ``JsonConverter`` turns a FLOAT32 field into a Jackson ``FloatNode`` and a FLOAT64
field into a ``DoubleNode``; Jackson writes them with ``Float.toString(float)`` /
``Double.toString(double)`` (``NumberOutput.toString``; its optional fast writer implements the
same algorithm).  Since JDK 19 (JDK-4511638; Debezium 3.3 images run Java 21) both follow
Raffaello Giulietti's specification, which this module implements with exact rational
arithmetic:

* ``R`` is the set of decimals that round to the value (IEEE round-half-even at the format's
  precision); ``m`` the minimal length (significant digits) of a decimal in ``R``;
* the candidates ``T`` are the decimals of ``R`` of length ``m`` -- or of length 1 or 2 when
  ``m`` is 1 -- and the chosen decimal is the one of ``T`` closest to the value (ties: even
  significand).  So ``Float.MIN_VALUE`` prints ``1.4E-45``, not the shortest ``1E-45``;
* it is written plain when ``1e-3 <= |d| < 1e7`` (``100.0``, ``0.001``), else in computerized
  scientific notation (``1.0E7``, ``3.4028235E38``), always with a digit after the point.

Python's ``repr`` is shortest-round-trip for doubles only, and so differs on the FLOAT32 values
(and on the length-1 special case); parsing the text this module returns as a double gives the
number a JSON reader of Kafka Connect's output gets.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

#: (significand bits without the hidden bit, exponent bits, exponent bias) per width.
_FORMATS = {32: (23, 8, 127), 64: (52, 11, 1023)}


def _decompose(value: float, bits: int) -> tuple[int, int, bool]:
    """``(c, q, lower_is_closer)`` with ``|value| = c * 2**q`` at the format's precision."""
    frac_bits, exp_bits, bias = _FORMATS[bits]
    raw = int.from_bytes(struct.pack(">f" if bits == 32 else ">d", abs(value)), "big")
    frac, exp = raw & ((1 << frac_bits) - 1), raw >> frac_bits
    if exp == 0:  # subnormal: no hidden bit, the minimum exponent
        return frac, 1 - bias - frac_bits, False
    # at a power of two (not the smallest normal) the predecessor is half an ulp away
    return frac | (1 << frac_bits), exp - bias - frac_bits, frac == 0 and exp > 1


def _candidates(lo: Fraction, hi: Fraction, closed: bool, n: int, e10: int) -> list[tuple[int, int]]:
    """Decimals ``s * 10**i`` of at most ``n`` digits (``10**(n-1) <= s < 10**n``) in the
    rounding interval, for leading-digit exponents around ``e10``."""
    out = []
    for e in (e10 - 1, e10, e10 + 1):
        i = e + 1 - n
        grid = Fraction(10) ** i
        a, b = lo / grid, hi / grid
        smin, smax = math.ceil(a), math.floor(b)
        if not closed:
            smin += smin == a
            smax -= smax == b
        for s in range(max(smin, 10 ** (n - 1)), min(smax, 10**n - 1) + 1):
            out.append((s, i))
    return out


def _canonical(s: int, i: int) -> tuple[int, int]:
    while s % 10 == 0:
        s, i = s // 10, i + 1
    return s, i


def _decimal(value: float, bits: int) -> tuple[int, int]:
    """The significand and exponent of the decimal Java prints for a finite non-zero value."""
    c, q, lower_closer = _decompose(value, bits)
    v = Fraction(c) * Fraction(2) ** q
    half_ulp = Fraction(2) ** q / 2
    lo, hi = v - (half_ulp / 2 if lower_closer else half_ulp), v + half_ulp
    closed = c % 2 == 0  # round-half-even: an even significand owns its interval's ends
    e10 = math.floor(math.log10(v))
    while Fraction(10) ** e10 > v:
        e10 -= 1
    while Fraction(10) ** (e10 + 1) <= v:
        e10 += 1
    for n in range(1, 18):
        found = _candidates(lo, hi, closed, n, e10)
        if found:
            break
    if n == 1:
        found += _candidates(lo, hi, closed, 2, e10)
    best = [_canonical(s, i) for s, i in found]
    return min(best, key=lambda d: (abs(d[0] * Fraction(10) ** d[1] - v), d[0] % 2))


def java_to_string(value: float, bits: int = 64) -> str:
    """Return Java's ``Double.toString`` (``bits=64``) or ``Float.toString`` (``bits=32``) text.

    :param value: the number; with ``bits=32`` it is first rounded to the nearest float32 (as a
        Java ``(float)`` cast does, so values beyond the range become infinite).
    """
    if math.isnan(value):
        return "NaN"
    if bits == 32 and math.isfinite(value):
        try:
            value = struct.unpack("<f", struct.pack("<f", value))[0]
        except OverflowError:
            value = math.copysign(math.inf, value)
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    s, i = _decimal(value, bits)
    digits = str(s)
    e = len(digits) + i - 1  # 10**e <= |d| < 10**(e+1)
    if 0 <= e < 7:
        whole = digits[: e + 1].ljust(e + 1, "0")
        return f"{sign}{whole}.{digits[e + 1 :] or '0'}"
    if -3 <= e < 0:
        return f"{sign}0.{'0' * (-e - 1)}{digits}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{e}"


def java_float_value(value: float) -> float:
    """The double a JSON reader gets from Java's ``Float.toString`` text of ``value``."""
    return float(java_to_string(value, 32))
