"""A VStream refused at its start with MariaDB's errno 4052 is opened again; later failures are not.

The message is the one a real v24 vttablet over MariaDB 10.11 returned in a SIGKILL test: the
tablet reuses a closed binlog connection's server id (``binlog_connection.go``) while the server's
dump thread for it still lingers.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from airflow_cdc.core.errors import ConnectionFailed
from airflow_cdc.sources.vitess import client as client_mod
from airflow_cdc.sources.vitess.client import ServerIdTaken, VtgateClient, map_rpc_error
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt

SAME_ID = (
    'error starting stream from shard GTID keyspace:"conv" shard:"-80" gtid:"MariaDB/0-1-20252": error in '
    "vstream for conv/-80 on tablet zone1-0000000100: target: conv.-80.primary: vttablet: rpc error: code = "
    "Unknown desc = stream (at source tablet) error @ (including the GTID we failed to process) 0-1-20252: "
    "A slave with the same server_uuid/server_id as this slave has connected to the master (errno 4052) "
    "(sqlstate HY000)"
)


class Failed(grpc.RpcError):
    def __init__(self, details: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        self._details, self._code = details, code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Call:
    """A VStream call that yields ``responses`` and then raises ``error`` (if any)."""

    def __init__(self, responses: list[vt.VStreamResponse], error: Exception | None) -> None:
        self.responses, self.error, self.cancelled = responses, error, False

    def __iter__(self) -> Any:
        yield from self.responses
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self.cancelled = True


def _client(calls: list[Call]) -> VtgateClient:
    c = VtgateClient.__new__(VtgateClient)
    c.where = "vtgate:15991"
    opened = iter(calls)
    c.vstream = lambda request, timeout=None: next(opened)  # type: ignore[method-assign]
    return c


def _response(gtid: str) -> vt.VStreamResponse:
    g = b.ShardGtid(keyspace="conv", shard="-80", gtid=gtid)
    return vt.VStreamResponse(events=[b.VEvent(type=b.VGTID, vgtid=b.VGtid(shard_gtids=[g]))])


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod.time, "sleep", lambda s: None)


def test_errno_4052_is_a_retryable_connection_failure() -> None:
    error = map_rpc_error(Failed(SAME_ID), "vtgate:15991")
    assert isinstance(error, ServerIdTaken) and isinstance(error, ConnectionFailed)
    assert error.retryable and "server_id" in str(error) and "run the capture again" in error.hint


def test_a_stream_refused_at_its_start_is_opened_again() -> None:
    calls = [Call([], Failed(SAME_ID)), Call([], Failed(SAME_ID)), Call([_response("MariaDB/0-1-7")], None)]
    events = list(_client(calls).stream(vt.VStreamRequest()))
    assert [e.vgtid.shard_gtids[0].gtid for e in events] == ["MariaDB/0-1-7"]
    assert all(c.cancelled for c in calls)


def test_a_stream_that_already_sent_events_is_not_opened_again() -> None:
    calls = [Call([_response("MariaDB/0-1-7")], Failed(SAME_ID)), Call([_response("MariaDB/0-1-8")], None)]
    got = []
    with pytest.raises(ServerIdTaken):
        for event in _client(calls).stream(vt.VStreamRequest()):
            got.append(event.vgtid.shard_gtids[0].gtid)
    assert got == ["MariaDB/0-1-7"]  # the events delivered stay delivered; nothing is read twice
    assert not calls[1].cancelled


def test_the_retry_gives_up_after_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: next(clock))
    calls = [Call([], Failed(SAME_ID)) for _ in range(20)]
    with pytest.raises(ServerIdTaken):
        list(_client(calls).stream(vt.VStreamRequest(), retry_seconds=30))
    assert sum(c.cancelled for c in calls) < 20


def test_other_failures_at_the_start_are_raised_at_once() -> None:
    calls = [Call([], Failed("no healthy tablet", grpc.StatusCode.UNAVAILABLE)), Call([], None)]
    with pytest.raises(ConnectionFailed, match="no healthy tablet"):
        list(_client(calls).stream(vt.VStreamRequest()))
    assert not calls[1].cancelled
