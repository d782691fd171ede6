"""The emulator's TDS listener: one thread per client connection on a loopback port.

The server speaks just enough TDS for pyodbc over FreeTDS or Microsoft's ODBC driver: PRELOGIN
(no encryption), LOGIN7 with a password check (wrong credentials get SQL Server's error 18456),
SQL batches, RPCs (``sp_executesql``, ``sp_prepexec``, ``sp_prepare``/``sp_execute``/
``sp_unprepare``) and transaction-manager requests.  Statements go to a :class:`Backend`, which
returns result sets or raises :class:`SqlError`.  Set ``trace`` to log every request (that is how
the FreeTDS traffic in the tests' docstrings was captured).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_cdc.testing.sqlserver_emulator import tokens as K
from airflow_cdc.testing.sqlserver_emulator import wire as W
from airflow_cdc.testing.sqlserver_emulator.types import SqlType

log = logging.getLogger(__name__)


class SqlError(Exception):
    """A SQL Server error to send to the client (number, severity and state as SQL Server uses);
    ``more``: the further messages SQL Server sends with it (e.g. 297 after 300)."""

    def __init__(
        self, number: int, text: str, severity: int = 16, state: int = 1, more: Sequence[SqlError] = ()
    ) -> None:
        super().__init__(f"Msg {number}: {text}")
        self.number, self.text, self.severity, self.state = number, text, severity, state
        self.more = tuple(more)

    def messages(self) -> bytes:
        """The ERROR tokens of this error and the ones sent with it."""
        return b"".join(
            K.message(e.number, e.text, severity=e.severity, state=e.state) for e in (self, *self.more)
        )


@dataclass
class Result:
    """One statement's outcome: a result set (``columns`` set) or a row count."""

    columns: Sequence[tuple[str, SqlType]] | None = None
    rows: Sequence[Sequence[Any]] = field(default_factory=list)
    rowcount: int = -1


class Session(Protocol):
    database: str
    in_transaction: bool

    def execute(self, sql: str, params: dict[str, Any]) -> list[Result]: ...

    def begin(self) -> None: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


class Backend(Protocol):
    def login(self, login: W.Login) -> Session:
        """Return a session, or raise SqlError(18456) / SqlError(4060) for a bad login or database."""
        ...


_PARAM_DEF = re.compile(r"@(\w+)\s+[^,]+?(?:\([^)]*\))?(?:\s+output)?\s*(?:,|$)", re.IGNORECASE)


class TdsServer:
    """Accept TDS connections on 127.0.0.1 and serve each with its own backend session."""

    def __init__(self, backend: Backend, port: int = 0, trace: bool = False) -> None:
        self.backend, self.trace = backend, trace
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="tds-accept", daemon=True)
        self.wire_log: list[tuple[str, Any]] = []  # (kind, detail) when trace is on

    def start(self) -> TdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening.  The socket is shut down and the accept thread joined before the
        descriptor is closed: a thread about to call ``accept()`` on a closed descriptor number
        could otherwise accept on the next socket given that number (another emulator's, in a
        test process that starts several), and serve its clients with this backend."""
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() (EINVAL on Linux)
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_Connection(self, conn).serve, name="tds-conn", daemon=True).start()

    def record(self, kind: str, detail: Any) -> None:
        if self.trace:
            self.wire_log.append((kind, detail))
            log.info("tds %s: %r", kind, detail)


class _Connection:
    def __init__(self, server: TdsServer, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.packet_size = 4096
        self.session: Session | None = None
        self.prepared: dict[int, tuple[str, list[str]]] = {}

    def send(self, payload: bytes) -> None:
        W.send_message(self.sock, W.REPLY, payload, self.packet_size)

    def serve(self) -> None:
        try:
            while (msg := W.read_message(self.sock)) is not None:
                kind, data = msg
                if not self._handle(kind, data):
                    break
        except (OSError, W.WireError) as exc:
            log.debug("TDS connection ended: %s", exc)
        finally:
            if self.session is not None:
                self.session.close()
            self.sock.close()

    def _handle(self, kind: int, data: bytes) -> bool:
        if kind == W.PRELOGIN:
            opts = W.parse_prelogin(data)
            self.server.record("prelogin", {k: v.hex() for k, v in opts.items()})
            asked = opts.get(1, b"\x02")[0]
            if asked in (W.ENCRYPT_ON, W.ENCRYPT_REQ):
                self.send(W.prelogin_response(W.ENCRYPT_NOT_SUP))
                return False  # the client wants TLS; we have none, it reports that
            self.send(W.prelogin_response(W.ENCRYPT_NOT_SUP))
            return True
        if kind == W.LOGIN7:
            return self._login(data)
        if self.session is None:
            raise W.WireError(f"packet type {kind} before login")
        if kind == W.ATTENTION:
            self.send(K.done(W.DONE_ATTN))
            return True
        try:
            if kind == W.SQL_BATCH:
                sql = W.skip_all_headers(data).decode("utf-16-le")
                self.server.record("batch", sql)
                self.send(self._results(self.session.execute(sql, {})) + self._final())
            elif kind == W.RPC:
                try:
                    calls = W.parse_rpc(W.skip_all_headers(data))
                except W.WireError as exc:  # SQL Server answers a malformed RPC with 8016
                    raise SqlError(
                        8016,
                        "The incoming tabular data stream (TDS) remote procedure call (RPC) "
                        f"protocol stream is incorrect: {exc}",
                    ) from exc
                self.send(self._rpc(calls))
            elif kind == W.TRANSACTION_MANAGER:
                self.send(self._transaction(W.skip_all_headers(data)))
            else:
                raise W.WireError(f"unsupported packet type {kind}")
        except SqlError as exc:
            self._error(exc)
        except W.WireError:
            raise  # the stream is out of step: drop the connection
        except Exception as exc:  # an emulator bug or a dropped backing database: tell the client
            log.exception("emulator failed on a request")
            self._error(
                SqlError(50000, f"SQL Server CDC emulator internal error: {type(exc).__name__}: {exc}")
            )
        return True

    def _error(self, exc: SqlError) -> None:
        self.send(exc.messages() + K.done(W.DONE_ERROR | self._xact_flag()))

    def _login(self, data: bytes) -> bool:
        login = W.parse_login7(data)
        self.server.record(
            "login7",
            {
                "tds_version": hex(login.tds_version),
                "packet_size": login.packet_size,
                "user": login.user,
                "database": login.database,
                "app": login.app_name,
            },
        )
        try:
            self.session = self.server.backend.login(login)
        except SqlError as exc:
            self.send(
                K.message(exc.number, exc.text, severity=exc.severity, state=exc.state) + K.done(W.DONE_ERROR)
            )
            return False
        self.packet_size = min(max(login.packet_size or 4096, 512), 32767)
        version = min(login.tds_version, W.TDS74) if login.tds_version >= W.TDS73B else W.TDS74
        self.send(
            K.envchange_text(K.ENV_DATABASE, self.session.database, "master")
            + K.message(
                5701, f"Changed database context to '{self.session.database}'.", severity=0, info=True
            )
            + K.envchange_bytes(K.ENV_COLLATION, bytes.fromhex("0904d00034"))
            + K.envchange_text(K.ENV_LANGUAGE, "us_english")
            + K.loginack(version)
            + K.envchange_text(K.ENV_PACKETSIZE, str(self.packet_size), "4096")
            + K.done()
        )
        return True

    def _xact_flag(self) -> int:
        return W.DONE_INXACT if self.session is not None and self.session.in_transaction else 0

    def _final(self) -> bytes:
        return K.done(self._xact_flag())

    def _results(self, results: list[Result], token: int = K.DONE) -> bytes:
        out = bytearray()
        for res in results:
            if res.columns is not None:
                out += K.colmetadata(res.columns)
                out += K.rows([t for _, t in res.columns], res.rows)
                out += K.done(W.DONE_MORE | W.DONE_COUNT | self._xact_flag(), len(res.rows), token)
            elif res.rowcount >= 0:
                out += K.done(W.DONE_MORE | W.DONE_COUNT | self._xact_flag(), res.rowcount, token)
        return bytes(out)

    def _rpc(self, calls: list[W.RpcCall]) -> bytes:
        assert self.session is not None
        out = bytearray()
        for call in calls:
            self.server.record("rpc", (call.proc, [(p.name, p.sql_type, p.value) for p in call.params]))
            out += self._call(call)
        return bytes(out)

    def _call(self, call: W.RpcCall) -> bytes:
        assert self.session is not None
        params = call.params
        extra = b""
        if call.proc == "sp_executesql":
            sql, names = str(params[0].value), _param_names(params[1].value if len(params) > 1 else "")
            values = params[2:]
        elif call.proc == "sp_prepexec":
            names, sql = _param_names(params[1].value), str(params[2].value)
            handle = len(self.prepared) + 1
            self.prepared[handle] = (sql, names)
            extra = K.return_value_int(0, params[0].name, handle)
            values = params[3:]
        elif call.proc == "sp_prepare":
            handle = len(self.prepared) + 1
            self.prepared[handle] = (str(params[2].value), _param_names(params[1].value))
            return (
                K.return_status(0)
                + K.return_value_int(0, params[0].name, handle)
                + K.done(self._xact_flag(), token=K.DONEPROC)
            )
        elif call.proc == "sp_execute":
            sql, names = self.prepared[int(params[0].value)]
            values = params[1:]
        elif call.proc == "sp_unprepare":
            self.prepared.pop(int(params[0].value), None)
            return K.return_status(0) + K.done(self._xact_flag(), token=K.DONEPROC)
        else:
            raise SqlError(2812, f"Could not find stored procedure '{call.proc}'.")
        bound = {name: p.value for name, p in zip(names, values, strict=False)}
        bound.update({p.name.lstrip("@"): p.value for p in values if p.name})
        body = self._results(self.session.execute(sql, bound), token=K.DONEINPROC)
        return body + K.return_status(0) + extra + K.done(self._xact_flag(), token=K.DONEPROC)

    def _transaction(self, data: bytes) -> bytes:
        assert self.session is not None
        request = int.from_bytes(data[:2], "little")
        self.server.record("transaction", request)
        descriptor = b"\x01\x00\x00\x00\x00\x00\x00\x00"
        if request == 5:  # TM_BEGIN_XACT
            self.session.begin()
            return K.envchange_bytes(K.ENV_BEGIN_TRAN, descriptor) + K.done(W.DONE_INXACT)
        if request in (7, 8):  # TM_COMMIT_XACT / TM_ROLLBACK_XACT (flag: begin a new one)
            (self.session.commit if request == 7 else self.session.rollback)()
            kind = K.ENV_COMMIT_TRAN if request == 7 else K.ENV_ROLLBACK_TRAN
            out = K.envchange_bytes(kind, b"", descriptor)
            if len(data) > 3 and data[3] & 1:
                self.session.begin()
                out += K.envchange_bytes(K.ENV_BEGIN_TRAN, descriptor)
            return out + K.done(self._xact_flag())
        raise SqlError(8509, f"Transaction manager request {request} is not supported by the emulator.")


def _param_names(definition: Any) -> list[str]:
    return [m.group(1) for m in _PARAM_DEF.finditer(str(definition or ""))]


Handler = Callable[..., list[Result]]
