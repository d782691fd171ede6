"""Accumulate change events of one table in pieces and write them as Parquet row groups.

Sources hand over row images as tuples of *text* values (``bytes``/``str``, ``None`` for SQL
NULL, any other object for "value not sent", e.g. PostgreSQL's unchanged-TOAST marker).
Conversion to the Debezium encoding happens column-wise per piece, through the column codecs,
so the per-event cost in Python is a few list appends.  Memory is bounded by the piece size: at
most ``piece_rows`` events, and about :data:`PIECE_BYTES` of values (sampled, so wide rows such as
blobs end a piece early).  Each Parquet row group holds about :data:`ROW_GROUP_BYTES` at most: a
reader (the Spark apply job) holds a row group's column chunks whole.
Compiled decoders hand over whole pieces column-wise instead (:class:`ColumnarPiece`); both
routes meet in the same conversion and produce identical rows.

A ``c`` event handed over *with* a before image is the create half of a primary-key change: the
sink writes its before image as null and keeps the old key's columns in ``__old_key``.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.core.events import (
    OLD_KEY_COLUMN,
    POSITION_COLUMN,
    TRANSACTION_TYPE,
    UNAVAILABLE_COLUMN,
    envelope_schema,
    now_us,
)
from airflow_cdc.core.filemodes import fsync_file, make_private
from airflow_cdc.core.unchanged import drop_unchanged_piece, drop_unchanged_rows

try:
    from airflow_cdc.core._columns import columns as _transpose
except ImportError:  # not built: Python transposition
    _transpose = None

#: Row data per Parquet row group, at most (about): Spark reads a row group's column chunks whole
ROW_GROUP_BYTES = 16 << 20
#: Values buffered per piece before it is converted and written (estimated from samples)
PIECE_BYTES = 32 << 20
_SAMPLE = 64  # every this many buffered events, one event's size is sampled
#: ``source`` string fields that differ from event to event (PostgreSQL's ``sequence``,
#: ``["<last commit LSN>","<change LSN>"]``): written without a dictionary
PER_EVENT = frozenset({"sequence"})


def _image_bytes(image: Any) -> int:
    """About the bytes of a row image's values (8 for a value that is not text or bytes)."""
    if not image:
        return 0
    return sum(len(v) if isinstance(v, (bytes, str, bytearray)) else 8 for v in image)


def row_group_rows(table: pa.Table, limit: int = ROW_GROUP_BYTES) -> int:
    """Rows per row group so that a group of ``table``'s rows holds about ``limit`` bytes."""
    n = table.num_rows
    return max(1, min(n, limit * n // max(1, table.nbytes)))


#: ``0`` turns off the snapshot parts' background writes (row groups encoded while the next rows
#: are converted, the parts of several tables side by side): one thread does everything
THREADS_ENV = "AIRFLOW_CDC_SNAPSHOT_THREADS"


def snapshot_threads() -> bool:
    """Whether snapshot parts are written in background threads (:data:`THREADS_ENV`)."""
    return os.environ.get(THREADS_ENV, "") != "0"


class BackgroundWrites:
    """Threads that encode and write row groups of parts, with at most ``most`` writes waiting or
    running: the rows handed over stay bounded however many parts are open."""

    def __init__(self, threads: int = 2, most: int = 4) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="parquet-write")
        self._slots = threading.BoundedSemaphore(most)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Run ``fn`` on a writer thread; blocks while ``most`` writes are outstanding."""
        self._slots.acquire()
        try:
            future = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class Codec(Protocol):
    """Converts a column of text values into its Debezium-encoded Arrow array.

    A codec may also define ``convert_values(values: list) -> pa.Array``: the sink then hands it
    the buffered values as they are (decoded Python values, ``None`` for NULL) instead of text.
    """

    field: pa.Field
    placeholder: pa.Scalar | None

    def convert(self, text: pa.Array) -> pa.Array: ...


@dataclass
class SourceLayout:
    """The ``source`` struct: constant fields fixed per table, varying ones supplied per event."""

    type: pa.StructType
    constants: dict[str, Any]
    varying: tuple[str, ...]

    def build(
        self,
        n: int,
        varying_rows: list[tuple] | tuple | dict[str, pa.Array],
        dictionary: frozenset[str] = frozenset(),
    ) -> pa.StructArray:
        """The ``source`` column: ``varying_rows`` per event, one tuple shared by all ``n``, or
        the varying fields' arrays by name; the ``dictionary`` fields as :data:`DICTIONARY_STRING`
        arrays, a value every row shares without hashing it."""
        arrays = []
        fields = []
        index = {name: i for i, name in enumerate(self.varying)}
        shared = isinstance(varying_rows, tuple)
        for f in self.type:
            value: Any = _NO_VALUE  # the one value of every row, where there is one
            if f.name in index:
                i = index[f.name]
                if isinstance(varying_rows, dict):
                    array = varying_rows[f.name].cast(f.type)
                elif shared:
                    value = varying_rows[i]
                else:
                    array = pa.array([r[i] for r in varying_rows], type=f.type)
            else:
                value = self.constants.get(f.name)
            if f.name in dictionary:
                f = f.with_type(DICTIONARY_STRING)
                array = as_dictionary(array) if value is _NO_VALUE else dictionary_constant(value, n)
            elif value is not _NO_VALUE:
                array = constant(value, f.type, n)
            arrays.append(array)
            fields.append(f)
        return pa.StructArray.from_arrays(arrays, fields=fields)


@dataclass
class RowImages:
    """One row image (``before`` or ``after``) of a piece, column-wise.

    ``present`` is false where the event has no such image; ``texts`` holds one string array
    of text output per captured column (null for SQL NULL and for values not sent), or the
    converted array for codecs with ``convert_values`` (sources that decode binary values);
    ``unchanged`` marks per column the values not sent (``None``: none in this piece).
    """

    present: pa.BooleanArray
    texts: list[pa.Array]
    unchanged: list[pa.BooleanArray | None]


@dataclass
class ColumnarPiece:
    """A piece of events given column-wise, as compiled decoders hand them over.

    ``source`` holds the arrays of the layout's varying ``source`` fields by name.
    """

    ops: pa.Array
    op_counts: dict[str, int]
    positions: pa.Array
    source: dict[str, pa.Array]
    before: RowImages
    after: RowImages


@dataclass
class PartInfo:
    file: str
    rows: int
    kind: str
    schema_version: str
    first_position: str | None = None
    last_position: str | None = None
    ops: dict[str, int] = field(default_factory=dict)


def _expand_plain(rows: list[tuple]) -> tuple[list[bytes], list[tuple], list | None]:
    """Rows appended by :meth:`TableSink.append`: (op, before, after, position, source, txn)."""
    return [r[3] for r in rows], [r[4] for r in rows], [r[5] for r in rows]


def relax(field: pa.Field) -> pa.Field:
    """The field with every nested field nullable: a null row image has null children, and
    Parquet rejects nulls in non-nullable columns even under a null parent."""
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([relax(t.field(i)) for i in range(t.num_fields)])
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        t = pa.list_(relax(t.value_field))
    elif pa.types.is_map(t):
        t = pa.map_(t.key_field, relax(t.item_field))
    return pa.field(field.name, t, True, field.metadata)


_NO_VALUE = object()


def repeat_value(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` rows of ``value`` (None: nulls) of ``type_``, as ``pa.repeat`` gives them.

    Built from whole buffers where it can: ``pa.repeat`` grows its buffers step by step, each
    step zeroing fresh memory (4-6 ms for 131,072 int64 or short strings among other live
    arrays, against 0.6 ms for ``numpy.full``), and copies a binary value row by row (14 ms).
    """
    if value is None:
        return pa.nulls(n, type_)
    binary, string = pa.types.is_binary(type_), pa.types.is_string(type_)
    if n and (binary or string):
        data = value.encode() if string and isinstance(value, str) else value
        if isinstance(data, bytes) and len(data) * n < 1 << 31:
            offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(data))
            return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])
    elif n and (pa.types.is_integer(type_) or pa.types.is_floating(type_)) and not isinstance(value, bool):
        return pa.array(np.full(n, value, dtype=type_.to_pandas_dtype()), type=type_)
    return pa.repeat(pa.scalar(value, type_), n)


class _Constants:
    """Arrays of one value repeated, kept and handed out as slices (least recently used dropped
    beyond ``max_bytes``).

    Every piece's envelope repeats values shared by all its rows (``op``, the ``source`` fields
    fixed per table, a snapshot chunk's position and LSN, the absent images).  Building them anew
    cost a snapshot run 0.3-0.4 s of its ~1.4 s of client CPU for 1.5M rows, most of it the page
    faults of fresh buffers, on the thread that hands row groups to the encoders.  Arrays are
    immutable: a slice of a kept one is the same array as a new one.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._arrays: dict[tuple[pa.DataType, Any], pa.Array] = {}  # insertion order = use order
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, value: Any, type_: pa.DataType, n: int) -> pa.Array:
        """``n`` rows of ``value`` (None: nulls) of ``type_``."""
        key = (type_, value)
        try:
            hash(key)
        except TypeError:  # a value no dictionary can hold: built each time
            return repeat_value(value, type_, n)
        with self._lock:
            kept = self._arrays.pop(key, None)
            if kept is not None:
                # types compare without their fields' metadata, which a nested type must keep
                if len(kept) >= n and kept.type.equals(type_, check_metadata=True):
                    self._arrays[key] = kept
                    return kept.slice(0, n)
                self._bytes -= kept.get_total_buffer_size()
        array = repeat_value(value, type_, n)
        size = array.get_total_buffer_size()
        if size <= self.max_bytes // 8:
            with self._lock:
                if key not in self._arrays:
                    self._arrays[key] = array
                    self._bytes += size
                while self._bytes > self.max_bytes:
                    oldest = next(iter(self._arrays))
                    self._bytes -= self._arrays.pop(oldest).get_total_buffer_size()
        return array


#: the process's kept constant arrays (:class:`_Constants`)
CONSTANTS = _Constants(32 << 20)
constant = CONSTANTS.get

#: how the low-cardinality envelope strings (``op``, the ``source`` fields but ``sequence``) are
#: handed to the Parquet encoder: as dictionary arrays.  Given plain strings, the encoder hashes
#: every value to build its dictionary (~2 ms per 131,072-row column, ~10 % of a snapshot
#: chunk's encode for its constant ``source`` fields); given one-entry dictionaries it writes the
#: indices as they are.  The file stays as it was: the same Parquet columns (dictionary-encoded
#: strings) and the plain string schema in ``ARROW:schema`` (:func:`arrow_schema_entry`).
DICTIONARY_STRING = pa.dictionary(pa.int32(), pa.string())
#: the Parquet footer entry pyarrow and Arrow C++ restore a file's Arrow schema from
ARROW_SCHEMA_KEY = "ARROW:schema"


def arrow_schema_entry(schema: pa.Schema) -> dict[str, str]:
    """The ``ARROW:schema`` footer entry of ``schema``, as pyarrow writes it (base64 of the IPC
    schema message): readers then see ``schema``, field metadata included, whatever Arrow types
    the arrays were handed to the encoder as."""
    return {ARROW_SCHEMA_KEY: base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}


def as_dictionary(array: pa.Array) -> pa.Array:
    """``array`` (strings) as a :data:`DICTIONARY_STRING` array (its values hashed)."""
    if array.type == DICTIONARY_STRING:
        return array
    return array.dictionary_encode()


def dictionary_constant(value: str | None, n: int) -> pa.Array:
    """``n`` rows of ``value`` (None: nulls) as a one-entry :data:`DICTIONARY_STRING` array:
    nothing to hash."""
    if value is None:
        return pa.nulls(n, DICTIONARY_STRING)
    return pa.DictionaryArray.from_arrays(constant(0, pa.int32(), n), pa.array([value], pa.string()))


def dictionary_schema(schema: pa.Schema, source_fields: frozenset[str]) -> pa.Schema:
    """``schema`` with ``op`` and the ``source_fields`` leaves as :data:`DICTIONARY_STRING`."""
    source = schema.field("source")
    leaves = [f.with_type(DICTIONARY_STRING) if f.name in source_fields else f for f in source.type]
    return schema.set(schema.get_field_index("op"), schema.field("op").with_type(DICTIONARY_STRING)).set(
        schema.get_field_index("source"), source.with_type(pa.struct(leaves))
    )


def text_array(values: Sequence[Any]) -> tuple[pa.Array, list[bool] | None]:
    """Build a string array from text values; returns also the "not sent" mask if any."""
    try:
        return pa.array(values, type=pa.string()), None
    except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError):
        mask = [v is not None and not isinstance(v, (bytes, str)) for v in values]
        if not any(mask):
            raise
        cleaned = [None if m else v for v, m in zip(values, mask, strict=True)]
        return pa.array(cleaned, type=pa.string()), mask


class _NotSent:
    """Type of :data:`NOT_SENT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_SENT"

    def __reduce__(self) -> str:
        return "NOT_SENT"  # pickles as a reference to the module-level singleton


#: A value a source whose codecs convert Python values (``convert_values``) did not receive: a
#: partial row image (Vitess ``data_columns``).  Staged NULL and listed in ``__unavailable``, so
#: apply keeps the stored value.  Such a source calls :meth:`TableSink.expect_partial_images` first.
NOT_SENT = _NotSent()


class TableSink:
    """Writes one Parquet part (one table, one schema version) of a staged batch."""

    #: whether row images may hold :data:`NOT_SENT` (checked per piece only then)
    partial_images = False
    #: ``skip.messages.without.change``: updates that change no captured column are not written
    #: (:mod:`airflow_cdc.core.unchanged`); a source sets it on the stream sinks it applies to
    skip_unchanged = False

    def expect_partial_images(self) -> None:
        self.partial_images = True

    def __init__(
        self,
        path: str,
        rel_path: str,
        codecs: Sequence[Codec],
        select: Sequence[int],
        source: SourceLayout,
        kind: str,
        schema_version: str,
        piece_rows: int,
        schema_metadata: dict[bytes, bytes] | None = None,
        expand: Callable[[list[tuple]], tuple[list[bytes], list[tuple], list | None]] | None = None,
        key_columns: Sequence[str] = (),
        filesystem: Any = None,
        synced: set[str] | None = None,
    ) -> None:
        """:param filesystem: a ``pyarrow.fs`` filesystem ``path`` is in (None: local).
        :param synced: a local file is fsynced once closed (by whichever thread closes it: a
            writer thread overlaps that with the next rows) and its ``rel_path`` added here.
        """
        self._expand = expand or _expand_plain
        self._synced = synced if filesystem is None else None
        self._path = path
        self.rel_path, self.kind, self.schema_version = rel_path, kind, schema_version
        self._codecs, self._select, self._source = list(codecs), list(select), source
        self._piece_rows = piece_rows
        self._fields = [relax(c.field) for c in codecs]
        self.schema = envelope_schema(self._fields, source.type, schema_metadata, list(key_columns))
        names = [f.name for f in self._fields]
        self._key_slots = [names.index(k) for k in key_columns] if OLD_KEY_COLUMN in self.schema.names else []
        # dictionary-encode only the low-cardinality envelope columns (not ``source.sequence``,
        # distinct per event: its dictionary cost ~8% of the encode and saved nothing) and keep
        # statistics only for the position, ts_ms (bronze files by date) and the unchanged-TOAST
        # lists (their null counts prove a part has none, which lets the apply job skip the TOAST
        # fill and MERGE without reading stored values): statistics of all columns cost ~35% of
        # write time on high-cardinality row data for no gain
        self._dictionary_source = frozenset(
            f.name for f in source.type if pa.types.is_string(f.type) and f.name not in PER_EVENT
        )
        dictionary = ["op"] + [f"source.{name}" for name in sorted(self._dictionary_source)]
        #: what the encoder is handed (:data:`DICTIONARY_STRING`); readers see :attr:`schema`
        self._write_schema = dictionary_schema(self.schema, self._dictionary_source)
        statistics = [POSITION_COLUMN, "ts_ms"]
        if UNAVAILABLE_COLUMN in self.schema.names:
            statistics.append(f"{UNAVAILABLE_COLUMN}.list.element")
        self._writer = pq.ParquetWriter(
            path,
            self._write_schema,
            compression="snappy",
            use_dictionary=dictionary,
            write_statistics=statistics,
            filesystem=filesystem,
            store_schema=False,  # the plain schema is stored at close (arrow_schema_entry)
        )
        self._reset()
        #: where row groups are encoded and written (None: in the caller's thread); one write of
        #: this part is outstanding at most, so its row groups keep their order
        self.writes: BackgroundWrites | None = None
        self._pending: Future | None = None
        self.closed = False
        self.rows = 0
        self.ops: dict[str, int] = {}
        self.first_position: bytes | None = None
        self.last_position: bytes | None = None

    def _reset(self) -> None:
        self._rows: list[tuple] = []
        self._sampled = 0  # bytes of the sampled events of this piece

    def _full(self) -> bool:
        """Whether the piece is full: ``piece_rows`` events, or about :data:`PIECE_BYTES` by the
        sizes of every :data:`_SAMPLE`-th event (checked only when one is sampled)."""
        n = len(self._rows)
        if n >= self._piece_rows:
            return True
        if n % _SAMPLE:
            return False
        row = self._rows[-1]
        self._sampled += _image_bytes(row[1]) + _image_bytes(row[2])
        return self._sampled * _SAMPLE >= PIECE_BYTES

    @property
    def buffered(self) -> int:
        return len(self._rows)

    def append(
        self,
        op: str,
        before: tuple | None,
        after: tuple | None,
        position: bytes,
        source_values: tuple,
        txn: tuple | None = None,
    ) -> None:
        """Buffer one event; flushes a row group when the piece is full."""
        self._rows.append((op, before, after, position, source_values, txn))
        if self._full():
            self.flush()

    def add(self, row: tuple) -> None:
        """Buffer one event as ``(op, before, after, *source_specific)``; the sink's ``expand``
        turns the source-specific tail into positions, source values and transaction blocks
        for a whole piece at once (cheaper than per event on the hot path)."""
        self._rows.append(row)
        if self._full():
            self.flush()

    def add_many(self, rows: list[tuple]) -> None:
        """:meth:`add` for each of ``rows`` (pieces end exactly where they would)."""
        size, i = len(rows), 0
        while i < size:
            n = len(self._rows)
            take = min(size - i, self._piece_rows - n)
            if take <= 0:
                self.flush()
                continue
            # the events that would be sampled (the piece's 64th, 128th, ...) end the piece early
            # once the sampled sizes reach PIECE_BYTES
            first = (-n) % _SAMPLE or _SAMPLE
            for k in range(first, take + 1, _SAMPLE):
                row = rows[i + k - 1]
                self._sampled += _image_bytes(row[1]) + _image_bytes(row[2])
                if self._sampled * _SAMPLE >= PIECE_BYTES:
                    take = k
                    break
            self._rows += rows[i : i + take] if i or take < size else rows
            i += take
            if len(self._rows) >= self._piece_rows or self._sampled * _SAMPLE >= PIECE_BYTES:
                self.flush()

    def _columns(self, rows: list[tuple | None]) -> dict[int, list]:
        """The selected columns' values of ``rows`` (None where a row is None), by column index."""
        if _transpose is not None:
            try:
                return dict(zip(self._select, _transpose(rows, self._select), strict=True))
            except IndexError as e:
                raise ProtocolError(
                    f"{self.rel_path}: a row image has fewer columns than the table ({e})"
                ) from None
        columns = {}
        for idx in self._select:
            try:
                columns[idx] = [r[idx] if r is not None else None for r in rows]
            except IndexError:
                raise ProtocolError(
                    f"{self.rel_path}: a row image has fewer columns than the table (column index {idx})"
                ) from None
        return columns

    def _image(self, rows: list[tuple | None], want_unavailable: bool) -> tuple[pa.Array, list | None]:
        texts: list[pa.Array] = []
        unchanged: list[pa.BooleanArray | None] = []
        columns = self._columns(rows)
        for idx in self._select:
            values = columns[idx]
            native = getattr(self._codecs[len(texts)], "convert_values", None)
            if native is not None:  # sources that decode binary values themselves (MySQL binlog)
                mask = None
                if self.partial_images:
                    flags = [v is NOT_SENT for v in values]
                    if any(flags):
                        values = [None if f else v for v, f in zip(values, flags, strict=True)]
                        mask = pa.array(flags, type=pa.bool_())
                texts.append(native(values))
                unchanged.append(mask)
                continue
            text, mask = text_array(values)
            texts.append(text)
            unchanged.append(None if mask is None else pa.array(mask, type=pa.bool_()))
        present = pa.array([r is not None for r in rows], type=pa.bool_())
        return self._struct(RowImages(present, texts, unchanged), want_unavailable)

    def _struct(self, image: RowImages, want_unavailable: bool) -> tuple[pa.Array, list | None]:
        """Convert a row image's text columns into the row struct; also the names of the
        columns not sent, per row, when ``want_unavailable`` and some were not sent."""
        n = len(image.present)
        children: list[pa.Array] = []
        unavailable: list[list[str]] | None = None
        for codec, text, mask in zip(self._codecs, image.texts, image.unchanged, strict=True):
            native = getattr(codec, "convert_values", None) is not None  # converted in _image
            arr = text if native else codec.convert(text)
            if mask is not None:
                if codec.placeholder is not None:
                    arr = pa.compute.if_else(mask, codec.placeholder, arr)
                if want_unavailable:
                    unavailable = unavailable or [[] for _ in range(n)]
                    name = codec.field.name
                    for i, m in enumerate(mask.to_pylist()):
                        if m:
                            unavailable[i].append(name)
            children.append(arr)
        children = [
            a if a.type == f.type else a.cast(f.type) for a, f in zip(children, self._fields, strict=True)
        ]
        struct = pa.StructArray.from_arrays(
            children, fields=self._fields, mask=pa.compute.invert(image.present)
        )
        return struct, unavailable

    def flush(self) -> None:
        """Convert the buffered events and write them as one row group."""
        rows = self._rows
        if not rows:
            return
        if self.skip_unchanged:
            native = [getattr(c, "convert_values", None) is not None for c in self._codecs]
            rows = drop_unchanged_rows(rows, self._columns, self._select, native, text_array, (NOT_SENT,))
            if not rows:
                self._reset()
                return
        ops = [r[0] for r in rows]
        before, _ = self._image([r[1] for r in rows], False)
        after, unavailable = self._image([r[2] for r in rows], True)
        positions, src, txn = self._expand(rows)
        counts = {op: ops.count(op) for op in set(ops)}
        self._write(
            pa.array(ops, type=pa.string()),
            counts,
            before,
            after,
            positions if isinstance(positions, pa.Array) else pa.array(positions, type=pa.binary()),
            src,
            txn,
            unavailable,
        )
        self._reset()

    def write_piece(self, piece: ColumnarPiece) -> None:
        """Write a piece given column-wise as one row group (after any buffered events)."""
        self.flush()
        kept = drop_unchanged_piece(piece) if self.skip_unchanged else piece
        if kept is None:
            return
        before, _ = self._struct(kept.before, False)
        after, unavailable = self._struct(kept.after, True)
        self._write(kept.ops, kept.op_counts, before, after, kept.positions, kept.source, None, unavailable)

    def _write(
        self,
        ops: pa.Array,
        op_counts: dict[str, int],
        before: pa.Array,
        after: pa.Array,
        positions: pa.Array,
        src_rows: list[tuple] | tuple | dict[str, pa.Array],
        txn: list[tuple | None] | None,
        unavailable: list | None,
    ) -> None:
        n = len(ops)
        ts_us = now_us()
        before, old_key = self._old_key(ops, before)
        txn_arr = (
            pa.array(
                [
                    None
                    if t is None
                    else dict(zip(("id", "total_order", "data_collection_order"), t, strict=True))
                    for t in txn
                ],
                type=TRANSACTION_TYPE,
            )
            if txn and txn.count(None) < len(txn)
            else pa.nulls(n, TRANSACTION_TYPE)
        )
        unavail_arr = (
            pa.array([u or None for u in unavailable], type=pa.list_(pa.string()))
            if unavailable
            else pa.nulls(n, pa.list_(pa.string()))
        )
        only = [op for op, count in op_counts.items() if count == n]  # one op for every row
        table = pa.Table.from_arrays(
            [
                dictionary_constant(only[0], n) if only else as_dictionary(ops),
                constant(ts_us // 1000, pa.int64(), n),
                constant(ts_us, pa.int64(), n),
                constant(ts_us * 1000, pa.int64(), n),
                before,
                after,
                self._source.build(n, src_rows, self._dictionary_source),
                txn_arr,
                positions,
                unavail_arr,
                *old_key,
            ],
            schema=self._write_schema,
        )
        self._write_table(table)
        self.rows += n
        for op, count in op_counts.items():
            self.ops[op] = self.ops.get(op, 0) + count
        if self.first_position is None:
            self.first_position = positions[0].as_py()
        self.last_position = positions[n - 1].as_py()

    def _write_table(self, table: pa.Table) -> None:
        rows = row_group_rows(table)
        if self.writes is None:
            self._writer.write_table(table, row_group_size=rows)
            return
        self._wait()
        self._pending = self.writes.submit(self._writer.write_table, table, row_group_size=rows)

    def _wait(self) -> None:
        """Wait for the outstanding row-group write; raises what it raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _old_key(self, ops: pa.Array, before: pa.Array) -> tuple[pa.Array, list[pa.Array]]:
        """Move the before image of key-change ``c`` events into ``__old_key`` (null elsewhere)."""
        if not self._key_slots:
            return before, []
        key_type = self.schema.field(OLD_KEY_COLUMN).type
        carriers = pc.and_(pc.equal(ops, "c"), before.is_valid())
        if not pc.any(carriers).as_py():
            return before, [pa.nulls(len(ops), key_type)]
        old_key = pa.StructArray.from_arrays(
            [before.field(i) for i in self._key_slots], fields=list(key_type), mask=pc.invert(carriers)
        )
        children = [before.field(i) for i in range(before.type.num_fields)]
        kept = pc.and_(before.is_valid(), pc.invert(carriers))
        before = pa.StructArray.from_arrays(children, fields=list(before.type), mask=pc.invert(kept))
        return before, [old_key]

    def write_columnar(
        self, op: str, columns: Sequence[pa.Array], position: bytes, source_values: tuple
    ) -> None:
        """Write rows given column-wise as text arrays (snapshot chunks): all share op and position."""
        self.flush()
        n = len(columns[0]) if columns else 0
        if n == 0:
            return
        children = [
            codec.convert(columns[idx]) for codec, idx in zip(self._codecs, self._select, strict=True)
        ]
        children = [
            a if a.type == f.type else a.cast(f.type) for a, f in zip(children, self._fields, strict=True)
        ]
        after = pa.StructArray.from_arrays(children, fields=self._fields)
        row_type = pa.struct(self._fields)
        self._write(
            constant(op, pa.string(), n),  # not a list of n references: ~1 µs/row
            {op: n},
            constant(None, row_type, n),
            after,
            constant(position, pa.binary(), n),
            source_values,
            None,
            None,
        )

    def close(self) -> PartInfo:
        """Flush and close the file; returns what the manifest records about this part."""
        return self.close_later().result()

    def close_later(self) -> Future:
        """Flush and close the file without waiting for the outstanding row-group write: the file
        is closed by the writer thread that finishes it (at once when none is outstanding).  The
        future gives what the manifest records about this part (:class:`PartInfo`), or raises
        what the write or the close raised; nothing more may be written to the sink."""
        self.flush()
        pending, self._pending = self._pending, None
        self.closed = True
        done: Future = Future()

        def finish(_: Any = None) -> None:
            try:
                try:
                    if pending is not None:
                        pending.result()
                finally:
                    self._writer.add_key_value_metadata(arrow_schema_entry(self.schema))
                    self._writer.close()
                if self._synced is not None:
                    make_private(self._path)  # before the fsync: the mode is as durable as the rows
                    fsync_file(self._path)
                    self._synced.add(self.rel_path)
            except BaseException as e:  # noqa: BLE001 - handed to whoever settles the part
                done.set_exception(e)
            else:
                first, last = self.first_position, self.last_position
                done.set_result(
                    PartInfo(
                        self.rel_path,
                        self.rows,
                        self.kind,
                        self.schema_version,
                        first.hex() if first else None,
                        last.hex() if last else None,
                        dict(self.ops),
                    )
                )

        if pending is None:
            finish()
        else:
            pending.add_done_callback(finish)
        return done


#: rows after which a table's snapshot part written in the background is closed (by its writer
#: thread, :meth:`TableSink.close_later`) and the next rows go to a new part: a part's row groups
#: are encoded one after another, so a large table's rows would otherwise be encoded by one
#: thread while the other waits (one part per chunk of the default chunk sizes' largest)
ROTATE_ROWS = 1 << 17
#: overrides :data:`ROTATE_ROWS` (tests: rotation with small tables)
PART_ROWS_ENV = "AIRFLOW_CDC_SNAPSHOT_PART_ROWS"


#: rows from which a snapshot chunk is encoded as a part of its own as soon as it is read
#: (:meth:`BatchWriter.write_ahead`): smaller chunks would make many small files
AHEAD_ROWS = 1 << 14
#: overrides :data:`AHEAD_ROWS` (tests: chunks of a few rows written ahead)
AHEAD_ROWS_ENV = "AIRFLOW_CDC_SNAPSHOT_AHEAD_ROWS"


def ahead_rows() -> int:
    return int(os.environ.get(AHEAD_ROWS_ENV) or AHEAD_ROWS)


def snapshot_part_rows() -> int:
    """Rows after which a snapshot part written in the background rotates (:data:`ROTATE_ROWS`,
    or :data:`PART_ROWS_ENV`)."""
    value = os.environ.get(PART_ROWS_ENV, "")
    return max(1, int(value)) if value.strip().isdigit() else ROTATE_ROWS


class SnapshotSinks:
    """The open snapshot sink of each (batch, table, table structure).

    A table's chunks, pre-images and purges of one batch share one part -- or, when written in
    the background, a new part once one holds :func:`snapshot_part_rows`, so that several are
    encoded side by side; a structure change inside the run (a new ``signature``) opens a new
    part, as the stream side does.  States are the sources' table states: anything with
    ``name``, ``signature`` and ``open_sink(writer, kind)``.
    """

    def __init__(self) -> None:
        self._open: dict[tuple, TableSink] = {}

    def get(self, writer: Any, state: Any) -> TableSink:
        key = (id(writer), state.name, state.signature)
        sink = self._open.get(key)
        if sink is None or sink.closed or (sink.writes is not None and sink.rows >= snapshot_part_rows()):
            sink = self._open[key] = state.open_sink(writer, "snapshot")
        return sink

    def clear(self) -> None:
        self._open.clear()
