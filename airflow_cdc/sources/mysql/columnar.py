"""Columnar hand-over of the binlog window: row images read by the compiled decoder straight into
Arrow buffers, the MySQL twin of PostgreSQL's :mod:`airflow_cdc.sources.postgres.columnar`.

``_binlogrows.Columns`` (``_binlogcols.c``) reads every row image of a rows event into per-column
buffers of the staged types, plus the events' op, position, ``source.pos``/``row`` and an index
into the transaction facts (``info``) of the piece; :class:`ColumnarBuffer` wraps them as a
:class:`~airflow_cdc.core.table_sink.ColumnarPiece` for the table's stream sink.  A captured
column gets fixed-width or string buffers where its codec says which (:func:`types.columnar`)
and its binlog type is the one that codec reads; any other column (TIMESTAMP, ENUM, binary
JSON, spatial, a mapped column, a declared type that differs from the binlog's) gets the same
neutral Python values the tuple path builds, converted by its codec: both routes stage identical
rows.  The tuple path (:meth:`TableState.events`) stays the reference and runs where this one
does not apply: skipped operations, transaction blocks, chunk tracking,
``skip.messages.without.change``, ``AIRFLOW_CDC_MYSQL_ROWS=python``, or
``AIRFLOW_CDC_MYSQL_COLUMNAR=0`` (the compiled reader then builds event tuples).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.core.table_sink import (
    PIECE_BYTES,
    BackgroundWrites,
    ColumnarPiece,
    RowImages,
    TableSink,
    snapshot_threads,
)
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.types import MySqlCodec

try:
    from airflow_cdc.sources.mysql._binlogrows import Columns as _Columns
except ImportError:  # not built: events as tuples (or the pure-Python readers)
    _Columns = None

log = logging.getLogger(__name__)
COLUMNAR_ENV = "AIRFLOW_CDC_MYSQL_COLUMNAR"
# buffer kinds of _binlogcols.c
M_OBJECT, M_INT, M_FLOAT, M_DECIMAL, M_BYTES, M_DATETIME = range(6)
_INTEGERS = frozenset(rc.INT_TYPES)
_FLOATS = frozenset({rc.T_FLOAT, rc.T_DOUBLE})
_VARIABLE = frozenset(
    {
        rc.T_VARCHAR, rc.T_VAR_STRING, rc.T_STRING, rc.T_BLOB, rc.T_TINY_BLOB, rc.T_MEDIUM_BLOB,
        rc.T_LONG_BLOB, rc.T_JSON,
    }
)  # fmt: skip


def mode_of(codec: Any, col: rc.ColumnLayout) -> tuple:
    """The buffer kind of one captured column: its codec's :func:`types.columnar` tag where the
    binlog type is the one the tag's converter expects, else :data:`M_OBJECT` (Python values)."""
    spec = getattr(codec.convert_values, "columnar", None) if type(codec) is MySqlCodec else None
    kind, t = spec[0] if spec else None, col.type
    if kind == "int" and t in _INTEGERS or kind == "bool" and (t in _INTEGERS or t == rc.T_BIT):
        return (M_INT,)
    if kind == "float" and t in _FLOATS:
        return (M_FLOAT,)
    if kind == "decimal" and t == rc.T_NEWDECIMAL:
        arrow = codec.field.type
        if (col.meta >> 8, col.meta & 0xFF) == (arrow.precision, arrow.scale):
            return (M_DECIMAL,)
    if kind == "text" and t in _VARIABLE and not (t == rc.T_JSON and col.json is not None):
        return (M_BYTES,)
    if kind == "datetime" and spec and t == rc.T_DATETIME2:
        _, divisor, zero, adjust = spec
        return (M_DATETIME, divisor, zero, adjust)
    return (M_OBJECT,)


def new_columns(state: Any) -> Any:
    """The compiled column buffers of a table state, or None (not built, disabled, or a column type
    the compiled decoder does not read)."""
    if _Columns is None or not rc.native_available() or not state.layout:
        return None
    if os.environ.get(COLUMNAR_ENV, "") == "0":
        return None
    layout = [(c.type, c.meta, bool(c.unsigned), c.json) for c in state.layout]
    modes = [mode_of(codec, state.layout[i]) for codec, i in zip(state.codecs, state.select, strict=True)]
    try:
        return _Columns(layout, state.select, modes, state.key_index)
    except NotImplementedError:
        return None


_writes: tuple[int, BackgroundWrites] | None = None  # (the process that made it, the threads)


def background_writes() -> BackgroundWrites | None:
    """The thread that encodes and writes the pieces' row groups while the window is decoded
    (one write outstanding per part, so row groups keep their order); None where
    ``AIRFLOW_CDC_SNAPSHOT_THREADS=0`` keeps every write in the caller's thread."""
    global _writes
    if not snapshot_threads():
        return None
    if _writes is None or _writes[0] != os.getpid():  # a forked child has none of the threads
        _writes = (os.getpid(), BackgroundWrites(threads=1, most=2))
    return _writes[1]


def _buf(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _bools(n: int, bitmap: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bitmap)])


def _column(n: int, codec: Any, mode: tuple, taken: tuple) -> pa.Array:
    """One captured column of a piece as its codec would have converted it."""
    valid, data, offsets = taken
    kind = mode[0]
    if kind == M_OBJECT:
        return codec.convert_values(data)  # type: ignore[no-any-return]
    field_type = codec.field.type
    if kind == M_BYTES:
        raw = pa.Array.from_buffers(pa.binary(), n, [_buf(valid), pa.py_buffer(offsets), pa.py_buffer(data)])
        try:
            return raw.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # not UTF-8: the codec's own decoding
            return codec.convert_values(raw.to_pylist())  # type: ignore[no-any-return]
    if kind == M_DECIMAL:
        return pa.Array.from_buffers(field_type, n, [_buf(valid), pa.py_buffer(data)])
    arr = pa.Array.from_buffers(
        pa.float64() if kind == M_FLOAT else pa.int64(), n, [_buf(valid), pa.py_buffer(data)]
    )
    if pa.types.is_boolean(field_type):
        return pc.not_equal(arr, 0)
    return arr if arr.type == field_type else arr.cast(field_type)


def _image(n: int, codecs: list, modes: list[tuple], taken: tuple) -> RowImages:
    present, columns = taken
    if columns is None:  # no event of the piece has this image
        texts = [pa.nulls(n, c.field.type) for c in codecs]
        return RowImages(_bools(n, present), texts, [None] * len(texts))
    texts = [_column(n, c, m, t) for c, m, t in zip(codecs, modes, columns, strict=True)]
    return RowImages(_bools(n, present), texts, [None] * len(texts))


def _runs(infos: list[tuple], index: pa.Array, i: int, arrow: pa.DataType) -> pa.Array:
    return pa.array([info[i] for info in infos], arrow).take(index)


def to_piece(taken: tuple, infos: list[tuple], codecs: list, modes: list[tuple]) -> ColumnarPiece:
    """Wrap what ``Columns.take`` returned (``infos``: the piece's transaction facts, as
    :func:`stream.expand_events` reads them) as the piece the stream sink writes."""
    n, counts, ops, positions, pos, row, info, before, after = taken
    index = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(info)])
    ts_ms = _runs(infos, index, 0, pa.int64())
    source = {
        "ts_ms": ts_ms,
        "server_id": _runs(infos, index, 1, pa.int64()),
        "gtid": _runs(infos, index, 2, pa.string()),
        "file": _runs(infos, index, 3, pa.string()),
        "pos": pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(pos)]),
        "row": pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(row)]),
        "thread": _runs(infos, index, 5, pa.int64()),
        "query": _runs(infos, index, 6, pa.string()),
        # ts_us/ts_ns: Debezium derives all three from the binlog event's time (whole seconds)
        "ts_us": pc.multiply(ts_ms, 1000),
        "ts_ns": pc.multiply(ts_ms, 1_000_000),
    }
    offsets = np.arange(n + 1, dtype=np.int32).tobytes()
    return ColumnarPiece(
        ops=pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(ops)]),
        op_counts={op: k for op, k in counts.items() if k},
        positions=pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(positions)]).cast(pa.binary()),
        source=source,
        before=_image(n, codecs, modes, before),
        after=_image(n, codecs, modes, after),
    )


class ColumnarBuffer:
    """The events of one table structure not yet handed to its stream sink, column-wise.

    The caller flushes it before any other event of the table reaches the sink (events keep
    their order) and at the end of the window; a piece is handed over at ``piece_rows`` events or
    :data:`PIECE_BYTES` of string values.  After a decoding error the buffer must be dropped.
    """

    def __init__(self, state: Any, columns: Any, sink: Callable[[], TableSink], piece_rows: int) -> None:
        self.state, self._columns, self._sink, self._piece_rows = state, columns, sink, piece_rows
        self._modes = [mode_of(c, state.layout[i]) for c, i in zip(state.codecs, state.select, strict=True)]
        self._infos: list[tuple] = []
        if log.isEnabledFor(logging.DEBUG):
            names = [
                state.tdef.columns[i].name if i < len(state.tdef.columns) else str(i) for i in state.select
            ]
            kinds = ("object", "int", "float", "decimal", "bytes", "datetime")
            log.debug(
                "table %s: column buffers %s",
                state.name,
                ", ".join(f"{n}={kinds[m[0]]}" for n, m in zip(names, self._modes, strict=True)),
            )

    @property
    def modes(self) -> list[tuple]:
        """The buffer kind of each captured column (:func:`mode_of`)."""
        return self._modes

    def add(
        self, body: Any, o: int, op: str, present: list[bool], after: list[bool] | None, pos: int, info: tuple
    ) -> int | None:
        """Append the events of one rows event (``body[o:]``: its row images); returns how many,
        or None where the compiled reader does not read these images (nothing appended).

        :raises SchemaError: an UPDATE/DELETE image lacks columns (see :meth:`TableState.decode`).
        :raises ProtocolError: a row image is malformed.
        """
        layouts = self.state.native_layouts(op, present, after, pos)
        if layouts is None:
            return None
        if not self._infos or self._infos[-1] is not info:
            self._infos.append(info)
        try:
            n: int = self._columns.add(
                body, o, op, layouts[0], layouts[1], pos, len(self._infos) - 1, info[4]
            )
        except ValueError as e:
            raise ProtocolError(f"table {self.state.name}: cannot decode rows event at {pos}: {e}") from e
        if self._columns.events >= self._piece_rows or self._columns.text_bytes >= PIECE_BYTES:
            self.flush()
        return n

    def flush(self) -> None:
        """Hand the buffered events to the table's stream sink as one piece (nothing if none)."""
        if not self._columns.events:
            return
        taken, infos = self._columns.take(), self._infos
        self._infos = []
        sink = self._sink()
        if sink.writes is None:
            sink.writes = background_writes()
        sink.write_piece(to_piece(taken, infos, self.state.codecs, self._modes))
