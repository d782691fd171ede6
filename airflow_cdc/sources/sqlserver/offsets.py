"""SQL Server LSNs, event positions and Debezium offsets.

An LSN is 10 bytes: VLF sequence number (4), log block offset (4), slot (2), compared as unsigned
big-endian.  Debezium prints it as ``0000002a:00000758:0003``.  A change row carries its
transaction's commit LSN (``__$start_lsn``) and its own LSN (``__$seqval``); Debezium orders by
(commit LSN, change LSN, operation) and numbers the events of one change LSN (``event_serial_no``:
1 for an insert or delete, 2 for the after-image of an update, counting on when a change position
repeats: a deferred update's delete and insert share one, and are 1 and 2).

LSNs are per database, so with several ``database.names`` each database has its own offset.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{4})")
_KEY = struct.Struct(">I10s10sI")
MAX_SERIAL = 0xFFFFFFFF


@dataclass(frozen=True, order=True, slots=True)
class SqlServerLsn:
    """A 10-byte SQL Server log sequence number; all zeroes means "none" (no CDC data yet)."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != 10:
            raise ValueError(f"an LSN is 10 bytes, not {self.raw!r}")

    NULL: ClassVar[SqlServerLsn]
    MAX: ClassVar[SqlServerLsn]

    @classmethod
    def of(cls, value: bytes | bytearray | memoryview | None) -> SqlServerLsn:
        """An LSN from a driver value (``None`` -> :attr:`NULL`)."""
        return cls.NULL if value is None else cls(bytes(value))

    @classmethod
    def parse(cls, text: str) -> SqlServerLsn:
        """Parse Debezium's ``xxxxxxxx:xxxxxxxx:xxxx``.

        :raises ValueError: when ``text`` is not in that form.
        """
        m = _LSN_TEXT.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"not a SQL Server LSN: {text!r} (expected xxxxxxxx:xxxxxxxx:xxxx)")
        return cls(bytes.fromhex(m[1] + m[2] + m[3]))

    @classmethod
    def from_int(cls, value: int) -> SqlServerLsn:
        return cls(value.to_bytes(10, "big"))

    def __int__(self) -> int:
        return int.from_bytes(self.raw, "big")

    @property
    def is_available(self) -> bool:
        return self.raw != b"\x00" * 10

    def increment(self) -> SqlServerLsn:
        """The next LSN (``sys.fn_cdc_increment_lsn`` computed locally)."""
        return SqlServerLsn.from_int(int(self) + 1)

    def __str__(self) -> str:
        h = self.raw.hex()
        return f"{h[:8]}:{h[8:16]}:{h[16:]}"


SqlServerLsn.NULL = SqlServerLsn(b"\x00" * 10)
SqlServerLsn.MAX = SqlServerLsn(b"\xff" * 10)


@dataclass(frozen=True, order=True, slots=True)
class SqlServerPosition:
    """Position of a SQL Server event inside one database: epoch, commit LSN, change LSN, serial.

    Snapshot rows of a chunk read while the window ended at LSN ``e`` sit at ``(e, MAX, MAX)``:
    after every change committed at or before ``e`` and before any later transaction.
    """

    kind: ClassVar[str] = "sqlserver"
    epoch: int
    commit_lsn: SqlServerLsn
    change_lsn: SqlServerLsn
    event_serial_no: int

    def sort_key(self) -> bytes:
        return _KEY.pack(self.epoch, self.commit_lsn.raw, self.change_lsn.raw, self.event_serial_no)

    @classmethod
    def from_sort_key(cls, key: bytes) -> SqlServerPosition:
        epoch, commit, change, serial = _KEY.unpack(key)
        return cls(epoch, SqlServerLsn(commit), SqlServerLsn(change), serial)

    @classmethod
    def snapshot_at(cls, epoch: int, window_end: SqlServerLsn) -> SqlServerPosition:
        return cls(epoch, window_end, SqlServerLsn.MAX, MAX_SERIAL)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, **offset_fields(self.commit_lsn, self.change_lsn, self.event_serial_no)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SqlServerPosition:
        change = data.get("change_lsn")
        return cls(
            int(data.get("epoch", 0)),
            SqlServerLsn.parse(data["commit_lsn"]),
            SqlServerLsn.parse(change) if change else SqlServerLsn.NULL,
            int(data.get("event_serial_no") or 0),
        )


def offset_fields(commit: SqlServerLsn, change: SqlServerLsn | None, serial: int | None) -> dict[str, Any]:
    """Debezium's offset keys for one database."""
    return {
        "commit_lsn": str(commit),
        "change_lsn": str(change) if change is not None and change.is_available else None,
        "event_serial_no": serial,
    }


def window_offset(databases: dict[str, SqlServerLsn], epoch: int) -> dict[str, Any]:
    """The offset after a window that read every database up to its ``fn_cdc_get_max_lsn()``.

    Whole transactions only, so ``change_lsn``/``event_serial_no`` are null (Debezium's form after a
    completed transaction); with one database its keys are also at the top level, as Debezium's.
    """
    per_db = {db: offset_fields(lsn, None, None) for db, lsn in sorted(databases.items())}
    out: dict[str, Any] = {"databases": per_db, "epoch": epoch}
    if len(per_db) == 1:
        out.update(next(iter(per_db.values())))
    return out


def committed_lsns(offset: dict[str, Any] | None) -> dict[str, SqlServerLsn]:
    """Per-database commit LSNs of a stored offset (empty for none).

    :raises ValueError: on a malformed offset.
    """
    if not offset:
        return {}
    return {db: SqlServerLsn.parse(v["commit_lsn"]) for db, v in (offset.get("databases") or {}).items()}
