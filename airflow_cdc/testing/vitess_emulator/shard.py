"""One emulated Vitess shard: a MariaDB server holding the keyspace's database ``vt_<keyspace>``.

GTID mapping.  Vitess positions are MySQL-5.6 GTID sets (``MySQL56/<server uuid>:1-<n>``);
MariaDB's are ``domain-server-seq``.  Each shard server runs alone in GTID domain 0 with its own
``server-id`` under ``gtid_strict_mode``, so its transactions are numbered 1, 2, 3 ... without gaps
and ``0-<server_id>-<n>`` maps one to one onto ``MySQL56/<uuid>:1-<n>``, where ``<uuid>`` is a
UUID the emulator draws for the shard server (real vtgate would show the MySQL 8 server_uuid).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pymysql.converters

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.sources.mysql import client
from airflow_cdc.sources.mysql.config import mysql_config
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.testing.servers import MariaDbServer
from airflow_cdc.testing.vitess_emulator.values import vitess_type

_POSITION = re.compile(r"^(?:MySQL56/)?([0-9a-fA-F-]{36}):1-(\d+)$")
JOURNAL_DB, JOURNAL_TABLE = "_vt", "resharding_journal"
# parameter encoders but no result decoders: values arrive as the server's text bytes
_ENCODERS_ONLY = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}


class PositionError(ValueError):
    """A position that does not name this shard's server or is not a contiguous ``1-n`` set."""


@dataclass
class EmulatedShard:
    """A shard of ``keyspace`` named ``name`` (``-``, ``0``, ``-80``, ``80-`` ...) on ``server``."""

    keyspace: str
    name: str
    server: MariaDbServer
    server_id: int
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    _fields: dict[str, tuple[tuple, list[q.Field]]] = field(default_factory=dict, repr=False)
    _info: client.ServerInfo | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._config = self.config()

    @property
    def database(self) -> str:
        return f"vt_{self.keyspace}"

    # -- positions ---------------------------------------------------------------------------
    def seq(self) -> int:
        """The number of the last transaction written (0 when none)."""
        text = str(self.server.execute("SELECT @@global.gtid_binlog_pos")[0][0] or "")
        for part in filter(None, text.split(",")):
            domain, server, number = part.strip().split("-")
            if domain == "0" and int(server) == self.server_id:
                return int(number)
        return 0

    def position(self, seq: int | None = None) -> str:
        """The Vitess position after transaction ``seq`` (default: now)."""
        seq = self.seq() if seq is None else seq
        return f"MySQL56/{self.uuid}:1-{seq}" if seq else "MySQL56/"

    def parse(self, position: str) -> int:
        """The transaction number a Vitess position of this shard stands for.

        :raises PositionError: another server's position, or not ``1-n``.
        """
        if position in ("MySQL56/", ""):
            return 0
        match = _POSITION.match(position)
        if not match:
            raise PositionError(f"position {position!r} is not a MySQL56 GTID set of the form <uuid>:1-<n>")
        if match[1].lower() != self.uuid:
            raise PositionError(
                f"position {position!r} names server {match[1]}, not this shard's {self.uuid}"
            )
        return int(match[2])

    def maria_state(self, seq: int) -> str:
        return f"0-{self.server_id}-{seq}" if seq else ""

    # -- connections -------------------------------------------------------------------------
    def config(self) -> ConnectorConfig:
        return mysql_config(
            {
                "name": f"vtgate-emulator-{self.keyspace}-{self.name}",
                "database.hostname": self.server.host,
                "database.port": self.server.port,
                "database.user": self.server.superuser,
                "database.password": self.server.password,
                "database.ssl.mode": "disabled",
                "database.server.id": 90_000 + self.server_id,
                "topic.prefix": "vtgate_emulator",
                "staging.path": "/nonexistent/vtgate-emulator",  # required by the schema, never used
            }
        )

    def connect(self, **kwargs: Any) -> Any:
        """A connection to the shard database returning every value as raw text bytes."""
        return self.server.connect(
            database=self.database, autocommit=True, use_unicode=False, conv=_ENCODERS_ONLY,
            init_command="SET time_zone = '+00:00'",
            **kwargs,
        )  # fmt: skip

    def open_dump(self, seq: int) -> client.BinlogStream:
        """A non-blocking binlog dump starting after transaction ``seq``."""
        if self._info is None:
            conn = client.connect(self._config)
            try:
                self._info = client.check_server(conn)
            finally:
                conn.close()
        return client.BinlogStream(self._config, self._info, "", 4, False, gtid_state=self.maria_state(seq))

    # -- schema ------------------------------------------------------------------------------
    def tables(self) -> list[str]:
        rows = self.server.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE'",
            (self.database,),
        )
        return sorted(str(r[0]) for r in rows)

    def pk_columns(self, table: str) -> list[str]:
        rows = self.server.execute(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = %s"
            " AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
            (self.database, table),
        )
        return [str(r[0]) for r in rows]

    def fields(self, table: str, signature: tuple = ()) -> list[q.Field]:
        """The FIELD description of ``table`` (cached per table-map signature, so a DDL refreshes it).

        Built as vttablet does: from the protocol metadata of an empty SELECT, plus ``column_type``
        from information_schema.  MariaDB's JSON is LONGTEXT with a ``json_valid`` check: such a
        column is reported as ``JSON``, as MySQL 8 under real Vitess would.
        """
        cached = self._fields.get(table)
        if cached is not None and cached[0] == signature and signature:
            return cached[1]
        fields = self._describe(table)
        self._fields[table] = (signature, fields)
        return fields

    def _describe(self, table: str) -> list[q.Field]:
        quoted = "`" + table.replace("`", "``") + "`"
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {quoted} LIMIT 0")  # noqa: S608 - quoted identifier
                described = list(cur._result.fields)
                cur.execute(
                    "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS"
                    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (self.database, table),
                )
                column_types = {r[0].decode(): r[1].decode() for r in cur.fetchall()}
                cur.execute(
                    "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS"
                    " WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s",
                    (self.database, table),
                )
                json_columns = {
                    m[1]
                    for (clause,) in cur.fetchall()
                    for m in [re.match(r"json_valid\(`(.+)`\)", clause.decode())]
                    if m
                }
        finally:
            conn.close()
        out = []
        for f in described:
            name = f.name
            t = vitess_type(f.type_code, f.flags, f.charsetnr)
            column_type = column_types.get(name, "")
            if name in json_columns:
                t, column_type = q.JSON, "json"
            out.append(
                q.Field(
                    name=name, type=t, table=table, org_table=table, database=self.database, org_name=name,
                    column_length=f.length, charset=f.charsetnr, decimals=f.scale, flags=f.flags,
                    column_type=column_type,
                )
            )  # fmt: skip
        return out

    def ensure_journal_table(self) -> None:
        self.server.execute(f"CREATE DATABASE IF NOT EXISTS `{JOURNAL_DB}`")
        self.server.execute(
            f"CREATE TABLE IF NOT EXISTS `{JOURNAL_DB}`.`{JOURNAL_TABLE}`"
            " (id BIGINT PRIMARY KEY, db_name VARBINARY(255), val LONGBLOB)"
        )


def is_purged_error(error: BaseException) -> bool:
    """Whether a dump failure is MariaDB's 1236 (the requested GTID is no longer in any binlog)."""
    cause = error.__cause__
    return isinstance(cause, pymysql.err.OperationalError) and bool(cause.args) and cause.args[0] == 1236
