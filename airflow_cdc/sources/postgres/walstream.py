"""The change window read through the streaming replication protocol (``window.reader=stream``).

``START_REPLICATION SLOT ... LOGICAL`` with pgoutput on a ``replication=database`` connection, as
Debezium reads: the server decodes while we decode (nothing is materialised on the server), and
the window is the same as the peek path's (:mod:`.stream`):

- it starts at the committed offset (the slot's confirmed position, which ``start_offset`` has
  aligned with it);
- it holds every transaction whose commit record starts below the target LSN (a ``Commit`` whose
  end reaches the target is the last one; a ``Begin`` or non-transactional message at or past it
  is not read), and stops early after the transaction or non-transactional message at which
  ``max_events`` messages have arrived, as ``pg_logical_slot_peek_binary_changes`` counts them;
- when the server has nothing more below the target it says so in a keepalive (its sent
  position reaches the target); an idle wait asks it for one.

Nothing is consumed: every standby status update reports the committed offset the window
started from as written, flushed and applied position -- never more -- so the slot's confirmed
position never passes what the state store committed (the slot is advanced at commit, as with
the peek path).  Keepalives asking for a reply are answered at once.  From PostgreSQL 14 on the
stream uses pgoutput protocol 2 with ``streaming 'on'``: a transaction larger than the server's
``logical_decoding_work_mem`` arrives in pieces while it runs (the server does not spill it) and
:mod:`.streamed` spools it until its Stream Commit, so no change is ever handed on before its
transaction committed; older servers get protocol 1 (each transaction whole at its commit).

Two readers of the stream, with the same rules: the compiled one (``_walstream.c``) takes over
the socket once libpq has authenticated the connection, sends ``START_REPLICATION`` itself and
splits the frames in C, handing Python only batches; the pure-Python one (libpq's
``PQgetCopyData`` through psycopg, one call per message) reads TLS- or GSSAPI-encrypted
connections, runs when the extension is not built, and is forced with
``AIRFLOW_CDC_PG_STREAM=python``.

Memory: one batch of at most ``batch_rows`` messages is held at a time; the socket and the
reader's buffer hold what the server sent ahead.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, NoReturn

import psycopg
from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGconn, PGresult

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ProtocolError, ServerMisconfigured
from airflow_cdc.sources.postgres import client, versions
from airflow_cdc.sources.postgres import sql as q
from airflow_cdc.sources.postgres.position import format_pg_lsn
from airflow_cdc.sources.postgres.streamed import unstream

try:
    import airflow_cdc.sources.postgres._walstream as _walstream
except ImportError:  # not built (a source checkout without pip install): the pure-Python reader
    _walstream = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: set to ``python`` to force the pure-Python reader of the stream
STREAM_ENV = "AIRFLOW_CDC_PG_STREAM"

_XLOG_DATA, _KEEPALIVE, _IDLE = 0x77, 0x6B, -1  # 'w', 'k', (no message yet)
_BEGIN, _COMMIT, _MESSAGE = 0x42, 0x43, 0x4D  # 'B', 'C', 'M'
_STREAM_START, _STREAM_STOP, _STREAM_COMMIT, _STREAM_ABORT = b"SEcA"  # protocol 2 streaming
_STREAM_KINDS = frozenset(b"SEcA")
#: the first server version whose pgoutput streams in-progress transactions (protocol 2)
STREAMING_VERSION = versions.STREAMING
_I64 = struct.Struct(">q").unpack_from
_KEEPALIVE_MSG = struct.Struct(">qqB").unpack_from
_STATUS = struct.Struct(">cqqqqB").pack
#: microseconds from the Unix epoch to PostgreSQL's (2000-01-01)
_PG_EPOCH_US = 946_684_800_000_000
#: seconds without a message before the server is asked where it is
IDLE_PROBE = 0.2
#: seconds to wait before reading again when nothing is buffered (see ``_messages``)
PILE_UP = 0.0001
#: seconds between unsolicited status updates (well below the default wal_sender_timeout of 60 s)
STATUS_INTERVAL = 10.0


class ReplicationStream:
    """One window of pgoutput messages from a logical slot, as batches of ``(lsn, data)``.

    :param config: the connector configuration (``database.*`` properties).
    :param slot: the logical slot.
    :param publication: the publication pgoutput reads.
    :param from_lsn: the committed offset: where the window starts and what status updates report.
    :param upto_lsn: the window's target (the flushed head read at the run's start).
    :param max_events: stop after the transaction at which this many messages have arrived.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        slot: str,
        publication: str,
        from_lsn: int,
        upto_lsn: int,
        max_events: int,
        batch_rows: int = 4096,
        confirmed_lsn: int | None = None,
    ) -> None:
        self.config, self.slot, self.publication = config, slot, publication
        self.from_lsn, self.upto_lsn, self.max_events = from_lsn, upto_lsn, max_events
        #: the position every status update reports: the committed offset, which a window after
        #: the run's first (its ``from_lsn`` is the end of a window not committed yet) lies past --
        #: reported, the server would confirm it and a killed run would leave the slot ahead
        self.confirmed_lsn = from_lsn if confirmed_lsn is None else min(confirmed_lsn, from_lsn)
        self.batch_rows = batch_rows
        self.messages = 0
        #: Stream Start/Stop/Commit/Abort messages read (protocol 2)
        self.stream_messages = 0
        #: whether the server streams large in-progress transactions (protocol 2; set by start)
        self.streaming = False
        #: whether the window stopped at ``max_events`` before reaching the target
        self.bounded = False
        #: the highest flush position this stream ever reported to the server
        self.reported: int | None = None
        self._pg: PGconn | None = None
        self._native: Any = None  # the compiled reader, when it reads this stream
        self.backend_pid = 0
        self._last_status = 0.0

    # -- connection ---------------------------------------------------------------------------
    def __enter__(self) -> ReplicationStream:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Connect with ``replication=database`` and start streaming from the committed offset.

        :raises AuthenticationFailed, ConfigError, ConnectionFailed: the connection failed.
        :raises ServerMisconfigured: the slot is in use by another process.
        """
        params = client.connect_params(self.config, "airflow-cdc")
        conninfo = make_conninfo("", **params, options=q.SESSION_OPTIONS, replication="database")
        pg = pq.PGconn.connect(conninfo.encode())
        if pg.status != pq.ConnStatus.OK:
            message = pg.get_error_message()
            pg.finish()
            client.raise_connect_error(self.config, psycopg.OperationalError(message))
        self._pg = pg
        #: the walsender serving this stream (see :func:`replication.wait_slot_released`)
        self.backend_pid = pg.backend_pid
        self.streaming = pg.server_version >= STREAMING_VERSION
        options = [
            *versions.window_options(pg.server_version, streaming=True),
            ("publication_names", q.quote_publication_name(self.publication)),
        ]
        if versions.with_messages(pg.server_version):
            options.append(("messages", "true"))
        command = (
            f'START_REPLICATION SLOT "{self.slot.replace(chr(34), chr(34) * 2)}" LOGICAL '
            f"{format_pg_lsn(self.from_lsn)} ({', '.join(f'{k} {_literal(v)}' for k, v in options)})"
        )
        if native_stream_available() and not pg.ssl_in_use and not pg.used_gssapi:
            self.start_native(pg.socket, command)
            return
        log.debug("replication stream of slot %r read through libpq (TLS, GSSAPI or forced)", self.slot)
        res = pg.exec_(command.encode())
        if res.status != pq.ExecStatus.COPY_BOTH:
            self._raise_result(res)
        self._status(reply=False)

    def start_native(self, fd: int, command: str) -> None:
        """Start the stream on socket ``fd`` (authenticated, idle, unencrypted) with the compiled
        reader: it sends ``command`` itself and reads every frame from then on."""
        reader = _walstream.Reader(
            fd,
            self.confirmed_lsn,  # the C reader uses it only for status updates
            self.upto_lsn,
            self.max_events,
            self.batch_rows,
            IDLE_PROBE,
            STATUS_INTERVAL,
            self._on_status,
        )
        try:
            reader.start(command.encode())
        except _walstream.StreamError as e:
            self._raise_state(*e.args)
        self._native = reader
        self.reported = reader.reported

    def close(self) -> None:
        """End the stream and the connection (the server's walsender exits, freeing the slot)."""
        if self._pg is not None:
            self._pg.finish()
            self._pg = None

    def _raise_result(self, res: PGresult) -> None:
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        text = (res.error_message or b"").decode(errors="replace").strip()
        self._raise_state(state, text)

    def _raise_state(self, state: str, text: str) -> NoReturn:
        """:raises ServerMisconfigured: the slot is in use (SQLSTATE 55006).
        :raises ProtocolError: any other server error (``state`` set) or a broken stream."""
        if not state:  # the compiled reader's own finding: no server error
            raise ProtocolError(f"replication stream of slot {self.slot!r} failed: {text}")
        if state == "55006":  # object_in_use: another process streams from the slot
            raise ServerMisconfigured(
                f"replication slot {self.slot!r} is in use by another process: {text}",
                hint="make sure only one consumer uses the slot (slot.name)",
            )
        raise ProtocolError(
            f"START_REPLICATION on slot {self.slot!r} failed ({state or 'no SQLSTATE'}): {text}"
        )

    # -- reading ------------------------------------------------------------------------------
    def batches(self) -> Iterator[list[tuple[int, bytes]]]:
        """The window's messages in order, in batches of at most about ``batch_rows`` (a batch of
        at least a quarter of that is also handed on when the server has sent nothing more yet);
        streamed transactions (protocol 2) come whole, in protocol 1 form, at their commit."""
        raw = self._native_batches() if self._native is not None else self._python_batches()
        if not self.streaming:
            yield from raw
            return
        yield from unstream(raw, lambda: self.stream_messages, self.batch_rows)

    def _python_batches(self) -> Iterator[list[tuple[int, bytes]]]:
        batch: list[tuple[int, bytes]] = []
        in_txn = in_stream = False
        upto, limit = self.upto_lsn, self.max_events
        for kind, lsn, data in self._messages():
            if kind != _XLOG_DATA:
                if kind == _IDLE:
                    if len(batch) >= self.batch_rows // 4:  # decode while the server catches up
                        yield batch
                        batch = []
                elif lsn >= upto and not in_txn and not in_stream:
                    break  # a keepalive: the server has sent everything below ``lsn``
                continue
            first = data[0]
            nontx = first == _MESSAGE and not in_stream and not data[1] & 1  # in a stream: xid first
            if first == _BEGIN:
                if _I64(data, 1)[0] >= upto:  # its commit record starts at or past the target
                    break
                in_txn = True
            elif first == _STREAM_COMMIT and _I64(data, 6)[0] >= upto:
                break  # a streamed transaction committing at or past the target
            elif nontx and _I64(data, 2)[0] >= upto:
                break  # a non-transactional message at or past the target
            batch.append((lsn, data))
            self.messages += 1
            if first in _STREAM_KINDS:
                self.stream_messages += 1
                in_stream = first == _STREAM_START or in_stream and first != _STREAM_STOP
            if first == _COMMIT or first == _STREAM_COMMIT:
                in_txn = False
                if _I64(data, 10 if first == _COMMIT else 14)[0] >= upto:
                    break
            if (first == _COMMIT or first == _STREAM_COMMIT or nontx) and self.messages >= limit:
                self.bounded = True
                break
            if len(batch) >= self.batch_rows:
                yield batch
                batch = []
        if batch:
            yield batch

    def _native_batches(self) -> Iterator[list[tuple[int, bytes]]]:
        """The compiled reader's batches (same rules as :meth:`batches`)."""
        reader = self._native
        try:
            while (batch := reader.next_batch()) is not None:
                self.messages, self.stream_messages = reader.messages, reader.stream_messages
                yield batch
        except _walstream.StreamError as e:
            self._raise_state(*e.args)
        finally:
            self.messages, self.bounded, self.reported = reader.messages, reader.bounded, reader.reported

    def _messages(self) -> Iterator[tuple[int, int, bytes]]:
        """``(kind, lsn, payload)`` of each XLogData (its start LSN), keepalive (the server's
        sent position) and wait (``_IDLE``, before blocking); answers keepalives that ask for a
        reply, probes an idle server, and sends a status update every ``STATUS_INTERVAL``."""
        pg = self._pg
        assert pg is not None
        get = pg.get_copy_data
        while True:
            n, buf = get(1)
            if n > 0:
                if buf[0] == _XLOG_DATA:
                    yield _XLOG_DATA, _I64(buf, 1)[0], bytes(buf[25:])
                elif buf[0] == _KEEPALIVE:
                    sent, _ts, reply = _KEEPALIVE_MSG(buf, 1)
                    if reply:
                        self._status(reply=False)
                    yield _KEEPALIVE, sent, b""
                else:
                    raise ProtocolError(
                        f"unexpected replication message type {chr(buf[0])!r} on slot {self.slot!r}"
                    )
                continue
            if n == -1:
                res = pg.get_result()
                if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
                    self._raise_result(res)
                raise ProtocolError(f"the server ended the replication stream of slot {self.slot!r} early")
            if n < -1:
                raise ProtocolError(
                    f"replication stream of slot {self.slot!r} failed: {pg.get_error_message()}"
                )
            if not select.select([pg.socket], [], [], 0)[0]:
                yield _IDLE, -1, b""  # nothing more has arrived yet: decode what is here
                # let the server's small sends (one per message) pile up a little: one read then
                # takes dozens of messages, and the server spends less per message
                time.sleep(PILE_UP)
                if not select.select([pg.socket], [], [], IDLE_PROBE)[0]:
                    self._status(reply=True)  # "where are you?": the answer is a keepalive
            if time.monotonic() - self._last_status > STATUS_INTERVAL:
                self._status(reply=False)
            pg.consume_input()

    def _status(self, reply: bool) -> None:
        """Send a standby status update reporting only the committed offset (never past it)."""
        pg = self._pg
        assert pg is not None
        now_us = time.time_ns() // 1000 - _PG_EPOCH_US
        pos = self.confirmed_lsn
        if pg.put_copy_data(_STATUS(b"r", pos, pos, pos, now_us, 1 if reply else 0)) != 1:
            raise ProtocolError(
                f"cannot send a status update on slot {self.slot!r}: {pg.get_error_message()}"
            )
        while pg.flush() == 1:
            select.select([], [pg.socket], [], 1.0)
        self.reported = pos if self.reported is None else max(self.reported, pos)
        self._last_status = time.monotonic()
        self._on_status(pos, reply)

    def _on_status(self, pos: int, reply: bool) -> None:
        """Called after every standby status update either reader sends (``pos``: the position
        reported); a hook for tests."""


def native_stream_available() -> bool:
    """Whether the compiled stream reader is built and not disabled through ``AIRFLOW_CDC_PG_STREAM``."""
    return _walstream is not None and os.environ.get(STREAM_ENV, "").lower() != "python"


def _literal(text: str) -> str:
    """A single-quoted SQL string literal (the replication grammar's option value)."""
    return "'" + text.replace("'", "''") + "'"
