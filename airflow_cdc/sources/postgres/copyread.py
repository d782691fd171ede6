"""Snapshot chunk reads: ``COPY (SELECT ...) TO STDOUT`` into Arrow string columns.

Two paths give the same table (one string column ``c<i>`` per selected column, the server's
text output of each value, NULL as null):

- compiled (``_pgcopy``, built by ``pip install``): the text-format COPY is drained by libpq's
  ``PQgetCopyData`` in a C loop -- the libpq psycopg itself uses, so the connection is shared --
  and each row is unescaped straight into Arrow buffers;
- pure Python (the reference, and the fallback when the extension is not built, psycopg's
  libpq cannot be located, or ``AIRFLOW_CDC_PG_COPY=python``): a CSV-format COPY read through
  psycopg and parsed by ``pyarrow.csv``.
"""

from __future__ import annotations

import ctypes
import functools
import io
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import generators, pq

try:
    from airflow_cdc.sources.postgres._pgcopy import read as _read
except ImportError:  # not built (a source checkout without pip install): pure Python
    _read = None
try:
    from airflow_cdc.sources.postgres._pgcopy import pairs as _pairs
except ImportError:  # not built, or built before it had the reader: the window uses a cursor
    _pairs = None
try:
    from airflow_cdc.sources.postgres._pgcopy import zoned_iso as _zoned_iso
except ImportError:  # not built, or built before it had the kernel: the string kernels run
    _zoned_iso = None

log = logging.getLogger(__name__)

COPY_ENV = "AIRFLOW_CDC_PG_COPY"
#: Value bytes buffered before the compiled reader hands a piece over (bounds its buffers and
#: keeps every string column far below Arrow's 32-bit offsets).
MAX_PIECE_BYTES = 64 << 20


@functools.cache
def _libpq_functions() -> tuple[int, int] | None:
    """Addresses of ``PQgetCopyData`` and ``PQfreemem`` in the libpq psycopg uses, or None."""
    impl = pq.__impl__  # type: ignore[attr-defined]
    try:
        if impl == "python":
            from psycopg.pq import _pq_ctypes

            lib: Any = _pq_ctypes.pq  # type: ignore[attr-defined]  # the ctypes CDLL (not in its stub)
        else:
            lib = ctypes.CDLL(_loaded_libpq(impl))
        get = ctypes.cast(lib.PQgetCopyData, ctypes.c_void_p).value
        free = ctypes.cast(lib.PQfreemem, ctypes.c_void_p).value
    except (OSError, AttributeError, ImportError, LookupError) as e:
        log.info("compiled COPY reader disabled: psycopg's libpq not found (%s)", e)
        return None
    return (get, free) if get and free else None


def _loaded_libpq(impl: str) -> str:
    """The path of the libpq this process loaded for psycopg (``binary``: the bundled copy).

    :raises LookupError: none, or more than one candidate.
    """
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libpq" in line and ".so" in line}
    if impl == "binary":
        paths = {p for p in paths if "psycopg_binary" in p}
    if len(paths) != 1:
        raise LookupError(f"{len(paths)} loaded libpq candidates")
    return paths.pop()


def native_available() -> bool:
    """Whether the compiled reader is built, usable, and not disabled through ``AIRFLOW_CDC_PG_COPY``."""
    if _read is None or os.environ.get(COPY_ENV, "").lower() == "python":
        return False
    return _libpq_functions() is not None


def pairs_available() -> bool:
    """Whether :class:`PairCopy` can read (the compiled reader is built, with its ``pairs``)."""
    return _pairs is not None and native_available()


class PairCopy:
    """``fetchmany`` over a started binary ``COPY`` of ``(bigint, bytea)`` rows, drained by the
    compiled reader: the lists of ``(int, bytes)`` tuples a binary cursor's ``fetchmany`` gives,
    without psycopg's per-row work or a ``FETCH`` round trip per batch.  An empty list: the COPY
    ended (its final result checked).  Only one thread may call it at a time.

    :raises psycopg.Error: the server failed the statement (as psycopg raises it), or the
        connection failed.
    """

    def __init__(self, conn: psycopg.Connection, copy: Any) -> None:
        functions = _libpq_functions()
        assert _pairs is not None and functions is not None
        self.conn, self.copy, self.functions = conn, copy, functions
        self.header, self.done = True, False

    def fetchmany(self, size: int) -> list[tuple[int, bytes]]:
        if self.done:
            return []
        pgconn = self.conn.pgconn
        address = pgconn.pgconn_ptr  # type: ignore[attr-defined]  # psycopg >= 3.1 (not in the stub)
        status, rows = _pairs(address, *self.functions, size, self.header)
        self.header = False
        if status == 0:
            return rows
        self.done = True
        if status == -2:
            raise psycopg.OperationalError(f"COPY of the change window failed: {_error_text(pgconn)}")
        if status != 1:
            raise psycopg.DataError("COPY of the change window: a row is not (bigint, bytea)")
        _end_copy(self.conn, self.copy)
        return rows


def zoned_iso(text: pa.Array, precision: int) -> pa.Array | None:
    """``timestamptz`` text output (``+00``) as Debezium ZonedTimestamp strings with exactly
    ``precision`` (0 to 6) fraction digits, in one compiled pass; NULL where a value is not in
    the common shape (for the caller's row-by-row path).  None when the compiled kernel is not
    built, ``precision`` is out of range or ``AIRFLOW_CDC_PG_COPY=python`` (the caller's string
    kernels then run).
    """
    if _zoned_iso is None or not 0 <= precision <= 6 or os.environ.get(COPY_ENV, "").lower() == "python":
        return None  # (a timestamptz has at most 6 digits)
    valid, offsets, data = text.buffers()
    n = len(text)
    if offsets is None or data is None:  # an empty array may come without buffers
        return pa.nulls(n, pa.string()) if n else pa.array([], pa.string())
    out_offsets, out_data, out_valid, nulls = _zoned_iso(offsets, data, valid, text.offset, n, precision)
    bufs = [pa.py_buffer(out_valid) if nulls else None, pa.py_buffer(out_offsets), pa.py_buffer(out_data)]
    return pa.Array.from_buffers(pa.string(), n, bufs, null_count=nulls)


def read_table(conn: psycopg.Connection, query: Callable[[str], Any], ncols: int) -> pa.Table:
    """Run a COPY TO STDOUT of ``ncols`` columns and return its rows as string columns.

    :param query: ``query(format)`` is the COPY statement in ``"text"`` or ``"csv"`` format.
    :raises psycopg.Error: the server failed the query (as psycopg raises it).
    """
    if native_available():
        return _native_table(conn, query("text"), ncols)
    return parse_csv(_copy_bytes(conn, query("csv")), ncols)


def iter_table(
    conn: psycopg.Connection, query: Callable[[str], Any], ncols: int, piece_bytes: int = 16 << 20
) -> Iterator[pa.Table]:
    """:func:`read_table` handed on in pieces of about ``piece_bytes`` value bytes, as the COPY
    streams in: a table of any size passes through a bounded amount of memory.

    :raises psycopg.Error: the server failed the query (after the pieces before the failure).
    """
    if native_available():
        yield from _native_pieces(conn, query("text"), ncols, piece_bytes)
        return
    rows: list[bytes] = []
    size = 0
    with conn.cursor().copy(query("csv")) as copy:
        while data := copy.read():  # one row per call (libpq hands COPY data over row by row)
            rows.append(bytes(data))
            size += len(data)
            if size >= piece_bytes:
                yield parse_csv(b"".join(rows), ncols)
                rows, size = [], 0
    if rows:
        yield parse_csv(b"".join(rows), ncols)


def _names(ncols: int) -> list[str]:
    return [f"c{i}" for i in range(ncols)]


def _native_table(conn: psycopg.Connection, statement: Any, ncols: int) -> pa.Table:
    pieces = list(_native_pieces(conn, statement, ncols, MAX_PIECE_BYTES))
    if not pieces:
        return parse_csv(b"", ncols)
    return pa.concat_tables(pieces)


def _native_pieces(
    conn: psycopg.Connection, statement: Any, ncols: int, piece_bytes: int
) -> Iterator[pa.Table]:
    functions = _libpq_functions()
    assert _read is not None and functions is not None
    with conn.cursor().copy(statement) as copy:
        pgconn = conn.pgconn
        while True:
            address = pgconn.pgconn_ptr  # type: ignore[attr-defined]  # psycopg >= 3.1 (not in the stub)
            status, n, columns = _read(address, *functions, ncols, piece_bytes)
            if n:
                yield pa.Table.from_arrays([_strings(n, *c) for c in columns], names=_names(ncols))
            if status == 0:
                continue
            if status == 1:
                break
            if status == -2:
                raise psycopg.OperationalError(f"COPY chunk read failed: {_error_text(pgconn)}")
            raise psycopg.DataError(f"COPY chunk row without {ncols} fields (status {status})")
        _end_copy(conn, copy)


def _end_copy(conn: psycopg.Connection, copy: Any) -> None:
    """After the compiled reader saw a COPY end: fetch its final result, the command status or
    the server's error (raised as psycopg raises it)."""
    results = conn.wait(generators.fetch_many(conn.pgconn))
    copy._finished = True  # psycopg must not read the ended COPY again on exit
    result = results[-1]
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)


def _error_text(pgconn: Any) -> str:
    return bytes(pgconn.error_message or b"").decode(errors="replace").strip() or "connection error"


def _strings(n: int, offsets: bytes, data: bytes, valid: bytes | None) -> pa.Array:
    bufs = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    arr = pa.Array.from_buffers(pa.string(), n, bufs)
    # the values are the server's bytes: reject invalid UTF-8 as the CSV path does
    arr.validate(full=True)
    return arr


def _copy_bytes(conn: psycopg.Connection, statement: Any) -> bytes:
    """All data of a COPY TO STDOUT; one buffer (no per-row objects kept alive for the GC)."""
    out = bytearray()
    with conn.cursor().copy(statement) as copy:
        while data := copy.read():
            out += data
    return bytes(out)


def parse_csv(data: bytes, ncols: int) -> pa.Table:
    """CSV-format COPY output as string columns (unquoted empty field: NULL)."""
    names = _names(ncols)
    if not data:
        return pa.table({n: pa.array([], pa.string()) for n in names})
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 24),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
