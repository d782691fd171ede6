"""One capture window of a VStream: from the committed VGTID to the shard positions of the run's start.

The target is read first (:meth:`VtgateClient.current_vgtid`); the stream then runs from the
committed VGTID and ends at the first transaction boundary where every target shard still in the
stream has reached its target GTID set and no copy phase is unfinished, or once ``max_events``
changes were read (a bounded window: the rest is the next run's), or when vtgate ends the stream
(``stop_on_reshard``: the journal's new shards become the end position).  A reshard without
``stop_on_reshard`` replaces the old shards in the VGTID; the window ends as soon as the shards
of the target that remain have reached it.  Only whole transactions are returned; ``end`` is the
VGTID after the last of them.

Two vtgate (v24) behaviours shape the end:

* a shard's copy ends with its own COPY_COMPLETED (keyspace and shard set); vtgate adds the
  keyspace-wide one (no shard) only once *every* shard of the call's VGTID sent its own
  (``vstream_manager.go``: ``isCopyFullyCompleted``), and a shard that is not copying never sends
  one (``uvstreamer.go``: ``Stream`` sends it only after a copy).  So a copy resumed on some shards
  is done when each of them sent its per-shard COPY_COMPLETED;
* with ``stop_on_reshard`` each participant of a reshard sends ``BEGIN, JOURNAL, VGTID, COMMIT``
  and its stream ends (``streamFromTablet``'s JOURNAL case); the VGTID still names the old shards
  (``getJournalEvent`` replaces them only without ``stop_on_reshard``).  The journal's new shards
  therefore replace its participants in every later VGTID of the call, and the window does not end
  before every participant sent the journal: an old shard left behind its journal would lose its
  last transactions, and one past it would never send the journal again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.vitess import offsets
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.protocol import Assembler, Table, Transaction

log = logging.getLogger(__name__)
PROGRESS_EVERY = 10.0  # seconds between progress lines of a long window


@dataclass
class Window:
    start: b.VGtid
    end: b.VGtid
    transactions: list[Transaction] = field(default_factory=list)
    events: int = 0
    bounded: bool = False
    copy_completed: bool = False  # every shard copying in the window sent COPY_COMPLETED
    journal: b.Journal | None = None
    tables: dict[str, Table] = field(default_factory=dict)  # keyspace.table -> last FIELD seen
    copy_chunks: int = 0
    shards_copied: set[tuple[str, str]] = field(default_factory=set)  # COPY_COMPLETED per shard
    columns: dict[str, dict[str, str]] = field(default_factory=dict)  # shard -> table -> digest


def _copy(vgtid: b.VGtid) -> b.VGtid:
    out = b.VGtid()
    out.CopyFrom(vgtid)
    return out


@dataclass
class _Journals:
    """The reshard journals one call sent (``stop_on_reshard``), by id, and who sent each."""

    journals: dict[int, b.Journal] = field(default_factory=dict)
    sent: dict[int, set[tuple[str, str]]] = field(default_factory=dict)

    def add(self, journal: b.Journal, keyspace: str, shard: str) -> None:
        self.journals.setdefault(journal.id, journal)
        sent = self.sent.setdefault(journal.id, set())
        if shard:
            sent.add((keyspace, shard))
        else:  # not stamped with its shard: cannot tell who is missing, take it as complete
            sent.update((p.keyspace, p.shard) for p in journal.participants)

    def pending(self) -> list[tuple[str, str]]:
        """Participants that have not sent a journal another participant sent."""
        return sorted(
            (p.keyspace, p.shard)
            for jid, journal in self.journals.items()
            for p in journal.participants
            if (p.keyspace, p.shard) not in self.sent[jid]
        )

    def apply(self, vgtid: b.VGtid) -> b.VGtid:
        """``vgtid`` with every journal's participants replaced by its new shards."""
        for journal in self.journals.values():
            vgtid = offsets.after_journal(vgtid, journal)
        return vgtid


def _pin_targets(target: b.VGtid, journal: b.Journal) -> None:
    """Make the journal's positions the target of its new shards: this call does not stream them."""
    new = {offsets.shard_key(g) for g in journal.shard_gtids}
    kept = [g for g in target.shard_gtids if offsets.shard_key(g) not in new]
    del target.shard_gtids[:]
    target.shard_gtids.extend([*kept, *journal.shard_gtids])


def _retire(copy_shards: set[tuple[str, str]], position: b.VGtid) -> None:
    """Drop from ``copy_shards`` the shards a reshard retired from ``position``.

    A keyspace-wide entry (shard ``""``: vtgate resolves the shards) stands for every shard of
    the keyspace once the position names them.
    """
    live = {offsets.shard_key(g) for g in position.shard_gtids}
    if any(shard == "" for _, shard in live):
        return  # not resolved yet
    for keyspace, shard in list(copy_shards):
        if shard == "":
            copy_shards.discard((keyspace, shard))
            copy_shards.update(k for k in live if k[0] == keyspace)
    copy_shards.intersection_update(live)


def _brief(vgtid: b.VGtid) -> str:
    """Shard positions for a log line: ``shard@gtid`` with the copied tables' names."""
    parts = []
    for g in vgtid.shard_gtids:
        copying = f" copying {','.join(t.table_name for t in g.table_p_ks)}" if g.table_p_ks else ""
        parts.append(f"{g.keyspace}/{g.shard or '*'}@{g.gtid or '-'}{copying}")
    return "; ".join(parts) or "-"


def read_window(
    client: VtgateClient,
    start: b.VGtid,
    target: b.VGtid,
    tables: list[str] | None,
    max_events: int,
    idle_timeout: float = 30.0,
    on_transaction: Callable[[Transaction, dict[str, Table]], None] | None = None,
    min_end: b.VGtid | None = None,
    columns: dict[str, dict[str, str]] | None = None,
) -> Window:
    """Read the changes from ``start`` up to ``target`` (see the module docstring).

    Nothing is acknowledged anywhere; calling it again with the same ``start`` reads the same
    changes (vtgate streams from any position the shards' binlogs still have).

    :param tables: table names of the keyspace to stream; None: all.
    :param on_transaction: called with each whole transaction (and the tables as FIELD events
        described them so far) instead of keeping it in ``window.transactions``.
    :param min_end: ``max_events`` does not end the window before every shard reached this VGTID.
    :param columns: the tables' column digests as of ``start`` (:class:`~.protocol.Assembler`).
    :raises ProtocolError: no event for ``idle_timeout`` seconds before the target was reached,
        or a malformed stream.
    :raises OffsetUnavailable / ConnectionFailed / AuthenticationFailed: from vtgate's answer.
    """
    request = client.request(start, tables)
    target = _copy(target)
    request.flags.heartbeat_interval = max(
        1, min(request.flags.heartbeat_interval or 1, int(idle_timeout) or 1)
    )
    window = Window(start, start)
    position = b.VGtid()
    position.CopyFrom(start)
    # shards whose copy phase is unfinished: done at the stream's COPY_COMPLETED, or when a reshard
    # retires them (their unfinished tables are requested again on the new shards)
    copy_shards = {offsets.shard_key(g) for g in start.shard_gtids if not g.gtid or g.table_p_ks}
    copying = bool(copy_shards)
    journals = _Journals()
    assembler = Assembler(start, columns)
    events = client.stream(request)
    last_progress = last_report = started = time.monotonic()
    try:
        for event in events:
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                last_report = time.monotonic()
                elapsed = last_report - started
                log.info(
                    "VStream window: %d changes in %.0fs (%.0f/s), %d copy chunks, copy %s; at %s, "
                    "target %s",
                    window.events, elapsed, window.events / max(elapsed, 1e-9), window.copy_chunks,
                    "unfinished" if copying else "done", _brief(position), _brief(target),
                )  # fmt: skip
            for item in assembler.feed(event):
                if isinstance(item, Transaction):
                    if on_transaction is not None:
                        on_transaction(item, assembler.tables)
                    else:
                        window.transactions.append(item)
                    window.events += len(item.changes)
                    window.copy_chunks += item.kind == "copy"
                    if item.vgtid is not None:
                        position = journals.apply(item.vgtid)
                    last_progress = time.monotonic()
                elif item.kind == "position" and item.vgtid is not None:
                    position = journals.apply(item.vgtid)
                elif item.kind == "copy_completed" and not item.shard:
                    copy_shards.clear()
                    window.copy_completed = True
                elif item.kind == "copy_completed":
                    # vtgate's keyspace-wide COPY_COMPLETED never comes while a shard of the VGTID
                    # is not copying: each copying shard's own one ends its copy
                    window.shards_copied.add((item.keyspace, item.shard))
                    _retire(copy_shards, position)
                    copy_shards.discard((item.keyspace, item.shard))
                    window.copy_completed = window.copy_completed or not copy_shards
                elif item.kind == "journal" and item.journal is not None:
                    window.journal = item.journal
                    journals.add(item.journal, item.keyspace, item.shard)
                    position = journals.apply(position)
                    _pin_targets(target, item.journal)
            window.end = position
            _retire(copy_shards, position)
            copy_shards -= window.shards_copied
            copying = bool(copy_shards)
            if assembler._txn is not None or journals.pending():
                continue  # inside a transaction, or between a reshard's journals: never stop here
            if (
                window.events >= max_events
                and (window.copy_chunks or not copying)
                and (min_end is None or offsets.reached(position, min_end))
            ):
                # while copying, a window ends only after a copied chunk: the catch-up before a
                # chunk grows with the writes since the last run and could fill every window
                window.bounded = True
                break
            for keyspace, shard in offsets.missing_targets(position, target):
                # a shard the run's start did not see (a reshard on either side of it): its position now
                target.shard_gtids.extend(client.current_vgtid(keyspace, shard).shard_gtids)
            if not copying and not offsets.copying(position) and offsets.reached(position, target):
                break
            if time.monotonic() - last_progress > idle_timeout:
                raise ProtocolError(
                    f"VStream from vtgate at {client.where} sent no transaction for {idle_timeout:.0f}s "
                    f"before reaching the run's target position {offsets.vgtid_to_json(target)}"
                )
    finally:
        events.close()
    if journals.pending():
        raise ProtocolError(
            f"VStream from vtgate at {client.where} ended after a reshard journal before shard(s) "
            f"{', '.join('/'.join(k) for k in journals.pending())} sent it"
        )
    window.tables = dict(assembler.tables)
    window.columns = assembler.columns  # as of window.end: the loop stops between transactions
    return window


def changes_after(
    client: VtgateClient,
    keyspace: str,
    shard: str | None,
    offset: dict | None,
    shards: list[str] | None = None,
) -> bool:
    """Whether vtgate holds changes past a stored offset -- the sensor's check; no row is read.

    Compares the shards' current positions with the offset's: any shard past it (or not in it,
    after a reshard), an unfinished copy, or no offset at all means yes.  Any transaction counts,
    also on tables not captured, so it may over-report, never under-reports.
    """
    if offset is None:
        return True
    stored = offsets.from_offset(offset)
    if offsets.copying(stored):
        return True
    current = client.current_vgtid(keyspace, shard)
    if shards is not None:  # one task's shards (offset storage per task)
        current = b.VGtid(shard_gtids=[g for g in current.shard_gtids if g.shard in shards])
    return not offsets.reached(stored, current)
