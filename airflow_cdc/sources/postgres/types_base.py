"""Building blocks shared by the PostgreSQL value codecs.

An :class:`Encoding` is what a PostgreSQL type becomes in the change event: the Arrow type that
holds it, the Kafka Connect schema Debezium declares for it (literal type, semantic name,
parameters) and a column-wise ``convert`` from the server's text output.  The public face of
this is :func:`airflow_cdc.sources.postgres.types.column_codec`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

Convert = Callable[[pa.Array], pa.Array]
#: Builds the TOAST placeholder value from (placeholder text, placeholder bytes).
PlaceholderFn = Callable[[str, bytes], object]

META_TYPE = b"connect.type"
META_NAME = b"connect.name"
META_VERSION = b"connect.version"
META_DOC = b"connect.doc"
META_PARAMS = b"connect.parameters"
META_PG_TYPE = b"pg.type"

NULL_STRING = pa.scalar(None, pa.string())


def connect_metadata(
    connect_type: str,
    name: str | None = None,
    params: Mapping[str, str] | None = None,
    doc: str | None = None,
) -> dict[bytes, bytes]:
    """Return the Arrow field metadata describing a Kafka Connect schema.

    Every named Debezium and Kafka Connect logical type is at schema version 1.

    :param connect_type: Connect literal type (``int32``, ``string``, ``struct`` ...).
    :param name: Connect schema name (semantic type), if any.
    :param params: Connect schema parameters, if any.
    :param doc: Connect schema documentation, if any.
    """
    meta = {META_TYPE: connect_type.encode()}
    if name:
        meta[META_NAME] = name.encode()
        meta[META_VERSION] = b"1"
    if doc:
        meta[META_DOC] = doc.encode()
    if params:
        meta[META_PARAMS] = json.dumps(dict(params), separators=(",", ":")).encode()
    return meta


def connect_field(
    name: str,
    arrow_type: pa.DataType,
    connect_type: str,
    nullable: bool = True,
    semantic: str | None = None,
    params: Mapping[str, str] | None = None,
    doc: str | None = None,
) -> pa.Field:
    """Return an Arrow child field (struct member, list item) carrying its Connect schema.

    :param name: field name.
    :param arrow_type: Arrow type of the values.
    :param connect_type: Connect literal type.
    :param nullable: whether the Connect schema is optional.
    :param semantic: Connect schema name, if any.
    :param params: Connect schema parameters, if any.
    :param doc: Connect schema documentation, if any.
    """
    return pa.field(
        name, arrow_type, nullable=nullable, metadata=connect_metadata(connect_type, semantic, params, doc)
    )


@dataclass(frozen=True)
class Encoding:
    """How one PostgreSQL type is represented: Arrow type, Connect schema and converter.

    ``placeholder`` builds the unchanged-TOAST stand-in; when unset it is derived from the
    Arrow type (string, binary, list of string, list of binary) or there is none.
    """

    arrow_type: pa.DataType
    connect_type: str
    convert: Convert
    name: str | None = None
    params: Mapping[str, str] | None = None
    doc: str | None = None
    placeholder: PlaceholderFn | None = None

    def item_field(self, nullable: bool = True) -> pa.Field:
        """Return this encoding as a list item field."""
        return connect_field(
            "item", self.arrow_type, self.connect_type, nullable, self.name, self.params, self.doc
        )

    def metadata(self, pg_type: str) -> dict[bytes, bytes]:
        """Return the top-level column metadata, including the PostgreSQL type text."""
        meta = connect_metadata(self.connect_type, self.name, self.params, self.doc)
        meta[META_PG_TYPE] = pg_type.encode()
        return meta


def identity(text: pa.Array) -> pa.Array:
    """Return the text output unchanged (types Debezium passes through as strings)."""
    return text


def fill_slow(text: pa.Array, fast: pa.Array, slow: Callable[[str], object]) -> pa.Array:
    """Complete a vectorised conversion row by row where it produced no value.

    Rows that are non-null in ``text`` but null in ``fast`` (values outside the fast path such
    as ``infinity``, BC dates or years past 9999) are converted with ``slow``; ``slow`` may
    itself return ``None``.

    :param text: the text output column.
    :param fast: the vectorised result, null where it could not convert.
    :param slow: converts one text value to a Python value of ``fast.type``.
    """
    need = pc.and_(pc.is_valid(text), pc.is_null(fast))
    if not pc.any(need).as_py():
        return fast
    values = [slow(v) for v in pc.filter(text, need).to_pylist()]
    return pc.replace_with_mask(fast, need, pa.array(values, type=fast.type))


def cast_where(text: pa.Array, arrow_type: pa.DataType, pattern: str) -> pa.Array:
    """Cast text with Arrow, leaving null the rows that are not in the cast's simple form.

    Tries the whole column first (the common case); if some row does not parse, only rows
    matching ``pattern`` are cast and the others stay null for :func:`fill_slow`.

    :param text: string array.
    :param arrow_type: target type.
    :param pattern: RE2 pattern of the rows Arrow parses exactly as PostgreSQL means them.
    """
    try:
        return pc.cast(text, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    simple = pc.if_else(pc.match_substring_regex(text, pattern), text, NULL_STRING)
    try:
        return pc.cast(simple, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(text), arrow_type)


def map_python(text: pa.Array, arrow_type: pa.DataType, fn: Callable[[str], object]) -> pa.Array:
    """Convert row by row in Python (for rare types); nulls stay null.

    :param text: string array.
    :param arrow_type: result type.
    :param fn: converts one non-null text value.
    """
    return pa.array([None if v is None else fn(v) for v in text.to_pylist()], type=arrow_type)


def rowwise(arrow_type: pa.DataType, fn: Callable[[str], object]) -> Convert:
    """Return a converter applying ``fn`` to each non-null value (see :func:`map_python`)."""
    return lambda text: map_python(text, arrow_type, fn)


def floor_div(values: pa.Array, divisor: int) -> pa.Array:
    """Integer division rounding toward negative infinity (Arrow's truncates toward zero)."""
    q = pc.divide(values, divisor)
    return pc.if_else(pc.less(values, pc.multiply(q, divisor)), pc.subtract(q, 1), q)
