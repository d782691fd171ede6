"""A raw grpcio client of the emulator (our generated stubs only) that collects events."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import topodata_pb2 as topo
from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt
from airflow_cdc.sources.vitess.proto import vtgateservice_pb2_grpc as svc
from airflow_cdc.testing.vitess_emulator.values import row_values


def request(keyspace: str, gtid: str = "current", shard: str = "", **kwargs: Any) -> vt.VStreamRequest:
    sgtid = b.ShardGtid(keyspace=keyspace, shard=shard, gtid=gtid, table_p_ks=kwargs.pop("table_p_ks", ()))
    vgtid = kwargs.pop("vgtid", None) or b.VGtid(shard_gtids=[sgtid])
    return vt.VStreamRequest(
        tablet_type=topo.PRIMARY, vgtid=vgtid, filter=b.Filter(rules=[b.Rule(match="/.*")]),
        flags=vt.VStreamFlags(**kwargs),
    )  # fmt: skip


class Drain:
    """Reads one VStream call on a thread; ``events`` grows as responses arrive."""

    def __init__(self, address: str, req: vt.VStreamRequest, metadata: Any = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.call = svc.VitessStub(self.channel).VStream(req, metadata=metadata, timeout=120)
        self.responses: list[vt.VStreamResponse] = []
        self.error: grpc.RpcError | None = None
        self.ended = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self.call:
                with self._cond:
                    self.responses.append(response)
                    self._cond.notify_all()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    @property
    def events(self) -> list[b.VEvent]:
        with self._cond:
            return [e for r in self.responses for e in r.events]

    def until(self, predicate: Callable[[list[b.VEvent]], bool], timeout: float = 30) -> list[b.VEvent]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                events = [e for r in self.responses for e in r.events]
                if predicate(events) or self.ended:
                    return events
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"condition not met in {timeout}s; {len(events)} events: {kinds(events)[-40:]}"
                    )
                self._cond.wait(left)

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(10)
        self.channel.close()

    def __enter__(self) -> Drain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kinds(events: list[b.VEvent]) -> list[str]:
    return [b.VEventType.Name(e.type) for e in events]


def rows_of(events: list[b.VEvent], table: str | None = None) -> list[tuple[Any, Any]]:
    """(before, after) value lists of every ROW change (optionally of one ``keyspace.table``)."""
    out = []
    for e in events:
        if e.type == b.ROW and (table is None or e.row_event.table_name == table):
            for change in e.row_event.row_changes:
                before = row_values(change.before) if change.HasField("before") else None
                after = row_values(change.after) if change.HasField("after") else None
                out.append((before, after))
    return out


def transactions(events: list[b.VEvent]) -> list[list[b.VEvent]]:
    """The BEGIN..COMMIT groups (copy chunks included).  An empty table's copy nests a BEGIN in its
    FIELD's (vttablet ``copy.go``: ``sendFieldEvent``, then ``copyComplete``); the outer group,
    which holds no rows, is dropped."""
    out, current = [], None
    for e in events:
        if e.type == b.BEGIN:
            assert current is None or b.ROW not in {x.type for x in current}, (
                f"BEGIN inside an open transaction: {kinds(current)}"
            )
            current = [e]
        elif current is not None:
            current.append(e)
            if e.type == b.COMMIT:
                out.append(current)
                current = None
    return out


def last_vgtid(events: list[b.VEvent]) -> b.VGtid:
    return [e for e in events if e.type == b.VGTID][-1].vgtid
