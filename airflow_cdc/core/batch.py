"""Staged batches: immutable Parquet files per table plus ``manifest.json``.

Layout of one batch directory ``<staging>/<connector>/batches/<batch_id>/``::

    manifest.json                      written last; its presence means the batch is complete
    tables/<table>/part-00000.parquet  envelope rows (core.events), one file per schema version
    messages/part-00000.parquet        logical messages (op = m), if any

A batch is built in a hidden ``.inprogress-*`` directory and renamed into place only after
every file and the manifest are fsynced, so readers never see a partial batch; a crash leaves
an ``.inprogress`` directory that :func:`clean_incomplete` removes once its writer is gone (the
writer is recorded in ``owner.json`` inside it).  Batches are never modified after the rename.
Every directory is ``0700`` and every file ``0600``, whatever the umask: they hold row images.
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
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_cdc.core.errors import BatchError
from airflow_cdc.core.filemodes import make_private, private_dir, private_dirs
from airflow_cdc.core.lease import pid_alive, pid_namespace
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def batches_root(staging: str | os.PathLike[str], connector: str) -> Path:
    return Path(staging) / safe_name(connector) / "batches"


class BatchWriter:
    """Builds one batch; call :meth:`finish` to publish it or :meth:`abort` to drop it."""

    def __init__(
        self,
        staging: str | os.PathLike[str],
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
        :param before_publish: called right before the atomic rename (a lease check); raising
            there leaves the batch unpublished.
        :param target: the connector name its Delta tables are named after (the manifest's
            ``connector``); default ``connector``.  Differs for one partition of a partitioned
            connector, whose batches go to the connector's tables.
        :param partition: that partition's key, recorded in the manifest.
        """
        self.batch_id = batch_id or new_batch_id()
        self.root = private_dirs(batches_root(staging, connector))
        self.tmp = private_dir(self.root / f".inprogress-{self.batch_id}-{os.getpid()}")
        me = {"host": socket.gethostname(), "pid": os.getpid(), "pidns": pid_namespace()}
        (self.tmp / OWNER).write_text(json.dumps(owner or me))
        make_private(self.tmp / OWNER)
        self._before_publish = before_publish
        self.connector, self.piece_rows = connector, piece_rows
        self.target, self.partition = target or connector, partition
        self._open: dict[str, TableSink] = {}
        self._parts: dict[str, list[PartInfo]] = {}
        self._tables: dict[str, dict[str, Any]] = {}
        self._counters: dict[str, int] = {}
        #: encodes snapshot parts' row groups while the caller prepares the next rows, and the
        #: parts of several tables side by side
        self._writes: BackgroundWrites | None = None

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
    ) -> TableSink:
        """Open a new part for ``table`` (closing its previous open part, if any).

        :param table_info: JSON-able facts for the manifest: schema, table, key columns, columns.
        """
        self.close_table(table)
        n = self._counters.get(table, 0)
        self._counters[table] = n + 1
        rel = f"tables/{safe_name(table)}/part-{n:05d}.parquet"
        private_dirs((self.tmp / rel).parent)
        sink = TableSink(
            str(self.tmp / rel),
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
        )
        if kind == "snapshot" and snapshot_threads():
            if self._writes is None:
                self._writes = BackgroundWrites()
            sink.writes = self._writes
        self._open[table] = sink
        self._tables.setdefault(table, {}).update(table_info)
        return sink

    def _stop_writes(self) -> None:
        if self._writes is not None:
            self._writes.shutdown()
            self._writes = None

    def close_table(self, table: str) -> None:
        sink = self._open.pop(table, None)
        if sink is not None:
            part = sink.close()
            if part.rows:
                self._parts.setdefault(table, []).append(part)
            else:
                (self.tmp / part.file).unlink()

    def inserted_rows(self, table: str, kind: str = "stream") -> list[dict[str, Any]]:
        """The after images of the ``c`` events of ``table`` staged so far in parts of ``kind``,
        in staging order (its open part is closed first).  For small tables (the signal table)."""
        self.close_table(table)
        out: list[dict[str, Any]] = []
        for part in self._parts.get(table, []):
            if part.kind != kind:
                continue
            events = pq.read_table(self.tmp / part.file, columns=["op", "after"]).to_pylist()
            out += [e["after"] for e in events if e["op"] == "c" and e["after"] is not None]
        return out

    def op_counts(self, kind: str) -> dict[str, dict[str, int]]:
        """Events per table and op in parts of ``kind`` so far (flushes open parts of that kind)."""
        out: dict[str, dict[str, int]] = {}
        for sink in self._open.values():
            if sink.kind == kind:
                sink.flush()
        sinks = [(t, s.ops) for t, s in self._open.items() if s.kind == kind]
        parts = [(t, p.ops) for t, ps in self._parts.items() for p in ps if p.kind == kind]
        for table, ops in sinks + parts:
            counts = out.setdefault(table, {})
            for op, n in ops.items():
                counts[op] = counts.get(op, 0) + n
        return out

    def write_messages(self, table: pa.Table) -> None:
        """Write logical messages (op = m) as one part."""
        n = self._counters.get("\0messages", 0)
        self._counters["\0messages"] = n + 1
        rel = f"messages/part-{n:05d}.parquet"
        private_dirs((self.tmp / rel).parent)
        pq.write_table(table, self.tmp / rel, compression="snappy")
        self._parts.setdefault("\0messages", []).append(PartInfo(rel, table.num_rows, "messages", "-"))

    def finish(self, manifest: dict[str, Any]) -> Path:
        """Close all parts, write the manifest, fsync, and publish the batch atomically.

        :param manifest: connector-specific fields (from/to offset, state_after, counts ...).
        :returns: the published batch directory.
        """
        try:
            for table in list(self._open):
                self.close_table(table)
        finally:
            self._stop_writes()
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
        for path in self.tmp.rglob("*.parquet"):
            make_private(path)
            _fsync_file(path)
        (self.tmp / OWNER).unlink()
        (self.tmp / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
        make_private(self.tmp / MANIFEST)
        _fsync_file(self.tmp / MANIFEST)
        for d in sorted({p.parent for p in self.tmp.rglob("*")} | {self.tmp}):
            make_private(d)
            _fsync_dir(d)
        if self._before_publish is not None:
            self._before_publish()
        final = self.root / self.batch_id
        os.rename(self.tmp, final)
        _fsync_dir(self.root)
        return final

    def abort(self) -> None:
        for sink in self._open.values():
            try:
                sink.close()
            except Exception:  # noqa: BLE001 - best effort while aborting
                pass
        self._open.clear()
        self._stop_writes()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Batch:
    """A published batch, read-only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.manifest: dict[str, Any] = json.loads((self.path / MANIFEST).read_text())
        except FileNotFoundError as e:
            raise BatchError(f"batch {self.path} has no {MANIFEST}: it is incomplete or not a batch") from e
        except json.JSONDecodeError as e:
            raise BatchError(f"batch {self.path}: {MANIFEST} is not valid JSON: {e}") from e
        if self.manifest.get("format") != FORMAT_VERSION:
            raise BatchError(f"batch {self.path}: unsupported format {self.manifest.get('format')!r}")

    @property
    def batch_id(self) -> str:
        return self.manifest["batch_id"]

    @property
    def empty(self) -> bool:
        """No table part and no logical message: nothing for Delta (its end offset may still move)."""
        return not self.tables() and not self.manifest.get("messages")

    @property
    def partition(self) -> str | None:
        """The partition of a partitioned connector that captured the batch (None: unpartitioned)."""
        return self.manifest.get("partition")

    def tables(self) -> list[str]:
        return sorted(self.manifest["tables"])

    def table_info(self, table: str) -> dict[str, Any]:
        return self.manifest["tables"][table]

    def parts(self, table: str) -> list[Path]:
        return [self.path / p["file"] for p in self.manifest["tables"][table]["parts"]]

    def iter_events(self, table: str, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream a table's events in pieces (bounded memory), part by part in write order."""
        for part in self.parts(table):
            yield from pq.ParquetFile(part).iter_batches(batch_size=batch_rows)

    def iter_messages(self) -> Iterator[pa.RecordBatch]:
        for part in self.manifest.get("messages", []):
            yield from pq.ParquetFile(self.path / part["file"]).iter_batches()

    def verify(self) -> None:
        """Check every listed file exists with the recorded row count.

        :raises BatchError: naming the missing or damaged file.
        """
        for table in self.tables():
            for part in self.table_info(table)["parts"]:
                path = self.path / part["file"]
                if not path.exists():
                    raise BatchError(f"batch {self.batch_id}: file {part['file']} is missing")
                rows = pq.ParquetFile(path).metadata.num_rows
                if rows != part["rows"]:
                    raise BatchError(
                        f"batch {self.batch_id}: {part['file']} has {rows} rows, manifest says {part['rows']}"
                    )


def list_batches(staging: str | os.PathLike[str], connector: str) -> list[Batch]:
    """Published batches of a connector, oldest first."""
    root = batches_root(staging, connector)
    if not root.exists():
        return []
    return [Batch(p) for p in sorted(root.iterdir()) if _BATCH_ID.match(p.name) and (p / MANIFEST).exists()]


def clean_incomplete(
    staging: str | os.PathLike[str], connector: str, token: int | None = None, grace: float = 0.0
) -> int:
    """Remove ``.inprogress`` directories whose writer is gone; returns how many.

    A writer on this host is gone when its pid no longer exists.  A writer on another host is
    taken as gone when its lease token is older than ``token`` (the caller's: it holds the lease,
    so that writer's lease has ended and it can never publish).  A directory without a readable
    owner (a crash before it was recorded, or an older release) is removed once it is older than
    ``grace`` seconds.  Live writers' directories are never touched.

    :param token: the caller's lease token, ``None`` when it holds no lease.
    """
    root = batches_root(staging, connector)
    removed = 0
    if root.exists():
        for p in root.glob(".inprogress-*"):
            if _writer_gone(p, token, grace):
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
    return removed


def _writer_gone(path: Path, token: int | None, grace: float) -> bool:
    try:
        owner = json.loads((path / OWNER).read_text())
        host, pid = owner["host"], int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return time.time() - path.stat().st_mtime > grace
        except FileNotFoundError:
            return False
    if host == socket.gethostname() and str(owner.get("pidns", "")) == pid_namespace():
        return not pid_alive(pid)
    return token is not None and int(owner.get("token") or 0) < token


def expire_batches(staging: str | os.PathLike[str], connector: str, keep_after: str, retain: int) -> int:
    """Delete committed batches older than ``keep_after`` beyond the newest ``retain`` ones."""
    old = [b for b in list_batches(staging, connector) if b.batch_id < keep_after]
    doomed = old[: max(0, len(old) - retain)]
    for b in doomed:
        shutil.rmtree(b.path, ignore_errors=True)
    return len(doomed)
