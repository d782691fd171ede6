"""The stores behind :class:`~airflow_cdc.core.storage.Location`: a local disk, S3, GCS, ADLS.

A store gives a ``pyarrow.fs`` filesystem for the bulk of the bytes (Parquet parts, listings,
reads, deletes: pyarrow's S3 client was the fastest measured and is already a dependency) and
one operation pyarrow lacks, :meth:`Store.create`, a write that fails when the object exists.
On the object stores that is ``obstore.put(..., mode="create")``: S3's ``PUT`` with
``If-None-Match: *``, GCS's with ``x-goog-if-generation-match: 0``, Azure's Put Blob with
``If-None-Match: *``; locally an ``O_EXCL`` open.  A new store is a class here and a line in
``SCHEMES``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from datetime import timedelta
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlparse

import pyarrow.fs as pafs

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.filemodes import FILE_MODE
from airflow_cdc.core.storage.settings import AzureSettings, GcsSettings, StorageSettings
from spark_jobs.cdc_apply.delta_log import azure_filesystem, azure_url, gcs_filesystem

#: the settings of any store; a store takes those of its kind and reads the environment else
AnySettings = StorageSettings | GcsSettings | AzureSettings

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

    def scrub(self, text: str) -> str:
        """``text`` (a library's error) without this store's secrets or URL query strings."""

    def children(self, path: str) -> list[pafs.FileInfo]:
        """What is directly below ``path``, files and directories (none when it is missing)."""

    def delete(self, path: str) -> None:
        """Delete one file.

        :raises FileNotFoundError: it is not there (callers may ignore that).
        """


def _listing(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


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

    def scrub(self, text: str) -> str:
        return text

    def children(self, path: str) -> list[pafs.FileInfo]:
        return _listing(self.fs, path)

    def delete(self, path: str) -> None:
        self.fs.delete_file(path)


def _client_options(endpoint: str | None) -> Any:  # obstore ClientConfig (a TypedDict)
    return {
        "allow_http": bool(endpoint and endpoint.startswith("http://")),
        "timeout": f"{REQUEST_TIMEOUT}s",
        "connect_timeout": f"{REQUEST_TIMEOUT}s",
    }


_RETRY: Any = {"max_retries": RETRIES, "retry_timeout": timedelta(seconds=REQUEST_TIMEOUT * RETRIES)}
_QUERY = re.compile(r"\?[^\s\"'<>]*")


class _ObjectStore:
    """What the object stores share: no rename, and :meth:`create` through obstore."""

    renames = False
    prefix: str
    fs: pafs.FileSystem
    settings: AnySettings
    _obstore: Any = None

    def _client(self) -> Any:
        """The obstore client (made on first use: most runs create one manifest)."""
        if self._obstore is None:
            self._obstore = self._make_client()
        return self._obstore

    def _make_client(self) -> Any:
        raise NotImplementedError

    def children(self, path: str) -> list[pafs.FileInfo]:
        return _listing(self.fs, path)

    def delete(self, path: str) -> None:
        self.fs.delete_file(path)

    def create(self, path: str, data: bytes) -> None:
        import obstore

        key = path.split("/", 1)[1]
        for attempt in range(CREATE_CONFLICT_RETRIES + 1):
            try:
                obstore.put(self._client(), key, data, mode="create")
                return
            except obstore.exceptions.AlreadyExistsError as e:
                raise FileExistsError(f"{self.prefix}/{key} exists") from e
            except obstore.exceptions.BaseError as e:  # its first line says what; the rest is a debug dump
                if attempt < CREATE_CONFLICT_RETRIES and _create_conflict(e):
                    time.sleep(0.1 * 2**attempt)
                    continue
                raise OSError(self.scrub(str(e).splitlines()[0])) from e

    def scrub(self, text: str) -> str:
        # a request URL's query may carry a SAS token; the secrets themselves, wherever they are
        text = _QUERY.sub("?...", text)
        for secret in self.settings.secrets:
            # a SAS token is a query string: its signature may show up alone, encoded or not
            values = [
                v for _, _, v in (p.partition("=") for p in secret.lstrip("?").split("&")) if len(v) >= 8
            ]
            for piece in sorted(
                {secret, *values, *map(unquote, values), *map(quote, values)}, key=len, reverse=True
            ):
                text = text.replace(piece, "***")
        return text


#: times a put-if-absent is sent again after the store answered that a concurrent conditional
#: write of the same key was in progress
CREATE_CONFLICT_RETRIES = 5


def _create_conflict(error: Exception) -> bool:
    """Whether a put-if-absent met another conditional write of the key in flight: AWS S3 answers
    ``409 ConditionalRequestConflict`` and asks for a retry, which then gets 412 (the other won)
    or succeeds (it failed) -- "Conditional writes", Amazon S3 user guide; a ``PreconditionError``
    is how obstore may report it."""
    import obstore

    if isinstance(error, obstore.exceptions.PreconditionError):
        return True
    first = str(error).splitlines()[0] if str(error) else ""
    return "ConditionalRequestConflict" in first or "409 Conflict" in first


class S3Store(_ObjectStore):
    """One bucket of an S3-API store (AWS, or any endpoint: MinIO, s3proxy, Ceph ...)."""

    settings: StorageSettings

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

    def _make_client(self) -> Any:
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
        return ObjectStoreS3(
            self.bucket,
            **options,  # type: ignore[arg-type]
            virtual_hosted_style_request=not s.use_path_style,
            client_options=_client_options(s.endpoint),
            retry_config=_RETRY,
        )

    def describe(self) -> str:
        return f"S3 bucket {self.bucket!r} at {self.settings.describe()}"


class GcsStore(_ObjectStore):
    """One bucket of Google Cloud Storage (or an emulator: fake-gcs-server)."""

    settings: GcsSettings

    def __init__(self, bucket: str, settings: GcsSettings) -> None:
        self.bucket, self.settings = bucket, settings
        self.prefix = f"gs://{bucket}"
        if settings.credentials_file and not settings.anonymous:
            _use_key_file(settings.credentials_file)
        self.fs = gcs_filesystem(settings.endpoint, settings.anonymous, settings.project_id)

    def _make_client(self) -> Any:
        from obstore.store import GCSStore

        s = self.settings
        options: dict[str, Any] = {}
        if s.anonymous:
            # obstore 0.12.1 asks the metadata server (169.254.169.254) for a token even with
            # skip_signature=True; object_store's recipe for an emulator is a key that turns
            # OAuth off (obstore's GCSConfig.service_account docs: gcs_base_url, disable_oauth)
            key = {"gcs_base_url": s.endpoint or "https://storage.googleapis.com", "disable_oauth": True}
            options["service_account_key"] = json.dumps(key | dict.fromkeys(_EMPTY_KEY_FIELDS, ""))
        else:
            options = {"base_url": s.endpoint, "application_credentials": s.credentials_file}
        return GCSStore(
            self.bucket,
            **{k: v for k, v in options.items() if v},
            client_options=_client_options(s.endpoint),
            retry_config=_RETRY,
        )

    def children(self, path: str) -> list[pafs.FileInfo]:
        """Listed through obstore: pyarrow lists a GCS "directory" only where a marker object
        names it (it asks for objects alone, not prefixes: arrow/cpp/src/arrow/filesystem/
        gcsfs.cc, ``GetFileInfo(FileSelector)``), and our writers leave none."""
        import obstore

        prefix = path.partition("/")[2]
        try:
            listed = obstore.list_with_delimiter(self._client(), f"{prefix}/" if prefix else None)
        except obstore.exceptions.BaseError as e:
            raise OSError(self.scrub(str(e).splitlines()[0])) from e
        found = [
            pafs.FileInfo(f"{self.bucket}/{p}", pafs.FileType.Directory) for p in listed["common_prefixes"]
        ]
        for o in listed["objects"]:
            if not o["path"].endswith("/"):  # a directory marker another tool left
                info = pafs.FileInfo(
                    f"{self.bucket}/{o['path']}", pafs.FileType.File, size=o["size"], mtime=o["last_modified"]
                )
                found.append(info)
        return found

    def describe(self) -> str:
        return f"GCS bucket {self.bucket!r} at {self.settings.describe()}"


_EMPTY_KEY_FIELDS = ("client_email", "private_key", "private_key_id")


def _use_key_file(path: str) -> None:
    """Make ``path`` this process's Application Default Credentials: pyarrow's GCS client
    (google-cloud-cpp) takes a key file only through ``GOOGLE_APPLICATION_CREDENTIALS``.

    :raises ConfigError: the variable names another file.
    """
    current = os.environ.setdefault("GOOGLE_APPLICATION_CREDENTIALS", path)
    if os.path.abspath(current) != os.path.abspath(path):
        raise ConfigError(
            f"GCS key file {path} given, but GOOGLE_APPLICATION_CREDENTIALS names {current}: "
            "pyarrow reads only that variable; make them agree"
        )


class AzureStore(_ObjectStore):
    """One container of an Azure storage account (Blob or ADLS Gen2; or Azurite)."""

    settings: AzureSettings

    def __init__(self, account: str, container: str, settings: AzureSettings) -> None:
        self.account, self.container, self.settings = account, container, settings
        # Hadoop's name for it (abfss://: TLS, as pyarrow and obstore always use off an emulator)
        self.prefix = f"abfss://{container}@{account}{_dfs_suffix(account, settings.endpoint)}"
        s = settings
        self.fs = azure_filesystem(
            account,
            s.endpoint,
            account_key=s.account_key,
            sas_token=s.sas_token,
            client_id=s.client_id,
            client_secret=s.client_secret,
            tenant_id=s.tenant_id,
        )

    def _make_client(self) -> Any:
        from obstore.store import AzureStore as ObjectStoreAzure

        s = self.settings
        options = {"account_key": s.account_key, "sas_key": s.sas_token and s.sas_token.lstrip("?")}
        if s.client_id and s.client_secret and s.tenant_id:
            options |= {"client_id": s.client_id, "client_secret": s.client_secret, "tenant_id": s.tenant_id}
        return ObjectStoreAzure(
            self.container,
            account_name=self.account,
            endpoint=s.blob_endpoint,
            **{k: v for k, v in options.items() if v},  # type: ignore[arg-type]
            client_options=_client_options(s.endpoint),
            retry_config=_RETRY,
        )

    def delete(self, path: str) -> None:
        """One Delete Blob through obstore.  pyarrow's ``delete_file`` on an account without
        a hierarchical namespace leases the blob and writes a marker blob for its parent
        first (arrow/cpp/src/arrow/filesystem/azurefs.cc, ``DeleteFileOnContainer``), and on
        a lease conflict waits out every lease the process took (up to 15 s): seen on
        Azurite as deletes of 7 and 14 s."""
        import obstore

        try:
            obstore.delete(self._client(), path.split("/", 1)[1])
        except obstore.exceptions.NotFoundError as e:
            raise FileNotFoundError(path) from e
        except obstore.exceptions.BaseError as e:
            raise OSError(self.scrub(str(e).splitlines()[0])) from e

    def describe(self) -> str:
        return f"Azure container {self.container!r} of {self.settings.describe()}"


def _dfs_suffix(account: str, endpoint: str | None) -> str:
    """``.dfs.core.windows.net``, or another cloud's (``https://<account>.blob.<suffix>``)."""
    host = urlparse(endpoint).netloc if endpoint else ""
    if host.startswith(f"{account}.blob."):
        return ".dfs." + host[len(f"{account}.blob.") :]
    return ".dfs.core.windows.net"


def _settings(kind: type[Any], settings: AnySettings | None) -> Any:
    """``settings`` when they are of ``kind``, else ``kind``'s from the environment (the
    settings of another kind of store are for that store)."""
    return settings if isinstance(settings, kind) else kind.from_env()


def _s3(url: str, settings: AnySettings | None) -> tuple[Store, str]:
    parts = urlparse(url)
    return _s3_store(parts.netloc, _settings(StorageSettings, settings)), _root(parts.netloc, parts.path)


def _gcs(url: str, settings: AnySettings | None) -> tuple[Store, str]:
    parts = urlparse(url)
    return _gcs_store(parts.netloc, _settings(GcsSettings, settings)), _root(parts.netloc, parts.path)


def _azure(url: str, settings: AnySettings | None) -> tuple[Store, str]:
    account, container, path, endpoint = azure_url(url)
    given: AzureSettings = _settings(AzureSettings, settings)
    account = account or given.account_name
    if not account:
        raise ConfigError(
            f"storage URL {url.split('://')[0]}://{container}/ names no storage account: use "
            "abfss://<container>@<account>.dfs.core.windows.net/<path> or set AZURE_STORAGE_ACCOUNT_NAME"
        )
    chosen = given.for_account(account)
    if endpoint and not chosen.endpoint:  # another cloud's suffix in the URL
        chosen = AzureSettings(endpoint=endpoint).over(chosen)
    return _azure_store(account, container, chosen), _root(container, path)


def _root(bucket: str, path: str) -> str:
    return f"{bucket}/{path.strip('/')}".rstrip("/")


# one client per bucket and settings: a client holds a connection pool
@lru_cache(maxsize=32)
def _s3_store(bucket: str, settings: StorageSettings) -> S3Store:
    return S3Store(bucket, settings)


@lru_cache(maxsize=32)
def _gcs_store(bucket: str, settings: GcsSettings) -> GcsStore:
    return GcsStore(bucket, settings)


@lru_cache(maxsize=32)
def _azure_store(account: str, container: str, settings: AzureSettings) -> AzureStore:
    return AzureStore(account, container, settings)


#: URL scheme -> store factory (URL, settings) -> (store, path in it).  Hadoop's names map to
#: the Python libraries' (:func:`~airflow_cdc.core.storage.python_url`): ``s3a://`` is
#: ``s3://``; ``gs://`` is ``gcs://`` too; ADLS is Hadoop's ``abfs[s]://<container>@<account>
#: .dfs.core.windows.net/<path>`` or adlfs' ``az://<container>/<path>`` (account from settings).
SCHEMES: dict[str, Callable[[str, AnySettings | None], tuple[Store, str]]] = {
    "s3": _s3,
    "s3a": _s3,
    "gs": _gcs,
    "gcs": _gcs,
    "abfs": _azure,
    "abfss": _azure,
    "az": _azure,
}


def store_for(url: str, settings: AnySettings | None) -> tuple[Store, str]:
    """The store of a URL and the path in it (``bucket/key``).

    :raises ConfigError: an unsupported scheme, or a URL without a bucket (or account).
    """
    scheme, _, rest = url.partition("://")
    factory = SCHEMES.get(scheme)
    if factory is None:
        raise ConfigError(
            f"storage URL scheme {scheme!r} is not supported; use a local path, s3:// (s3a://), "
            "gs://, abfss:// (abfs://) or az://"
        )
    if not rest.split("/", 1)[0].split("@", 1)[0]:
        raise ConfigError(f"storage URL {scheme}:// needs a bucket: {scheme}://<bucket>/<prefix>")
    return factory(url, settings)
