"""Connections, server checks and the binlog dump stream (pymysql for the wire protocol).

Errors are mapped to the product's hierarchy with the setting or privilege named; passwords
never reach messages.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.converters

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import (
    AuthenticationFailed,
    ConnectionFailed,
    MissingPrivilege,
    ProtocolError,
    ServerMisconfigured,
)
from airflow_cdc.core.session_sql import split_statements
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql.config import default_server_id
from airflow_cdc.sources.mysql.flavour import Flavour, detect
from airflow_cdc.sources.mysql.position import binlog_file_number
from airflow_cdc.sources.mysql.tls import auth_hint, tls_failure, tls_params

log = logging.getLogger(__name__)
COM_BINLOG_DUMP = 0x12


def connect(
    config: ConnectorConfig, *, initial: bool = True, **kwargs: Any
) -> pymysql.connections.Connection:
    """Open a connection (UTC session time zone, utf8mb4; read-only transactions with ``read.only``)
    and, unless not ``initial`` (the binlog dump's connection, as Debezium), run
    ``database.initial.statements``.

    :raises AuthenticationFailed: the server rejected the user or password.
    :raises ConnectionFailed: the server cannot be reached.
    """
    params: dict[str, Any] = {
        "host": config["database.hostname"],
        "port": config["database.port"] or 3306,
        "user": config["database.user"],
        "password": config.secret("database.password") or "",
        "charset": "utf8mb4",
        "connect_timeout": 10,
        "autocommit": True,
        "init_command": "SET time_zone = '+00:00'",
        # no result decoders: values arrive as the server's text (bytes for binary columns)
        "conv": {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)},
    }
    params.update(tls_params(config))
    params.update(kwargs)
    try:
        conn = pymysql.connect(**params)
    except pymysql.err.OperationalError as e:
        code = e.args[0] if e.args else 0
        where = f"{params['host']}:{params['port']}"
        if code in (1045, 1044, 1698):
            raise AuthenticationFailed(
                f"MySQL at {where} rejected the credentials of user {params['user']!r} (error {code})",
                hint=auth_hint(config),
            ) from None
        failure = tls_failure(config, where, code, str(e.args[1]) if len(e.args) > 1 else "")
        if failure is not None:
            raise failure from None
        raise ConnectionFailed(f"cannot connect to MySQL at {where}: error {code}") from None
    statements = split_statements(config["database.initial.statements"]) if initial else []
    if config["read.only"]:
        # first: the server then refuses every write on this connection, whatever the user's
        # privileges (SUPER and READ_ONLY ADMIN write through read_only=ON) and whoever's SQL it is
        statements.insert(0, "SET SESSION TRANSACTION READ ONLY")
    if statements:
        with conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)  # the operator's own SQL, by definition
    return conn


def query(conn: Any, sql: str, args: Any = None) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


@dataclass(frozen=True)
class ServerInfo:
    flavour: Flavour
    server_id: int
    row_metadata_full: bool
    checksum: bool
    variables: dict[str, str]


_REQUIRED = (
    ("log_bin", ("ON", "1"), "log_bin must be enabled (start the server with --log-bin)"),
    ("binlog_format", ("ROW",), "binlog_format must be ROW"),
    ("binlog_row_image", ("FULL",), "binlog_row_image must be FULL"),
)


def check_server(conn: Any) -> ServerInfo:
    """Check the binlog settings change capture needs.

    :raises ServerMisconfigured: naming the setting, its value and what it must be.
    """
    version = query(conn, "SELECT VERSION()")[0][0]
    names = (
        "log_bin",
        "binlog_format",
        "binlog_row_image",
        "binlog_row_metadata",
        "server_id",
        "binlog_checksum",
        "gtid_mode",
    )
    rows = query(
        conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names
    )
    values = {str(k).lower(): str(v) for k, v in rows}
    for name, allowed, hint in _REQUIRED:
        value = values.get(name, "")
        if value.upper() not in allowed:
            raise ServerMisconfigured(
                f"server setting {name} is {value or 'unset'!r}; change capture needs {' or '.join(allowed)}",
                hint=f"{hint} and restart the server",
            )
    metadata = values.get("binlog_row_metadata")
    if metadata is not None and metadata.upper() != "FULL":
        # not required: a table map without column names is still decoded exactly when the schema
        # history can prove the structure, and stops with an error naming the table when not
        log.warning(
            "server setting binlog_row_metadata is %r: set it to FULL so that every binlog row names its "
            "columns; without it two DDLs on one table in quick succession stop capture with a SchemaError",
            metadata,
        )
    return ServerInfo(
        detect(version),
        int(values.get("server_id", 0)),
        values.get("binlog_row_metadata", "").upper() == "FULL",
        values.get("binlog_checksum", "NONE").upper() != "NONE",
        values,
    )


_GRANT_ON_ALL = re.compile(r"^GRANT (.+?) ON \*\.\* TO", re.IGNORECASE)


def check_privileges(conn: Any, flavour: Flavour) -> None:
    """Check REPLICATION SLAVE and a binlog monitor privilege (global grants, roles ignored).

    :raises MissingPrivilege: naming the privilege to grant.
    """
    held: set[str] = set()
    for (grant,) in query(conn, "SHOW GRANTS FOR CURRENT_USER()"):
        match = _GRANT_ON_ALL.match(str(grant))
        if match:
            held |= {x.strip().upper() for x in match[1].split(",")}
    if "ALL PRIVILEGES" in held:
        return
    user = query(conn, "SELECT CURRENT_USER()")[0][0]
    if not held & {"REPLICATION SLAVE", "REPLICATION REPLICA"}:
        raise MissingPrivilege(
            f"user {user} lacks the REPLICATION SLAVE privilege needed to read the binlog",
            hint=f"GRANT REPLICATION SLAVE ON *.* TO {user}",
        )
    if not held & set(flavour.monitor_privileges):
        wanted = flavour.monitor_privileges[0]
        raise MissingPrivilege(
            f"user {user} lacks the {wanted} (REPLICATION CLIENT) privilege needed to read binlog positions",
            hint=f"GRANT {wanted} ON *.* TO {user}",
        )


def head(conn: Any, flavour: Flavour) -> tuple[str, int, str]:
    """(file, position, GTID set) of the end of the binlog now.

    On MySQL the GTID set comes from the same status row, so it is exact; on MariaDB it is read
    just after and may include a transaction beyond the position: :func:`gtids_at` is exact.

    :raises MissingPrivilege: the status statement was refused.
    """
    try:
        rows = query(conn, flavour.status_sql)
    except pymysql.err.OperationalError as e:
        if e.args and e.args[0] in (1227, 1142):
            raise MissingPrivilege(f"{flavour.status_sql} was refused: {e.args[1]}") from None
        raise
    if not rows:
        raise ServerMisconfigured(
            "the binlog is not enabled (SHOW MASTER STATUS is empty)", hint="start the server with --log-bin"
        )
    gtids = flavour.status_gtids(rows[0])
    if gtids is None:
        gtids = str(query(conn, flavour.gtid_sql)[0][0] or "").replace("\n", "")
    return str(rows[0][0]), int(rows[0][1]), gtids


def gtids_at(conn: Any, flavour: Flavour, file: str, pos: int, head_gtids: str) -> str:
    """The exact GTID set at ``file:pos`` of the head (``head_gtids``: what :func:`head` read)."""
    sql = flavour.gtids_at_sql(file, pos)
    if sql is None:
        return head_gtids
    return str(query(conn, *sql)[0][0] or "")


def file_start_gtids(conn: Any, flavour: Flavour, file: str) -> str | None:
    """The GTID set of everything written before binlog ``file``; None if the file is gone."""
    return flavour.file_start_gtids(query(conn, *flavour.file_start_gtids_sql(file)))


def server_flavour(conn: Any) -> Flavour:
    """The flavour of a connected server, without the checks of :func:`check_server`."""
    return detect(str(query(conn, "SELECT VERSION()")[0][0]))


def binlog_files(conn: Any) -> list[str]:
    return [str(r[0]) for r in query(conn, "SHOW BINARY LOGS")]


def coordinate(file: str, pos: int) -> int:
    """A binlog coordinate as one orderable integer: file number in the high 32 bits."""
    return binlog_file_number(file) << 32 | pos


class BinlogStream:
    """A binlog dump from ``file:pos`` on a dedicated connection; :meth:`read` returns event bytes
    (header included, checksum stripped) until the server reports the end (non-blocking dump)."""

    def __init__(
        self,
        config: ConnectorConfig,
        info: ServerInfo,
        file: str,
        pos: int,
        annotate: bool,
        gtid_state: str | None = None,
    ) -> None:
        """:param gtid_state: MariaDB only: start after this GTID position (``domain-server-seq``
        list) instead of at ``file:pos`` (pass ``""`` and 4 for those)."""
        self.conn = connect(config, initial=False, read_timeout=600)
        self.checksum = info.checksum
        with self.conn.cursor() as cur:
            if info.checksum:
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cur.execute("SET @mariadb_slave_capability = 4")  # send real GTID events
            if gtid_state is not None:
                cur.execute("SET @slave_connect_state = %s", (gtid_state,))
                cur.execute("SET @slave_gtid_strict_mode = 1")
        server_id = config["database.server.id"] or default_server_id(config["name"])
        name = file.encode()
        packet = (
            struct.pack("<BIHI", COM_BINLOG_DUMP, pos, info.flavour.dump_flags(annotate), server_id) + name
        )
        self.conn._next_seq_id = 0
        self.conn._write_bytes(struct.pack("<I", len(packet))[:3] + b"\x00" + packet)
        self.conn._next_seq_id = 1

    def read(self) -> bytes | None:
        """Next event, or None at the end of the binlog.

        :raises MissingPrivilege: the server refused the dump (REPLICATION SLAVE).
        :raises ProtocolError: the server reported another error.
        """
        try:
            packet = self.conn._read_packet()
        except pymysql.err.OperationalError as e:
            code = e.args[0] if e.args else 0
            if code in (1227, 1045):
                raise MissingPrivilege(
                    f"binlog dump refused: {e.args[1]}",
                    hint="GRANT REPLICATION SLAVE ON *.* TO the connector user",
                ) from None
            raise ProtocolError(f"binlog dump failed: error {code}: {e.args[1:]}") from e
        data = packet._data
        if data[0] == 0xFE and len(data) < 9:
            return None
        if data[0] != 0:
            raise ProtocolError(f"unexpected binlog packet marker 0x{data[0]:02x}")
        if self.checksum and data[5] != p.FORMAT_DESCRIPTION:
            return data[1:-4]
        return data[1:]

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - the dump connection may already be gone
            pass


def check_connection(config: ConnectorConfig) -> str:
    """Connect and run the start-up checks of a capture: binlog settings and privileges."""
    conn = connect(config)
    try:
        info = check_server(conn)
        check_privileges(conn, info.flavour)
        version = query(conn, "SELECT VERSION()")[0][0]
    finally:
        conn.close()
    return f"{version}: binlog ROW/FULL, server_id {info.server_id}, replication privileges granted"
