"""The compiled stream reader (``_walstream.c``) against the pure-Python one, on scripted streams.

A socket pair plays the server: the compiled reader sends ``START_REPLICATION`` on it, reads the
scripted frames (CopyBothResponse, CopyData with XLogData / keepalives, ErrorResponse) and writes
its status updates back.  Every script of :mod:`test_walstream` must give the same messages, the
same ``bounded`` and ``messages``, and the same status updates (all at the committed offset) as
the pure-Python reader; errors map to the same exceptions; arbitrary bytes never crash it.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_cdc.core.errors import ProtocolError, ServerMisconfigured
from airflow_cdc.sources.postgres import streamed, walstream
from airflow_cdc.sources.postgres.walstream import ReplicationStream

from .test_walstream import FROM, UPTO, FakeConn, _begin, _change, _commit, _keepalive, _message, _xlog

pytestmark = pytest.mark.skipif(walstream._walstream is None, reason="compiled stream reader not built")
COPY_BOTH = b"W" + struct.pack(">iBh", 7, 0, 0)
COMMAND = "START_REPLICATION SLOT \"slot\" LOGICAL 0/3E8 (proto_version '1')"


def test_compiled_reader_is_built() -> None:
    assert walstream.native_stream_available()


def _frame(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack(">i", len(body) + 4) + body


def _copy(message: bytes) -> bytes:
    return _frame(b"d", message)


def _error(state: str, text: str) -> bytes:
    return _frame(b"E", b"SERROR\0C" + state.encode() + b"\0M" + text.encode() + b"\0\0")


class Server:
    """The far end of a socket pair: writes ``wire`` (from a thread: it may exceed the socket
    buffer), then collects what the reader sent: its query and its status updates."""

    def __init__(self, wire: bytes) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.ours.setblocking(False)  # libpq leaves its socket non-blocking
        self.writer = threading.Thread(target=self._write, args=(wire,), daemon=True)
        self.writer.start()

    def _write(self, wire: bytes) -> None:
        try:
            self.theirs.sendall(wire)
        except OSError:
            pass  # the reader stopped and closed its end first

    def received(self) -> tuple[bytes, list[tuple[int, int, int, bool]]]:
        """The query text and every status update ``(write, flush, apply, reply)``."""
        self.theirs.settimeout(0.2)
        data = b""
        try:
            while chunk := self.theirs.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        assert data[:1] == b"Q"
        qlen = struct.unpack_from(">i", data, 1)[0]
        query, pos, sent = data[5 : qlen], qlen + 1, []
        while pos < len(data):
            assert data[pos : pos + 1] == b"d"
            n = struct.unpack_from(">i", data, pos + 1)[0]
            kind, write, flush, apply, _ts, reply = struct.unpack_from(">cqqqqB", data, pos + 5)
            assert kind == b"r" and n == 38
            sent.append((write, flush, apply, bool(reply)))
            pos += n + 1
        return query, sent

    def close(self) -> None:
        self.ours.close()
        self.writer.join(5)
        self.theirs.close()


def _native(script: list[bytes], max_events: int = 1_000_000, batch_rows: int = 4096, prefix: bytes = COPY_BOTH,
            streaming: bool = False) -> tuple[ReplicationStream, list[tuple[int, bytes]], Server]:
    server = Server(prefix + b"".join(_copy(m) for m in script))
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, max_events, batch_rows)  # type: ignore[arg-type]
    stream.streaming = streaming
    try:
        stream.start_native(server.ours.fileno(), COMMAND)
        out = [m for batch in stream.batches() for m in batch]
    except BaseException:
        server.close()
        raise
    return stream, out, server


def _python(script: list[bytes], monkeypatch: pytest.MonkeyPatch, max_events: int = 1_000_000,
            batch_rows: int = 4096, streaming: bool = False,
            ) -> tuple[ReplicationStream, list[tuple[int, bytes]], FakeConn]:
    monkeypatch.setattr(walstream.select, "select", lambda r, w, x, t=None: (r, w, x))
    monkeypatch.setattr(walstream, "PILE_UP", 0.0)
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, max_events, batch_rows)  # type: ignore[arg-type]
    stream.streaming = streaming
    conn = FakeConn(script)
    stream._pg = conn  # type: ignore[assignment]
    return stream, [m for batch in stream.batches() for m in batch], conn


_BIG = [_begin(2000)] + [_change(1100 + i) for i in range(10)] + [_commit(2000, 2100)]
SCRIPTS: dict[str, tuple[list[bytes], dict[str, Any]]] = {
    "commit_reaching_target": ([_begin(2000), _change(1500), _commit(2000, 2100), _begin(4990), _change(4000),
                                _commit(4990, 5050), _begin(6000), _change(5500), _commit(6000, 6100)], {}),
    "commit_past_target": ([_begin(2000), _change(1500), _commit(2000, 2100), _begin(5000), _change(4500),
                            _commit(5000, 5100)], {}),
    "nontx_at_target": ([_message(4999, False), _message(5000, False), _begin(5100)], {}),
    "keepalive_between_txns": ([_begin(3000), _change(2500), _keepalive(UPTO), _change(2600), _commit(3000, 3100),
                                _keepalive(UPTO - 1), _keepalive(UPTO), _begin(9000)], {}),
    "max_events_whole_txn": ([*_BIG, _begin(3000), _change(2500), _commit(3000, 3100)],
                             {"max_events": 3, "batch_rows": 4}),
    "max_events_nontx": ([_message(1200, False), _message(1300, False), *_BIG], {"max_events": 2}),
    "transactional_messages": ([_begin(2000), _message(1500, True), _commit(2000, 2100), _message(2200, False),
                                _keepalive(UPTO)], {"max_events": 3}),
    "feedback": ([_begin(2000), _change(1500), _keepalive(2000, reply=True), _commit(2000, 2100),
                  _keepalive(4000, reply=True), _begin(4500), _change(4400), _commit(4500, 4600),
                  _keepalive(UPTO + 900, reply=True)], {}),
    "many_batches": ([_begin(4000)] + [_change(1001 + i) for i in range(5000)] + [_commit(4000, 4100),
                                                                                 _keepalive(UPTO)],
                     {"batch_rows": 7}),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_compiled_and_python_readers_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script, kw = SCRIPTS[name]
    py_stream, py_out, conn = _python(script, monkeypatch, **kw)
    c_stream, c_out, server = _native(script, **kw)
    try:
        query, sent = server.received()
    finally:
        server.close()
    assert c_out == py_out and py_out
    assert (c_stream.messages, c_stream.bounded) == (py_stream.messages, py_stream.bounded)
    assert query.decode() == COMMAND
    # the compiled reader's first update is start()'s (the Python reader's start is not scripted)
    assert sent[0] == (FROM, FROM, FROM, False) and sent[1:] == conn.sent
    assert all(s[:3] == (FROM, FROM, FROM) for s in sent) and c_stream.reported == FROM


def test_a_message_larger_than_the_read_buffer() -> None:
    big = b"M\x01" + struct.pack(">q", 1500) + b"p\0" + struct.pack(">i", 5 << 20) + bytes(range(256)) * (5 << 12)
    script = [_begin(2000), _xlog(1500, big), _commit(2000, 2100), _keepalive(UPTO)]
    _, out, server = _native(script)
    server.close()
    assert [d for _, d in out] == [m[25:] for m in script[:3]]


def test_idle_server_is_asked_where_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing arrives: after ``IDLE_PROBE`` the reader asks for a keepalive; the answer ends the window."""
    monkeypatch.setattr(walstream, "IDLE_PROBE", 0.05)
    stream, out, server = None, None, Server(COPY_BOTH + _copy(_begin(2000)) + _copy(_change(1500))
                                             + _copy(_commit(2000, 2100)))
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, 100)  # type: ignore[arg-type]

    def answer() -> None:
        buf = b""
        while b"\x01" != buf[-1:] or len(buf) < 39:  # a status update with the reply flag set
            buf = buf[-39:] + server.theirs.recv(4096)
        server.theirs.sendall(_copy(_keepalive(UPTO)))

    server.writer.join()
    helper = threading.Thread(target=answer, daemon=True)
    helper.start()
    stream.start_native(server.ours.fileno(), COMMAND)
    out = [m for batch in stream.batches() for m in batch]
    helper.join(5)
    server.close()
    assert [d[:1] for _, d in out] == [b"B", b"I", b"C"] and not helper.is_alive()


@pytest.mark.parametrize(("state", "error"), [("55006", ServerMisconfigured), ("42704", ProtocolError)])
def test_start_errors_map_like_the_python_reader(state: str, error: type[Exception]) -> None:
    with pytest.raises(error, match="slot 'slot'") as info:
        _native([], prefix=_frame(b"N", b"SNOTICE\0Mhello\0\0") + _error(state, "no such slot"))
    assert "no such slot" in str(info.value)


@pytest.mark.parametrize(("tail", "match"), [
    (_error("XX000", "walsender died"), "walsender died"),
    (_copy(b"w" + bytes(10)), "truncated XLogData"),
    (_copy(b"x" + bytes(30)), "unexpected replication message type 'x'"),
    (_copy(b"k" + bytes(5)), "truncated keepalive"),
    (_copy(_xlog(1500, b"C\0")), "truncated pgoutput message"),
    # beyond PostgreSQL's 1 GB message limit: refused at the header, nothing reserved for it
    (b"d" + (0x40000001).to_bytes(4, "big") + bytes(64), "malformed message of length 1073741825"),
    (_frame(b"c", b""), "ended the replication stream early"),
    (b"", "closed the replication connection"),
])
def test_broken_streams_raise_protocol_errors(tail: bytes, match: str) -> None:
    server = Server(COPY_BOTH + _copy(_begin(2000)) + _copy(_change(1500)) + tail)
    server.writer.join()
    server.theirs.shutdown(socket.SHUT_WR)  # the server goes away after the tail
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, 100)  # type: ignore[arg-type]
    try:
        stream.start_native(server.ours.fileno(), COMMAND)
        with pytest.raises(ProtocolError, match=match):
            list(stream.batches())
    finally:
        server.close()


def test_arbitrary_bytes_never_crash_the_reader() -> None:
    rng = random.Random(15)
    good = b"".join(_copy(m) for m in SCRIPTS["feedback"][0])
    for _ in range(300):
        wire = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            wire[rng.randrange(len(wire))] = rng.randrange(256)
        server = Server(COPY_BOTH + bytes(wire[: rng.randint(0, len(wire))]))
        server.writer.join()
        server.theirs.shutdown(socket.SHUT_WR)
        stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, 100)  # type: ignore[arg-type]
        try:
            stream.start_native(server.ours.fileno(), COMMAND)
            for batch in stream.batches():
                assert all(isinstance(lsn, int) and isinstance(d, bytes) for lsn, d in batch)
        except ProtocolError:
            pass
        finally:
            server.close()


def test_tls_and_gssapi_connections_keep_the_python_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled reader reads the raw socket: only for connections libpq does not encrypt."""
    started: list[str] = []

    real = walstream.pq

    class Conn:
        status, backend_pid, socket, server_version = real.ConnStatus.OK, 42, 99, 150000

        def __init__(self, ssl: bool, gss: bool) -> None:
            self.ssl_in_use, self.used_gssapi = ssl, gss

        def exec_(self, command: bytes) -> Any:
            started.append("python")
            return type("Res", (), {"status": real.ExecStatus.COPY_BOTH})()

    monkeypatch.setattr(walstream.client, "connect_params", lambda config, app: {})
    monkeypatch.setattr(ReplicationStream, "start_native", lambda self, fd, command: started.append("native"))
    monkeypatch.setattr(ReplicationStream, "_status", lambda self, reply: None)
    for ssl, gss, forced, expected in [(False, False, False, "native"), (True, False, False, "python"),
                                       (False, True, False, "python"), (False, False, True, "python")]:
        conn = Conn(ssl, gss)
        fake_pgconn = type("PGconn", (), {"connect": staticmethod(lambda conninfo, c=conn: c)})
        monkeypatch.setattr(walstream, "pq", SimpleNamespace(PGconn=fake_pgconn, ConnStatus=real.ConnStatus,
                                                             ExecStatus=real.ExecStatus))
        if forced:
            monkeypatch.setenv(walstream.STREAM_ENV, "python")
        else:
            monkeypatch.delenv(walstream.STREAM_ENV, raising=False)
        ReplicationStream(None, "slot", "pub", FROM, UPTO, 100).start()  # type: ignore[arg-type]
        assert started.pop() == expected


# -- protocol 2: streamed in-progress transactions ------------------------------------------------

def _sstart(lsn: int, xid: int) -> bytes:
    return _xlog(lsn, b"S" + struct.pack(">IB", xid, 1))


def _sstop(lsn: int) -> bytes:
    return _xlog(lsn, b"E")


def _schange(lsn: int, xid: int) -> bytes:
    return _xlog(lsn, b"I" + struct.pack(">Ii", xid, 1) + b"N\x00\x00")


def _smessage(lsn: int, xid: int) -> bytes:
    return _xlog(lsn, b"M" + struct.pack(">IBq", xid, 1, lsn) + b"p\x00" + struct.pack(">i", 1) + b"x")


def _scommit(xid: int, commit_lsn: int, end_lsn: int) -> bytes:
    return _xlog(end_lsn, b"c" + struct.pack(">IBqqq", xid, 0, commit_lsn, end_lsn, 77))


def _sabort(lsn: int, xid: int, subxid: int) -> bytes:
    return _xlog(lsn, b"A" + struct.pack(">II", xid, subxid))


def _whole(xid: int, commit_lsn: int, end_lsn: int, changes: list[bytes]) -> list[tuple[int, bytes]]:
    """What protocol 1 sends for the transaction (the form the window reader gets)."""
    return [(end_lsn, b"B" + struct.pack(">qqI", commit_lsn, 77, xid)),
            *[(struct.unpack_from(">q", c, 1)[0], c[25:]) for c in changes],
            (end_lsn, b"C" + struct.pack(">Bqqq", 0, commit_lsn, end_lsn, 77))]


# xid 10: streamed in three blocks around xid 20's; xid 11 and 12 its subtransactions, 12 (nested in
# 11) rolled back with 11; xid 20 aborted whole; a keepalive inside a block is not the end; xid 30
# streamed, then a plain transaction, then xid 30 commits past the target (not read).
V2 = [_sstart(1100, 10), _schange(1101, 10), _schange(1102, 11), _sstop(1103),
      _sstart(1104, 20), _schange(1105, 20), _sstop(1106),
      _keepalive(1106, reply=True),
      _sstart(1107, 10), _schange(1108, 12), _sstop(1109),
      _sabort(1110, 10, 11), _sabort(1111, 20, 20),
      _sstart(1112, 10), _schange(1113, 10), _keepalive(UPTO), _smessage(1114, 10), _sstop(1115),
      _scommit(10, 1200, 1210),
      _sstart(1300, 30), _schange(1301, 30), _sstop(1302),
      _begin(1400), _change(1350), _commit(1400, 1410),
      _scommit(30, 5000, 5010)]
V2_EXPECTED = [*_whole(10, 1200, 1210, [_schange(1101, 10)[:26] + _schange(1101, 10)[30:],
                                         _schange(1113, 10)[:26] + _schange(1113, 10)[30:],
                                         _smessage(1114, 10)[:26] + _smessage(1114, 10)[30:]]),
               (1390, _begin(1400)[25:]),
               (1350, _change(1350)[25:]), (1410, _commit(1400, 1410)[25:])]


@pytest.mark.parametrize("reader", ["native", "python"])
@pytest.mark.parametrize("spill", [1 << 20, 16])
def test_streamed_transactions_come_whole_at_their_commit(reader: str, spill: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Protocol 2: aborted (sub)transactions leave nothing, interleaved blocks are put together,
    the xid is removed, a stream commit past the target ends the window -- in memory or spilled."""
    monkeypatch.setattr(streamed, "SPILL_BYTES", spill)
    if reader == "native":
        stream, out, server = _native(V2, streaming=True, batch_rows=3)
        server.close()
    else:
        stream, out, _ = _python(V2, monkeypatch, streaming=True, batch_rows=3)
    assert out == V2_EXPECTED
    assert stream.stream_messages == 5 + 5 + 2 + 1 and not stream.bounded  # S, E, A, c (xid 30: not read)


@pytest.mark.parametrize("reader", ["native", "python"])
def test_max_events_ends_after_a_stream_commit(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = [_sstart(1100, 10), *[_schange(1101 + i, 10) for i in range(5)], _sstop(1110),
              _scommit(10, 1200, 1210), _begin(1400), _change(1350), _commit(1400, 1410)]
    if reader == "native":
        stream, out, server = _native(script, streaming=True, max_events=2)
        server.close()
    else:
        stream, out, _ = _python(script, monkeypatch, streaming=True, max_events=2)
    assert [d[:1] for _, d in out] == [b"B", *[b"I"] * 5, b"C"] and stream.bounded


@pytest.mark.parametrize("bad", [_xlog(1100, b"S\x00"), _xlog(1100, b"c" + bytes(10)),
                                 _xlog(1100, b"A\x00\x00"), _sstop(1100)],
                         ids=["short_start", "short_commit", "short_abort", "stop_without_start"])
def test_malformed_stream_messages_are_protocol_errors(bad: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed pgoutput stream message|Stream Stop without"):
        list(streamed.unstream(iter([[(1100, bad[25:])]]), lambda: 1, 10))
