"""Apply the configured column mappers to a table's column codecs, before anything is staged.

Every source converts each captured column through a codec (text or decoded values ->
Debezium-encoded Arrow array): the staging sink (change events, before and after images, the
``__old_key`` of a key change), the snapshot/copy chunk writers, the compiled PostgreSQL decoder's
column-wise pieces and ``verify`` all go through it.  :func:`map_codecs` wraps the codec of each
mapped column so that its output passes through the mapper, in memory: no unmapped value of such a
column ever reaches a Parquet file.  Unmapped columns keep their codecs as they are (no cost).

Rules, as Debezium's ``ColumnMappers``:

* one mapper per column: the first match among the ``column.truncate.to`` properties, then
  ``column.mask.with``, then ``column.mask.hash`` (in configuration order within a kind);
* the column regexes are anchored and case-insensitive, against the fully-qualified column name
  the source gives (``<schema>.<table>.<column>``, ``<db>.<table>.<column>`` for MySQL,
  ``<keyspace>.<table>.<column>`` for Vitess);
* only character columns are mapped (CHAR, VARCHAR, TEXT kinds, as JDBC's string types); any
  other column passes through unchanged;
* key columns: Debezium maps a key column's value in the event value (``before``/``after``) but not
  in the Kafka record key.  Staged images are the only copy here, so key columns are mapped in
  them too; only a hash is allowed on a key column (deterministic and injective in practice, so
  rows keep their identity in Delta).  A truncation or a fixed mask of a key column could merge
  distinct rows and is refused with :class:`ConfigError`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.column_mappers import PROPAGATE, Mapper, hash_values, mask, parse_mapper, truncate
from airflow_cdc.core.errors import ConfigError

log = logging.getLogger(__name__)
_ASTRAL = r"[\x{10000}-\x{10FFFF}]"  # characters that are two UTF-16 units (RE2 syntax)

#: The templated property names, in Debezium's order of precedence.
TEMPLATES = (
    "column.truncate.to.<length>.chars",
    "column.mask.with.<length>.chars",
    "column.mask.hash.<algorithm>.with.salt.<salt>",
)


@dataclass(frozen=True)
class ColumnInfo:
    """What a mapper needs of a captured column.

    :param name: the column name as captured.
    :param character: whether the column has a character type (CHAR, VARCHAR, TEXT ...).
    :param length: its declared length in characters, ``-1`` when unknown or unbounded (a hash
        is cut to it, as Debezium does).
    """

    name: str
    character: bool
    length: int = -1
    #: the source type as ``__debezium.source.column.*`` propagates it: name, declared length
    #: (or precision) and scale where the type declares them
    type_name: str = ""
    size: int | None = None
    scale: int | None = None


def configured_mappers(config: Any) -> tuple[Mapper, ...]:
    """The mappers ``config`` defines, in order of precedence.

    :raises ConfigError: a bad property name, regex or hash algorithm.
    """
    out: list[Mapper] = []
    for template in TEMPLATES:
        for name, columns in config.templated(template):
            mapper = parse_mapper(name, tuple(columns))
            if mapper is not None:
                out.append(mapper)
    for name in PROPAGATE:
        columns = tuple(config[name] or ())
        if columns:
            out.append(parse_mapper(name, columns))  # type: ignore[arg-type]
    return tuple(out)


def map_array(mapper: Mapper, values: pa.Array | pa.ChunkedArray, length: int = -1) -> pa.Array:
    """Map one column of Debezium-encoded strings (``length``: the column's declared length)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if mapper.kind == "mask":  # every value, NULL included (Debezium's MaskingValueConverter)
        return pa.repeat(pa.scalar(mask(mapper.length), pa.string()), len(values))
    if mapper.kind == "truncate":
        longest = pc.max(pc.binary_length(values)).as_py() if len(values) else None
        if longest is None or longest <= mapper.length:  # UTF-16 units <= UTF-8 bytes: nothing to cut
            return values
        if not pc.any(pc.match_substring_regex(values, _ASTRAL)).as_py():
            # every character is one UTF-16 unit: cut by code points, in Arrow
            return pc.utf8_slice_codeunits(values, 0, mapper.length)
        return pa.array([truncate(v, mapper.length) for v in values.to_pylist()], pa.string())
    hashed = hash_values(values.to_pylist(), mapper.algorithm, mapper.salt, mapper.v2, length)
    return pa.array(hashed, pa.string())


class MappedCodec:
    """A column codec whose output passes through a mapper (``field`` and ``placeholder`` kept)."""

    def __init__(self, inner: Any, mapper: Mapper, length: int) -> None:
        self.inner, self.mapper, self.length = inner, mapper, length
        self.field: pa.Field = inner.field
        self.placeholder = inner.placeholder
        native = getattr(inner, "convert_values", None)
        if native is not None:  # the sink hands such codecs decoded values, not text
            self.convert_values = lambda values: map_array(mapper, native(values), length)

    def __repr__(self) -> str:
        return f"MappedCodec({self.inner!r}, {self.mapper.kind})"

    def convert(self, text: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The inner codec's conversion, mapped."""
        return map_array(self.mapper, self.inner.convert(text), self.length)


class SourceTypeCodec:
    """A column codec whose field carries the source type as Debezium's schema parameters
    (``column.propagate.source.type`` / ``datatype.propagate.source.type``); values unchanged."""

    def __init__(self, inner: Any, col: ColumnInfo) -> None:
        self.inner = inner
        params = {"__debezium.source.column.type": col.type_name, "__debezium.source.column.name": col.name}
        if col.size is not None:
            params["__debezium.source.column.length"] = str(col.size)
        if col.scale is not None:
            params["__debezium.source.column.scale"] = str(col.scale)
        meta = dict(inner.field.metadata or {})
        meta.update({k.encode(): v.encode() for k, v in params.items()})
        self.field: pa.Field = inner.field.with_metadata(meta)

    def __getattr__(self, name: str) -> Any:  # convert, convert_values, placeholder, ...
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"SourceTypeCodec({self.inner!r})"


def _propagates(rules: Sequence[Mapper], table: str, col: ColumnInfo) -> bool:
    for rule in rules:
        subject = col.name if rule.kind == "propagate-column" else col.type_name
        if col.type_name and rule.matches(f"{table}.{subject}"):
            return True
    return False


def mapper_for(mappers: Sequence[Mapper], qualified_column: str) -> Mapper | None:
    """The first mapper whose regexes match ``qualified_column``, or ``None``."""
    return next((m for m in mappers if m.matches(qualified_column)), None)


def map_codecs(
    codecs: Sequence[Any],
    table: str,
    columns: Sequence[ColumnInfo],
    mappers: Sequence[Mapper],
    key: Collection[str] = (),
) -> list[Any]:
    """The codecs with those of mapped character columns wrapped in :class:`MappedCodec`.

    :param codecs: one codec per captured column, in the order of ``columns``.
    :param table: the fully-qualified table name; a column is matched as ``<table>.<column>``.
    :param key: the table's key columns (only a hash may map them).
    :raises ConfigError: a truncation or mask matches a key column, naming table, column, property.
    """
    if not mappers:
        return list(codecs)
    rules = [m for m in mappers if m.kind in PROPAGATE.values()]
    if rules:
        codecs = [
            SourceTypeCodec(c, col) if _propagates(rules, table, col) else c
            for c, col in zip(codecs, columns, strict=True)
        ]
        mappers = [m for m in mappers if m.kind not in PROPAGATE.values()]
    out = []
    for codec, col in zip(codecs, columns, strict=True):
        mapper = mapper_for(mappers, f"{table}.{col.name}")
        if mapper is None or not col.character or not pa.types.is_string(codec.field.type):
            if mapper is not None:
                log.info(
                    "table %s, column %s: not a character column, %s mapper not applied",
                    table,
                    col.name,
                    mapper.kind,
                )
            out.append(codec)
            continue
        if col.name in key and mapper.kind != "hash":
            raise ConfigError(
                f"table {table}, key column {col.name!r}: property {mapper.prop!r} would merge "
                "distinct rows (keys must stay unique); map key columns with "
                "column.mask.hash.<algorithm>.with.salt.<salt> only, or narrow the column regex"
            )
        out.append(MappedCodec(codec, mapper, col.length))
    return out


def declared_size(column_type: str) -> tuple[int | None, int | None]:
    """(length or precision, scale) declared in a MySQL-style type, e.g. ``decimal(10,2)`` ->
    ``(10, 2)``, ``varchar(40)`` -> ``(40, None)``, ``int unsigned`` -> ``(None, None)``."""
    m = re.match(r"^[^(]*\((\d+)(?:\s*,\s*(\d+))?\)", column_type)
    if m is None:
        return None, None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)
