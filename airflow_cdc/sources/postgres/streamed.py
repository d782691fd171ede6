"""pgoutput protocol 2 streaming of in-progress transactions, turned back into whole transactions.

With ``streaming 'on'`` (PostgreSQL 14+) the server sends a transaction larger than its
``logical_decoding_work_mem`` in pieces while it is still running, instead of spilling it to
disk and sending it whole at its commit: blocks of changes between Stream Start ``S`` (xid) and
Stream Stop ``E``, each change carrying its (sub)transaction's xid after the message type; then
Stream Commit ``c`` or Stream Abort ``A`` (of the whole transaction, or of one subtransaction).

:func:`unstream` keeps the window's contract -- no change is handed on before its transaction
committed -- by spooling each streamed transaction's messages (in memory up to
:data:`SPILL_BYTES`, then in a temporary file: memory stays bounded however large it is) and, at
its Stream Commit, handing on exactly what protocol 1 would have sent at that point: ``Begin``,
the changes without their xid, ``Commit``.  The Origin message of a transaction that came through
a replication origin has no xid and is kept as sent, right after the ``Begin`` as in protocol 1,
but its origin LSN is 0: pgoutput does not know it before the commit (``pgoutput_stream_start``
sends ``InvalidXLogRecPtr``).  A Stream Abort drops the transaction; the abort of a
subtransaction drops everything from that subtransaction's first change on (everything after it
belongs to it or to subtransactions nested in it, as PostgreSQL's own apply worker assumes).
Transactions still open when the window ends are dropped: nothing was consumed, so the next
window receives them again.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

from airflow_cdc.core.errors import ProtocolError

_S, _E, _SC, _SA = b"SEcA"  # Stream Start, Stream Stop, Stream Commit, Stream Abort
_O = b"O"[0]  # Origin: no xid; sent after the transaction's first Stream Start, with origin LSN 0
_I32 = struct.Struct(">I").unpack_from
_FRAME = struct.Struct(">QI")  # spooled message: its lsn and length
#: bytes of one streamed transaction kept in memory before it moves to a temporary file
SPILL_BYTES = 32 << 20

Batch = list[tuple[int, bytes]]


class Spool:
    """The streamed messages of one transaction so far (protocol 1 form: xid removed)."""

    def __init__(self, xid: int, spill_bytes: int) -> None:
        self.xid = xid
        self.file: IO[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115 (closed by unstream)
            max_size=spill_bytes, prefix="airflow_cdc_stream_"
        )
        #: subtransaction xid -> spool offset of its first change
        self.subxacts: dict[int, int] = {}

    def add(self, lsn: int, data: bytes) -> None:
        if data[0] == _O:  # carries no xid: kept whole, where protocol 1 sends it (after Begin)
            self.file.write(_FRAME.pack(lsn, len(data)))
            self.file.write(data)
            return
        xid = _I32(data, 1)[0]
        if xid != self.xid and xid not in self.subxacts:
            self.subxacts[xid] = self.file.tell()
        self.file.write(_FRAME.pack(lsn, len(data) - 4))
        self.file.write(data[:1])
        self.file.write(data[5:])

    def abort_subxact(self, subxid: int) -> None:
        offset = self.subxacts.get(subxid)
        if offset is None:
            return  # none of its changes was streamed
        self.file.seek(offset)
        self.file.truncate()
        self.subxacts = {x: o for x, o in self.subxacts.items() if o < offset}

    def replay(self, batch_rows: int) -> Iterator[Batch]:
        self.file.seek(0)
        read, out = self.file.read, []
        while header := read(_FRAME.size):
            lsn, n = _FRAME.unpack(header)
            out.append((lsn, read(n)))
            if len(out) >= batch_rows:
                yield out
                out = []
        if out:
            yield out


def unstream(
    batches: Iterator[Batch], streamed: Callable[[], int], batch_rows: int, spill_bytes: int | None = None
) -> Iterator[Batch]:
    """The window's batches with every streamed transaction replaced by its protocol 1 form at
    its Stream Commit.  ``streamed()`` counts the stream messages (S/E/c/A) the reader has read
    so far: a batch read while no stream block is open and with no new one passes untouched.
    ``spill_bytes`` defaults to :data:`SPILL_BYTES`."""
    spill_bytes = spill_bytes or SPILL_BYTES
    spools: dict[int, Spool] = {}
    state: dict[str, Spool | None] = {"current": None}
    seen = 0
    try:
        for batch in batches:
            count = streamed()
            if count == seen and state["current"] is None:
                yield batch
                continue
            seen = count
            yield from _translate(batch, spools, state, batch_rows, spill_bytes)
    finally:
        for spool in spools.values():
            spool.file.close()


_MIN_LEN = {_S: 6, _E: 1, _SC: 30, _SA: 9}


def _translate(
    batch: Batch, spools: dict[int, Spool], state: dict[str, Spool | None], batch_rows: int, spill_bytes: int
) -> Iterator[Batch]:
    out: Batch = []
    for lsn, data in batch:
        kind = data[0]
        current = state["current"]
        if kind in _MIN_LEN and (len(data) < _MIN_LEN[kind] or (current is not None and kind != _E)):
            raise ProtocolError(f"malformed pgoutput stream message {chr(kind)!r} of {len(data)} bytes")
        if current is not None:
            if kind == _E:
                state["current"] = None
            elif len(data) < 5:
                raise ProtocolError(f"truncated streamed pgoutput message {chr(kind)!r} of {len(data)} bytes")
            else:
                current.add(lsn, data)
        elif kind == _S:
            xid = _I32(data, 1)[0]
            state["current"] = spools.get(xid) or spools.setdefault(xid, Spool(xid, spill_bytes))
        elif kind == _SC:
            xid, (commit_lsn, _end_lsn, ts) = _I32(data, 1)[0], struct.unpack_from(">qqq", data, 6)
            spool = spools.pop(xid, None)
            out.append((lsn, b"B" + struct.pack(">qqI", commit_lsn, ts, xid)))
            if spool is not None:
                with spool.file:
                    for piece in spool.replay(batch_rows):
                        if out:
                            yield out
                        out = piece
            out.append((lsn, b"C" + data[5:]))
        elif kind == _SA:
            xid, subxid = struct.unpack_from(">II", data, 1)
            spool = spools.get(xid)
            if spool is not None and xid == subxid:
                spools.pop(xid).file.close()
            elif spool is not None:
                spool.abort_subxact(subxid)
        elif kind == _E:
            raise ProtocolError("pgoutput Stream Stop without a Stream Start")
        else:
            out.append((lsn, data))
    if out:
        yield out
