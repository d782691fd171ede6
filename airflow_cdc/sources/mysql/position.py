"""MySQL/MariaDB binlog event positions.

A position orders every event of one connector (see ``airflow_cdc.core.source``): its
``sort_key`` is the staged ``__position``, whose byte order equals the typed order.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

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
