"""Everything that differs between MariaDB and MySQL 8, in one place.

=========================  =================================  =======================================
aspect                     MariaDB 10.x/11.x                  MySQL 8.x
=========================  =================================  =======================================
head position              ``SHOW MASTER STATUS``             ``SHOW BINARY LOG STATUS`` (8.4+),
                                                              ``SHOW MASTER STATUS`` before
GTID set                   ``@@gtid_binlog_pos``              ``@@gtid_executed``
                           (``domain-server-seq``, ...)       (``uuid:1-5``, ...)
GTID event                 GTID_EVENT 162                     GTID_LOG_EVENT 33
rows events                v1 (23-25)                         v2 (30-32)
query of a rows event      ANNOTATE_ROWS 160 (dump flag 2)    ROWS_QUERY 29
                                                              (``binlog_rows_query_log_events``)
JSON columns               LONGTEXT (text in the binlog)      binary JSON (type 245)
GTIDs at a coordinate      ``BINLOG_GTID_POS(file, pos)``     ``Executed_Gtid_Set`` of the status row
GTIDs before a file        ``BINLOG_GTID_POS(file, 4)``       ``Previous_gtids`` event (2nd of a file)
exact snapshot watermark   ``binlog_snapshot_file/position``  none: chunks reconcile against every
                           under a consistent snapshot        change of the window (log wins)
monitor privilege          BINLOG MONITOR (alias              REPLICATION CLIENT
                           REPLICATION CLIENT)
replica status             ``SHOW ALL SLAVES STATUS``         ``SHOW REPLICA STATUS`` (8.0.22+),
                           (SLAVE MONITOR)                    ``SHOW SLAVE STATUS`` before
=========================  =================================  =======================================
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_cdc.sources.mysql import protocol as p


def _mysql_json(raw: bytes) -> bytes:
    """Convert MySQL's binary JSON to JSON text (decoder of the mysql-replication package)."""
    if not raw:
        return b"null"
    from pymysqlreplication.json_binary import parse_json

    value = parse_json(raw[0], raw[1:])
    return json.dumps(_plain(value), separators=(", ", ": "), ensure_ascii=False).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Flavour:
    name: str  # "mariadb" | "mysql"
    version: tuple[int, int, int]

    @property
    def is_mariadb(self) -> bool:
        return self.name == "mariadb"

    @property
    def status_sql(self) -> str:
        if not self.is_mariadb and self.version >= (8, 4, 0):
            return "SHOW BINARY LOG STATUS"
        return "SHOW MASTER STATUS"

    @property
    def gtid_sql(self) -> str:
        return "SELECT @@GLOBAL.gtid_binlog_pos" if self.is_mariadb else "SELECT @@GLOBAL.gtid_executed"

    def status_gtids(self, row: Sequence[Any]) -> str | None:
        """The GTID set of a status row (MySQL's ``Executed_Gtid_Set``, read with the position in
        one statement); None for MariaDB, whose status has no GTIDs: see :meth:`gtids_at_sql`."""
        if self.is_mariadb or len(row) < 5:
            return None
        return str(row[4] or "").replace("\n", "")

    def gtids_at_sql(self, file: str, pos: int) -> tuple[str, tuple] | None:
        """SQL for the exact GTID set at ``file:pos`` where the status row lacks it (MariaDB)."""
        return ("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos)) if self.is_mariadb else None

    def file_start_gtids_sql(self, file: str) -> tuple[str, tuple]:
        """SQL for the GTIDs of everything before binlog ``file``; parse with :meth:`file_start_gtids`."""
        if self.is_mariadb:
            return "SELECT BINLOG_GTID_POS(%s, 4)", (file,)
        return "SHOW BINLOG EVENTS IN %s LIMIT 3", (file,)

    def file_start_gtids(self, rows: Sequence[Sequence[Any]]) -> str | None:
        """Parse :meth:`file_start_gtids_sql` rows; None when the server does not know the file."""
        if self.is_mariadb:
            return None if not rows or rows[0][0] is None else str(rows[0][0])
        for row in rows:  # Log_name, Pos, Event_type, Server_id, End_log_pos, Info
            if str(row[2]) == "Previous_gtids":
                return str(row[5] or "").replace("\n", "")
        return None if not rows else ""

    @property
    def gtid_event(self) -> int:
        return p.MARIA_GTID if self.is_mariadb else p.GTID

    @property
    def monitor_privileges(self) -> tuple[str, ...]:
        return (
            ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER")
            if self.is_mariadb
            else ("REPLICATION CLIENT", "SUPER")
        )

    @property
    def replica_status_sql(self) -> str:
        """The server's replication connections, one row each (none when it replicates from no one)."""
        if self.is_mariadb:
            return "SHOW ALL SLAVES STATUS"
        return "SHOW REPLICA STATUS" if self.version >= (8, 0, 22) else "SHOW SLAVE STATUS"

    def json_decoder(self) -> Any:
        return None if self.is_mariadb else _mysql_json

    def parse_gtid(self, header: p.Header, body: bytes) -> tuple[str, bool]:
        """(GTID text, standalone) of a GTID event.  A MySQL transaction is standalone (one DDL)
        until a ``BEGIN`` query follows its GTID event."""
        if self.is_mariadb:
            return p.parse_maria_gtid(body, header.server_id)
        return p.parse_mysql_gtid(body), True

    @staticmethod
    def gtid_source(gtid: str) -> str:
        """The part of a GTID that ``gtid.source.*`` match: MySQL server UUID, MariaDB ``domain-server``."""
        if ":" in gtid:
            return gtid.split(":", 1)[0]
        return gtid.rsplit("-", 1)[0]

    def dump_flags(self, annotate: bool) -> int:
        flags = 0x01  # BINLOG_DUMP_NON_BLOCK: EOF at the end instead of waiting
        if self.is_mariadb and annotate:
            flags |= 0x02  # BINLOG_SEND_ANNOTATE_ROWS_EVENT
        return flags

    def snapshot_watermark_sql(self) -> str | None:
        return "SHOW STATUS LIKE 'binlog_snapshot_%'" if self.is_mariadb else None


def detect(version_text: str) -> Flavour:
    """Flavour from ``SELECT VERSION()`` (``10.11.6-MariaDB-log``, ``8.0.36``)."""
    numbers = version_text.split("-", 1)[0].split(".")
    parsed = tuple(int(x) if x.isdigit() else 0 for x in (numbers + ["0", "0", "0"])[:3])
    name = "mariadb" if "mariadb" in version_text.lower() else "mysql"
    return Flavour(name, parsed)  # type: ignore[arg-type]


class GtidSet:
    """A GTID position that grows with the GTIDs of a window.

    MariaDB (``0-1-100,1-2-7``): the last GTID per replication domain.  MySQL
    (``uuid:1-5:7``): intervals of transaction numbers per source UUID.
    """

    def __init__(self, text: str = "") -> None:
        self.maria: dict[str, str] = {}
        self.mysql: dict[str, list[list[int]]] = {}
        for part in (x.strip() for x in text.replace("\n", "").split(",")):
            if not part:
                continue
            if ":" in part:
                uuid, *ranges = part.split(":")
                for r in ranges:
                    lo, _, hi = r.partition("-")
                    for gno in (int(lo), int(hi or lo)):
                        self._add_mysql(uuid.lower(), gno)
                    self._fill(uuid.lower(), int(lo), int(hi or lo))
            else:
                self.maria[part.split("-", 1)[0]] = part

    def _fill(self, uuid: str, lo: int, hi: int) -> None:
        ivs = self.mysql.setdefault(uuid, [])
        ivs.append([lo, hi])
        ivs.sort()
        merged: list[list[int]] = []
        for iv in ivs:
            if merged and iv[0] <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], iv[1])
            else:
                merged.append(list(iv))
        self.mysql[uuid] = merged

    def _add_mysql(self, uuid: str, gno: int) -> None:
        self._fill(uuid, gno, gno)

    def __bool__(self) -> bool:
        return bool(self.maria or self.mysql)

    def contains(self, gtid: str) -> bool:
        """Whether the transaction ``gtid`` is in this set (MariaDB: at or below its domain's seq)."""
        if ":" in gtid:
            uuid, gno = gtid.rsplit(":", 1)
            return self._has_interval(uuid.lower(), int(gno), int(gno))
        domain, _, seq = gtid.split("-", 2)
        mine = self.maria.get(domain)
        return mine is not None and int(mine.rsplit("-", 1)[1]) >= int(seq)

    def _has_interval(self, uuid: str, lo: int, hi: int) -> bool:
        return any(a <= lo and hi <= b for a, b in self.mysql.get(uuid, ()))

    def covers(self, other: GtidSet, source_filter: Callable[[str], bool] = lambda _: True) -> bool:
        """Whether every transaction of ``other`` from a source ``source_filter`` accepts is in this set.

        Sources are what ``gtid.source.*`` match: the MySQL server UUID, MariaDB ``domain-server``.
        """
        for uuid, ivs in other.mysql.items():
            if source_filter(uuid) and not all(self._has_interval(uuid, a, b) for a, b in ivs):
                return False
        return all(
            self.contains(gtid) for gtid in other.maria.values() if source_filter(gtid.rsplit("-", 1)[0])
        )

    def add(self, gtid: str) -> None:
        if ":" in gtid:
            uuid, gno = gtid.rsplit(":", 1)
            self._add_mysql(uuid.lower(), int(gno))
        else:
            self.maria[gtid.split("-", 1)[0]] = gtid

    def __str__(self) -> str:
        if self.mysql:
            return ",".join(
                uuid + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in ivs)
                for uuid, ivs in sorted(self.mysql.items())
            )
        return ",".join(self.maria[d] for d in sorted(self.maria, key=int))
