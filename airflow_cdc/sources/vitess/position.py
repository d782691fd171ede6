"""Vitess event positions and in-run coordinates.

Ordering across shards.  A VGTID is a vector of per-shard GTID sets: shards are not ordered with
each other, and the order in which vtgate interleaves them changes from one read to the next.  The
apply job only compares positions of events of the *same key*, and a key lives in one shard (the
keyspace's vindex routes it), except across a reshard.  So a position orders events per shard,
deterministically (re-reading a window after a crash gives every event the same position):

``(epoch, generation, shard transactions, index, stamp)``, 4 + 4 + 8 + 4 + 8 bytes, big-endian:

* ``shard transactions`` -- the number of transactions in the shard's GTID set *after* the event's
  transaction.  A shard's executed GTID set only grows (also across a primary failover, whose new
  primary carries the old one's set), so the count strictly increases with every transaction of
  that shard;
* ``index`` -- the event's place inside its transaction (1..n); copy-phase rows (``op=r``) take the
  maximum: a copy chunk is read at a snapshot that reflects every transaction up to its VGTID's GTID
  set and none after, so its rows sort after those transactions and before the next one;
* ``stamp`` (8 bytes, last) -- 0 for changes; for copy rows the run's start in milliseconds, so a
  row re-copied by a later run at the same shard position sorts after the earlier copy (and
  :mod:`.orphans` can place a delete between the two).
* ``generation`` -- raised whenever the set of shards changes (a reshard, seen as a VGTID naming
  other shards): a key that moves to a new shard keeps sorting after everything captured for it on
  the old one, although the new shard's GTID counts are unrelated;
* ``epoch`` -- raised when a lost offset restarts capture (``snapshot.mode=when_needed``).

Keys of different shards get positions that are not comparable in any meaningful way, which the
apply job never needs for a keyed table.

Tables without key columns (``keyless: multiset``) are different: their silver is one multiset
per table, and the apply job skips a table's events at or below the greatest position it already
applied (``spark_jobs/cdc_apply/keyless.py``: ``through``), across shards.  So their events carry
the run's *keyless epoch and round* in place of the epoch and generation, ``(keyless epoch, round,
shard transactions, index, stamp)`` (:func:`keyless_key`): the round is raised once per run that
stages such events, above the committed one and above those of batches published but not committed
(:mod:`.orphans`), and the keyless epoch is the greatest of theirs (the offset's ``keyless_epoch``;
before it was stored, the offset's ``epoch``), so every event of a run sorts above everything an
earlier batch held, whatever the shards' counts.  The keyless epoch is fixed for the run: the run's
own epoch can rise in its middle (a snapshot requested after a table was read whole), and a batch
whose keyless events took that raised epoch but was never committed would otherwise sort above the
whole next run, which starts from the committed (lower) epoch -- its events would be skipped.
A run that follows uncommitted batches holding such a table reads the table whole again
(:mod:`.whole`): events cannot be matched to the ones those batches held in another round.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b

_KEY = struct.Struct(">IIQIQ")
SNAPSHOT_INDEX = 0xFFFFFFFF


def transactions_in(gtid: str) -> int:
    """How many transactions a shard's GTID set holds (0 for ``""`` / ``current``).

    MariaDB positions count ``seq`` per domain (a domain's sequence numbers only grow).
    """
    if gtid in ("", offsets.CURRENT):
        return 0
    return offsets.GtidSet(gtid).count()


def sort_key(epoch: int, generation: int, count: int, index: int, stamp: int = 0) -> bytes:
    return _KEY.pack(epoch, generation, count, index, stamp)


def keyless_key(epoch: int, round_: int, count: int, index: int, stamp: int = 0) -> bytes:
    """The position of an event of a table without key columns (see the module notes)."""
    return _KEY.pack(epoch, round_, count, index, stamp)


def stored_keyless_epoch(offset: dict[str, Any]) -> int:
    """The keyless epoch an offset (or a manifest's ``to_offset``) stands at: its
    ``keyless_epoch``, or -- stored before there was one -- its ``epoch``, never below the epochs
    its keyless events took (a run's epoch only rises)."""
    return int(offset.get("keyless_epoch", offset.get("epoch")) or 0)


def unpack(key: bytes) -> tuple[int, int, int, int, int]:
    return _KEY.unpack(key)


def shard_set(vgtid: b.VGtid) -> frozenset[tuple[str, str]]:
    return frozenset(offsets.shard_key(g) for g in vgtid.shard_gtids)


@dataclass
class VitessCoord:
    """An in-run coordinate: a VGTID and the shard generation it belongs to.

    Ordered as the capture core needs it: ``a < b`` when ``b`` is in a later generation, or in the
    same one every shard of ``b`` covers ``a``'s position and ``a`` does not cover ``b``'s.
    Positions that are not comparable (other shards) are never "less", so the core never takes a
    window end for a step backward.
    """

    vgtid: b.VGtid
    generation: int = 0

    def _covers(self, other: VitessCoord) -> bool:
        return offsets.reached(self.vgtid, other.vgtid)

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, VitessCoord):
            return NotImplemented
        if self.generation != other.generation:
            return self.generation < other.generation
        if shard_set(self.vgtid) != shard_set(other.vgtid):
            return False
        return other._covers(self) and not self._covers(other)

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, VitessCoord):
            return NotImplemented
        return other < self

    def __ge__(self, other: Any) -> bool:
        return not self < other

    def __le__(self, other: Any) -> bool:
        return not self > other
