"""Sortable, source-specific event positions.

A position orders every event of one connector: apply keeps, per key, the event with the
greatest position, so an event older than what a row already reflects never overwrites it.
Each position encodes to a fixed-width big-endian byte string (``sort_key``) whose plain
byte order equals the typed order; that is what goes into the staged batch's ``__position``
column, so any engine (Spark, DuckDB, Python) compares positions exactly without knowing the
source.  Positions round-trip through JSON; nothing is pickled.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

_U64 = (1 << 64) - 1


_LSN_RE = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def format_pg_lsn(value: int) -> str:
    """Format an LSN the way PostgreSQL does, e.g. ``16/B374D848``.

    :raises ValueError: if ``value`` is not an integer in ``[0, 2**64)``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64:
        raise ValueError(f"not a valid LSN: {value!r}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def parse_pg_lsn(text: str) -> int:
    """Parse PostgreSQL's ``XXXXXXXX/XXXXXXXX`` notation (1 to 8 hex digits per half, any case).

    :raises ValueError: when ``text`` is not an LSN.
    """
    match = _LSN_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a valid LSN: {text!r}")
    return (int(match[1], 16) << 32) | int(match[2], 16)


@dataclass(frozen=True, order=True, slots=True)
class PgLsn:
    """A PostgreSQL WAL location (64-bit unsigned)."""

    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.value <= _U64:
            raise ValueError(f"LSN out of range: {self.value}")

    @classmethod
    def parse(cls, text: str) -> PgLsn:
        return cls(parse_pg_lsn(text))

    def __str__(self) -> str:
        return format_pg_lsn(self.value)


_PG_KEY = struct.Struct(">IQQ")


@dataclass(frozen=True, order=True, slots=True)
class PgPosition:
    """Position of a PostgreSQL event: epoch, commit LSN of its transaction, order inside it.

    Change LSNs alone interleave across concurrent transactions; commit LSN order is the order
    in which transactions became durable, which is the order logical decoding emits them.
    Snapshot rows of a chunk are placed at ``(epoch, window_end, 0)``: after every event of the
    window (all of which have a commit LSN below the window end) and before any later transaction
    (sequence numbers of real events start at 1).  A chunk row dropped by reconciliation whose
    first unreflected change left TOAST values unsent is placed at ``(epoch, commit LSN of that
    change, 0)``: before that transaction's events, after every earlier one.  The *epoch* goes up
    whenever the connector's log restarts at lower LSNs than it captured (a restore or PITR, a new
    cluster, a re-created slot), so positions keep growing across it.  ``sort_key`` is 20 bytes:
    epoch (4), LSN (8), sequence (8).
    """

    kind: ClassVar[str] = "postgresql"
    epoch: int
    commit_lsn: int
    seq: int

    def __post_init__(self) -> None:
        if not (0 <= self.epoch < 1 << 32 and 0 <= self.commit_lsn <= _U64 and 0 <= self.seq <= _U64):
            raise ValueError(f"position out of range: {self.epoch}/{self.commit_lsn}/{self.seq}")

    def sort_key(self) -> bytes:
        return _PG_KEY.pack(self.epoch, self.commit_lsn, self.seq)

    @classmethod
    def from_sort_key(cls, key: bytes) -> PgPosition:
        return cls(*_PG_KEY.unpack(key))

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "commit_lsn": format_pg_lsn(self.commit_lsn), "seq": self.seq}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PgPosition:
        return cls(int(data.get("epoch", 0)), parse_pg_lsn(data["commit_lsn"]), int(data["seq"]))

    def __str__(self) -> str:
        return f"{self.epoch}/{format_pg_lsn(self.commit_lsn)}#{self.seq}"


#: epoch, file number, position, row: 4 bytes each, big-endian (byte order = typed order)
_MYSQL_KEY = struct.Struct(">IIII")
_BINLOG_FILE_RE = re.compile(r".*\.([0-9]+)")


def binlog_file_number(name: str) -> int:
    """The sequence number of a binlog file name (``binlog.000042`` -> 42).

    :raises ValueError: when the name has no numeric extension.
    """
    match = _BINLOG_FILE_RE.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"not a binlog file name: {name!r}")
    return int(match[1])


@dataclass(frozen=True, order=True, slots=True)
class MySqlPosition:
    """Position of a MySQL/MariaDB event: epoch, binlog file number, start position of its rows
    event, row inside that event.

    Binlog coordinates of one server order every event (the binlog is written in commit order).
    Snapshot rows of a chunk sit at ``(window end file, window end pos, 0)``: after every event
    of the window (whose rows events start below the window end) and before any later one (a
    later transaction's rows events start after its GTID/BEGIN event, i.e. above the window end).
    The *epoch* goes up whenever capture resumes at coordinates below the stored ones (a failover
    to a server with lower binlog numbers, ``RESET MASTER``), so positions keep growing across it.
    The GTID of the transaction is carried in the event's ``source.gtid``, not in the position:
    GTID sets are not totally ordered.
    """

    kind: ClassVar[str] = "mysql"
    epoch: int
    file_no: int
    pos: int
    row: int = 0

    def __post_init__(self) -> None:
        if not all(0 <= v < 1 << 32 for v in (self.epoch, self.file_no, self.pos, self.row)):
            raise ValueError(f"binlog position out of range: {self}")

    def sort_key(self) -> bytes:
        return _MYSQL_KEY.pack(self.epoch, self.file_no, self.pos, self.row)

    @classmethod
    def from_sort_key(cls, key: bytes) -> MySqlPosition:
        return cls(*_MYSQL_KEY.unpack(key))

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "file_no": self.file_no, "pos": self.pos, "row": self.row}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MySqlPosition:
        return cls(int(data.get("epoch", 0)), int(data["file_no"]), int(data["pos"]), int(data.get("row", 0)))

    def __str__(self) -> str:
        return f"{self.epoch}/{self.file_no:06d}:{self.pos}#{self.row}"
