"""Vitess offsets: the VGTID (one position per shard) as Debezium stores it, and GTID-set order.

The stored offset is ``{"vgtid": [{"keyspace", "shard", "gtid", "table_p_ks"?}, ...]}``: Debezium's
``vgtid`` JSON list, where ``table_p_ks`` (present only while a shard's copy phase is unfinished)
holds each table's last copied primary key as the protobuf JSON of ``binlogdata.TableLastPK``
(proto field names).  A VGTID is a vector, not a number: shard positions are compared one by one
as GTID sets (:class:`GtidSet`: MySQL56 or MariaDB flavour), and the shard set itself changes at a reshard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b

CURRENT = "current"


class GtidSet:
    """A shard position as Vitess encodes it: ``<flavour>/<GTID set>``, as ``source -> [(first, last)]``.

    * ``MySQL56/uuid:1-5:7-9,uuid2:1-3`` (also without the flavour): each server UUID's
      transaction intervals.
    * ``MariaDB/<domain>-<server>-<seq>[,...]`` (Vitess over MariaDB shards): each replication
      domain's transactions ``1..seq``, keyed ``mariadb:<domain>``.  Vitess compares MariaDB sets
      per domain by sequence number alone and ignores the server id (v24
      ``go/mysql/replication/mariadb_gtid.go``: ``MariadbGTIDSet.ContainsGTID`` /``Contains``, used
      by ``Position.AtLeast``); a domain named twice keeps its last entry, as
      ``ParseMariadbGTIDSet`` does.

    Sets of different flavours never cover each other (``Contains`` is false across flavours).

    :raises ValueError: text that is not a GTID set of its flavour (names the text and the part).
    """

    def __init__(self, text: str = "") -> None:
        self.intervals: dict[str, list[tuple[int, int]]] = {}
        flavour, slash, body = text.partition("/")
        if not slash:
            flavour, body = "MySQL56", text
        if flavour not in _PARSERS:
            raise ValueError(f"GTID set {text!r}: unknown flavour {flavour!r} (MySQL56 or MariaDB)")
        self.flavour = flavour
        for part in filter(None, (p.strip() for p in body.split(","))):
            _PARSERS[flavour](self, text, part)

    def _mysql56(self, text: str, part: str) -> None:
        source, *ranges = part.split(":")
        if not ranges:
            raise ValueError(f"GTID set {text!r}: {part!r} has no transaction numbers")
        spans = self.intervals.setdefault(source.lower(), [])
        for r in ranges:
            first, _, last = r.partition("-")
            try:
                span = (int(first), int(last or first))
            except ValueError:
                raise ValueError(f"GTID set {text!r}: bad interval {r!r} in {part!r}") from None
            if not 0 < span[0] <= span[1]:
                raise ValueError(f"GTID set {text!r}: bad interval {r!r} in {part!r}")
            spans.append(span)
        spans.sort()

    def _mariadb(self, text: str, part: str) -> None:
        pieces = part.split("-")
        if len(pieces) != 3 or not all(p.isdigit() for p in pieces):
            raise ValueError(f"GTID set {text!r}: {part!r} is not a MariaDB GTID <domain>-<server>-<seq>")
        domain, _server, seq = (int(p) for p in pieces)
        self.intervals[f"mariadb:{domain}"] = [(1, seq)]  # seq 0: the domain, no transactions yet

    def covers(self, other: GtidSet) -> bool:
        """Whether every transaction of ``other`` is in this set (an empty ``other`` always is)."""
        if other.intervals and other.flavour != self.flavour:
            return False
        for source, spans in other.intervals.items():
            if source not in self.intervals:
                return False
            mine = self.intervals[source]
            for first, last in spans:
                if last < first:
                    continue
                if not any(a <= first and last <= z for a, z in mine):
                    return False
        return True

    def count(self) -> int:
        """How many transactions the set holds."""
        return sum(last - first + 1 for spans in self.intervals.values() for first, last in spans)

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def __repr__(self) -> str:
        return f"GtidSet({self.flavour}, {self.intervals!r})"


_PARSERS = {"MySQL56": GtidSet._mysql56, "MariaDB": GtidSet._mariadb}


def shard_key(sgtid: b.ShardGtid) -> tuple[str, str]:
    return sgtid.keyspace, sgtid.shard


def vgtid_to_json(vgtid: b.VGtid) -> list[dict[str, Any]]:
    """The Debezium ``vgtid`` list of a VGTID."""
    out = []
    for g in vgtid.shard_gtids:
        entry: dict[str, Any] = {"keyspace": g.keyspace, "shard": g.shard, "gtid": g.gtid}
        if g.table_p_ks:
            entry["table_p_ks"] = [
                json_format.MessageToDict(t, preserving_proto_field_name=True) for t in g.table_p_ks
            ]
        out.append(entry)
    return out


def vgtid_from_json(data: Any, what: str = "offset") -> b.VGtid:
    """A VGTID from Debezium's ``vgtid`` list (or its JSON text).

    :raises ConfigError: not a list of ``{keyspace, shard, gtid}`` objects (``what`` names the source).
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what}: VGTID is not valid JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{what}: VGTID must be a non-empty JSON list of {{keyspace, shard, gtid}}")
    vgtid = b.VGtid()
    for entry in data:
        if not isinstance(entry, dict) or not {"keyspace", "shard", "gtid"} <= set(entry):
            raise ConfigError(f"{what}: VGTID entry {entry!r} lacks keyspace, shard or gtid")
        g = vgtid.shard_gtids.add(
            keyspace=str(entry["keyspace"]), shard=str(entry["shard"]), gtid=str(entry["gtid"])
        )
        for pk in entry.get("table_p_ks") or ():
            try:
                json_format.ParseDict(pk, g.table_p_ks.add())
            except json_format.ParseError as e:
                raise ConfigError(f"{what}: bad table_p_ks entry {pk!r}: {e}") from None
    return vgtid


def to_offset(vgtid: b.VGtid) -> dict[str, Any]:
    return {"vgtid": vgtid_to_json(vgtid)}


def from_offset(offset: dict[str, Any]) -> b.VGtid:
    return vgtid_from_json(offset.get("vgtid"), "stored offset")


def copying(vgtid: b.VGtid) -> bool:
    """Whether some shard's copy phase is unfinished (an empty gtid, or tables with a last key)."""
    return any(not g.gtid or g.table_p_ks for g in vgtid.shard_gtids)


def reached(position: b.VGtid, target: b.VGtid) -> bool:
    """Whether every shard of ``position`` is at or past its position in ``target``.

    A shard the target does not name has no target: not reached (the caller reads one for it).
    Target shards the position lacks are ignored (shards a reshard retired, or not streamed yet).
    """
    goal = {shard_key(g): g.gtid for g in target.shard_gtids}
    for g in position.shard_gtids:
        want = goal.get(shard_key(g))
        if want is None or g.gtid in (CURRENT, "") or not GtidSet(g.gtid).covers(GtidSet(want)):
            return False
    return True


def after_journal(position: b.VGtid, journal: b.Journal) -> b.VGtid:
    """``position`` with a reshard journal's participants replaced by its new shards at the journal's
    positions -- where a later stream must start, since vtgate with ``stop_on_reshard`` keeps naming
    the old shards (see :mod:`.window`).  Repeating it changes nothing: a new shard the position
    already names keeps its own (later) position.
    """
    gone = {(p.keyspace, p.shard) for p in journal.participants}
    kept = [g for g in position.shard_gtids if shard_key(g) not in gone]
    named = {shard_key(g) for g in kept}
    return b.VGtid(shard_gtids=[*kept, *(g for g in journal.shard_gtids if shard_key(g) not in named)])


def missing_targets(position: b.VGtid, target: b.VGtid) -> list[tuple[str, str]]:
    """Shards of ``position`` that ``target`` does not name."""
    named = {shard_key(g) for g in target.shard_gtids}
    return [shard_key(g) for g in position.shard_gtids if shard_key(g) not in named and g.shard]


def start_vgtid(keyspace: str, shard: str | None, gtid: str, shards: Iterable[str] = ()) -> b.VGtid:
    """The VGTID a stream without a stored offset starts from (``vitess.gtid``).

    ``current`` / ``""`` without a shard name every shard of the keyspace (vtgate resolves them);
    a VGTID JSON list is taken as is.
    """
    if gtid.startswith("["):
        return vgtid_from_json(gtid, "property 'vitess.gtid'")
    names = [shard] if shard else list(shards) or [""]
    return b.VGtid(shard_gtids=[b.ShardGtid(keyspace=keyspace, shard=s, gtid=gtid) for s in names])
