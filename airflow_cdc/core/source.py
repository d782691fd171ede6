"""The change-source contract and the registry through which sources plug into the core.

A source is a package under ``airflow_cdc.sources`` (or any installed distribution exposing an
``airflow_cdc.sources`` entry point) that registers a :class:`SourceSpec`: its connector name and
aliases, how to validate its configuration, and how to build its :class:`ChangeSource`.  The core
never imports a source by name; it asks the registry.

Coordinates.  Inside a run a source speaks in *coordinates*: opaque values it hands out
(``start_offset``, ``head``, chunk watermarks, the window end) and that the core only compares with
each other (``<``, ``>=``, ``max``) and hands back.  They must be totally ordered within one run.
The durable form is the source's JSON *offset* (``offset_at``): the core stores it and gives it back
at the next run; it never looks inside.

Positions.  Every staged event carries ``__position``, a fixed-width byte string whose byte order is
the event order of the connector for its whole life -- including across restores, failovers and
re-snapshots: a source prefixes an *epoch* that it raises whenever its log restarts at lower
coordinates, so new events always sort after everything captured before.
"""

from __future__ import annotations

import abc
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import ChunkRead

log = logging.getLogger(__name__)

#: Entry-point group of third-party sources; built-ins register when ``airflow_cdc.sources`` loads.
ENTRY_POINT_GROUP = "airflow_cdc.sources"
_BUILTIN_PACKAGE = "airflow_cdc.sources"


@dataclass(frozen=True)
class Capabilities:
    """What a source does beyond the required contract, declared rather than probed.

    :param acknowledges: the server keeps the log for us until :meth:`ChangeSource.acknowledge`
        (a PostgreSQL slot); False: the server's own retention decides (binlog, CDC cleanup job).
    :param keeps_state: the source keeps state besides its offset (e.g. MySQL's schema history):
        :meth:`ChangeSource.restore_state` / :meth:`ChangeSource.extra_state` carry it.
    :param chunked_snapshots: snapshots are key-ordered chunks reconciled by the core against the
        window (:meth:`ChangeSource.read_chunks`, ``reflects``, ``write_snapshot_rows``); False: the
        source snapshots natively inside its window (Vitess's copy phase) from the pending list.
    :param checks: names of the cheap change checks :meth:`ChangeSource.changes_after` accepts; the
        first is the default.
    :param snapshot_readers: chunks can be read side by side by :meth:`ChangeSource.snapshot_reader`
        sources (the connector then has the ``snapshot.max.threads`` property).
    :param logs_creation: :meth:`ChangeSource.created_in_log` names the tables whose creation the
        window read; a table found new when a run opens is then snapshotted from the next run on,
        once the window showed whether the log holds all its rows.
    :param blocking_snapshots: :meth:`ChangeSource.read_whole` reads any captured table (keyed
        too) in one consistent snapshot at an exact log position, with an ``additional-conditions``
        filter: ``execute-snapshot`` signals of type ``blocking`` run
        (:mod:`airflow_cdc.core.snapshot_blocking`); False: they are refused.
    :param stores_run_signals: the snapshots a run's own signals queue (or stop) are stored
        before the run publishes anything (``Capture._store_signals``), after
        :meth:`ChangeSource.check_snapshot_requests`: a batch published but never committed holds
        effects of the request that only its completion makes right (Vitess: a raised epoch, a
        purge below the copy, the copy's keys voided by the next run otherwise).  False: a run
        signal belongs to its run (an Airflow retry carries it again), as the orphan's snapshot
        rows are harmless without it.
    """

    acknowledges: bool = False
    keeps_state: bool = False
    chunked_snapshots: bool = True
    snapshot_readers: bool = False
    checks: tuple[str, ...] = ("wal",)
    logs_creation: bool = False
    blocking_snapshots: bool = False
    stores_run_signals: bool = False


class ChangeSource(abc.ABC):
    """One captured database, opened for one capture run (or one sensor check / commit).

    Contract, for every source:

    * **Non-consuming windows.**  ``read_window`` reads from a coordinate without consuming
      anything: re-reading the same window (after a crash) yields the same events.  Only
      ``acknowledge`` lets the server free log, and only up to an offset already committed.
    * **Whole transactions.**  A window ends on a transaction boundary (``max_events`` bounds it at
      transaction granularity), so a committed offset never splits a transaction.
    * **Ordering.**  Events get ``__position`` bytes in strictly increasing order across windows and
      epochs; snapshot rows of a chunk sit after every event of the window that holds its
      watermark and before any later event.
    * **Never backward.**  ``offset_at`` of a window end never precedes the start offset;
      ``acknowledge`` never moves the server's position backward and works on a closed source.
    * **Watermarks are exact.**  ``reflects(watermark, txn)`` says exactly whether a chunk read with
      ``watermark`` already contains transaction ``txn`` of the window; a chunk that cannot be made
      exact for its window is re-read or deferred, never emitted stale.
    * **Errors.**  Everything raised is an :class:`airflow_cdc.core.errors.CdcError` naming the
      table/column/setting at fault; nothing is acknowledged on an error.
    """

    kind: ClassVar[str]
    capabilities: ClassVar[Capabilities] = Capabilities()

    # -- life cycle ---------------------------------------------------------------------------
    @abc.abstractmethod
    def open(self) -> None:
        """Connect, check server settings and privileges, discover the captured tables."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; safe to call twice or after a failed ``open``."""

    def heartbeat(self) -> None:  # noqa: B027 (optional hook)
        """Run ``heartbeat.action.query`` or the source's equivalent (once per capture run)."""

    @abc.abstractmethod
    def tables(self) -> list[str]:
        """Captured tables (``schema.table``) known now; may grow during ``read_window``."""

    def created_in_log(self) -> frozenset[str]:
        """Captured tables whose creation this run's windows read from the log: the log holds all
        their rows, so they need no snapshot (Debezium sends none).  Tables that existed before
        they joined the captured set (renamed in, filters widened) are not among them."""
        return frozenset()

    def restore_state(self, data: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Load state kept besides the offset (only with ``capabilities.keeps_state``)."""

    def extra_state(self) -> dict[str, Any]:
        """State to commit besides the offset (only with ``capabilities.keeps_state``)."""
        return {}

    def inherit_state(self, load: Callable[[str], dict[str, Any] | None]) -> dict[str, Any] | None:
        """The state a partition without a stored state of its own starts from, taken from other
        stored states (``load(state_name)``), e.g. a Vitess task's shards from the previous task
        generation; None: start fresh.  Called after :meth:`open`; never writes anything."""
        return None

    # -- offsets ------------------------------------------------------------------------------
    @abc.abstractmethod
    def start_offset(self, offset: dict[str, Any] | None, when_needed: bool) -> tuple[Any, str | None]:
        """Resolve where the window starts: ``(coordinate, reason a full snapshot is needed)``.

        :raises OffsetUnavailable: the stored offset cannot be read and ``when_needed`` is false.
        """

    @abc.abstractmethod
    def head(self) -> Any:
        """The coordinate up to which the server has durably logged changes now."""

    def flush_log(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Make the server durably log everything it has written so far.

        Called while :meth:`head` lags a chunk's closing watermark: on a server with nothing left to
        commit, log records that no commit follows may stay unflushed indefinitely.  No-op by default.
        """

    @abc.abstractmethod
    def offset_at(self, end: Any, window: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The JSON offset of coordinate ``end`` (a window end, or a start with ``window=None``)."""

    @abc.abstractmethod
    def describe_offset(self, offset: Mapping[str, Any] | None) -> str:
        """A short human form of a JSON offset, for logs."""

    def acknowledge(self, offset: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Let the server free log up to a committed ``offset`` (only with ``acknowledges``)."""

    @abc.abstractmethod
    def changes_after(self, offset: dict[str, Any] | None, check: str | None = None) -> bool:
        """Whether the source may hold captured changes past ``offset``; cheap, decodes nothing.

        May over-report (one empty batch), never under-report.  Works on a closed source.
        """

    # -- snapshots and the window -------------------------------------------------------------
    def table_columns(self, table: str) -> list[str] | None:
        """Column names of a captured table (after :meth:`open`), which an ad hoc snapshot's
        additional condition may name; None when the source cannot tell (nothing is checked)."""
        return None

    def check_snapshot_requests(self, requested: list) -> None:  # noqa: B027 (optional hook)
        """Refuse, before anything is stored, ad hoc snapshots (``TableSnapshot``) this source
        would refuse when it reads them; nothing by default.

        :raises ConfigError: naming the table and what is not supported.
        """

    def read_chunks(self, pending: list, max_rows: int, chunk_size: Any) -> list:
        """Key-ordered chunks of the pending table snapshots (``chunked_snapshots`` sources)."""
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks")

    def snapshot_whole(self, table: str) -> bool:
        """Whether ``table``'s snapshot is read whole, in one consistent read (:meth:`read_whole`),
        instead of in key-ordered chunks: a table without key columns has no order to chunk by."""
        return False

    def read_whole(self, snap: Any, writer: Any) -> int:
        """Stage a table's snapshot (``snap``, :meth:`snapshot_whole`) whole, read in one consistent
        snapshot of the source and streamed into ``writer`` in bounded pieces; returns the rows.

        The rows are positioned where that snapshot stands in the log: every event at or below the
        position is in them, none above it -- whatever window the batch holds (an applier skips
        events it already holds by position).  A table whose silver mirrors its rows (``keyless``
        ``multiset``) gets a truncate at that same position first: the image replaces silver; a
        keyed table gets none (a blocking snapshot re-reads rows, ``blocking_snapshots``), and only
        its rows matching ``snap.condition`` (an ``additional-conditions`` filter) are staged.
        Repeating it stages the table again at a new position.
        """
        raise NotImplementedError(f"{self.kind} does not read tables whole")

    def snapshot_reader(self) -> ChangeSource:
        """A source on a connection of its own that reads snapshot chunks (:meth:`read_chunks`) of
        the tables this opened source discovered, side by side with others (``snapshot.max.threads``,
        :mod:`airflow_cdc.core.snapshot_readers`); the caller closes it.  Checks nothing again and
        changes nothing on the server."""
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks side by side")

    def continue_window(self, window: Any) -> bool:
        """Prepare a follow-on ``read_window`` from ``window.end`` in the same run (the first chunks
        of a snapshot the signal table started); False (the default) when the source cannot, and
        such chunks wait for the next run."""
        return False

    def snapshot_bounds(self, snap: Any, offsets: list[int]) -> tuple[list, list]:
        """Key boundaries that split the rest of a pending table snapshot (snapshot parts).

        In one read-only snapshot: the snapshot's ``max_key`` (read if still None, as the first chunk
        would; ``[]``: no rows) and, for each of the increasing ``offsets``, the cursor of the row
        that many rows past ``snap.last_key`` (in chunk order, up to ``max_key``, matching its
        condition), or None once the table has no such row (then the list ends).  Changes nothing.
        """
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks")

    def chunk_floor(self, watermark: Any) -> Any:
        """The coordinate below which a chunk read at ``watermark`` holds every transaction, when the
        watermark says (None: it does not); a prepared chunk below the window start is refused."""
        return None

    def watermark_to_json(self, watermark: Any) -> dict[str, Any]:
        """A chunk watermark as JSON (a dataclass's fields; sets become sorted lists)."""
        out = {}
        for name, value in vars(watermark).items():
            out[name] = sorted(value) if isinstance(value, (set, frozenset)) else value
        return out

    def watermark_from_json(self, data: dict[str, Any]) -> Any:
        """The chunk watermark :meth:`watermark_to_json` wrote."""
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks")

    def chunk_to_files(self, chunk: Any) -> tuple[Any, dict[str, Any]]:
        """A chunk as an Arrow table (to store as Parquet) and small JSON metadata."""
        meta = {
            "columns": chunk.columns,
            "key_index": chunk.key_index,
            "cursor_index": chunk.cursor_index,
            "last": chunk.last,
            "watermark": self.watermark_to_json(chunk.watermark),
        }
        return chunk.data, meta

    def chunk_from_files(self, snap: Any, data: Any, meta: dict[str, Any]) -> Any:
        """The chunk :meth:`chunk_to_files` stored, bound to the table snapshot ``snap``."""
        watermark = self.watermark_from_json(meta["watermark"])
        return ChunkRead(
            snap, meta["columns"], data, meta["key_index"], watermark, meta["last"], meta["cursor_index"]
        )

    def chunk_misfit(self, chunk: Any) -> str | None:
        """Why a chunk read by another process (a snapshot part) cannot be staged by this opened
        source -- its table's columns changed since -- or None when it fits."""
        return None

    def plan_native_snapshots(self, pending: list) -> None:  # noqa: B027 (optional hook)
        """Hand the pending table snapshots to a source that snapshots natively inside its window
        (``chunked_snapshots=False``), before ``read_window``.  The source stages their ``op=r``
        rows itself, updates their ``rows``/``chunks``/``last_key`` as progress, and its window
        result lists the ones it completed in ``snapshots_done`` and the rows per table in
        ``snapshot_rows``; an unfinished snapshot stays pending for the next run."""

    def reflects(self, watermark: Any, txn: Any) -> bool:
        """Whether a chunk read at ``watermark`` contains transaction ``txn``."""
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks")

    def write_ahead(self, writer: Any) -> None:
        """Encode the snapshot chunks read from now on into parts of ``writer`` as they are read
        (None: stop), for :meth:`write_snapshot_rows` to keep the ones whose rows all survive.
        Optional: the default reads and writes chunks as before."""
        return None

    def write_snapshot_rows(
        self, writer: Any, chunk: Any, rows: Any, end: Any, at: bytes | None = None
    ) -> None:
        """Stage a chunk's surviving rows as ``op=r`` positioned at window end ``end``.

        :param at: stage the rows at this exact ``__position`` instead (pre-images: the row as it
            was just before a change the chunk did not reflect, positioned right below it).
        """
        raise NotImplementedError(f"{self.kind} does not read snapshot chunks")

    @abc.abstractmethod
    def position_floor(self) -> bytes:
        """The smallest ``__position`` of the current epoch (every event of this run is above it)."""

    @abc.abstractmethod
    def write_purge(self, writer: Any, table: str, position: bytes, end: Any) -> None:
        """Stage a truncate of ``table`` at ``position``: silver drops every row captured below it.

        Emitted when a re-snapshot after a lost offset completes: every row the source still has
        was re-captured above ``position``; anything older is gone from the source.
        """

    @abc.abstractmethod
    def read_window(self, start: Any, upto: Any, writer: Any, tracker: Any, max_events: int) -> Any:
        """Stage the change window ``[start, upto)`` (whole transactions, at most about
        ``max_events``), reporting every windowed change of a chunked table to ``tracker``.

        Returns a result with ``end`` (coordinate), ``events``, ``per_table``, ``messages`` and
        ``manifest_extra``.
        """

    def encoded_chunks(self, table: str, chunk_size: int) -> Iterator[Any]:
        """The live table in key order, encoded like captured rows (``verify``), at most
        ``chunk_size`` rows at a time.  A table without key columns comes in no particular order,
        from one consistent read, in pieces of bounded size (verify compares it as a multiset)."""
        raise NotImplementedError(f"{self.kind} cannot be verified")


def columns_changed(table: str, read: list[str], now: list[str], otherwise: str) -> str:
    """A chunk's misfit (:meth:`ChangeSource.chunk_misfit`): the columns dropped and added between
    the ``read`` and the ``now`` column names, or ``otherwise`` when the names are the same."""
    read_set, now_set = set(read), set(now)
    gone, added = [c for c in read if c not in now_set], [c for c in now if c not in read_set]
    what = f"dropped {gone}, added {added}" if gone or added else otherwise
    return f"the columns of {table} changed since it was read ({what})"


@dataclass(frozen=True)
class SourceSpec:
    """How one kind of source plugs in.

    :param kind: the canonical connector name (``connector: <kind>``).
    :param aliases: other accepted names (Debezium ``connector.class`` values ...), each mapped to
        the connector name it stands for (often ``kind``; MariaDB maps to ``mariadb``).
    :param build_config: validate raw properties into a :class:`ConnectorConfig`.
    :param build_source: make the source of a validated config.
    :param partitions: split a validated config into the configs of its partitions
        (:meth:`ConnectorConfig.for_partition`), each captured, committed and resumed on its own
        with an offset of its own (Debezium's source partitions: a SQL Server database, a Vitess
        task's shards).  Partitions of one connector must never capture the same row: their
        events go to the connector's Delta tables side by side.  ``None``, or one config that is
        the given one: the connector is not partitioned.
    :param check_connection: reach the server of a validated config and verify what capture
        needs (server settings, privileges) without changing anything there; returns a one-line
        summary and raises the :class:`CdcError` that names what is missing.  Backs the
        Airflow connection form's *Test* button.
    """

    kind: str
    aliases: Mapping[str, str]
    build_config: Callable[[Mapping[str, Any]], ConnectorConfig]
    build_source: Callable[[ConnectorConfig], ChangeSource]
    names: tuple[str, ...] = ()  # further canonical connector names served (e.g. mariadb)
    partitions: Callable[[ConnectorConfig], list[ConnectorConfig]] | None = None
    check_connection: Callable[[ConnectorConfig], str] | None = None


_SPECS: dict[str, SourceSpec] = {}
_NAMES: dict[str, tuple[str, SourceSpec]] = {}
_loaded = False


def register_source(spec: SourceSpec) -> None:
    """Make a source known.  Registering the same spec again is a no-op.

    :raises ValueError: another spec already claims one of its names.
    """
    claims = {spec.kind: spec.kind, **{n: n for n in spec.names}, **dict(spec.aliases)}
    for name, canonical in claims.items():
        held = _NAMES.get(name.lower())
        if held is not None and held[1] is not spec:
            raise ValueError(f"connector name {name!r} is already registered by {held[1].kind!r}")
        _NAMES[name.lower()] = (canonical, spec)
    _SPECS[spec.kind] = spec


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    importlib.import_module(_BUILTIN_PACKAGE)  # built-in sources register themselves
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()
        except Exception as e:  # a broken plugin must not hide the built-ins
            log.warning("source plugin %s could not be loaded: %s", ep.value, e)
            continue
        register_source(spec)


def known_connectors() -> list[str]:
    """Canonical connector names of every registered source."""
    _load()
    return sorted({canonical for canonical, _ in _NAMES.values()})


def resolve_connector(raw: Mapping[str, Any]) -> tuple[str, SourceSpec]:
    """The canonical connector name and spec of raw properties (``connector`` or ``connector.class``).

    :raises ConfigError: missing or unknown connector.
    """
    _load()
    given = str(raw.get("connector") or raw.get("connector.class") or "")
    found = _NAMES.get(given.lower())
    if found is None:
        raise ConfigError(
            f"property 'connector': {given or '(missing)'!r} is not a supported source; "
            f"supported: {', '.join(known_connectors())}"
        )
    return found


def source_spec(config: ConnectorConfig) -> SourceSpec:
    """The spec serving a validated config."""
    return resolve_connector({"connector": config["connector"]})[1]


def check_connection(config: ConnectorConfig) -> str:
    """Reach the source of ``config`` and verify its capture prerequisites (read only).

    :returns: a one-line summary of what was checked.
    :raises ConfigError: the connector has no connection check.
    :raises CdcError: what is missing (settings, privileges), as the capture would report it.
    """
    check = source_spec(config).check_connection
    if check is None:
        raise ConfigError(f"connector {config['connector']!r} has no connection check")
    return check(config)
