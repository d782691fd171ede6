"""Staged batches: immutable Parquet files per table plus ``manifest.json``.

Layout of one batch directory ``<staging>/<connector>/batches/<batch_id>/``::

    manifest.json                      written last; its presence means the batch is complete
    tables/<table>/part-00000.parquet  envelope rows (core.events), one file per schema version
    messages/part-00000.parquet        logical messages (op = m), if any

On a local disk a batch is built in a hidden ``.inprogress-*`` directory and renamed into place
only after every file and the manifest are fsynced, so readers never see a partial batch; a
crash leaves an ``.inprogress`` directory that :func:`clean_incomplete` removes once its writer
is gone (the writer is recorded in ``owner.json`` inside it).  Every directory is ``0700`` and
every file ``0600``, whatever the umask: they hold row images.

On an object store (``s3://``; :mod:`airflow_cdc.core.storage`), which has no rename, the parts
are written straight under ``<batch_id>/`` with a suffix unique to the writer
(``part-00000-w<hex>.parquet``, its owner in ``owner-w<hex>.json``), and ``manifest.json`` is
*created* last, put-if-absent: the batch exists exactly when its manifest does, and of two
writers of one batch id exactly one publishes (the other's parts are never listed by the
manifest and go with the batch).  A batch whose manifest never appeared is never read, and is
swept by :func:`clean_incomplete` once its writer is gone or it is older than the lease timeout.
Either way batches are never modified after they are published.
The manifest holds the from/to offsets and the connector state to commit
once the batch is durably applied (``state_after``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_cdc.core.errors import BatchError
from airflow_cdc.core.filemodes import fsync_dir, fsync_file, make_private, private_dir, private_dirs
from airflow_cdc.core.lease import pid_namespace
from airflow_cdc.core.storage import Location, open_location
from airflow_cdc.core.table_sink import BackgroundWrites, PartInfo, TableSink, snapshot_threads

MANIFEST = "manifest.json"
OWNER = "owner.json"
FORMAT_VERSION = 1
_BATCH_ID = re.compile(r"^[0-9]{8}T[0-9]{12}Z-[0-9a-f]{6}$")


def new_batch_id() -> str:
    """A sortable, unique batch id: UTC time to the microsecond plus randomness."""
    t = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t % 1 * 1e6):06d}"
    return f"{stamp}Z-{secrets.token_hex(3)}"


def safe_name(text: str) -> str:
    """A file-system-safe, reversible directory name for a table (percent-encoding)."""
    return quote(text, safe="").replace(".", "%2E") if text.startswith(".") else quote(text, safe=".")


Staging = str | os.PathLike[str] | Location


def batches_root(staging: str | os.PathLike[str], connector: str) -> Path:
    """The local directory of a connector's batches (local staging only: see :func:`batches_at`)."""
    return Path(staging) / safe_name(connector) / "batches"


def batches_at(staging: Staging, connector: str) -> Location:
    """Where a connector's batches live, on any store."""
    return open_location(staging) / safe_name(connector) / "batches"


class BatchWriter:
    """Builds one batch; call :meth:`finish` to publish it or :meth:`abort` to drop it."""

    def __init__(
        self,
        staging: Staging,
        connector: str,
        batch_id: str | None = None,
        piece_rows: int = 65_536,
        *,
        owner: dict[str, Any] | None = None,
        before_publish: Callable[[], None] | None = None,
        target: str | None = None,
        partition: str | None = None,
    ) -> None:
        """:param connector: the name the batch is kept under (``<staging>/<connector>/batches``):
            the connector's state name (:attr:`ConnectorConfig.state_name`).
        :param owner: who writes the batch (host, pid, lease token): lets a later run tell a
            live writer's directory from a dead one's.
        :param before_publish: called right before the batch is published, by the atomic rename
            (local) or the manifest's put-if-absent (object stores): a lease check; raising there
            leaves the batch unpublished.
        :param target: the connector name its Delta tables are named after (the manifest's
            ``connector``); default ``connector``.  Differs for one partition of a partitioned
            connector, whose batches go to the connector's tables.
        :param partition: that partition's key, recorded in the manifest.
        """
        self.batch_id = batch_id or new_batch_id()
        me = {"host": socket.gethostname(), "pid": os.getpid(), "pidns": pid_namespace()}
        owner_doc = json.dumps(owner or me).encode()
        root = batches_at(staging, connector)
        #: the writer's own files: "" locally (its directory is its own), else unique per writer
        self._suffix = ""
        if root.local:
            self.root: Path | None = private_dirs(root.as_path())
            name = f".inprogress-{self.batch_id}-{os.getpid()}-{secrets.token_hex(2)}"
            self.tmp: Path | None = private_dir(self.root / name)
            self.area = open_location(self.tmp)
            (self.tmp / OWNER).write_text(owner_doc.decode())
            make_private(self.tmp / OWNER)
        else:
            self.root = self.tmp = None
            self.area = root / self.batch_id
            self._suffix = f"-w{secrets.token_hex(4)}"
            (self.area / _owner_name(self._suffix)).write_bytes(owner_doc)
        self._before_publish = before_publish
        self.connector, self.piece_rows = connector, piece_rows
        self.target, self.partition = target or connector, partition
        self.published = False
        self._open: dict[str, TableSink] = {}
        #: closed parts per table, in the order they were opened; a :class:`Future` of one while
        #: a writer thread closes it (:meth:`_settle`)
        self._parts: dict[str, list[Any]] = {}
        self._tables: dict[str, dict[str, Any]] = {}
        self._counters: dict[str, int] = {}
        #: encodes snapshot parts' row groups while the caller prepares the next rows, and the
        #: parts of several tables side by side
        self._writes: BackgroundWrites | None = None
        #: parts written ahead (:meth:`write_ahead`), neither kept nor dropped yet
        self._ahead: list[AheadPart] = []
        #: part numbers and the writer threads are shared with snapshot readers' threads
        self._lock = threading.Lock()
        #: parts fsynced when they were closed (local staging), by their relative path
        self._synced: set[str] = set()

    def sink(
        self,
        table: str,
        table_info: dict[str, Any],
        codecs: list,
        select: list[int],
        source: Any,
        kind: str,
        schema_version: str,
        metadata: dict[bytes, bytes] | None = None,
        expand: Any = None,
        ahead: bool = False,
    ) -> TableSink:
        """Open a new part for ``table`` (closing its previous open part, if any).

        :param table_info: JSON-able facts for the manifest: schema, table, key columns, columns.
        :param ahead: a part for :meth:`write_ahead` instead: the table's open part stays open,
            and the new one is neither open nor listed until it is kept.
        """
        if not ahead:
            self.close_table(table)
        with self._lock:
            n = self._counters.get(table, 0)
            self._counters[table] = n + 1
        rel = f"tables/{safe_name(table)}/part-{n:05d}{self._suffix}.parquet"
        (self.area / rel).parent.make_dirs()
        sink = TableSink(
            (self.area / rel).path,
            rel,
            codecs,
            select,
            source,
            kind,
            schema_version,
            self.piece_rows,
            metadata,
            expand=expand,
            key_columns=table_info.get("key_columns") or (),
            filesystem=None if self.area.local else self.area.fs,
            synced=self._synced,
        )
        if ahead:
            return sink
        if kind == "snapshot" and snapshot_threads():
            sink.writes = self._background()
        self._open[table] = sink
        self._tables.setdefault(table, {}).update(table_info)
        return sink

    def _background(self) -> BackgroundWrites:
        with self._lock:
            if self._writes is None:
                self._writes = BackgroundWrites()
            return self._writes

    def _stop_writes(self) -> None:
        if self._writes is not None:
            self._writes.shutdown()
            self._writes = None

    def writes_ahead(self) -> bool:
        """Whether :meth:`write_ahead` is used (parts are written in background threads)."""
        return snapshot_threads()

    def write_ahead(
        self, table: str, table_info: dict[str, Any], sink: TableSink, write: Callable[[TableSink], None]
    ) -> AheadPart:
        """Write a part on a writer thread now, to be kept (:meth:`keep`) or dropped later.

        Snapshot chunks are encoded this way while the next chunks are read, before the window
        tells which of their rows survive: a chunk that keeps all its rows (the common case) is
        then written already.  Any thread may call this.

        :param sink: from :meth:`sink` with ``ahead=True``; ``write(sink)`` fills it on the writer
            thread, which then closes it.
        """

        def run() -> PartInfo:
            try:
                write(sink)
            finally:
                part = sink.close()
            return part

        ahead = AheadPart(table, table_info, sink.rel_path, self._background().submit(run))
        with self._lock:
            self._ahead.append(ahead)
        return ahead

    def keep(self, ahead: AheadPart) -> bool:
        """List a part written ahead in the batch; False (and dropped) if its write failed --
        the caller writes its rows the usual way then, which meets the same error if any."""
        try:
            part = ahead.future.result()
        except Exception:  # noqa: BLE001 - the caller's own write raises it where it belongs
            self.drop(ahead)
            return False
        with self._lock:
            self._ahead.remove(ahead)
        self._parts.setdefault(ahead.table, []).append(part)
        self._tables.setdefault(ahead.table, {}).update(ahead.table_info)
        return True

    def drop(self, ahead: AheadPart) -> None:
        """Remove a part written ahead (after its write ended)."""
        with self._lock:
            if ahead not in self._ahead:
                return
            self._ahead.remove(ahead)
        try:
            ahead.future.result()
        except Exception:  # noqa: BLE001 - dropped: its rows are written elsewhere or not at all
            pass
        (self.area / ahead.rel_path).delete()

    def close_table(self, table: str) -> None:
        sink = self._open.pop(table, None)
        if sink is not None and sink.rows and sink.writes is not None:
            # its last row group may still be encoding: a writer thread closes the file then,
            # while the next part's rows go on
            self._parts.setdefault(table, []).append(sink.close_later())
        elif sink is not None:
            part = sink.close()
            if part.rows:
                self._parts.setdefault(table, []).append(part)
            else:
                (self.area / part.file).delete()

    def _settle(self) -> None:
        """Wait for the parts writer threads are closing; raises what a write or close raised."""
        for parts in self._parts.values():
            for i, part in enumerate(parts):
                if isinstance(part, Future):
                    parts[i] = part.result()

    def inserted_rows(self, table: str, kind: str = "stream") -> list[dict[str, Any]]:
        """The after images of the ``c`` events of ``table`` staged so far in parts of ``kind``,
        in staging order (its open part is closed first).  For small tables (the signal table)."""
        self.close_table(table)
        self._settle()
        out: list[dict[str, Any]] = []
        for part in self._parts.get(table, []):
            if part.kind != kind:
                continue
            where = self.area / part.file
            events = pq.read_table(where.path, columns=["op", "after"], filesystem=where.fs).to_pylist()
            out += [e["after"] for e in events if e["op"] == "c" and e["after"] is not None]
        return out

    def op_counts(self, kind: str) -> dict[str, dict[str, int]]:
        """Events per table and op in parts of ``kind`` so far (flushes open parts of that kind)."""
        out: dict[str, dict[str, int]] = {}
        for sink in self._open.values():
            if sink.kind == kind:
                sink.flush()
        sinks = [(t, s.ops) for t, s in self._open.items() if s.kind == kind]
        self._settle()
        parts = [(t, p.ops) for t, ps in self._parts.items() for p in ps if p.kind == kind]
        for table, ops in sinks + parts:
            counts = out.setdefault(table, {})
            for op, n in ops.items():
                counts[op] = counts.get(op, 0) + n
        return out

    def closed_parts(self, kind: str) -> list[tuple[str, PartInfo, Location]]:
        """``(table, part, where)`` of every part of ``kind`` so far, its open parts closed first
        (for facts read from their footers before :meth:`finish`; a later row opens a new part)."""
        for table in [t for t, s in self._open.items() if s.kind == kind]:
            self.close_table(table)
        self._settle()
        return [(t, p, self.area / p.file) for t, ps in self._parts.items() for p in ps if p.kind == kind]

    def write_messages(self, table: pa.Table) -> None:
        """Write logical messages (op = m) as one part."""
        n = self._counters.get("\0messages", 0)
        self._counters["\0messages"] = n + 1
        rel = f"messages/part-{n:05d}{self._suffix}.parquet"
        where = self.area / rel
        where.parent.make_dirs()
        pq.write_table(table, where.path, compression="snappy", filesystem=where.fs)
        self._parts.setdefault("\0messages", []).append(PartInfo(rel, table.num_rows, "messages", "-"))

    def finish(self, manifest: dict[str, Any]) -> Path | str:
        """Close all parts, write the manifest, fsync, and publish the batch atomically.

        :param manifest: connector-specific fields (from/to offset, state_after, counts ...).
        :returns: the published batch directory (a ``Path``; an ``s3://`` URL on an object store).
        :raises BatchError: another writer published this batch id first (nothing of this
            writer's is visible; call :meth:`abort` to remove its files).
        :raises StorageUnavailable: the object store failed; the batch is not published.
        """
        try:
            for ahead in list(self._ahead):  # chunks the window dropped rows of, or deferred
                self.drop(ahead)
            for table in list(self._open):
                self.close_table(table)
        finally:
            self._stop_writes()
        self._settle()
        tables = {}
        for name, info in self._tables.items():
            parts = self._parts.get(name, [])
            if parts:
                tables[name] = {
                    **info,
                    "parts": [asdict(p) for p in parts],
                    "rows": sum(p.rows for p in parts),
                }
        messages = [asdict(p) for p in self._parts.get("\0messages", [])]
        doc = {
            "format": FORMAT_VERSION,
            "batch_id": self.batch_id,
            "connector": self.target,
            **({"partition": self.partition, "state_name": self.connector} if self.partition else {}),
            "tables": tables,
            "messages": messages,
            **manifest,
        }
        body = json.dumps(doc, indent=1, sort_keys=True, default=str)
        if self.tmp is None:
            return self._publish_by_create(body)
        assert self.root is not None
        for path in self.tmp.rglob("*.parquet"):
            if path.relative_to(self.tmp).as_posix() not in self._synced:  # else done at its close
                make_private(path)
                fsync_file(path)
        (self.tmp / OWNER).unlink()
        (self.tmp / MANIFEST).write_text(body)
        make_private(self.tmp / MANIFEST)
        fsync_file(self.tmp / MANIFEST)
        for d in sorted({p.parent for p in self.tmp.rglob("*")} | {self.tmp}):
            make_private(d)
            fsync_dir(d)
        if self._before_publish is not None:
            self._before_publish()
        final = self.root / self.batch_id
        try:
            os.rename(self.tmp, final)
        except OSError as e:  # ENOTEMPTY / EEXIST: published by another writer first
            if not (final / MANIFEST).exists():
                raise
            raise BatchError(f"batch {self.batch_id} was published by another writer first") from e
        fsync_dir(self.root)
        self.published = True
        return final

    def _publish_by_create(self, body: str) -> str:
        """Object stores: every part is written; the manifest's creation publishes the batch."""
        if self._before_publish is not None:
            self._before_publish()
        try:
            (self.area / MANIFEST).create(body.encode())
        except FileExistsError as e:
            raise BatchError(f"batch {self.batch_id} was published by another writer first") from e
        self.published = True
        (self.area / _owner_name(self._suffix)).delete()
        return self.area.url

    def abort(self) -> None:
        """Drop what this writer wrote (a no-op once it published)."""
        if self.published:
            return
        for sink in self._open.values():
            try:
                sink.close()
            except Exception:  # noqa: BLE001 - best effort while aborting
                pass
        self._open.clear()
        self._stop_writes()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        for info in self.area.walk():  # only this writer's files: another may have published
            if self._suffix in info.base_name:
                Location(self.area.store, info.path).delete()


@dataclass(eq=False)
class AheadPart:
    """A part :meth:`BatchWriter.write_ahead` is writing or wrote: not in the batch until kept."""

    table: str
    table_info: dict[str, Any]
    rel_path: str
    future: Future


def _owner_name(suffix: str) -> str:
    return f"owner{suffix}.json"


# the reader and the sweep live in batch_read; re-exported: callers import them from here
from airflow_cdc.core.batch_read import (  # noqa: E402
    Batch,
    clean_incomplete,
    expire_batches,
    list_batches,
)

__all__ = [
    "Batch",
    "BatchWriter",
    "batches_at",
    "batches_root",
    "clean_incomplete",
    "expire_batches",
    "list_batches",
    "new_batch_id",
    "safe_name",
]
