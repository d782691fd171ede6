"""PostgreSQL LSNs and event positions.

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
