"""The gRPC client of vtgate's VStream (``vtgateservice.Vitess/VStream``), with our generated stubs.

Credentials go as vtgate's static-auth call metadata (``username``, ``password``); TLS is optional.
gRPC failures are mapped to the product's errors naming what to fix; the password never reaches
a message.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Generator, Iterator
from typing import Any

import grpc

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import (
    AuthenticationFailed,
    CdcError,
    ConfigError,
    ConnectionFailed,
    OffsetUnavailable,
    ProtocolError,
)
from airflow_cdc.sources.vitess.offsets import CURRENT
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.proto import topodata_pb2 as topo
from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt
from airflow_cdc.sources.vitess.proto import vtgateservice_pb2_grpc as service
from airflow_cdc.sources.vitess.protocol import schema_drift

log = logging.getLogger(__name__)

_TABLET_TYPES = {
    "master": topo.PRIMARY,
    "primary": topo.PRIMARY,
    "replica": topo.REPLICA,
    "rdonly": topo.RDONLY,
}


#: vttablet's error for rows with more columns than the current schema (v24 vstreamer.go)
_NO_COLUMNS = re.compile(r"cannot determine table columns for ([^\s:]+)")
_KEYSPACE = re.compile(r'keyspace:"([^"]+)"')


class ServerIdTaken(ConnectionFailed):
    """MySQL/MariaDB ended a tablet's binlog stream (errno 4052, ER_SLAVE_SAME_ID) because a second
    connection registered with its server_id.

    vttablet hands binlog connections server ids from a pool and takes a closed stream's id back
    at once (v24 ``go/vt/binlog/binlog_connection.go``: ``serverIDPool.Put`` in ``Close``), while
    the server's dump thread for the closed one can still be waiting for binlog events: a stream
    opened right after another ended (a killed or finished run's) can meet it.  The old thread
    ends, so opening the stream again succeeds.
    """

    default_hint = "run the capture again: a previous stream on the tablet was still ending"


def map_rpc_error(error: grpc.RpcError, where: str) -> CdcError:
    """The product error for a failed VStream call to vtgate at ``where``."""
    code, details = error.code(), error.details() or ""
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthenticationFailed(
            f"vtgate at {where} rejected the credentials ({code.name}: {details})",
            hint="check database.user / database.password (vtgate's static gRPC auth)",
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return ConnectionFailed(f"cannot stream from vtgate at {where}: {details}")
    if "errno 4052" in details:
        return ServerIdTaken(
            f"vtgate at {where}: a tablet's binlog connection was refused by its MySQL/MariaDB because "
            f"another one used the same server_id: {details}"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ConnectionFailed(f"vtgate at {where} did not answer in time: {details}")
    if "errno 1236" in details or "GTIDSet Mismatch" in details or "could not decode position" in details:
        return OffsetUnavailable(f"vtgate at {where} cannot stream from the stored position: {details}")
    drift = _NO_COLUMNS.search(details)
    if drift:
        keyspace = _KEYSPACE.search(details)
        table = f"{keyspace.group(1)}.{drift.group(1)}" if keyspace else drift.group(1)
        return schema_drift(
            table,
            "the binlog rows have more columns than the table has now (vttablet: "
            f"{drift.group(0)}{details.split(drift.group(0), 1)[1][:160]}...)",
        )
    if "fetch error" in details and "keyspace" in details:
        return ConfigError(f"property 'vitess.keyspace': vtgate at {where} does not know it: {details}")
    return ProtocolError(f"VStream from vtgate at {where} failed ({code.name}): {details}")


class VtgateClient:
    """A channel to vtgate for VStream calls; :meth:`close` releases it."""

    def __init__(self, config: ConnectorConfig) -> None:
        self.config = config
        self.where = f"{config['database.hostname']}:{config['database.port']}"
        options = [
            ("grpc.max_receive_message_length", config["vitess.grpc.max_inbound_message_size"]),
            ("grpc.enable_retries", 0),
        ]
        if config["vitess.grpc.tls"]:
            name = config["vitess.grpc.tls.server.name"]
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            self.channel = grpc.secure_channel(self.where, grpc.ssl_channel_credentials(_ca(config)), options)
        else:
            self.channel = grpc.insecure_channel(self.where, options)
        self.stub = service.VitessStub(self.channel)
        self.metadata = self._metadata()
        self.tablet_type = _TABLET_TYPES[config["vitess.tablet.type"]]

    def _metadata(self) -> list[tuple[str, str]]:
        out = []
        for header in self.config["vitess.grpc.headers"]:
            key, _, value = header.partition(":")
            out.append((key.strip().lower(), value.strip()))
        user = self.config["database.user"]
        if user:
            password = self.config.secret("database.password") or ""
            out += [("username", user), ("password", password)]
        return out

    def request(self, vgtid: b.VGtid, tables: list[str] | None = None) -> vt.VStreamRequest:
        """A VStream request from ``vgtid`` for ``tables`` (names in the keyspace; None: every table).

        The tables go in one regular-expression rule: vttablet describes a table (and fails the
        stream when it cannot, see :func:`~.protocol.schema_drift`) only when a rule matches it
        (v24 ``vstreamer.go``: ``ruleMatches`` before ``buildTablePlan``), and an exact-name rule
        needs a SELECT filter (``buildTablePlan``), a regular expression does not (``buildREPlan``).

        The tables the VGTID names in ``table_p_ks`` go into ``tables_to_copy``: without it
        vttablet copies *every* table the filter matches whenever one is named (v24
        ``uvstreamer.go``: ``buildTablePlan`` plans each matching table, with a nil last key when
        the VGTID does not name it, unless ``options.TablesToCopy`` leaves it out; vtgate passes
        ``flags.tables_to_copy`` on, ``vstream_manager.go`` ``streamFromTablet``) -- a finished
        table would be copied again, its changes until then dropped (``shouldSendEventForTable``)."""
        if tables is None:
            rules = [b.Rule(match="/.*")]
        elif tables:
            rules = [b.Rule(match="/^(?:" + "|".join(re.escape(t) for t in sorted(tables)) + ")$")]
        else:
            rules = []
        flags = vt.VStreamFlags(
            stop_on_reshard=self.config["vitess.stop_on_reshard"],
            heartbeat_interval=self.config["vitess.heartbeat.interval"],
        )
        flags.tables_to_copy.extend(sorted({t.table_name for g in vgtid.shard_gtids for t in g.table_p_ks}))
        return vt.VStreamRequest(
            tablet_type=self.tablet_type, vgtid=vgtid, filter=b.Filter(rules=rules), flags=flags
        )

    def vstream(self, request: vt.VStreamRequest, timeout: float | None = None) -> Any:
        """Open a VStream call: an iterator of responses that can be ``cancel()``-ed."""
        return self.stub.VStream(request, metadata=self.metadata, timeout=timeout)

    def stream(
        self, request: vt.VStreamRequest, timeout: float | None = None, retry_seconds: float = 30.0
    ) -> Generator[b.VEvent, None, None]:
        """The events of a VStream call from ``request`` (each call with gRPC deadline ``timeout``);
        the call is cancelled when the iterator is closed.  A stream refused at its start because
        the tablet's binlog connection met a lingering one with its server id (:class:`ServerIdTaken`)
        is opened again, with back-off, for up to ``retry_seconds``; once an event arrived, every
        failure is raised.
        """
        deadline, delay = time.monotonic() + retry_seconds, 0.5
        while True:
            call = self.vstream(request, timeout=timeout)
            started = False
            try:
                for event in self.events(call):
                    started = True
                    yield event
                return
            except ServerIdTaken as e:
                if started or time.monotonic() + delay > deadline:
                    raise
                log.warning("%s; opening the stream again in %.1fs", e.args[0][:300], delay)
            finally:
                call.cancel()
            time.sleep(delay)
            delay = min(delay * 2, 8.0)

    def events(self, call: Any) -> Iterator[b.VEvent]:
        """The events of a call, gRPC failures mapped (a cancelled call just ends)."""
        try:
            for response in call:
                yield from response.events
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise map_rpc_error(e, self.where) from None

    def current_vgtid(self, keyspace: str, shard: str | None = None, timeout: float = 30) -> b.VGtid:
        """The positions of every shard of ``keyspace`` (or of ``shard``) now.

        Asks vtgate for a stream from ``current`` over no table and reads the VGTID once every
        shard has reported its position.

        :raises ConnectionFailed: vtgate unreachable; :raises ConfigError: unknown keyspace.
        """
        start = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=keyspace, shard=shard or "", gtid=CURRENT)])
        request = self.request(start, tables=[])
        request.filter.rules.add(match="/^$")  # matches no table: only positions flow
        deadline = time.monotonic() + timeout
        events = self.stream(request, timeout=timeout)
        try:
            for event in events:
                if event.type == b.VGTID and all(g.gtid != CURRENT for g in event.vgtid.shard_gtids):
                    return event.vgtid
                if time.monotonic() > deadline:
                    break
        finally:
            events.close()
        raise ConnectionFailed(f"vtgate at {self.where} reported no position for keyspace {keyspace!r}")

    def list_tables(self, keyspace: str, timeout: float = 30) -> list[str]:
        """The tables of ``keyspace`` (vtgate's ``SHOW TABLES`` through ``Execute``), sorted.

        :raises ConfigError: unknown keyspace; :raises ConnectionFailed / AuthenticationFailed.
        """
        request = vt.ExecuteRequest(
            session=vt.Session(target_string=keyspace, autocommit=True), query=q.BoundQuery(sql="show tables")
        )
        try:
            response = self.stub.Execute(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise map_rpc_error(e, self.where) from None
        if response.error.message:
            raise ConfigError(
                f"property 'vitess.keyspace': vtgate at {self.where} cannot list the tables of "
                f"{keyspace!r}: {response.error.message}"
            )
        return sorted(bytes(r.values).decode("utf-8") for r in response.result.rows)

    def execute(
        self, keyspace: str, sql: str, binds: dict[str, q.BindVariable] | None = None, timeout: float = 300
    ) -> q.QueryResult:
        """Run one read-only statement through vtgate (``Execute``), with every field's metadata
        (column type, flags, charset) in the result.

        :raises ProtocolError: vtgate's answer carried an error (the statement and the error named);
            :raises ConnectionFailed / AuthenticationFailed.
        """
        options = q.ExecuteOptions(included_fields=q.ExecuteOptions.ALL)
        request = vt.ExecuteRequest(
            session=vt.Session(target_string=keyspace, autocommit=True, options=options),
            query=q.BoundQuery(sql=sql, bind_variables=binds or {}),
        )
        try:
            response = self.stub.Execute(request, metadata=self.metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise map_rpc_error(e, self.where) from None
        if response.error.message:
            raise ProtocolError(f"vtgate at {self.where} failed {sql!r}: {response.error.message}")
        return response.result

    def close(self) -> None:
        self.channel.close()


def _ca(config: ConnectorConfig) -> bytes | None:
    path = config["vitess.grpc.tls.ca"]
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(
            f"property 'vitess.grpc.tls.ca': cannot read CA file {path!r}: {e.strerror}"
        ) from None
