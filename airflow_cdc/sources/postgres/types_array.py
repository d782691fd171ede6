"""PostgreSQL arrays: ARRAY of the element type's encoding.

The array text output (``{1,NULL,"a \\"b\\""}``, optionally prefixed with bounds like
``[0:2]=``) is split in Python, then all elements of the column are converted in one go by
the element codec, so arrays of any supported element type cost one vectorised conversion.

Multi-dimensional values (``{{1,2},{3,4}}``; the column type does not fix the number of
dimensions) become one null element per sub-array, as in Debezium: its ``convertArray`` hands
each top-level item of the JDBC array -- itself an array -- to the element converter, which
cannot convert it and, elements being optional, yields null (``handleUnknownData``,
PostgresValueConverter / JdbcValueConverters, Debezium 3.3).  For string-like elements Debezium
emits the Java array's ``toString()`` (``[Ljava.lang.String;@<identity hash>``), a value that
exists only in that JVM; we emit null there as well.
"""

from __future__ import annotations

import logging
import uuid
from hashlib import md5

import pyarrow as pa

from airflow_cdc.sources.postgres.types_base import Encoding

log = logging.getLogger(__name__)


def _bad(text: str, why: str) -> ValueError:
    return ValueError(f"unsupported array value ({why}): {text[:80]!r}")


def _quoted_elements(inner: str, text: str) -> list[str | None]:
    out: list[str | None] = []
    i, n = 0, len(inner)
    while i <= n:
        if i < n and inner[i] == '"':
            chars, i = [], i + 1
            while i < n and inner[i] != '"':
                if inner[i] == "\\":
                    i += 1
                chars.append(inner[i])
                i += 1
            out.append("".join(chars))
            i += 1
        else:
            end = inner.find(",", i)
            end = n if end < 0 else end
            item = inner[i:end].strip()
            if item.startswith("{"):
                raise _bad(text, "multi-dimensional arrays are not supported")
            out.append(None if item == "NULL" else item)
            i = end
        if i < n and inner[i] != ",":
            raise _bad(text, f"unexpected {inner[i]!r}")
        i += 1
    return out


def _subarrays(inner: str, text: str) -> int:
    """Count the top-level sub-arrays of a multi-dimensional array's inner text."""
    count, depth, quoted, i = 0, 0, False, 0
    while i < len(inner):
        ch = inner[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "{":
            depth += 1
            count += depth == 1
        elif ch == "}":
            depth -= 1
        i += 1
    if depth or quoted:
        raise _bad(text, "unbalanced braces or quotes")
    return count


def _body(text: str) -> str:
    """The array text without its optional bounds prefix (``[0:2]=``)."""
    return text[text.index("=") + 1 :] if text.startswith("[") else text


def parse_array(text: str) -> list[str | None]:
    """Split an array's text output into element texts (``None`` for NULL).

    A multi-dimensional array yields one ``None`` per top-level sub-array (Debezium's output,
    see the module docstring).

    :raises ValueError: malformed input.
    """
    body = _body(text)
    if len(body) < 2 or body[0] != "{" or body[-1] != "}":
        raise _bad(text, "expected {...}")
    inner = body[1:-1]
    if not inner:
        return []
    if inner[0] == "{":
        return [None] * _subarrays(inner, text)
    if '"' not in inner and "{" not in inner:
        return [None if e == "NULL" else e for e in inner.split(",")]
    return _quoted_elements(inner, text)


def _convert_list(element: Encoding, list_type: pa.DataType):
    def convert(text: pa.Array) -> pa.Array:
        offsets, flat, mask, nested = [0], [], [], 0
        for value in text.to_pylist():
            if value is not None:
                flat.extend(parse_array(value))
                nested += _body(value).startswith("{{")
            offsets.append(len(flat))
            mask.append(value is None)
        if nested:
            log.warning(
                "%d multi-dimensional array value(s) captured as one null element per sub-array, "
                "as Debezium does",
                nested,
            )
        values = element.convert(pa.array(flat, pa.string()))
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), values, type=list_type, mask=pa.array(mask, pa.bool_())
        )

    return convert


def _java_name_uuid(data: bytes) -> str:
    # java.util.UUID.nameUUIDFromBytes: MD5, version 3, IETF variant
    digest = bytearray(md5(data, usedforsecurity=False).digest())
    digest[6] = (digest[6] & 0x0F) | 0x30
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def _placeholder(element_name: str, element: Encoding):
    """Debezium's unchanged-TOAST value for array columns, by element type."""
    if element_name in ("int4", "date", "int8"):  # the placeholder's bytes as numbers
        return lambda _text, raw: [b - 256 if b > 127 else b for b in raw]
    if element_name == "uuid":
        return lambda _text, raw: [_java_name_uuid(raw)]
    if pa.types.is_string(element.arrow_type):
        return lambda text, _raw: [text]
    if pa.types.is_binary(element.arrow_type):
        return lambda _text, raw: [raw]
    return None


def array_encoding(element: Encoding, element_name: str) -> Encoding:
    """Return the ARRAY encoding whose items use ``element``.

    :param element: the element type's encoding.
    :param element_name: the element's ``typname`` (selects Debezium's TOAST placeholder).
    """
    list_type = pa.list_(element.item_field())
    placeholder = _placeholder(element_name, element)
    return Encoding(
        list_type,
        "array",
        _convert_list(element, list_type),
        placeholder=placeholder if placeholder is not None else _no_placeholder,
    )


def _no_placeholder(_text: str, _raw: bytes) -> None:
    return None
