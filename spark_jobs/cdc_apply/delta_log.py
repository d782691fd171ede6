"""Read a Delta table's transaction identifiers and commit info straight from ``_delta_log``.

Delta records idempotent writes as ``txn`` actions (``appId`` -> ``version``).  Reading them
needs no Spark: the newest checkpoint (Parquet) plus the JSON commits after it.  The apply job
uses this to skip tables a batch already reached; the Airflow commit step uses it to tell
"applied but not committed" from "not applied" after a crash.  Works on local paths and any
filesystem ``pyarrow.fs`` understands.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

#: table property that turns on Delta change data feed
CHANGE_FEED = "delta.enableChangeDataFeed"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet$")


#: S3 settings of this process, from Hadoop's S3A keys (:func:`use_hadoop_conf`); the
#: environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` ...) fills the rest
_S3A: dict[str, str] = {}
S3A_KEYS = {
    "fs.s3a.endpoint": "endpoint",
    "fs.s3a.endpoint.region": "region",
    "fs.s3a.path.style.access": "path_style",
    "fs.s3a.access.key": "access_key",
    "fs.s3a.secret.key": "secret_key",
    "fs.s3a.session.token": "session_token",
}


#: GCS and ADLS settings of this process, from the GCS connector's and hadoop-azure's keys
#: (:func:`use_hadoop_conf`); the environment fills the rest (see :func:`_gcs_filesystem`,
#: :func:`_azure_filesystem`).  Azure's are per storage account (``None``: every account).
_GCS: dict[str, str] = {}
_AZURE: dict[str | None, dict[str, str]] = {}
#: GCS connector keys (GoogleCloudDataproc/hadoop-connectors, gcs/CONFIGURATION.md)
GCS_KEYS = {
    "fs.gs.storage.root.url": "endpoint",
    "fs.gs.project.id": "project_id",
    "fs.gs.auth.service.account.json.keyfile": "credentials_file",
    "fs.gs.auth.type": "auth_type",  # UNAUTHENTICATED: no credentials (an emulator)
}
#: hadoop-azure's ABFS keys (hadoop.apache.org/docs/stable/hadoop-azure/abfs.html): for one
#: account with the ``.<account>.dfs.core.windows.net`` suffix, for every account without
AZURE_KEY = re.compile(
    r"^fs\.azure\.(account\.key|sas\.fixed\.token|account\.oauth2\.client\.(?:id|secret|endpoint))"
    r"(?:\.([a-z0-9]+)\.(?:dfs|blob)\.[a-z0-9.]+)?$"
)
AZURE_NAMES = {
    "account.key": "account_key",
    "sas.fixed.token": "sas_token",
    "account.oauth2.client.id": "client_id",
    "account.oauth2.client.secret": "client_secret",
    "account.oauth2.client.endpoint": "tenant_id",  # https://login.microsoftonline.com/<tenant>/oauth2/token
}
#: the ``AZURE_STORAGE_*`` variables of obstore (object_store) and adlfs, for one account
#: (``AZURE_STORAGE_ACCOUNT_NAME``); service principals' ``AZURE_CLIENT_*`` the libraries read
AZURE_ENV = {
    "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
    "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "endpoint": "AZURE_STORAGE_ENDPOINT",
}


def use_hadoop_conf(conf: Mapping[str, str]) -> None:
    """Read endpoints and credentials from Hadoop's keys (S3A's ``fs.s3a.*``, the GCS
    connector's ``fs.gs.*``, hadoop-azure's ``fs.azure.*``; with or without ``spark.hadoop.``),
    so pyarrow reaches the same store as Spark.  They replace those of an earlier call: a
    process that applies for several pipelines (an Airflow worker's in-process applies) must not
    reach one pipeline's store with another's endpoint or credentials."""
    _S3A.clear()
    _GCS.clear()
    _AZURE.clear()
    for key, value in conf.items():
        key = key.removeprefix("spark.hadoop.")
        if not value:
            continue
        if name := S3A_KEYS.get(key):
            _S3A[name] = str(value)
        elif name := GCS_KEYS.get(key):
            _GCS[name] = str(value)
        elif m := AZURE_KEY.match(key):
            name, value = AZURE_NAMES[m.group(1)], str(value)
            _AZURE.setdefault(m.group(2), {})[name] = azure_tenant(value) if name == "tenant_id" else value


def azure_tenant(value: str) -> str:
    """The tenant of an OAuth token endpoint (``https://login.microsoftonline.com/<tenant>/...``)."""
    return urlparse(value).path.strip("/").split("/")[0] if "://" in value else value


def _s3_setting(name: str, *env: str) -> str | None:
    return _S3A.get(name) or next((os.environ[e] for e in env if os.environ.get(e)), None)


def _s3_filesystem() -> pafs.FileSystem:
    endpoint = _s3_setting("endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    path_style = _S3A.get("path_style")
    return _cached_s3(
        endpoint,
        _s3_setting("region", "AWS_REGION", "AWS_DEFAULT_REGION"),
        (path_style or "").lower() == "true" if path_style is not None else endpoint is not None,
        _S3A.get("access_key"),
        _S3A.get("secret_key"),
        _S3A.get("session_token"),
    )


@lru_cache(maxsize=8)
def _cached_s3(
    endpoint: str | None,
    region: str | None,
    path_style: bool,
    access_key: str | None,
    secret_key: str | None,
    token: str | None,
) -> pafs.FileSystem:
    scheme = "https"
    if endpoint and "://" in endpoint:
        scheme, endpoint = endpoint.split("://", 1)
    return pafs.S3FileSystem(
        access_key=access_key,
        secret_key=secret_key,
        session_token=token,
        region=region,
        endpoint_override=endpoint,
        scheme=scheme,
        force_virtual_addressing=not path_style,
        connect_timeout=20,
        request_timeout=20,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    )


def gcs_filesystem(endpoint: str | None, anonymous: bool, project_id: str | None = None) -> pafs.FileSystem:
    """pyarrow's GCS filesystem (``bucket/key`` paths); ``endpoint``: an emulator's
    ``http://host:port`` (None: Google's).  Credentials: Application Default Credentials, which
    pyarrow's client (google-cloud-cpp) reads from ``GOOGLE_APPLICATION_CREDENTIALS``, unless
    ``anonymous``."""
    scheme, host = "https", None
    if endpoint:
        scheme, host = endpoint.split("://", 1) if "://" in endpoint else ("http", endpoint)
    return _cached_gcs(scheme, host and host.rstrip("/"), anonymous, project_id)


@lru_cache(maxsize=8)
def _cached_gcs(scheme: str, host: str | None, anonymous: bool, project_id: str | None) -> pafs.FileSystem:
    return pafs.GcsFileSystem(
        anonymous=anonymous,
        scheme=scheme,
        endpoint_override=host,
        project_id=project_id,
        retry_time_limit=timedelta(seconds=20),
    )


def _gcs_filesystem() -> pafs.FileSystem:
    # STORAGE_EMULATOR_HOST: the emulator variable of Google's client libraries, which add
    # http:// when it has no scheme and send no credentials there (cloud.google.com/go/storage)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST") if "endpoint" not in _GCS else None
    anonymous = _GCS.get("auth_type", "").upper() == "UNAUTHENTICATED" or bool(emulator)
    if keyfile := _GCS.get("credentials_file"):
        os.environ.setdefault("GOOGLE_APPLICATION_CREDENTIALS", keyfile)  # the only way pyarrow takes one
    project = _GCS.get("project_id") or os.environ.get("GOOGLE_CLOUD_PROJECT")
    return gcs_filesystem(_GCS.get("endpoint") or emulator, anonymous, project)


def azure_url(url: str) -> tuple[str | None, str, str, str | None]:
    """``(account, container, path, endpoint)`` of an ADLS URL: Hadoop's
    ``abfs[s]://<container>@<account>.dfs.core.windows.net/<path>`` (the endpoint of another
    cloud's suffix, else None), or adlfs' ``az://`` / ``abfs[s]://<container>/<path>`` that
    leave the account to the settings (None)."""
    parts = urlparse(url)
    container, _, host = parts.netloc.rpartition("@") if "@" in parts.netloc else (parts.netloc, "", "")
    account, _, suffix = host.partition(".")
    blob = suffix.replace("dfs.", "blob.", 1)
    endpoint = f"https://{account}.{blob}" if blob and blob != "blob.core.windows.net" else None
    return account or None, container, parts.path.strip("/"), endpoint


def azure_filesystem(account: str, endpoint: str | None = None, **credentials: str | None) -> pafs.FileSystem:
    """pyarrow's Azure filesystem of one storage account (``container/path`` paths).

    :param endpoint: the account's Blob endpoint as a connection string's ``BlobEndpoint``
        names it: ``https://<account>.blob.<suffix>``, or path-style
        ``http://127.0.0.1:10000/<account>`` (Azurite).  pyarrow builds ``<scheme>://<account>
        <authority>`` for an authority starting with a dot, else ``<scheme>://<authority>/<account>``
        (arrow/cpp/src/arrow/filesystem/azurefs.cc, ``BuildBaseUrl``); None: Azure's public cloud.
    :param credentials: ``account_key``; else ``sas_token``; else a service principal's
        ``client_id``/``client_secret``/``tenant_id``; else ``DefaultAzureCredential``, which
        reads ``AZURE_CLIENT_ID`` ... (and workload or managed identity) itself.
    """
    options: dict[str, Any] = {}
    if endpoint:
        parts = urlparse(endpoint)
        path_style = bool(parts.path.strip("/"))  # one authority serves Blob and DFS requests
        blob = parts.netloc if path_style else parts.netloc[len(account) :]
        dfs = blob if path_style else blob.replace(".blob.", ".dfs.", 1)
        options = {"blob_storage_authority": blob, "dfs_storage_authority": dfs}
        options |= {"blob_storage_scheme": parts.scheme, "dfs_storage_scheme": parts.scheme}
    if credentials.get("account_key"):
        options["account_key"] = credentials["account_key"]
    elif credentials.get("sas_token"):  # pyarrow appends it to the account URL as it is
        options["sas_token"] = "?" + str(credentials["sas_token"]).lstrip("?")
    elif all(credentials.get(k) for k in ("client_id", "client_secret", "tenant_id")):
        options |= {k: credentials[k] for k in ("client_id", "client_secret", "tenant_id")}
    return _cached_azure(account, tuple(sorted(options.items())))


@lru_cache(maxsize=8)
def _cached_azure(account: str, options: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    return pafs.AzureFileSystem(account, **dict(options))


def _azure_filesystem(account: str | None, endpoint: str | None) -> pafs.FileSystem:
    """The account's filesystem with hadoop-azure's keys for it, then the ``AZURE_STORAGE_*``
    variables (credentials only when they are for the same account)."""
    env = os.environ
    env_account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT")
    account = account or env_account or next((a for a in _AZURE if a), None)
    if not account:
        raise ValueError("an az:// or abfs://<container>/ URL needs AZURE_STORAGE_ACCOUNT_NAME")
    values: dict[str, str | None] = {"endpoint": endpoint, **_AZURE.get(None, {}), **_AZURE.get(account, {})}
    if env_account in (None, account):
        values |= {name: values.get(name) or env.get(key) for name, key in AZURE_ENV.items()}
    return azure_filesystem(account, **values)


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``path`` and the path within it (local for plain paths).

    ``s3://`` and Hadoop's ``s3a://`` name the same objects: both get pyarrow's S3 filesystem
    with the settings of :func:`use_hadoop_conf` and the environment (``bucket/key`` paths);
    ``gs://`` (``gcs://``) gets its GCS filesystem, ``abfs[s]://`` / ``az://`` its Azure one
    (``container/path`` paths).
    """
    scheme = path.split("://", 1)[0] if "://" in path else ""
    if scheme in ("s3", "s3a", "gs", "gcs"):
        fs = _s3_filesystem() if scheme.startswith("s3") else _gcs_filesystem()
        return fs, path.split("://", 1)[1].rstrip("/")
    if scheme in ("abfs", "abfss", "az"):
        account, container, key, endpoint = azure_url(path)
        return _azure_filesystem(account, endpoint), f"{container}/{key}".rstrip("/")
    if scheme and scheme != "file":
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path.removeprefix("file://")


def hadoop_url(path: str) -> str:
    """``path`` as Spark names it: ``s3://`` is ``s3a://`` to Hadoop, ``gcs://`` is ``gs://``,
    adlfs' ``az://<container>/`` (``abfs[s]://<container>/``) is
    ``abfss://<container>@<account>.dfs.core.windows.net/`` (the environment's account)."""
    scheme, _, rest = path.partition("://")
    if scheme in ("s3", "gcs"):
        return {"s3": "s3a", "gcs": "gs"}[scheme] + "://" + rest
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or next((a for a in _AZURE if a), None)
    container, _, key = rest.partition("/")
    if scheme in ("az", "abfs", "abfss") and "@" not in container and account:
        return f"abfss://{container}@{account}.dfs.core.windows.net/{key}".rstrip("/")
    return path


def _listing(fs: pafs.FileSystem, log_dir: str) -> list[str]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def table_exists(table_path: str) -> bool:
    fs, local = filesystem(table_path)
    return any(_COMMIT.match(n) for n in _listing(fs, f"{local}/_delta_log"))


@dataclass
class LogState:
    """What the apply job needs from a table's log: idempotent writes and live data files."""

    txns: dict[str, int] = field(default_factory=dict)
    files: dict[str, int | None] = field(default_factory=dict)  # path -> numRecords, if recorded
    configuration: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # path -> bytes on storage
    deleted: dict[str, int] = field(default_factory=dict)  # path -> rows its deletion vector hides
    stats: dict[str, str] = field(default_factory=dict)  # path -> its statistics (JSON), if recorded
    partition_columns: list[str] = field(default_factory=list)
    schema_string: str | None = None  # the newest metaData's schema (JSON)
    version: int = -1  # the newest commit replayed (-1: no table)
    protocol: dict[str, Any] = field(default_factory=dict)  # the newest protocol action

    def has_applied(self, app_id: str, version: int = 1) -> bool:
        return self.txns.get(app_id, -1) >= version

    @property
    def records(self) -> int | None:
        """Rows in the current version, from file statistics (None when a file has none)."""
        total = 0
        for count in self.files.values():
            if count is None:
                return None
            total += count
        return total

    def physical_name(self, column: str) -> str | None:
        """``column``'s name in the data files and their statistics (column mapping's physical
        name, or the name itself); None when the table has no such top-level column."""
        if self.schema_string is None:
            return None
        for f in json.loads(self.schema_string).get("fields", []):
            if f.get("name") == column:
                return (f.get("metadata") or {}).get("delta.columnMapping.physicalName", column)
        return None

    def all_null(self, column: str) -> bool | None:
        """Whether every live file's statistics prove ``column`` NULL in all its rows (True also
        when the table has no such column); None when some file's statistics do not say (none
        recorded, or the column beyond ``delta.dataSkippingNumIndexedCols``).  False means some
        file may hold a value, which its deletion vector may hide."""
        if self.schema_string is None:
            return None
        name = self.physical_name(column)
        if name is None:
            return True
        for path in self.files:
            text = self.stats.get(path)
            if not text:
                return None
            stats = json.loads(text)
            rows, nulls = stats.get("numRecords"), (stats.get("nullCount") or {}).get(name)
            if rows is None or not isinstance(nulls, int):
                return None
            if nulls < rows:
                return False
        return True

    def _meta(self, meta: dict[str, Any]) -> None:
        self.configuration = dict(meta.get("configuration") or {})
        self.partition_columns = list(meta.get("partitionColumns") or [])
        self.schema_string = meta.get("schemaString") or self.schema_string

    def _add(self, add: dict[str, Any]) -> None:
        stats = add.get("stats")
        if stats:
            self.stats[add["path"]] = stats
        records = json.loads(stats).get("numRecords") if stats else None
        deleted = (add.get("deletionVector") or {}).get("cardinality") or 0
        self.files[add["path"]] = None if records is None else int(records) - int(deleted)
        self.sizes[add["path"]] = int(add.get("size") or 0)
        self.deleted[add["path"]] = int(deleted)


def replay(table_path: str) -> LogState:
    """Replay the newest checkpoint and the commits after it (an empty state if there is no table)."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    names = _listing(fs, log_dir)
    checkpoints: dict[int, list[str]] = {}
    for n in names:
        m = _CHECKPOINT.match(n)
        if m:
            checkpoints.setdefault(int(m.group(1)), []).append(n)
    state = LogState()
    start = -1
    if checkpoints:
        start = max(checkpoints)
        for name in checkpoints[start]:
            table = pq.read_table(
                f"{log_dir}/{name}", columns=["txn", "add", "metaData", "protocol"], filesystem=fs
            )
            for protocol in table.column("protocol").to_pylist():
                if protocol:
                    state.protocol = {k: v for k, v in protocol.items() if v is not None}
            for txn in table.column("txn").to_pylist():
                if txn:
                    state.txns[txn["appId"]] = txn["version"]
            for add in table.column("add").to_pylist():
                if add:
                    state._add(add)
            for meta in table.column("metaData").to_pylist():
                if meta:
                    state._meta(meta)
    commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
    state.version = start
    for version in commits:
        if version <= start:
            continue
        _apply_commit(state, _actions(fs, f"{log_dir}/{version:020d}.json"))
        state.version = version
    return state


def _apply_commit(state: LogState, actions: list[dict[str, Any]]) -> None:
    """One commit's actions.  Removes go first: a commit that gives a file a new deletion vector
    removes and re-adds the same path (with the old and the new vector), in either order."""
    for action in actions:
        if "remove" in action:
            state.files.pop(action["remove"]["path"], None)
            state.sizes.pop(action["remove"]["path"], None)
            state.deleted.pop(action["remove"]["path"], None)
            state.stats.pop(action["remove"]["path"], None)
    for action in actions:
        if "txn" in action:
            state.txns[action["txn"]["appId"]] = action["txn"]["version"]
        elif "add" in action:
            state._add(action["add"])
        elif "metaData" in action:
            state._meta(action["metaData"])
        elif "protocol" in action:
            state.protocol = dict(action["protocol"])


def row_bytes(table_path: str, state: LogState, sample: int = 2) -> int:
    """About the widest row group's uncompressed bytes per row, from the Parquet footers of the
    ``sample`` files with the most stored bytes per row (0: no files).  Sizes Spark's reads of
    the table, which hold a batch of rows of every column at once."""
    ranked = sorted((size / max(1, state.files.get(path) or 1), path) for path, size in state.sizes.items())
    fs, local = filesystem(table_path)
    widest = 0
    for _, path in ranked[-sample:]:
        if path.startswith("file:"):
            file = unquote(urlparse(path).path)
        elif "://" in path:
            continue  # an absolute path elsewhere (shallow clone): not worth a second filesystem
        else:
            file = f"{local}/{unquote(path)}"
        meta = pq.read_metadata(file, filesystem=fs)
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            if group.num_rows:
                widest = max(widest, -(-group.total_byte_size // group.num_rows))
    return widest


def _actions(fs: pafs.FileSystem, path: str) -> list[dict[str, Any]]:
    with fs.open_input_stream(path) as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def last_commit_info(table_path: str) -> dict[str, Any] | None:
    """The ``commitInfo`` of the newest commit, or None if there is no table."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    commits = sorted(int(m.group(1)) for n in _listing(fs, log_dir) if (m := _COMMIT.match(n)))
    if not commits:
        return None
    for action in _actions(fs, f"{log_dir}/{commits[-1]:020d}.json"):
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    return None


def has_applied(table_path: str, app_id: str, version: int = 1) -> bool:
    return replay(table_path).has_applied(app_id, version)


class StaleFence(RuntimeError):
    """A newer lease holder (higher fencing token) already committed to the table."""


def newest_fence(table_path: str, partition: str | None = None) -> int | None:
    """The fencing token of the newest airflow-cdc commit of the table by ``partition`` (None:
    none recorded).  Partitions of one connector hold leases of their own, so only the same
    partition's tokens compare.

    Walks the JSON commits from the newest down to the first one airflow-cdc wrote (maintenance
    commits such as OPTIMIZE carry no token); commits older than the newest checkpoint are gone
    from view, which is fine: a token only matters while it is the newest.
    """
    found = newest_recorded(table_path, "fence", partition)
    return None if found is None else int(found)


def newest_recorded(table_path: str, name: str, partition: str | None = None) -> Any:
    """The value of ``name`` in the newest airflow-cdc commit info of the table by ``partition``
    that records one (None: none does), walking the JSON commits from the newest down."""
    fs, local = filesystem(table_path)
    log_dir = f"{local}/_delta_log"
    commits = sorted(
        (int(m.group(1)) for n in _listing(fs, log_dir) if (m := _COMMIT.match(n))), reverse=True
    )
    for version in commits:
        for action in _actions(fs, f"{log_dir}/{version:020d}.json"):
            meta = (action.get("commitInfo") or {}).get("userMetadata")
            if not meta:
                continue
            try:
                ours = json.loads(meta).get("airflow_cdc") or {}
            except (ValueError, AttributeError):
                continue
            if name in ours and ours.get("partition") == partition:
                return ours[name]
    return None


def check_fence(table_path: str, fence: int | None, partition: str | None = None) -> None:
    """Refuse to write ``table_path`` when a newer lease holder already did.

    :param fence: this run's fencing token; ``None`` (no lease) skips the check.
    :param partition: the partition of a partitioned connector whose lease issued ``fence``.
    :raises StaleFence: the table's newest airflow-cdc commit carries a higher token.
    """
    if fence is None:
        return
    seen = newest_fence(table_path, partition)
    if seen is not None and seen > fence:
        raise StaleFence(
            f"{table_path} was written under lease token {seen}, newer than this run's {fence}: "
            "a newer run of the connector took over"
        )
