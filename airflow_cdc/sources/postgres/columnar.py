"""Columnar fast path of the change window: the compiled pgoutput decoder and its Arrow hand-over.

The compiled ``_pgoutput.Decoder`` (C, built by ``pip install``) decodes Insert/Update/Delete
messages of registered relations straight into Arrow buffers: per captured column one string
array per row image, plus the envelope facts.  Everything else -- transaction framing,
relations, truncates, messages, and any row it finds malformed -- it leaves to the pure-Python
decoder in :mod:`stream`, which stays the reference: both paths produce identical pieces, and a
malformed row is rejected by the Python parser with its :class:`ProtocolError`.

Set ``AIRFLOW_CDC_PG_DECODER=python`` to force the pure-Python path (it also runs when the
extension is not built).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.table_sink import ColumnarPiece, RowImages
from airflow_cdc.sources.postgres.types_base import floor_div

try:
    from airflow_cdc.sources.postgres._pgoutput import Decoder as _Decoder
except ImportError:  # not built (e.g. a source checkout without pip install): pure Python
    _Decoder = None

DECODER_ENV = "AIRFLOW_CDC_PG_DECODER"
#: Text bytes buffered per relation before a piece is handed over, whatever its row count:
#: bounds memory for wide rows and keeps every string column within Arrow's 32-bit offsets.
MAX_PIECE_BYTES = 64 << 20


def native_available() -> bool:
    """Whether the compiled decoder is built and not disabled through ``AIRFLOW_CDC_PG_DECODER``."""
    return _Decoder is not None and os.environ.get(DECODER_ENV, "").lower() != "python"


def native_decoder(piece_rows: int, skipped: frozenset[str], max_bytes: int | None = None) -> Any:
    """A compiled decoder for one window, or ``None`` when only the pure-Python path is available.

    :param piece_rows: events per relation handed over as one piece (``staging.piece.rows``).
    :param skipped: operations not emitted (``c``, ``u``, ``d``; others are ignored here).
    :param max_bytes: message bytes per relation after which a piece is handed over early
        (default :data:`MAX_PIECE_BYTES`).
    """
    if not native_available():
        return None
    return _Decoder(piece_rows, max_bytes or MAX_PIECE_BYTES, "".join(sorted(skipped & {"c", "u", "d"})))  # type: ignore[misc]


def _buf(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _strings(n: int, offsets: bytes, data: bytes, valid: bytes | None = None) -> pa.Array:
    arr = pa.Array.from_buffers(pa.string(), n, [_buf(valid), pa.py_buffer(offsets), pa.py_buffer(data)])
    # the values are the server's bytes: reject invalid UTF-8 as pa.array() does on the Python path
    arr.validate(full=True)
    return arr


def _bools(n: int, bitmap: bytes) -> pa.BooleanArray:
    return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(bitmap)])


def _int64(n: int, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(data)])


def _images(n: int, taken: tuple[bytes, list[tuple]] | None, width: int) -> RowImages:
    """A row image of the piece; ``None``: no event of the piece has it (the before image of
    inserts, or of updates without an old image): ``width`` null columns, written by Arrow alone."""
    if taken is None:
        return RowImages(pa.repeat(pa.scalar(False), n), [pa.nulls(n, pa.string())] * width, [None] * width)
    present, columns = taken
    texts = [_strings(n, off, data, valid) for off, data, valid, _ in columns]
    unchanged = [None if toast is None else _bools(n, toast) for *_, toast in columns]
    return RowImages(_bools(n, present), texts, unchanged)


def _origins(n: int, taken: tuple[bytes, bytes, bytes, bytes] | None) -> dict[str, pa.Array]:
    """``source.origin`` and ``origin_lsn`` of a piece (None: no row has an origin)."""
    if taken is None:
        return {"origin": pa.nulls(n, pa.string()), "origin_lsn": pa.nulls(n, pa.int64())}
    offsets, data, valid, lsn = taken
    return {
        "origin": _strings(n, offsets, data, valid),
        "origin_lsn": pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(valid), pa.py_buffer(lsn)]),
    }


def to_piece(taken: tuple) -> ColumnarPiece:
    """Wrap what ``Decoder.take`` returned as Arrow arrays (no value is copied again).

    The ``source`` values are the PostgreSQL varying fields: ``ts_ms/us/ns`` from the commit
    time, ``sequence`` (``["<previous commit LSN>","<change LSN>"]``), ``txId``, ``lsn``, and
    ``origin``/``origin_lsn`` (all null unless a row of the piece came through a replication origin).

    :raises pyarrow.ArrowInvalid: a text value is not valid UTF-8.
    """
    (
        n,
        counts,
        op_offsets,
        ops,
        pos_offsets,
        positions,
        ts,
        xid,
        lsn,
        seq_offsets,
        seq_data,
        before,
        after,
        origin,
    ) = taken
    ts_us = _int64(n, ts)
    width = len((before or after)[1])  # every event has one image at least
    source = {
        "ts_ms": floor_div(ts_us, 1000),
        "ts_us": ts_us,
        "ts_ns": pc.multiply_checked(ts_us, 1000),
        "sequence": _strings(n, seq_offsets, seq_data),
        "txId": _int64(n, xid),
        "lsn": _int64(n, lsn),
        **_origins(n, origin),
    }
    return ColumnarPiece(
        ops=_strings(n, op_offsets, ops),
        op_counts={op: k for op, k in counts.items() if k},
        positions=pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(pos_offsets), pa.py_buffer(positions)]
        ),
        source=source,
        before=_images(n, before, width),
        after=_images(n, after, width),
    )


class PieceStage:
    """A helper thread that runs the hand-over of taken pieces (Arrow wrapping, conversion by the
    column codecs, the row group's assembly) while the caller decodes the next messages.

    Work runs in submission order, at most ``depth`` items waiting: memory stays bounded (a piece
    is at most ``staging.piece.rows`` events and about :data:`MAX_PIECE_BYTES` of text).  The
    caller must :meth:`sync` before it touches anything the submitted work touches (the batch's
    parts), and :meth:`stop` at the end, also on errors.  After an item failed, later items are
    skipped (the batch is void) and :meth:`submit` / :meth:`sync` raise the error.
    """

    def __init__(self, depth: int = 1) -> None:
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="airflow-cdc-pieces", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            try:
                if work is None:
                    return
                if self._error is None:
                    work()
            except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by submit/sync
                self._error = e
            finally:
                self._queue.task_done()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, work: Callable[[], Any]) -> None:
        """Queue ``work``; blocks while ``depth`` items wait.

        :raises Exception: what earlier work raised.
        """
        self._check()
        self._queue.put(work)

    def sync(self) -> None:
        """Wait until the submitted work ran.

        :raises Exception: what it raised.
        """
        self._queue.join()
        self._check()

    def stop(self) -> None:
        """End the thread after the work submitted so far (errors are left to :meth:`sync`)."""
        self._queue.put(None)
        self._thread.join()
