"""One-dimensional PostgreSQL arrays: ARRAY of the element type's encoding.

The array text output (``{1,NULL,"a \\"b\\""}``, optionally prefixed with bounds like
``[0:2]=``) is split in Python, then all elements of the column are converted in one go by
the element codec, so arrays of any supported element type cost one vectorised conversion.
"""

from __future__ import annotations

import uuid
from hashlib import md5

import pyarrow as pa

from airflow_cdc.sources.postgres.types_base import Encoding


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


def parse_array(text: str) -> list[str | None]:
    """Split a one-dimensional array's text output into element texts (``None`` for NULL).

    :raises ValueError: multi-dimensional or malformed input.
    """
    body = text[text.index("=") + 1 :] if text.startswith("[") else text
    if len(body) < 2 or body[0] != "{" or body[-1] != "}":
        raise _bad(text, "expected {...}")
    inner = body[1:-1]
    if not inner:
        return []
    if '"' not in inner and "{" not in inner:
        return [None if e == "NULL" else e for e in inner.split(",")]
    return _quoted_elements(inner, text)


def _convert_list(element: Encoding, list_type: pa.DataType):
    def convert(text: pa.Array) -> pa.Array:
        offsets, flat, mask = [0], [], []
        for value in text.to_pylist():
            if value is not None:
                flat.extend(parse_array(value))
            offsets.append(len(flat))
            mask.append(value is None)
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
