"""``VtgateEmulator``: a gRPC server on loopback that implements ``vtgateservice.Vitess/VStream``
like vtgate, over keyspaces whose shards are throwaway MariaDB servers.  A test stand-in only:
no vtgate can run here (see :mod:`airflow_cdc.testing.vitess_emulator`).
"""

from __future__ import annotations

import logging
import random
import re
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.proto import topodata_pb2 as topo
from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt
from airflow_cdc.sources.vitess.proto import vtgateservice_pb2_grpc as service
from airflow_cdc.sources.vitess.proto import vtrpc_pb2 as vtrpc
from airflow_cdc.testing.servers import MariaDbServer
from airflow_cdc.testing.vitess_emulator.session import VStreamError, VStreamSession
from airflow_cdc.testing.vitess_emulator.shard import JOURNAL_DB, JOURNAL_TABLE, EmulatedShard
from airflow_cdc.testing.vitess_emulator.values import in_range, keyspace_id, make_row

log = logging.getLogger(__name__)
_next_server_id = iter(range(101, 10_000))


def start_shard_server() -> MariaDbServer:
    """A MariaDB server for one shard, with a server-id no other emulated shard uses."""
    return MariaDbServer(settings={"server-id": str(next(_next_server_id))}).start()


class _Servicer(service.VitessServicer):
    def __init__(self, emulator: VtgateEmulator) -> None:
        self.emulator = emulator

    def VStream(
        self, request: vt.VStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[vt.VStreamResponse]:  # noqa: N802
        self.emulator.authenticate(context)
        try:
            yield from VStreamSession(self.emulator, request, context).responses()
        except VStreamError as e:
            context.abort(e.code, e.message)

    def Execute(self, request: vt.ExecuteRequest, context: grpc.ServicerContext) -> vt.ExecuteResponse:  # noqa: N802
        """``SHOW TABLES`` in the session's target keyspace, and the two statements that describe a
        table (``VitessSource._described``): ``SELECT * FROM t WHERE 1 != 1`` (the columns' fields,
        flags included, no rows) and its ``information_schema.columns`` column types, answered as
        vtgate answers them from a shard (the keyspace's schema name is the shard's database)."""
        self.emulator.authenticate(context)
        keyspace = request.session.target_string.split("@")[0].split(":")[0]
        sql = request.query.sql.strip()
        described = _DESCRIBE.match(sql)
        if sql.lower() != "show tables" and not described and not _COLUMN_TYPES.match(sql):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"vtgate emulator: {sql!r} not supported")
        try:
            shard = self.emulator.keyspace_shards(keyspace)[0]
        except VStreamError as e:
            return vt.ExecuteResponse(
                error=vtrpc.RPCError(message=e.message, code=5), session=request.session
            )
        if described:
            result = _fields_of(shard, described.group(1).replace("``", "`"))
        elif sql.lower() != "show tables":
            result = _column_types(shard, request.query.bind_variables["t"].value.decode())
        else:
            result = q.QueryResult(
                fields=[q.Field(name=f"Tables_in_{keyspace}", type=q.VARCHAR)],
                rows=[make_row([n.encode()]) for n in shard.tables()],
            )
        return vt.ExecuteResponse(session=request.session, result=result)


def _fields_of(shard: EmulatedShard, table: str) -> q.QueryResult:
    """``SELECT * FROM table WHERE 1 != 1``: the columns' fields (flags included), no rows."""
    fields = [
        q.Field(name=f.name, type=f.type, table=f.table, charset=f.charset, flags=f.flags)
        for f in shard.fields(table)
    ]
    return q.QueryResult(fields=fields)


def _column_types(shard: EmulatedShard, table: str) -> q.QueryResult:
    """The ``information_schema.columns`` column types of ``table`` in the shard's database."""
    rows = shard.server.execute(
        "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (shard.database, table),
    )
    fields = [q.Field(name="column_name", type=q.VARCHAR), q.Field(name="column_type", type=q.TEXT)]
    return q.QueryResult(fields=fields, rows=[make_row([_text(n), _text(t)]) for n, t in rows])


_DESCRIBE = re.compile(r"^SELECT \* FROM `((?:[^`]|``)+)` WHERE 1 != 1$", re.IGNORECASE)
_COLUMN_TYPES = re.compile(
    r"^SELECT column_name, column_type FROM information_schema\.columns\s", re.IGNORECASE
)


def _text(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class VtgateEmulator:
    """An EMULATOR of vtgate's VStream API for tests (not Vitess; see the package docstring).

    :param users: static gRPC credentials (``username`` -> ``password``, vtgate's
        ``grpc_auth_static``); None accepts every caller.
    :param poll_interval: seconds between binlog polls of an idle stream.
    :param copy_chunk_rows: rows per copy-phase chunk (one VGTID with ``table_p_ks`` each).
    """

    def __init__(
        self,
        *,
        users: dict[str, str] | None = None,
        poll_interval: float = 0.05,
        copy_chunk_rows: int = 1000,
        enum_set_string_values: bool = True,
    ) -> None:
        """:param enum_set_string_values: False sends what vttablet before v20 sent: streamed ENUM
        and SET values as their index / bit mask, copied ones as labels, no FIELD event flag."""
        self.users, self.poll_interval, self.copy_chunk_rows = users, poll_interval, copy_chunk_rows
        self.enum_set_string_values = enum_set_string_values
        self.keyspaces: dict[str, list[EmulatedShard]] = {}
        self.all_shards: dict[tuple[str, str], EmulatedShard] = {}
        self.write_lock = threading.RLock()
        self._server: grpc.Server | None = None
        self.port = 0

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> VtgateEmulator:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        service.add_VitessServicer_to_server(_Servicer(self), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def __enter__(self) -> VtgateEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- topology ----------------------------------------------------------------------------
    def add_keyspace(
        self, keyspace: str, shards: dict[str, MariaDbServer], schema: Sequence[str] = ()
    ) -> None:
        """Serve ``keyspace`` from ``shards`` (shard name -> server), creating ``vt_<keyspace>``
        (and the emulator's ``_vt`` journal table) on each and running the ``schema`` DDL there."""
        members = []
        for name, server in shards.items():
            server_id = int(server.settings["server-id"])
            shard = EmulatedShard(keyspace, name, server, server_id)
            self._prepare(shard, schema)
            members.append(shard)
            self.all_shards[(keyspace, name)] = shard
        self.keyspaces[keyspace] = members

    def _prepare(self, shard: EmulatedShard, schema: Sequence[str]) -> None:
        shard.server.execute(f"CREATE DATABASE IF NOT EXISTS `{shard.database}` CHARACTER SET utf8mb4")
        shard.ensure_journal_table()
        for ddl in schema:
            shard.server.execute(ddl, database=shard.database)

    def keyspace_shards(self, keyspace: str) -> list[EmulatedShard]:
        """The serving shards of ``keyspace``.

        :raises VStreamError: vtgate's error for a keyspace the topology does not have.
        """
        shards = self.keyspaces.get(keyspace)
        if shards is None:
            raise VStreamError(
                grpc.StatusCode.UNKNOWN,
                f"keyspace {keyspace} fetch error: node doesn't exist: keyspaces/{keyspace}/SrvKeyspace",
            )
        return list(shards)

    def shard(self, keyspace: str, name: str, tablet_type: int = topo.PRIMARY) -> EmulatedShard:
        self.keyspace_shards(keyspace)
        shard = self.all_shards.get((keyspace, name))
        if shard is None:
            kind = topo.TabletType.Name(tablet_type).lower() if tablet_type else "unknown"
            raise VStreamError(
                grpc.StatusCode.UNAVAILABLE, f"target: {keyspace}.{name}.{kind}: no healthy tablet available"
            )
        return shard

    def authenticate(self, context: grpc.ServicerContext) -> None:
        """vtgate's static gRPC authentication (``username``/``password`` call metadata)."""
        if self.users is None:
            return
        metadata = dict(context.invocation_metadata())
        user, password = metadata.get("username"), metadata.get("password")
        if not user or password is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "username and password must be provided")
        if self.users.get(str(user)) != password:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f'auth failure: caller "{user}" provided invalid credentials',
            )

    # -- writes (the test's application) ----------------------------------------------------
    def route(self, keyspace: str, key: int | None = None) -> EmulatedShard:
        """The shard that owns ``key`` (hash vindex); ``key`` may be omitted for one-shard keyspaces."""
        shards = self.keyspace_shards(keyspace)
        if len(shards) == 1:
            return shards[0]
        if key is None:
            raise ValueError(f"keyspace {keyspace} has {len(shards)} shards: pass the row's key")
        kid = keyspace_id(key)
        return next(s for s in shards if in_range(kid, s.name))

    def execute(
        self, keyspace: str, statement: str, params: Any = None, *, key: int | None = None
    ) -> list[Any]:
        """Run one autocommit statement on the shard that owns ``key`` (serialised with :meth:`reshard`)."""
        with self.write_lock:
            shard = self.route(keyspace, key)
            return shard.server.execute(statement, params, database=shard.database)

    def execute_all(self, keyspace: str, statement: str, params: Any = None) -> None:
        """Run a statement (a DDL, say) on every serving shard of ``keyspace``."""
        with self.write_lock:
            for shard in self.keyspace_shards(keyspace):
                shard.server.execute(statement, params, database=shard.database)

    # -- resharding --------------------------------------------------------------------------
    def reshard(self, keyspace: str, targets: dict[str, MariaDbServer], key_column: str = "id") -> b.Journal:
        """Split (or merge) ``keyspace`` onto ``targets`` as a Reshard workflow ends: copy every row
        to the shard its ``key_column`` hashes to, write the journal on the old shards, then route
        writes to the new shards.  Writes through :meth:`execute` wait meanwhile.
        """
        with self.write_lock:
            old = self.keyspace_shards(keyspace)
            tables = old[0].tables()
            schema = [self._create_table(old[0], t) for t in tables]
            new = []
            for name, server in targets.items():
                shard = EmulatedShard(keyspace, name, server, int(server.settings["server-id"]))
                self._prepare(shard, schema)
                new.append(shard)
            for source in old:
                for table in tables:
                    self._split_rows(source, table, new, key_column)
            journal = b.Journal(
                id=random.getrandbits(62), migration_type=b.SHARDS, tables=tables,
                local_position=old[0].position(),
                shard_gtids=[b.ShardGtid(keyspace=keyspace, shard=s.name, gtid=s.position()) for s in new],
                participants=[b.KeyspaceShard(keyspace=keyspace, shard=s.name) for s in old],
                source_workflows=[f"{keyspace}.reshard"],
            )  # fmt: skip
            # the new shards' tablets serve before the journal exists: a stream reading the journal
            # at once must find them (registered after it, a busy machine saw "no healthy tablet")
            for shard in new:
                self.all_shards[(keyspace, shard.name)] = shard
            for source in old:
                source.server.execute(
                    f"INSERT INTO `{JOURNAL_DB}`.`{JOURNAL_TABLE}` (id, db_name, val) VALUES (%s, %s, %s)",  # noqa: S608
                    (journal.id, source.database, journal.SerializeToString()),
                )
            self.keyspaces[keyspace] = new
            return journal

    @staticmethod
    def _create_table(shard: EmulatedShard, table: str) -> str:
        return str(shard.server.execute(f"SHOW CREATE TABLE `{table}`", database=shard.database)[0][1])

    @staticmethod
    def _split_rows(source: EmulatedShard, table: str, targets: list[EmulatedShard], key_column: str) -> None:
        conn = source.server.connect(database=source.database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM `{table}`")  # noqa: S608 - table name from information_schema
                names = [d[0] for d in cur.description]
                rows = cur.fetchall()
        finally:
            conn.close()
        key = names.index(key_column)
        columns = ", ".join(f"`{n}`" for n in names)
        insert = f"INSERT INTO `{table}` ({columns}) VALUES ({', '.join(['%s'] * len(names))})"  # noqa: S608
        for target in targets:
            mine = [r for r in rows if in_range(keyspace_id(int(r[key])), target.name)]
            if not mine:
                continue
            conn = target.server.connect(database=target.database)
            try:
                with conn.cursor() as cur:
                    cur.executemany(insert, mine)
                conn.commit()
            finally:
                conn.close()
