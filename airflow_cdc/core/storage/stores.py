"""The stores behind :class:`~airflow_cdc.core.storage.Location`: a local disk and S3.

A store gives a ``pyarrow.fs`` filesystem for the bulk of the bytes (Parquet parts, listings,
reads, deletes: pyarrow's S3 client was the fastest measured and is already a dependency) and
one operation pyarrow lacks, :meth:`Store.create`, a write that fails when the object exists.
On S3 that is a ``PUT`` with ``If-None-Match: *`` through ``obstore`` (``mode="create"``);
locally an ``O_EXCL`` open.  GCS and ADLS slot in the same way (``pyarrow.fs.GcsFileSystem`` /
``AzureFileSystem`` with ``obstore``'s ``GCSStore`` / ``AzureStore``, which support ``create``
too): a class here and a line in ``SCHEMES``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from functools import lru_cache
from typing import Protocol

import pyarrow.fs as pafs

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.filemodes import FILE_MODE
from airflow_cdc.core.storage.settings import StorageSettings

#: seconds before a request to an object store gives up (a stopped store fails a run quickly:
#: the run is retried, and nothing it wrote is published)
REQUEST_TIMEOUT = 20
RETRIES = 3


class Store(Protocol):
    """A filesystem plus an atomic create.  Paths are the filesystem's (``bucket/key`` on S3)."""

    #: ``s3://bucket`` style prefix of this store's URLs ("" for local paths)
    prefix: str
    fs: pafs.FileSystem
    #: whether a directory rename is atomic (local disks): publish by rename, else by create
    renames: bool

    def create(self, path: str, data: bytes) -> None:
        """Write ``data`` at ``path`` unless something is there already.

        :raises FileExistsError: it exists (another writer won); nothing was changed.
        """

    def describe(self) -> str:
        """Where the store is, for messages (no credentials)."""


class LocalStore:
    prefix = ""
    renames = True

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()

    def create(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def describe(self) -> str:
        return "local disk"


class S3Store:
    """One bucket of an S3-API store (AWS, or any endpoint: MinIO, s3proxy, Ceph ...)."""

    renames = False

    def __init__(self, bucket: str, settings: StorageSettings) -> None:
        self.bucket, self.settings = bucket, settings
        self.prefix = f"s3://{bucket}"
        endpoint = settings.endpoint
        scheme = "https"
        if endpoint and "://" in endpoint:
            scheme, endpoint = endpoint.split("://", 1)
        self.fs = pafs.S3FileSystem(
            access_key=settings.access_key,
            secret_key=settings.secret_key,
            session_token=settings.session_token,
            region=settings.region,
            endpoint_override=endpoint,
            scheme=scheme,
            force_virtual_addressing=not settings.use_path_style,
            connect_timeout=REQUEST_TIMEOUT,
            request_timeout=REQUEST_TIMEOUT,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES),
        )
        self._obstore: object | None = None

    def _conditional(self) -> object:
        if self._obstore is None:
            from obstore.store import S3Store as ObjectStoreS3

            s = self.settings
            options = {
                k: v
                for k, v in {
                    "endpoint": s.endpoint,
                    "region": s.region,
                    "access_key_id": s.access_key,
                    "secret_access_key": s.secret_key,
                    "session_token": s.session_token,
                }.items()
                if v
            }
            self._obstore = ObjectStoreS3(
                self.bucket,
                **options,  # type: ignore[arg-type]
                virtual_hosted_style_request=not s.use_path_style,
                client_options={
                    "allow_http": bool(s.endpoint and s.endpoint.startswith("http://")),
                    "timeout": f"{REQUEST_TIMEOUT}s",
                    "connect_timeout": f"{REQUEST_TIMEOUT}s",
                },
                retry_config={
                    "max_retries": RETRIES,
                    "retry_timeout": timedelta(seconds=REQUEST_TIMEOUT * RETRIES),
                },
            )
        return self._obstore

    def create(self, path: str, data: bytes) -> None:
        import obstore

        key = path.split("/", 1)[1]
        try:
            obstore.put(self._conditional(), key, data, mode="create")  # type: ignore[arg-type]
        except obstore.exceptions.AlreadyExistsError as e:
            raise FileExistsError(f"{self.prefix}/{key} exists") from e
        except obstore.exceptions.BaseError as e:  # its first line says what; the rest is a debug dump
            raise OSError(str(e).splitlines()[0]) from e

    def describe(self) -> str:
        return f"S3 bucket {self.bucket!r} at {self.settings.describe()}"


def _s3(netloc: str, settings: StorageSettings | None) -> Store:
    return _s3_store(netloc, settings or StorageSettings.from_env())


@lru_cache(maxsize=32)
def _s3_store(bucket: str, settings: StorageSettings) -> S3Store:
    # one client per bucket and settings: a client holds a connection pool
    return S3Store(bucket, settings)


#: URL scheme -> store factory (netloc, settings).  ``s3a://`` is Hadoop's name for the same
#: buckets: Python libraries get ``s3://``.
SCHEMES: dict[str, Callable[[str, StorageSettings | None], Store]] = {"s3": _s3, "s3a": _s3}
PLANNED = ("gs", "gcs", "abfs", "abfss", "az")


def store_for(scheme: str, netloc: str, settings: StorageSettings | None) -> Store:
    factory = SCHEMES.get(scheme)
    if factory is None:
        planned = " (planned; not yet supported)" if scheme in PLANNED else ""
        raise ConfigError(
            f"storage URL scheme {scheme!r}{planned} is not supported; use a local path or s3:// / s3a://"
        )
    if not netloc:
        raise ConfigError(f"storage URL {scheme}:// needs a bucket: {scheme}://<bucket>/<prefix>")
    return factory(netloc, settings)
