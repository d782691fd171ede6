"""The streaming window's stop rules and feedback, against a scripted replication connection."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from airflow_cdc.sources.postgres import walstream
from airflow_cdc.sources.postgres.walstream import ReplicationStream

FROM, UPTO = 1000, 5000


def _xlog(lsn: int, payload: bytes) -> bytes:
    return b"w" + struct.pack(">qqq", lsn, lsn, 0) + payload


def _keepalive(sent: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack(">qqB", sent, 0, 1 if reply else 0)


def _begin(final_lsn: int, xid: int = 7) -> bytes:
    return _xlog(final_lsn - 10, b"B" + struct.pack(">qqi", final_lsn, 0, xid))


def _change(lsn: int) -> bytes:
    return _xlog(lsn, b"I" + struct.pack(">i", 1) + b"N\x00\x00")


def _commit(commit_lsn: int, end_lsn: int) -> bytes:
    return _xlog(end_lsn, b"C\x00" + struct.pack(">qqq", commit_lsn, end_lsn, 0))


def _message(lsn: int, transactional: bool) -> bytes:
    return _xlog(lsn, b"M" + bytes([1 if transactional else 0]) + struct.pack(">q", lsn) + b"p\x00"
                 + struct.pack(">i", 1) + b"x")


class FakeConn:
    """Hands out scripted CopyData messages; records every standby status update sent."""

    socket = -1

    def __init__(self, script: list[bytes], run_dry: bool = False) -> None:
        self.script = list(script)
        self.sent: list[tuple[int, int, int, bool]] = []
        self.run_dry = run_dry  # an exhausted script is an error (the reader should have stopped)

    def get_copy_data(self, async_: int) -> tuple[int, memoryview]:
        if not self.script:
            return (-2 if self.run_dry else 0), memoryview(b"")
        data = self.script.pop(0)
        return len(data), memoryview(data)

    def put_copy_data(self, data: bytes) -> int:
        kind, write, flush, apply, _ts, reply = struct.unpack(">cqqqqB", data)
        assert kind == b"r"
        self.sent.append((write, flush, apply, bool(reply)))
        return 1

    def flush(self) -> int:
        return 0

    def get_error_message(self) -> str:
        return "the script ran dry"

    def consume_input(self) -> None:
        pass


def _read(script: list[bytes], monkeypatch: pytest.MonkeyPatch, max_events: int = 1_000_000,
          batch_rows: int = 4096) -> tuple[ReplicationStream, list[tuple[int, bytes]], FakeConn]:
    monkeypatch.setattr(walstream.select, "select", lambda r, w, x, t=None: (r, w, x))
    monkeypatch.setattr(walstream, "PILE_UP", 0.0)
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, max_events, batch_rows)  # type: ignore[arg-type]
    conn = FakeConn(script, run_dry=True)
    stream._pg = conn  # type: ignore[assignment]
    out = [m for batch in stream.batches() for m in batch]
    return stream, out, conn


def _kinds(messages: list[tuple[int, bytes]]) -> str:
    return "".join(chr(data[0]) for _, data in messages)


def test_commit_reaching_the_target_is_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [_begin(2000), _change(1500), _commit(2000, 2100), _begin(4990), _change(4000),
              _commit(4990, 5050), _begin(6000), _change(5500), _commit(6000, 6100)]
    stream, out, _ = _read(script, monkeypatch)
    assert _kinds(out) == "BICBIC" and not stream.bounded


def test_transaction_committing_past_the_target_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [_begin(2000), _change(1500), _commit(2000, 2100), _begin(5000), _change(4500), _commit(5000, 5100)]
    _, out, conn = _read(script, monkeypatch)
    assert _kinds(out) == "BIC" and conn.script == [_change(4500), _commit(5000, 5100)]


def test_non_transactional_message_at_the_target_ends_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    script = [_message(4999, False), _message(5000, False), _begin(5100)]
    _, out, _ = _read(script, monkeypatch)
    assert [lsn for lsn, _ in out] == [4999]


def test_keepalive_at_the_target_ends_the_window_between_transactions_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = [_begin(3000), _change(2500), _keepalive(UPTO), _change(2600), _commit(3000, 3100),
              _keepalive(UPTO - 1), _keepalive(UPTO), _begin(9000)]
    _, out, conn = _read(script, monkeypatch)
    assert _kinds(out) == "BIIC" and conn.script == [_begin(9000)]


def test_max_events_stops_after_whole_transactions_and_nontx_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    big = [_begin(2000)] + [_change(1100 + i) for i in range(10)] + [_commit(2000, 2100)]
    script = [*big, _begin(3000), _change(2500), _commit(3000, 3100)]
    stream, out, _ = _read(script, monkeypatch, max_events=3, batch_rows=4)
    assert len(out) == 12 and stream.bounded  # the 12-message transaction is read whole
    stream, out, _ = _read([_message(1200, False), _message(1300, False), *big], monkeypatch, max_events=2)
    assert len(out) == 2 and stream.bounded


def test_feedback_reports_only_the_committed_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keepalives asking for a reply are answered at once, and no update ever reports more than
    the offset the window started from, whatever the server has sent."""
    script = [_begin(2000), _change(1500), _keepalive(2000, reply=True), _commit(2000, 2100),
              _keepalive(4000, reply=True), _begin(4500), _change(4400), _commit(4500, 4600),
              _keepalive(UPTO + 900, reply=True)]
    _, out, conn = _read(script, monkeypatch)
    assert _kinds(out) == "BICBIC"
    assert len(conn.sent) == 3 and all(s[:3] == (FROM, FROM, FROM) for s in conn.sent)


def test_idle_server_is_asked_where_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing buffered and nothing arriving, the reader requests a keepalive (reply flag)."""
    conn_script: list[Any] = [_begin(2000), _change(1500), _commit(2000, 2100)]
    monkeypatch.setattr(walstream, "PILE_UP", 0.0)
    stream = ReplicationStream(None, "slot", "pub", FROM, UPTO, 100)  # type: ignore[arg-type]
    conn = FakeConn(conn_script)
    calls = {"n": 0}

    def select(r: list, w: list, x: list, t: float | None = None) -> tuple[list, list, list]:
        calls["n"] += 1
        if w:
            return r, w, x
        if not conn.script and conn.sent and conn.sent[-1][3]:
            conn.script.append(_keepalive(UPTO))  # the server answers the probe
        return ([], w, x) if not conn.script else (r, w, x)

    monkeypatch.setattr(walstream.select, "select", select)
    stream._pg = conn  # type: ignore[assignment]
    out = [m for batch in stream.batches() for m in batch]
    assert _kinds(out) == "BIC" and any(s[3] for s in conn.sent)
