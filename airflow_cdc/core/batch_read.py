"""Published batches: read them, list them, sweep what never got published, expire old ones.

The layout and the publishing rules are in :mod:`airflow_cdc.core.batch`.  A batch is whatever
has a ``manifest.json``: directories (or prefixes) without one are never read.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_cdc.core import batch as _batch
from airflow_cdc.core.errors import BatchError
from airflow_cdc.core.lease import pid_alive, pid_namespace
from airflow_cdc.core.storage import Location, open_location

MANIFEST, OWNER = "manifest.json", "owner.json"


class Batch:
    """A published batch, read-only.

    :attr:`path` is a ``Path`` for a local batch and the ``s3://`` URL of one on an object store;
    :attr:`location` is the same place as a :class:`~airflow_cdc.core.storage.Location`.
    """

    def __init__(self, path: str | os.PathLike[str] | Location) -> None:
        self.location = open_location(path)
        self.path: Path | str = self.location.as_path() if self.location.local else self.location.url
        try:
            self.manifest: dict[str, Any] = json.loads((self.location / MANIFEST).read_text())
        except FileNotFoundError as e:
            raise BatchError(f"batch {self.path} has no {MANIFEST}: it is incomplete or not a batch") from e
        except json.JSONDecodeError as e:
            raise BatchError(f"batch {self.path}: {MANIFEST} is not valid JSON: {e}") from e
        if self.manifest.get("format") != _batch.FORMAT_VERSION:
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

    def parts(self, table: str) -> list[Path] | list[str]:
        """The table's part files: ``Path``\\ s locally, URIs on an object store (a ``%`` of a
        percent-encoded table name escaped as ``%25``, so Python libraries that decode URIs,
        pyarrow and fsspec, find the object)."""
        where = [self.location / p["file"] for p in self.manifest["tables"][table]["parts"]]
        if self.location.local:
            return [w.as_path() for w in where]
        return [w.url.replace("%", "%25") for w in where]

    def _file(self, rel: str) -> pq.ParquetFile:
        where = self.location / rel
        return pq.ParquetFile(where.path, filesystem=where.fs)

    def iter_events(self, table: str, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream a table's events in pieces (bounded memory), part by part in write order."""
        for part in self.manifest["tables"][table]["parts"]:
            yield from self._file(part["file"]).iter_batches(batch_size=batch_rows)

    def iter_messages(self) -> Iterator[pa.RecordBatch]:
        for part in self.manifest.get("messages", []):
            yield from self._file(part["file"]).iter_batches()

    def verify(self) -> None:
        """Check every listed file exists with the recorded row count.

        :raises BatchError: naming the missing or damaged file.
        """
        for table in self.tables():
            for part in self.table_info(table)["parts"]:
                if not (self.location / part["file"]).exists():
                    raise BatchError(f"batch {self.batch_id}: file {part['file']} is missing")
                rows = self._file(part["file"]).metadata.num_rows
                if rows != part["rows"]:
                    raise BatchError(
                        f"batch {self.batch_id}: {part['file']} has {rows} rows, manifest says {part['rows']}"
                    )


def list_batches(staging: _batch.Staging, connector: str) -> list[Batch]:
    """Published batches of a connector, oldest first (a batch without manifest is not one)."""
    root = _batch.batches_at(staging, connector)
    names = [i.base_name for i in root.children() if _batch._BATCH_ID.match(i.base_name)]
    return [Batch(root / n) for n in names if (root / n / MANIFEST).exists()]


def clean_incomplete(
    staging: _batch.Staging, connector: str, token: int | None = None, grace: float = 0.0
) -> int:
    """Remove unpublished batches whose writer is gone; returns how many.

    Locally these are ``.inprogress`` directories; on an object store, batch prefixes without a
    manifest.  A writer on this host is gone when its pid no longer exists.  A writer on another
    host is taken as gone when its lease token is older than ``token`` (the caller's: it holds
    the lease, so that writer's lease has ended and it can never publish).  A batch without a
    readable owner (a crash before it was recorded, or an older release) is removed once it is
    older than ``grace`` seconds.  Live writers' files are never touched.

    :param token: the caller's lease token, ``None`` when it holds no lease.
    """
    root = _batch.batches_at(staging, connector)
    removed = 0
    for info in root.children():
        name = info.base_name
        if root.local and name.startswith(".inprogress-"):
            gone = _writer_gone(root / name, [root / name / OWNER], token, grace)
        elif not root.local and _batch._BATCH_ID.match(name) and not (root / name / MANIFEST).exists():
            found = (root / name).children()
            owners = [root / name / i.base_name for i in found if i.base_name.startswith("owner")]
            gone = _writer_gone(root / name, owners, token, grace)
        else:
            continue
        if gone:
            _remove(root / name)
            removed += 1
    return removed


def _remove(where: Location) -> None:
    if where.local:
        shutil.rmtree(where.path, ignore_errors=True)
    else:
        where.delete_tree()


def _age(where: Location) -> float | None:
    """Seconds since the newest file below ``where`` (or the directory itself) changed."""
    if where.local:
        try:
            return time.time() - os.stat(where.path).st_mtime
        except FileNotFoundError:
            return None
    times = [i.mtime.timestamp() for i in where.walk() if i.mtime is not None]
    return time.time() - max(times) if times else None


def _writer_gone(where: Location, owners: list[Location], token: int | None, grace: float) -> bool:
    docs = []
    for owner in owners:
        try:
            doc = json.loads(owner.read_text())
            docs.append((doc, str(doc["host"]), int(doc["pid"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not docs:
        age = _age(where)
        if age is None:  # local: gone meanwhile; a prefix without objects: nothing to keep
            return not where.local
        return age > grace
    return all(_one_gone(doc, host, pid, token) for doc, host, pid in docs)


def _one_gone(owner: dict[str, Any], host: str, pid: int, token: int | None) -> bool:
    if host == socket.gethostname() and str(owner.get("pidns", "")) == pid_namespace():
        return not pid_alive(pid)
    return token is not None and int(owner.get("token") or 0) < token


def expire_batches(staging: _batch.Staging, connector: str, keep_after: str, retain: int) -> int:
    """Delete committed batches older than ``keep_after`` beyond the newest ``retain`` ones."""
    old = [b for b in list_batches(staging, connector) if b.batch_id < keep_after]
    doomed = old[: max(0, len(old) - retain)]
    for b in doomed:
        _remove(b.location)
    return len(doomed)
