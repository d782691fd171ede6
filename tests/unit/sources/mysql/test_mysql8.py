"""MySQL 8 code paths without a MySQL 8 server: flavour SQL per version, status rows, GTID events
and uuid interval sets, v2 rows events, binary JSON, and ``caching_sha2_password`` against a fake
server speaking the client/server protocol.  ``tests/integration/mysql8`` runs the real thing
when ``AIRFLOW_CDC_MYSQL8_URL`` names a server."""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
import uuid
from typing import Any

import pytest

from airflow_cdc.core.errors import AuthenticationFailed, ProtocolError, ServerMisconfigured
from airflow_cdc.sources.mysql import client, offsets
from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql.config import mysql_config
from airflow_cdc.sources.mysql.flavour import GtidSet, _mysql_json, detect

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "8f2c7e10-0000-4000-8000-000000000002"


class FakeConn:
    """Answers ``client.query`` from canned rows (first SQL prefix that matches); records the SQL."""

    def __init__(self, answers: dict[str, list[tuple]]) -> None:
        self.answers, self.sql = answers, []

    def cursor(self) -> FakeConn:
        return self

    def __enter__(self) -> FakeConn:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: Any = None) -> None:
        self.sql.append((sql, args))
        self.rows = next(rows for prefix, rows in self.answers.items() if sql.startswith(prefix))

    def fetchall(self) -> list[tuple]:
        return self.rows


def _mysql8(version: str, status: tuple, server_id: int = 7) -> FakeConn:
    return FakeConn(
        {
            "SELECT VERSION()": [(version,)],
            "SELECT @@GLOBAL.server_id": [(server_id,)],
            "SHOW BINARY LOG STATUS": [status],
            "SHOW MASTER STATUS": [status],
        }
    )


def test_status_statement_and_gtids_by_version():
    assert detect("8.4.2").status_sql == "SHOW BINARY LOG STATUS"
    assert detect("8.0.36").status_sql == "SHOW MASTER STATUS"
    assert detect("10.11.6-MariaDB-log").status_sql == "SHOW MASTER STATUS"
    status = ("binlog.000003", 1200, "", "", f"{U1}:1-10,\n{U2}:1-3")
    for version in ("8.0.36", "8.4.2"):
        conn = _mysql8(version, status)
        flavour = client.server_flavour(conn)
        # the GTID set comes from the status row itself: exact at the position, no second query
        assert client.head(conn, flavour) == ("binlog.000003", 1200, f"{U1}:1-10,{U2}:1-3")
        assert [s for s, _ in conn.sql] == ["SELECT VERSION()", flavour.status_sql]
        assert client.gtids_at(conn, flavour, "binlog.000003", 1200, "x") == "x"
    maria = detect("10.11.6-MariaDB")
    assert maria.status_gtids(("binlog.000001", 4, "", "")) is None
    assert maria.gtids_at_sql("binlog.000001", 99) == (
        "SELECT BINLOG_GTID_POS(%s, %s)",
        ("binlog.000001", 99),
    )


def test_gtids_before_a_binlog_file():
    mysql = detect("8.0.36")
    sql, args = mysql.file_start_gtids_sql("binlog.000002")
    assert sql.startswith("SHOW BINLOG EVENTS IN %s") and args == ("binlog.000002",)
    rows = [
        ("binlog.000002", 4, "Format_desc", 1, 126, "Server ver: 8.0.36, Binlog ver: 4"),
        ("binlog.000002", 126, "Previous_gtids", 1, 197, f"{U1}:1-10,\n{U2}:1-3"),
    ]
    assert mysql.file_start_gtids(rows) == f"{U1}:1-10,{U2}:1-3"
    assert mysql.file_start_gtids([]) is None  # no such file
    conn = FakeConn(
        {
            "SHOW BINLOG EVENTS": [
                ("binlog.000001", 4, "Format_desc", 1, 126, ""),
                ("binlog.000001", 126, "Previous_gtids", 1, 197, f"{U1}:1-5"),
            ]
        }
    )
    stored = GtidSet(f"{U1}:1-7")
    assert offsets.gtid_start_file(conn, mysql, stored, ["binlog.000001"], lambda _: True) == "binlog.000001"
    assert (
        offsets.gtid_start_file(conn, mysql, GtidSet(f"{U1}:1-4"), ["binlog.000001"], lambda _: True) is None
    )


def test_changes_after_on_mysql8():
    status = ("binlog.000003", 1200, "", "", f"{U1}:1-10,{U2}:1-3")
    offset = {"file": "binlog.000003", "pos": 1200, "gtids": f"{U1}:1-10,{U2}:1-3", "server_id": 7}
    every = lambda _: True  # noqa: E731
    assert offsets.changes_after(_mysql8("8.4.2", status), offset, "binlog", every) is False
    assert offsets.changes_after(_mysql8("8.4.2", status), offset, "gtid", every) is False
    moved = ("binlog.000004", 157, "", "", f"{U1}:1-11,{U2}:1-3")
    assert offsets.changes_after(_mysql8("8.4.2", moved), offset, "wal", every) is True
    assert offsets.changes_after(_mysql8("8.4.2", moved), offset, "gtid", every) is True
    assert offsets.changes_after(_mysql8("8.4.2", moved), offset, "gtid", lambda s: s != U1) is False
    assert offsets.changes_after(_mysql8("8.0.36", status, server_id=8), offset, "gtid", every) is True
    no_gtids = ("binlog.000003", 1200, "", "", "")
    with pytest.raises(ServerMisconfigured, match="gtid_mode=ON"):
        offsets.changes_after(_mysql8("8.0.36", no_gtids), offset, "gtid", every)


def test_gtid_uuid_interval_sets():
    gset = GtidSet(f"{U1}:1-5:7-9,\n{U2}:3")
    assert gset.contains(f"{U1}:8") and not gset.contains(f"{U1}:6") and gset.contains(f"{U2.upper()}:3")
    assert gset.covers(GtidSet(f"{U1}:2-4:9")) and not gset.covers(GtidSet(f"{U1}:5-7"))
    assert gset.covers(GtidSet(f"{U1}:1-9"), source_filter=lambda s: s == U2)  # U1 is not captured
    assert not GtidSet("").covers(GtidSet(f"{U2}:1")) and not GtidSet("")
    maria = GtidSet("0-1-100,7-2-5")
    assert maria.contains("0-3-100") and not maria.contains("0-1-101") and not maria.contains("1-1-1")
    assert maria.covers(GtidSet("0-1-90,7-2-5")) and not maria.covers(GtidSet("0-1-90,8-1-1"))
    assert maria.covers(GtidSet("8-1-1"), source_filter=lambda s: not s.startswith("8-"))


def test_mysql_gtid_event_and_flavour_parse():
    sid = uuid.UUID(U1).bytes
    body = b"\x01" + sid + struct.pack("<Q", 42) + b"\x02" + b"\x00" * 16
    assert p.parse_mysql_gtid(body) == f"{U1}:42"
    mysql = detect("8.0.36")
    header = p.Header(0, p.GTID, 1, 19 + len(body), 500, 0)
    assert mysql.parse_gtid(header, body) == (f"{U1}:42", True) and mysql.gtid_event == p.GTID
    assert mysql.gtid_source(f"{U1}:42") == U1 and mysql.dump_flags(annotate=True) == 0x01
    assert mysql.snapshot_watermark_sql() is None and "REPLICATION CLIENT" in mysql.monitor_privileges
    with pytest.raises(ProtocolError):
        p.parse_mysql_gtid(body[:20])


def test_rows_v2_events_skip_their_extra_data():
    bitmap = b"\x07"  # three columns present
    head = (1234).to_bytes(6, "little") + struct.pack("<H", 1)
    plain = head + struct.pack("<H", 2) + b"\x03" + bitmap
    assert p.rows_body_start(p.WRITE_V2, plain) == (1234, 1, len(plain), [True] * 3, None)
    extra = head + struct.pack("<H", 2 + 5) + b"\x01\x03abc" + b"\x03" + bitmap + b"\x05"
    table_id, _, o, present, after = p.rows_body_start(p.UPDATE_V2, extra)
    assert (table_id, o, present, after) == (1234, len(extra), [True] * 3, [True, False, True])
    v1 = head + b"\x03" + bitmap
    assert p.rows_body_start(p.DELETE_V1, v1)[2] == len(v1)
    with pytest.raises(ProtocolError):
        p.rows_body_start(p.WRITE_V2, head + b"\x02")


def test_binary_json_of_mysql8():
    small_object = b"\x00" + struct.pack("<HH", 1, 12) + struct.pack("<HH", 11, 1) + b"\x05\x01\x00" + b"a"
    decode = detect("8.0.36").json_decoder()
    assert decode(small_object) == b'{"a": 1}' and decode(b"\x0c\x03abc") == b'"abc"'
    assert decode(b"") == b"null" and detect("10.11.6-MariaDB").json_decoder() is None
    assert _mysql_json is decode


# -- caching_sha2_password against a fake MySQL 8 server --------------------------------------------

CAPS = 0x1 | 0x8 | 0x200 | 0x2000 | 0x8000 | 0x20000 | 0x80000 | 0x200000


def _packet(seq: int, payload: bytes) -> bytes:
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload


def _read_packet(conn: socket.socket) -> tuple[int, bytes]:
    head = conn.recv(4, socket.MSG_WAITALL)
    size = int.from_bytes(head[:3], "little")
    return head[3], conn.recv(size, socket.MSG_WAITALL) if size else b""


def _scramble(password: bytes, nonce: bytes) -> bytes:
    p1 = hashlib.sha256(password).digest()
    p3 = hashlib.sha256(hashlib.sha256(p1).digest() + nonce).digest()
    return bytes(a ^ b for a, b in zip(p1, p3, strict=True))


class FakeMySql8(threading.Thread):
    """Accepts one client: ``caching_sha2_password`` fast authentication, then OK to every query."""

    nonce = bytes(range(1, 21))

    def __init__(self, password: str) -> None:
        super().__init__(daemon=True)
        self.password, self.seen_user, self.queries = password.encode(), "", []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def run(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            greeting = (
                b"\x0a8.4.2\x00" + struct.pack("<I", 9) + self.nonce[:8] + b"\x00"
                + struct.pack("<HBHH", CAPS & 0xFFFF, 255, 2, CAPS >> 16) + bytes([21]) + b"\x00" * 10
                + self.nonce[8:] + b"\x00" + b"caching_sha2_password\x00"
            )  # fmt: skip
            conn.sendall(_packet(0, greeting))
            _, reply = _read_packet(conn)
            user_end = reply.index(b"\x00", 32)
            self.seen_user = reply[32:user_end].decode()
            length = reply[user_end + 1]
            token = reply[user_end + 2 : user_end + 2 + length]
            if token != _scramble(self.password, self.nonce):
                message = f"Access denied for user '{self.seen_user}'@'localhost' (using password: YES)"
                conn.sendall(_packet(2, b"\xff" + struct.pack("<H", 1045) + b"#28000" + message.encode()))
                return
            conn.sendall(_packet(2, b"\x01\x03"))  # fast authentication succeeded
            conn.sendall(_packet(3, b"\x00\x00\x00\x02\x00\x00\x00"))
            while True:
                seq, command = _read_packet(conn)
                if not command or command[0] == 0x01:  # COM_QUIT
                    return
                self.queries.append(command[1:].decode())
                conn.sendall(_packet(seq + 1, b"\x00\x00\x00\x02\x00\x00\x00"))


def _config(port: int, password: str) -> Any:
    return mysql_config(
        {
            "name": "m8",
            "connector": "mysql",
            "database.hostname": "127.0.0.1",
            "database.port": port,
            "database.user": "cdc",
            "database.password": password,
            "staging.path": "/nonexistent",
        }
    )


def test_caching_sha2_password_fast_auth():
    server = FakeMySql8("s3cret-pw")
    server.start()
    conn = client.connect(_config(server.port, "s3cret-pw"))
    conn.close()
    server.join(timeout=10)
    assert server.seen_user == "cdc" and "SET time_zone = '+00:00'" in server.queries


def test_caching_sha2_password_rejected_without_leaking_the_password():
    server = FakeMySql8("s3cret-pw")
    server.start()
    with pytest.raises(AuthenticationFailed) as info:
        client.connect(_config(server.port, "wrong-pw"))
    server.join(timeout=10)
    text = str(info.value) + repr(info.value.__cause__) + repr(info.value.__context__)
    assert "'cdc'" in text and "1045" in text and "wrong-pw" not in text
