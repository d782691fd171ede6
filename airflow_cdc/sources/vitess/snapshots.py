"""Snapshots as Vitess's copy phase, tracked in the VGTID's ``table_p_ks``.

A table snapshot is requested by listing the table in every shard's ``table_p_ks`` without a last
key: vtgate then copies it on each shard (in primary key order, catching the stream up between
chunks) and keeps the entry, with the last copied key, in every VGTID it sends until that shard's
copy of the table completes.  So the stored VGTID alone says what is left per shard, and a copy
resumes where the last committed window stopped.  A table's snapshot is complete when no shard of
the window's end lists it.  The request names the listed tables in ``tables_to_copy`` too
(:meth:`.client.VtgateClient.request`): else vttablet copies every table the filter matches.  That
flag holds for the whole call, so a table still listed on one shard is copied again from its first
row on a shard that had finished it (at least once, as the catch-up).  Tables without key columns
never come here: they are read whole (:mod:`.whole`).

While a table waits for its copy, vtgate drops its changes (the copy will read the rows as they
are then) -- deletes too.  A table captured before (ad hoc snapshot, ``always``, a table that
appeared mid-window) would keep rows deleted meanwhile: so requesting such a snapshot raises the
epoch and sets the snapshot's ``purge_below`` to the new epoch's floor, and its completion stages a
truncate there (every shard's rows of the table captured before the copy are void; the copy and
everything after it are above the floor).

A reshard during a copy retires shards with their unfinished entries; the tables they still listed
are requested again on the new shards (which hold every row of the keyspace), so the copy stays
complete -- rows re-read there sort after the old shards' (a new shard generation).  Deletes made
while such a table waits for its re-copy are dropped like any change of an uncopied table, so the
re-copy's completion voids every row of the table below a new epoch, which the windows after the
reshard's run use (a truncate, as for an ad hoc snapshot): what the old shards copied or streamed,
and what the new shards streamed before the re-copy, is superseded by it.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b

#: ``TableSnapshot.last_key`` once its table was put into the VGTID (the VGTID then tracks it)
REQUESTED: list[str | None] = ["vitess:table_p_ks"]


def listed(sgtid: b.ShardGtid) -> set[str]:
    return {t.table_name for t in sgtid.table_p_ks}


def check_supported(snap: TableSnapshot) -> None:
    """:raises ConfigError: a snapshot with a condition or surrogate key (not supported by
    VStream copy)."""
    if snap.condition or snap.surrogate_key:
        raise ConfigError(
            f"snapshot of {snap.table}: additional conditions and surrogate keys are not supported "
            "by the Vitess copy phase"
        )


def request(
    start: b.VGtid, pending: Iterable[TableSnapshot], known: set[str]
) -> tuple[b.VGtid, list[str], list[TableSnapshot]]:
    """The VGTID to stream from: ``start`` with every new pending table in every shard's
    ``table_p_ks`` (without a last key: copy from the first row).  Marks them requested.

    :param known: captured tables (``keyspace.table``); snapshots of others are skipped.
    :returns: the VGTID, notes (skipped snapshots) and the snapshots requested now.
    :raises ConfigError: a snapshot with a condition or surrogate key (not supported by VStream copy).
    """
    out = b.VGtid()
    out.CopyFrom(start)
    notes, new = [], []
    for snap in pending:
        if snap.last_key == REQUESTED:
            continue
        check_supported(snap)
        if snap.table not in known:
            notes.append(f"snapshot of {snap.table} skipped: not a captured table")
            continue
        name = snap.table.split(".", 1)[1]
        for sgtid in out.shard_gtids:
            kept = [t for t in sgtid.table_p_ks if t.table_name != name]
            del sgtid.table_p_ks[:]
            sgtid.table_p_ks.extend([*kept, b.TableLastPK(table_name=name)])
        snap.last_key = REQUESTED
        new.append(snap)
    return out, notes, new


def carry_over_retired(end: b.VGtid, last_seen: dict[tuple[str, str], b.ShardGtid]) -> set[str]:
    """Request on the shards of ``end`` the tables that shards retired by a reshard had not
    finished; returns their names (the caller voids what was captured of them before)."""
    current = {offsets.shard_key(g) for g in end.shard_gtids}
    unfinished: set[str] = set()
    for key, sgtid in last_seen.items():
        if key not in current:
            unfinished |= listed(sgtid)
    for sgtid in end.shard_gtids:
        for name in sorted(unfinished - listed(sgtid)):
            sgtid.table_p_ks.append(b.TableLastPK(table_name=name))
    return unfinished


def void_before_recopy(
    pending: Iterable[TableSnapshot], keyspace: str, tables: set[str], floor: str
) -> list[TableSnapshot]:
    """Make the snapshots of ``tables`` (copied again from the first row on the new shards) void,
    on completion, every row of theirs captured below ``floor`` (hex position of a new epoch): the
    re-copy holds every row, but not the deletes made while it waited."""
    out = []
    for snap in pending:
        if snap.last_key == REQUESTED and snap.table in {f"{keyspace}.{t}" for t in tables}:
            snap.purge_below = max(snap.purge_below or "", floor)
            out.append(snap)
    return out


def finished(pending: Iterable[TableSnapshot], end: b.VGtid, keyspace: str) -> list[TableSnapshot]:
    """Requested snapshots no shard of ``end`` still copies."""
    remaining = {f"{keyspace}.{name}" for g in end.shard_gtids for name in listed(g)}
    return [s for s in pending if s.last_key == REQUESTED and s.table not in remaining]
