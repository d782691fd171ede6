"""One filesystem abstraction for staged batches and Delta logs: local paths and object stores.

``staging.path`` and ``delta.root`` may be a local directory or a URL: ``s3://bucket/prefix``
(or Hadoop's ``s3a://``, which names the same objects), ``gs://bucket/prefix``, or ADLS's
``abfss://container@account.dfs.core.windows.net/prefix`` (``abfs://``; adlfs' ``az://container/
prefix`` with the account in the settings).  :func:`open_location` turns either into a
:class:`Location`: a store (:mod:`.stores`) plus a path within it, joined with ``/``.

What differs between the two, and what callers rely on:

* local directories rename atomically (:attr:`Location.renames`): batches are built aside and
  renamed into place, as they always were;
* object stores have no rename but an atomic create (:meth:`Location.create`, put-if-absent):
  batches are published by writing every part first and ``manifest.json`` last, created only if
  absent, so a batch is visible exactly when its manifest is, and of two writers only one wins.

Failures of a remote store raise :class:`~airflow_cdc.core.errors.StorageUnavailable`
(retryable) naming the store; a missing object stays ``FileNotFoundError``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow.fs as pafs

from airflow_cdc.core.errors import StorageUnavailable
from airflow_cdc.core.filemodes import make_private, private_dirs
from airflow_cdc.core.storage.settings import AzureSettings, GcsSettings, StorageSettings
from airflow_cdc.core.storage.stores import AnySettings, LocalStore, Store, store_for

__all__ = [
    "AzureSettings",
    "GcsSettings",
    "Location",
    "StorageSettings",
    "Store",
    "is_remote",
    "open_location",
    "python_url",
]

_LOCAL = LocalStore()


def is_remote(path: str | os.PathLike[str] | Location) -> bool:
    """Whether ``path`` names an object store (a URL other than ``file://``)."""
    if isinstance(path, Location):
        return not path.local
    text = os.fspath(path)
    return "://" in text and not text.startswith("file://")


def python_url(url: str) -> str:
    """``url`` as Python libraries name it: Hadoop's ``s3a://`` is ``s3://`` there, ``gcs://``
    is ``gs://``.  Hadoop's ADLS URLs (``abfss://<container>@<account>.dfs.core.windows.net/``)
    stay: pyarrow, obstore and adlfs read that form as it is."""
    for hadoop, python in (("s3a://", "s3://"), ("gcs://", "gs://")):
        if url.startswith(hadoop):
            return python + url[len(hadoop) :]
    return url


def open_location(path: str | os.PathLike[str] | Location, settings: AnySettings | None = None) -> Location:
    """The location of a local path or a store URL.

    :param settings: endpoint and credentials of an object store (:class:`StorageSettings`,
        :class:`GcsSettings` or :class:`AzureSettings`: those of another kind of store are
        ignored); default: the environment.
    :raises ConfigError: an unsupported scheme, or a URL without a bucket (or account).
    """
    if isinstance(path, Location):
        return path
    text = os.fspath(path)
    if not is_remote(text):
        return Location(_LOCAL, os.path.abspath(text.removeprefix("file://")))
    return Location(*store_for(text, settings))


@dataclass(frozen=True)
class Location:
    """A path in a store.  Immutable; ``location / "name"`` joins."""

    store: Store
    path: str

    @property
    def local(self) -> bool:
        return isinstance(self.store, LocalStore)

    @property
    def renames(self) -> bool:
        return self.store.renames

    @property
    def fs(self) -> pafs.FileSystem:
        return self.store.fs

    @property
    def url(self) -> str:
        """The local path, or ``s3://bucket/key`` (``gs://``, ``abfss://container@account...``)."""
        return self.path if self.local else f"{self.store.prefix}/{self.path.split('/', 1)[-1]}"

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Location:
        return Location(self.store, self.path.rstrip("/").rsplit("/", 1)[0])

    def __truediv__(self, name: str) -> Location:
        return Location(self.store, f"{self.path.rstrip('/')}/{name}")

    def __str__(self) -> str:
        return self.url

    def as_path(self) -> Path:
        """The local path (only for :attr:`local` locations)."""
        if not self.local:
            raise ValueError(f"{self.url} is not a local path")
        return Path(self.path)

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Raise a remote store's failures as :class:`StorageUnavailable` naming the store."""
        try:
            yield
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as e:
            if self.local:
                raise
            message = self.store.scrub(str(e))
            raise StorageUnavailable(f"{self.store.describe()}: {doing} {self.url} failed: {message}") from e

    def read_bytes(self) -> bytes:
        with self._errors("reading"), self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        """Write (or replace) the object; local files are made ``0600``."""
        with self._errors("writing"):
            if self.local:
                private_dirs(Path(self.path).parent)
            with self.fs.open_output_stream(self.path) as f:
                f.write(data)
            if self.local:
                make_private(self.path)

    def create(self, data: bytes) -> None:
        """Write the object only if absent (atomic; local files ``0600`` and fsynced).

        :raises FileExistsError: it exists; nothing was changed.
        """
        with self._errors("creating"):
            self.store.create(self.path, data)

    def info(self) -> pafs.FileInfo:
        with self._errors("reading"):
            return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def mtime(self) -> datetime | None:
        return self.info().mtime

    def children(self) -> list[pafs.FileInfo]:
        """Direct children, sorted by name (none when the location does not exist)."""
        with self._errors("listing"):
            infos = self.store.children(self.path)
        return sorted(infos, key=lambda i: i.base_name)

    def walk(self) -> list[pafs.FileInfo]:
        """Every file below, recursively (none when the location does not exist)."""
        with self._errors("listing"):
            infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True, recursive=True))
        return [i for i in infos if i.type == pafs.FileType.File]

    def delete(self) -> None:
        """Delete one file; a missing one is fine."""
        with self._errors("deleting"), contextlib.suppress(FileNotFoundError):
            self.store.delete(self.path)

    def delete_tree(self) -> None:
        """Delete everything below and the directory itself; missing is fine."""
        with self._errors("deleting"), contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.path)

    def make_dirs(self) -> Location:
        """Create the directory (``0700`` locally); object stores have none to create."""
        if self.local:
            private_dirs(self.path)
        return self
