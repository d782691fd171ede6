"""A MariaDB primary and a read-only GTID replica of it, and the audit of what a connector user ran.

The replica has ``log_slave_updates=ON`` (its own binlog holds what it replicates), ``read_only=ON``
and a general log in ``mysql.general_log`` (``log_output=TABLE``: not binlogged).  Replication
starts at the primary's GTID position after both servers' own set-up (``RESET MASTER`` on the
replica, ``MASTER_USE_GTID=slave_pos``); every later user, database and row is made on the primary
and reaches the replica through replication.  A connector user has only what a read-only capture
needs: ``SELECT``, ``REPLICATION SLAVE``, ``REPLICATION CLIENT`` (MariaDB's ``BINLOG MONITOR``).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_cdc.testing.servers import MariaDbServer

REPLICATION_USER, REPLICATION_PASSWORD = "repl", "repl-secret-4c1"  # noqa: S105 - a throwaway server's
CONNECTOR_PASSWORD = "cdc-ro-secret-9d2"  # noqa: S105 - a throwaway server's
REPLICA_SETTINGS = {
    "server-id": "2",
    "log-slave-updates": "ON",
    "read-only": "ON",
    "general-log": "ON",
    "log-output": "TABLE",
}
#: what a read-only capture may send: reads, session settings, its own read-only transactions
_ALLOWED = re.compile(
    r"^\s*(SELECT\b|SHOW\b|SET\s+(SESSION\b|@|NAMES\b|time_zone\b|autocommit\b)|"
    r"START\s+TRANSACTION\b.*\bREAD\s+ONLY\s*$|COMMIT\s*$|ROLLBACK\s*$)",
    re.IGNORECASE | re.DOTALL,
)
#: SELECT forms that lock or write
_WRITING_SELECT = re.compile(r"\bFOR\s+UPDATE\b|\bLOCK\s+IN\s+SHARE\s+MODE\b|\bINTO\s+(OUT|DUMP)FILE\b", re.I)
#: binlog events that a transaction written on the replica itself would leave (server_id 2)
_DATA_EVENTS = {"Gtid", "Query", "Table_map", "Write_rows_v1", "Update_rows_v1", "Delete_rows_v1", "Xid"}


@dataclass
class PrimaryDb:
    """A database made on the primary (the replica gets it through replication)."""

    name: str
    server: MariaDbServer

    def connect(self, **kwargs: Any) -> Any:
        return self.server.connect(database=self.name, **kwargs)


class ReplicaPair:
    """A started primary and its read-only replica; :meth:`stop` removes both."""

    def __init__(self) -> None:
        self.primary = MariaDbServer(settings={"server-id": "1"}).start()
        try:
            self.replica = MariaDbServer(settings=REPLICA_SETTINGS).start()
            self._replicate()
        except BaseException:
            self.stop()
            raise

    def _replicate(self) -> None:
        self.primary.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (REPLICATION_USER, REPLICATION_PASSWORD))
        self.primary.execute("GRANT REPLICATION SLAVE ON *.* TO %s@'%%'", (REPLICATION_USER,))
        position = self.primary.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        self.replica.execute("RESET MASTER")  # its own set-up (root's password) is not replicated
        self.replica.execute("SET GLOBAL gtid_slave_pos = %s", (position,))
        self.replica.execute(
            "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s, MASTER_PASSWORD = %s, "
            "MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            (self.primary.host, self.primary.port, REPLICATION_USER, REPLICATION_PASSWORD),
        )
        self.replica.execute("START SLAVE")
        self.sync()

    def stop(self) -> None:
        for server in (getattr(self, "replica", None), self.primary):
            if server is not None:
                server.stop()

    def sync(self, timeout: float = 120) -> None:
        """Wait until the replica applied everything the primary has logged."""
        position = self.primary.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0]
        done = self.replica.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout))[0][0]
        assert done == 0, f"the replica did not reach {position} in {timeout}s: {self.replica_status()}"

    def replica_status(self) -> dict[str, Any]:
        conn = self.replica.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW ALL SLAVES STATUS")
                names = [d[0] for d in cur.description]
                return dict(zip(names, cur.fetchone() or (), strict=False))
        finally:
            conn.close()

    def create_database(self) -> PrimaryDb:
        db = PrimaryDb(self.primary.create_database(f"ro_{uuid.uuid4().hex[:10]}"), self.primary)
        self.sync()
        return db

    def connector_user(self, *extra_privileges: str) -> str:
        """A new capture user (made on the primary): SELECT, REPLICATION SLAVE and REPLICATION CLIENT
        on everything, nothing else (plus ``extra_privileges``)."""
        user = f"cdc_{uuid.uuid4().hex[:8]}"
        privileges = ", ".join(("SELECT", "REPLICATION SLAVE", "REPLICATION CLIENT", *extra_privileges))
        self.primary.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (user, CONNECTOR_PASSWORD))
        self.primary.execute(f"GRANT {privileges} ON *.* TO %s@'%%'", (user,))  # noqa: S608 - fixed names
        self.sync()
        return user

    def config(self, db: PrimaryDb, user: str, staging: Path, **props: Any) -> dict[str, Any]:
        """A pipeline capturing ``db`` from the replica as ``user`` with ``read.only=true``."""
        return {
            "name": f"ro_{db.name}",
            "connector": "mariadb",
            "database.hostname": self.replica.host,
            "database.port": self.replica.port,
            "database.user": user,
            "database.password": CONNECTOR_PASSWORD,
            "database.include.list": db.name,
            "staging.path": str(staging),
            "read.only": "true",
            **{k.replace("__", "."): v for k, v in props.items()},
        }

    def primary_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` reading the primary as root: what the replayed batches must equal."""
        return {
            **config,
            "database.hostname": self.primary.host,
            "database.port": self.primary.port,
            "database.user": self.primary.superuser,
            "database.password": self.primary.password,
        }

    # -- the audit: no write by the connector -------------------------------------------------
    def statements_of(self, user: str) -> list[tuple[str, str]]:
        """``(command, SQL)`` of everything ``user`` sent the replica (its general log)."""
        rows = self.replica.execute(
            "SELECT command_type, CONVERT(argument USING utf8mb4) FROM mysql.general_log "
            "WHERE user_host LIKE %s ORDER BY event_time",
            (f"{user}[{user}]%",),
        )
        return [(str(c), str(a)) for c, a in rows]

    def assert_read_only(self, user: str) -> int:
        """Assert that ``user`` sent the replica nothing that writes, and that no transaction was
        written on the replica itself (its binlog holds only the primary's); returns the count of
        statements checked."""
        statements = [a for c, a in self.statements_of(user) if c in ("Query", "Execute", "Prepare")]
        assert statements, f"no statement of {user} in the general log"
        writes = [s for s in statements if not _ALLOWED.match(s) or _WRITING_SELECT.search(s)]
        assert not writes, f"{len(writes)} statement(s) that may write, e.g. {sorted(set(writes))[:5]}"
        state = self.replica.execute("SELECT @@GLOBAL.gtid_binlog_state")[0][0]
        assert all(g.split("-")[1] == "1" for g in state.split(",") if g), f"replica wrote {state}"
        own = [
            (name, row[1], row[2])
            for (name, *_) in self.replica.execute("SHOW BINARY LOGS")
            for row in self.replica.execute("SHOW BINLOG EVENTS IN %s", (name,))
            if int(row[3]) == 2 and row[2] in _DATA_EVENTS
        ]
        assert not own, f"events written on the replica itself: {own[:5]}"
        return len(statements)
