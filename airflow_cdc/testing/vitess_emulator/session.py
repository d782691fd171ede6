"""One VStream call of the emulator: vtgate's event flow over the shards' binlogs.

What a client sees, as vtgate v18 sends it:

* per shard transaction: ``BEGIN, [FIELD], ROW..., VGTID, COMMIT`` (vttablet's GTID event becomes
  a VGTID naming every shard of the stream), ``VGTID, DDL`` for a DDL, ``VGTID, OTHER`` for other
  statements, ``BEGIN, VGTID, COMMIT`` for a transaction on no streamed table;
* ``gtid: "current"``: ``VGTID, OTHER`` first, then changes from that point (or the copy phase,
  when ``table_p_ks`` names a table: v24 ``uvstreamer.go`` ``init``, ``setStreamStartPosition``);
* copy phase (``gtid: ""``, or ``table_p_ks`` set): the tables of ``flags.tables_to_copy``, else
  *every* table the filter matches (v24 ``uvstreamer.go`` ``buildTablePlan``: a table the VGTID
  does not name starts from no last key), per table, in name order, a consistent snapshot
  whose position is first caught up to (``BEGIN, FIELD, VGTID, COMMIT``), then the rows in primary
  key order in chunks (``BEGIN, ROW..., VGTID, COMMIT``; the VGTID carries the table's last copied
  key in ``table_p_ks``), then ``BEGIN, VGTID, COMMIT`` without the table; after the last table
  ``COPY_COMPLETED`` with the shard's keyspace and shard, and (in the same response) one without
  keyspace or shard once *every* shard of the call's VGTID sent its own.  A shard that is not
  copying never sends one: a copy resumed on only some shards never gets the keyspace-wide event
  (vtgate v24 ``vstream_manager.go`` ``isCopyFullyCompleted``).
  Catch-up between snapshots drops the rows of tables not copied yet and sends every change of a
  table whose copy has started, rows above its last copied key included (at least once: those rows
  are copied again later; v24 ``uvstreamer.go`` ``shouldSendEventForTable``);
* a resharding journal: not sent; the old shards' entries of the VGTID are replaced by the new
  shards at the journal's positions, from which they stream.  With ``stop_on_reshard`` each
  participant sends its journal transaction ``BEGIN, JOURNAL, VGTID, COMMIT`` -- the VGTID still
  names the old shards (vtgate does not replace them with ``stop_on_reshard``), the participant's
  GTID moved past the journal -- and its stream ends (the call ends when no stream is left; v24
  ``vstream_manager.go``: ``streamFromTablet``'s JOURNAL case, ``getJournalEvent``);
* ``HEARTBEAT`` every ``heartbeat_interval`` seconds of silence.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.mysql.schema import enum_labels
from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt
from airflow_cdc.testing.vitess_emulator.binlog import RowsChange, ShardBinlog, Transaction
from airflow_cdc.testing.vitess_emulator.shard import EmulatedShard, PositionError, is_purged_error
from airflow_cdc.testing.vitess_emulator.values import make_row

if TYPE_CHECKING:
    from airflow_cdc.testing.vitess_emulator.server import VtgateEmulator

_SELECT_ALL = re.compile(r"^\s*select\s+\*\s+from\s+`?(\w+)`?\s*$", re.IGNORECASE)


class VStreamError(Exception):
    """Ends the call with a gRPC status (the code and text vtgate would send)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class _Copy:
    tables: list[str]  # still to copy, in order; the first is in progress
    lastpk: dict[str, q.QueryResult] = field(default_factory=dict)
    conn: Any = None  # the open snapshot transaction of the table in progress
    fields: list[q.Field] = field(default_factory=list)  # of the table in progress
    opening: list[b.VEvent] = field(default_factory=list)  # BEGIN, FIELD, [VGTID] of the table's first chunk
    resume: q.QueryResult | None = None  # the table's last key when this call started copying it
    sent: int = 0  # rows of the table's query sent so far in this call


@dataclass
class _ShardStream:
    sgtid: b.ShardGtid  # the entry of the session's VGTID (updated in place)
    shard: EmulatedShard
    binlog: ShardBinlog
    seq: int | None = None
    copy: _Copy | None = None
    fields_sent: dict[str, tuple] = field(default_factory=dict)


class VStreamSession:
    """Runs one ``Vitess.VStream`` call; :meth:`responses` yields what vtgate would send."""

    def __init__(
        self, emulator: VtgateEmulator, request: vt.VStreamRequest, context: grpc.ServicerContext
    ) -> None:
        self.emulator, self.context = emulator, context
        self.flags = request.flags
        self.rules = list(request.filter.rules) or [b.Rule(match="/.*")]
        self.vgtid = b.VGtid()
        self.streams: list[_ShardStream] = []
        self.journals: dict[int, set[tuple[str, str]]] = {}
        self.copying = 0
        self.copy_completed: set[tuple[str, str]] = set()  # shards that sent their COPY_COMPLETED
        self._request = request

    # -- set-up ------------------------------------------------------------------------------
    def _resolve(self) -> None:
        request = self._request
        if not request.vgtid.shard_gtids:
            raise VStreamError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "vgtid must have at least one value with a starting position",
            )
        for rule in self.rules:
            if rule.filter and not _SELECT_ALL.match(rule.filter):
                raise VStreamError(
                    grpc.StatusCode.UNIMPLEMENTED, f"vtgate emulator: filter {rule.filter!r} not supported"
                )
        for sgtid in request.vgtid.shard_gtids:
            shards = self.emulator.keyspace_shards(sgtid.keyspace)
            if not sgtid.shard:
                if sgtid.gtid not in ("current", ""):
                    raise VStreamError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "if shards are unspecified, the Gtid value must be 'current' or empty; "
                        f"got: {sgtid.gtid!r}",
                    )
                for shard in shards:
                    self._add(b.ShardGtid(keyspace=sgtid.keyspace, shard=shard.name, gtid=sgtid.gtid), shard)
                continue
            shard = self.emulator.shard(sgtid.keyspace, sgtid.shard, request.tablet_type)
            self._add(b.ShardGtid(), shard, sgtid)

    def _add(
        self, sgtid: b.ShardGtid, shard: EmulatedShard, source: b.ShardGtid | None = None
    ) -> _ShardStream:
        self.vgtid.shard_gtids.append(source if source is not None else sgtid)
        entry = self.vgtid.shard_gtids[-1]
        st = _ShardStream(entry, shard, ShardBinlog(shard))
        self.streams.append(st)
        return st

    def _start(self, st: _ShardStream) -> Iterator[list[b.VEvent]]:
        gtid = st.sgtid.gtid
        if gtid == "current":
            st.seq = st.shard.seq()
            st.sgtid.gtid = st.shard.position(st.seq)
            yield [self._vgtid(), self._event(st, b.OTHER)]
            if st.sgtid.table_p_ks:
                st.copy = self._copy_plan(st)
                self.copying += 1
            return
        if gtid:
            try:
                st.seq = st.shard.parse(gtid)
            except PositionError as e:
                raise VStreamError(grpc.StatusCode.UNKNOWN, f"could not decode position: {e}") from None
            current = st.shard.seq()
            if st.seq > current:
                raise VStreamError(
                    grpc.StatusCode.UNKNOWN,
                    f"GTIDSet Mismatch: requested source position:{gtid}, current target vrep position: "
                    f"{st.shard.position(current)}",
                )
        if not gtid or st.sgtid.table_p_ks:
            st.copy = self._copy_plan(st)
            self.copying += 1

    def _copy_plan(self, st: _ShardStream) -> _Copy:
        present = st.shard.tables()
        for rule in self.rules:
            if not rule.match.startswith("/") and rule.match not in present:
                raise VStreamError(
                    grpc.StatusCode.UNKNOWN, f"table {rule.match} is not present in the database"
                )
        wanted = set(self.flags.tables_to_copy)
        plan = _Copy([t for t in present if self._rule(t) is not None and (not wanted or t in wanted)])
        for t in st.sgtid.table_p_ks:
            if t.lastpk.rows and t.table_name in plan.tables:
                plan.lastpk[t.table_name] = t.lastpk
        return plan

    def _rule(self, table: str) -> b.Rule | None:
        for rule in self.rules:
            if rule.match == table or (
                rule.match.startswith("/") and re.search(rule.match.strip("/"), table)
            ):
                return rule
        return None

    # -- the call ----------------------------------------------------------------------------
    def responses(self) -> Iterator[vt.VStreamResponse]:
        self._resolve()
        for st in list(self.streams):
            for events in self._start(st):
                yield vt.VStreamResponse(events=events)
        last_sent = time.monotonic()
        while self.streams and self.context.is_active():
            sent = False
            for st in list(self.streams):
                for events in self._step(st):
                    sent = True
                    yield vt.VStreamResponse(events=events)
            if sent:
                last_sent = time.monotonic()
                continue
            interval = self.flags.heartbeat_interval
            if interval and time.monotonic() - last_sent >= interval:
                now = time.time_ns()
                yield vt.VStreamResponse(
                    events=[b.VEvent(type=b.HEARTBEAT, timestamp=now // 10**9, current_time=now)]
                )
                last_sent = time.monotonic()
            time.sleep(self.emulator.poll_interval)

    def _step(self, st: _ShardStream) -> Iterator[list[b.VEvent]]:
        if st.copy is not None:
            yield from self._copy_step(st)
            return
        assert st.seq is not None
        try:
            for count, txn in enumerate(st.binlog.transactions(st.seq)):
                events = self._transaction(st, txn)
                st.seq = txn.seq
                if events:
                    yield events
                if st not in self.streams or count >= 500:
                    return
        except ProtocolError as e:
            raise self._dump_error(st, e) from None

    def _dump_error(self, st: _ShardStream, error: ProtocolError) -> VStreamError:
        cause = error.__cause__
        detail = str(cause.args[1]) if cause is not None and len(cause.args) > 1 else str(error)
        errno = " (errno 1236) (sqlstate HY000)" if is_purged_error(error) else ""
        return VStreamError(
            grpc.StatusCode.UNKNOWN,
            f"vttablet: rpc error: code = Unknown desc = stream (at source tablet) error @ "
            f"{st.shard.position(st.seq)}: {detail}{errno}",
        )

    # -- binlog transactions -----------------------------------------------------------------
    def _event(self, st: _ShardStream, kind: b.VEventType, timestamp: int = 0, **fields: Any) -> b.VEvent:
        return b.VEvent(
            type=kind, timestamp=timestamp, current_time=time.time_ns(), keyspace=st.shard.keyspace,
            shard=st.shard.name, **fields,
        )  # fmt: skip

    def _vgtid(self) -> b.VEvent:
        vgtid = b.VGtid()
        vgtid.CopyFrom(self.vgtid)
        return b.VEvent(type=b.VGTID, vgtid=vgtid)

    def _transaction(self, st: _ShardStream, txn: Transaction) -> list[b.VEvent]:
        ts = txn.timestamp
        if txn.kind == "journal":
            return self._journal(st, txn)
        st.sgtid.gtid = st.shard.position(txn.seq)
        if txn.kind in ("ddl", "other"):
            if txn.kind == "ddl":
                st.fields_sent.clear()  # vstreamer describes a table again after a DDL
                st.shard._fields.clear()
            fields = {"statement": txn.statement} if txn.kind == "ddl" else {}
            return [self._vgtid(), self._event(st, b.DDL if txn.kind == "ddl" else b.OTHER, ts, **fields)]
        events = [self._event(st, b.BEGIN, ts)]
        for change in txn.rows:
            if self._rule(change.table) is None:
                continue
            kept = self._catchup_filter(st, change.table, change.changes)
            if not kept:
                continue
            events.extend(self._field_event(st, change, ts))
            if not self.emulator.enum_set_string_values:
                kept = _enum_set_indexes(st.shard.fields(change.table, change.signature), kept)
            row_event = b.RowEvent(
                table_name=f"{st.shard.keyspace}.{change.table}",
                keyspace=st.shard.keyspace,
                shard=st.shard.name,
                row_changes=[
                    b.RowChange(
                        before=make_row(before) if before is not None else None,
                        after=make_row(after) if after is not None else None,
                    )
                    for before, after in kept
                ],
            )  # fmt: skip
            events.append(self._event(st, b.ROW, ts, row_event=row_event))
        return events + [self._vgtid(), self._event(st, b.COMMIT, ts)]

    def _field_event(self, st: _ShardStream, change: RowsChange, ts: int) -> list[b.VEvent]:
        table, signature = change.table, change.signature
        if st.fields_sent.get(table) == signature and signature:
            return []
        st.fields_sent[table] = signature
        fields = st.shard.fields(table, signature)
        if change.names and [f.name for f in fields] != change.names:
            # the schema moved on since these rows were written (no schema historian): describe the
            # columns the rows have, as far as the current schema still knows them
            known = {f.name: f for f in fields}
            fields = [known.get(n) or q.Field(name=n, type=q.VARBINARY, table=table) for n in change.names]
        event = field_event(self.emulator, st.shard, table, fields)
        return [self._event(st, b.FIELD, ts, field_event=event)]

    def _catchup_filter(self, st: _ShardStream, table: str, changes: list) -> list:
        """The changes vttablet sends while a copy runs (catch-up and fast-forward between chunks).

        Real vttablet drops the changes of a table whose copy has not started (no last PK) and sends
        *every* change of a table whose copy has started, rows above the last copied key included:
        "We may send duplicate insert events or update/delete events for rows not yet seen ... we
        only promise at-least-once semantics" (``go/vt/vttablet/tabletserver/vstreamer/uvstreamer.go``
        v24, ``shouldSendEventForTable``; ``isRowCopied`` returns true).  The client sees updates and
        deletes of rows it has not been sent yet, and the copy sends those rows again later.
        """
        copy = st.copy
        if copy is None or table not in copy.tables:
            return changes
        return changes if table in copy.lastpk else []

    def _journal(self, st: _ShardStream, txn: Transaction) -> list[b.VEvent]:
        journal = b.Journal.FromString(txn.journal or b"")
        if self.flags.stop_on_reshard:
            # vtgate sends the journal with the rest of its transaction (the GTID event becomes a
            # VGTID of the call's shards, which stop_on_reshard leaves as they are), then ends the
            # participant's stream
            st.sgtid.gtid = st.shard.position(txn.seq)
            self._retire(st)
            return [
                self._event(st, b.BEGIN, txn.timestamp),
                self._event(st, b.JOURNAL, txn.timestamp, journal=journal),
                self._vgtid(),
                self._event(st, b.COMMIT, txn.timestamp),
            ]
        joined = self.journals.setdefault(journal.id, set())
        joined.add((st.shard.keyspace, st.shard.name))
        participants = {(p.keyspace, p.shard) for p in journal.participants}
        if joined < participants:
            self._retire(st)
            return []
        for old in [s for s in self.streams if (s.shard.keyspace, s.shard.name) in participants]:
            self._retire(old)
        kept = [g for g in self.vgtid.shard_gtids if (g.keyspace, g.shard) not in participants]
        del self.vgtid.shard_gtids[:]
        self.vgtid.shard_gtids.extend(kept)
        for target in journal.shard_gtids:
            shard = self.emulator.shard(target.keyspace, target.shard, self._request.tablet_type)
            new = self._add(
                b.ShardGtid(keyspace=target.keyspace, shard=target.shard, gtid=target.gtid), shard
            )
            new.seq = shard.parse(target.gtid)
        return []

    def _retire(self, st: _ShardStream) -> None:
        """End a shard's stream at its journal.  A copy still running on it (its catch-up met the
        journal) is abandoned: vtgate's new shard positions carry no ``table_p_ks``, and no
        COPY_COMPLETED is sent for it."""
        self.streams.remove(st)
        if st.copy is not None:
            if st.copy.conn is not None:
                st.copy.conn.close()
            st.copy = None
            self.copying -= 1

    # -- copy phase --------------------------------------------------------------------------
    def _copy_step(self, st: _ShardStream) -> Iterator[list[b.VEvent]]:
        from airflow_cdc.testing.vitess_emulator.copy import copy_step

        yield from copy_step(self, st)


def field_event(emulator: Any, shard: EmulatedShard, table: str, fields: list[q.Field]) -> b.FieldEvent:
    """A FIELD event; v20+ vttablet flags one whose table has ENUM/SET columns: their values are
    labels (v24 vstreamer.go ``EnumSetStringValues: len(plan.EnumSetValuesMap) > 0``, copy.go)."""
    labels = emulator.enum_set_string_values and any(f.type in (q.ENUM, q.SET) for f in fields)
    return b.FieldEvent(
        table_name=f"{shard.keyspace}.{table}",
        fields=fields,
        keyspace=shard.keyspace,
        shard=shard.name,
        enum_set_string_values=labels,
    )


def _enum_set_indexes(fields: list[q.Field], changes: list) -> list:
    """Streamed ENUM/SET values as vttablet before v20 sent them: an ENUM's 1-based index and a
    SET's bit mask, as text (the binlog's integers; vstreamer did not map them then)."""
    maps: dict[int, tuple[bool, list[bytes]]] = {}
    for i, f in enumerate(fields):
        if f.type in (q.ENUM, q.SET):
            labels = [v.encode() for v in enum_labels(f.column_type)]
            maps[i] = (f.type == q.SET, labels)
    if not maps:
        return changes

    def index(image: tuple | None) -> tuple | None:
        if image is None:
            return None
        out = list(image)
        for i, (is_set, labels) in maps.items():
            v = out[i]
            if v is None:
                continue
            if is_set:
                out[i] = str(sum(1 << labels.index(x) for x in v.split(b",") if x in labels)).encode()
            else:
                out[i] = str(labels.index(v) + 1 if v in labels else 0).encode()
        return tuple(out)

    return [(index(before), index(after)) for before, after in changes]


def _pk_index(shard: EmulatedShard, table: str, fields: list[q.Field]) -> list[int]:
    names = [f.name for f in fields]
    return [names.index(c) for c in shard.pk_columns(table)]
